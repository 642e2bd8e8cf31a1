/* splitdrv: a Xen split-driver analogue for bunkai flow's case study
 * (seed 003, Table 2). Two processes share a ring of request slots in a
 * file (a tmpfs file both map, standing in for Xen's granted pages):
 *
 *   splitdrv front RING N [BG]
 *                           the front end (netfront in domain U): allocates
 *                           a buffer struct per packet (alloc_skb), fills it,
 *                           and puts it on the ring (netif_xmit): header
 *                           netif_tx_request, data copied to the slot;
 *                           with BG > 0, only one packet in BG + 1 comes
 *                           from alloc_skb, the others (background traffic)
 *                           from alloc_skb_bulk;
 *   splitdrv back RING N    the back end (netback in domain 0), run in
 *                           another network namespace: takes each request
 *                           (net_tx_action), copies it into its own struct,
 *                           clones one in four (skb_clone; chosen by a hash
 *                           of the packet's number, so that it does not line
 *                           up with the front end's one in BG + 1), sends each to a
 *                           real UDP socket (dev_queue_xmit) and frees it
 *                           (kfree_skb); it counts what its own UDP socket
 *                           receives.
 *
 * The front waits for "go" on stdin before sending (so advice can be woven
 * into both first); each side prints a checksum of what it handled. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "splitdrv.h"

static struct ring *map_ring(const char *path, int create) {
  int fd = open(path, O_RDWR | (create ? O_CREAT | O_TRUNC : 0), 0600);
  if (fd < 0 || (create && ftruncate(fd, sizeof(struct ring)))) {
    perror(path);
    exit(1);
  }
  struct ring *r = mmap(0, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (r == MAP_FAILED) exit(1);
  return r;
}

/* ---- the front end ---- */

__attribute__((noinline)) struct sk_buff *alloc_skb(unsigned len, unsigned seed) {
  struct sk_buff *skb = calloc(1, sizeof *skb);
  skb->len = len;
  skb->data = skb->head;
  for (unsigned i = 0; i < len; i++) skb->data[i] = (char)(seed * 13 + i);
  return skb;
}

/* the request for skb in slot idx (netfront's xennet_make_txreqs) */
__attribute__((noinline)) void make_txreq(struct netif_tx_request *tx, struct sk_buff *skb, unsigned idx) {
  tx->id = (uint16_t)idx;
  tx->size = (uint16_t)skb->len;
  tx->offset = 0;
  tx->flags |= 1; /* NETTXF_csum_blank; the bits above 3 carry the flow ID */
}

/* background traffic: the same packets from another allocation site */
__attribute__((noinline)) struct sk_buff *alloc_skb_bulk(unsigned len, unsigned seed) {
  struct sk_buff *skb = calloc(1, sizeof *skb);
  skb->len = len;
  skb->data = skb->head;
  for (unsigned i = 0; i < len; i++) skb->data[i] = (char)(seed * 13 + i);
  return skb;
}

__attribute__((noinline)) void netif_xmit(struct ring *r, struct sk_buff *skb) {
  while (__atomic_load_n(&r->prod, __ATOMIC_ACQUIRE) - __atomic_load_n(&r->cons, __ATOMIC_ACQUIRE) >= RING_SLOTS) sched_yield();
  unsigned idx = r->prod % RING_SLOTS;
  make_txreq(&r->slot[idx].req, skb, idx);
  memcpy(r->slot[idx].data, skb->data, skb->len);
  __atomic_store_n(&r->prod, r->prod + 1, __ATOMIC_RELEASE);
  free(skb);
}

/* ---- the back end ---- */

__attribute__((noinline)) struct sk_buff *net_tx_action(struct ring *r, struct netif_tx_request *tx) {
  struct sk_buff *skb = calloc(1, sizeof *skb);
  skb->data = skb->head;
  skb->len = tx->size;
  if (tx->flags & 1) skb->csum = 1;
  memcpy(skb->data, r->slot[tx->id].data, skb->len);
  tx->flags = 0;
  return skb;
}

__attribute__((noinline)) struct sk_buff *skb_clone(struct sk_buff *skb) {
  struct sk_buff *n = malloc(sizeof *n);
  memcpy(n, skb, sizeof *n);
  n->data = n->head;
  n->cloned = 1;
  return n;
}

__attribute__((noinline)) unsigned long dev_queue_xmit(int fd, const struct sockaddr_in *to, struct sk_buff *skb) {
  sendto(fd, skb->data, skb->len, 0, (const struct sockaddr *)to, sizeof *to);
  unsigned long sum = skb->len;
  for (unsigned i = 0; i < skb->len; i++) sum = sum * 31 + (unsigned char)skb->data[i];
  return sum;
}

__attribute__((noinline)) unsigned kfree_skb(struct sk_buff *skb) {
  unsigned len = skb->len;
  free(skb);
  return len;
}

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: splitdrv front|back RING N [BG]\n");
    return 2;
  }
  int n = atoi(argv[3]);
  int bg = argc == 5 ? atoi(argv[4]) : 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!strcmp(argv[1], "front")) {
    struct ring *r = map_ring(argv[2], 1);
    printf("ready\n");
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
      unsigned len = 32 + (unsigned)i % 64;
      netif_xmit(r, bg && i % (bg + 1) ? alloc_skb_bulk(len, (unsigned)i) : alloc_skb(len, (unsigned)i));
    }
    while (__atomic_load_n(&r->cons, __ATOMIC_ACQUIRE) != r->prod) sched_yield();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("front: %d packets sent in %.6f s\n", n, s);
    return 0;
  }
  struct ring *r = map_ring(argv[2], 0);
  int out = socket(AF_INET, SOCK_DGRAM, 0), in = socket(AF_INET, SOCK_DGRAM, 0);
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof to;
  if (bind(in, (struct sockaddr *)&to, sizeof to) || getsockname(in, (struct sockaddr *)&to, &len)) return 1;
  printf("ready\n");
  unsigned long sum = 0;
  int sent = 0, got = 0;
  char buf[256];
  for (int done = 0; done < n;) {
    if (__atomic_load_n(&r->prod, __ATOMIC_ACQUIRE) == r->cons) {
      sched_yield();
      continue;
    }
    struct netif_tx_request *tx = &r->slot[r->cons % RING_SLOTS].req;
    struct sk_buff *skb = net_tx_action(r, tx);
    __atomic_store_n(&r->cons, r->cons + 1, __ATOMIC_RELEASE);
    /* one in four, by the top two bits of a multiplicative hash: "every
     * fourth" would clone half of the front end's one-in-ten packets (every
     * twentieth number is both), and make the followed packets busier than
     * the background ones in Table 3 */
    if (((uint32_t)done * 2654435761u) >> 30 == 0) {
      struct sk_buff *c = skb_clone(skb);
      sum += dev_queue_xmit(out, &to, c);
      kfree_skb(c);
      sent++;
    }
    sum += dev_queue_xmit(out, &to, skb);
    kfree_skb(skb);
    sent++;
    done++;
    while (recv(in, buf, sizeof buf, MSG_DONTWAIT) > 0) got++;
  }
  while (got < sent && recv(in, buf, sizeof buf, 0) > 0) got++;
  printf("back: %d packets, %d sent and received on UDP, checksum %lu\n", n, got, sum);
  return 0;
}
