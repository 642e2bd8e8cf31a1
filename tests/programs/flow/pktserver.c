/* pktserver: the packets workload of packets.c as a long-running process,
 * for weaving tests. Reads commands on stdin: "go N" processes N packets
 * (allocate, queue, clone every 7th, checksum, free) and prints the
 * checksum; end of input ends it. Built with `bunkai flow cc`; run with
 * libbunkai-host.so and libbunkai-flow.so preloaded so that `bunkai flow
 * weave` can load advice into it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pkt {
  unsigned len;
  unsigned flags;
  char *data;
  struct pkt *next;
};

struct queue {
  struct pkt *head;
  struct pkt *tail;
  long count;
};

__attribute__((noinline)) struct pkt *pkt_alloc(unsigned len, unsigned seed) {
  struct pkt *p = malloc(sizeof *p);
  char *buf = malloc(len);
  for (unsigned i = 0; i < len; i++)
    buf[i] = (char)(seed * 31 + i);
  p->data = buf;
  p->len = len;
  p->flags = seed & 3;
  p->next = NULL;
  return p;
}

__attribute__((noinline)) struct pkt *pkt_clone(const struct pkt *skb) {
  struct pkt *n = malloc(sizeof *n);
  n->len = skb->len;
  n->flags = skb->flags | 4;
  n->data = malloc(skb->len);
  memcpy(n->data, skb->data, skb->len);
  n->next = NULL;
  return n;
}

__attribute__((noinline)) void queue_push(struct queue *q, struct pkt *p) {
  if (q->tail)
    q->tail->next = p;
  else
    q->head = p;
  q->tail = p;
  q->count++;
}

__attribute__((noinline)) unsigned long checksum(const struct queue *q) {
  unsigned long sum = 0;
  for (const struct pkt *p = q->head; p; p = p->next)
    for (unsigned i = 0; i < p->len; i++)
      sum = sum * 131 + (unsigned char)p->data[i] + p->flags;
  return sum;
}

__attribute__((noinline)) void pkt_free(struct pkt *p) {
  free(p->data);
  free(p);
}

int main(void) {
  char line[64];
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("ready\n");
  while (fgets(line, sizeof line, stdin)) {
    int n = 0;
    if (sscanf(line, "go %d", &n) != 1) continue;
    struct queue q = {0};
    for (int i = 0; i < n; i++) {
      struct pkt *p = pkt_alloc(16 + i % 50, (unsigned)i);
      queue_push(&q, p);
      if (i % 7 == 0)
        queue_push(&q, pkt_clone(p));
    }
    unsigned long sum = checksum(&q);
    for (struct pkt *p = q.head, *next; p; p = next) {
      next = p->next;
      pkt_free(p);
    }
    printf("packets %ld checksum %lu\n", q.count, sum);
  }
  return 0;
}
