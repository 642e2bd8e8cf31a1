/* ring: a front end and a back end joined by a ring of slots, each with a
 * request header like Xen's netif_tx_request (seed 003, Fig. 4), in one
 * process. Weaving tests follow packets across the ring with xin/xout: the
 * front packs a packet's flow ID into the header's `tag` and the back
 * registers it for its own packet. Reads "go N" on stdin, sends N packets
 * through the ring, prints a checksum; end of input ends it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ring.h"

static struct slot ring[64];

__attribute__((noinline)) struct pkt *front_alloc(unsigned len, unsigned seed) {
  struct pkt *skb = calloc(1, sizeof *skb);
  skb->len = len;
  for (unsigned i = 0; i < len && i < sizeof skb->data; i++) skb->data[i] = (char)(seed + i);
  return skb;
}

__attribute__((noinline)) void front_send(struct pkt *skb, struct tx_req *tx) {
  tx->size = (uint16_t)skb->len;
  tx->tag |= 1; /* "more data" in bit 0; the bits above carry the flow ID */
  memcpy(((struct slot *)tx)->payload, skb->data, sizeof skb->data);
  free(skb);
}

__attribute__((noinline)) struct pkt *back_recv(struct tx_req *tx) {
  struct pkt *skb = calloc(1, sizeof *skb);
  skb->len = tx->size;
  if (tx->tag & 1) skb->flags = 1;
  memcpy(skb->data, ((struct slot *)tx)->payload, sizeof skb->data);
  tx->tag = 0;
  return skb;
}

__attribute__((noinline)) unsigned long back_free(struct pkt *skb) {
  unsigned long sum = skb->len * 31u + skb->flags;
  for (unsigned i = 0; i < sizeof skb->data; i++) sum = sum * 7 + (unsigned char)skb->data[i];
  free(skb);
  return sum;
}

int main(void) {
  char line[64];
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("ready\n");
  while (fgets(line, sizeof line, stdin)) {
    int n = 0;
    if (sscanf(line, "go %d", &n) != 1) continue;
    unsigned long sum = 0;
    for (int i = 0; i < n; i++) {
      struct tx_req *tx = &ring[i % 64].req;
      front_send(front_alloc(16 + (unsigned)i % 32, (unsigned)i), tx);
      sum += back_free(back_recv(tx));
    }
    printf("packets %d checksum %lu\n", n, sum);
  }
  return 0;
}
