/* flow test program: packets built in a loop, linked through pointers,
 * cloned and freed. Join points: accesses to struct pkt and struct queue
 * members (loads and stores, in loops, through pointers) and the entries of
 * the non-inlined functions. Output must not change under `bunkai flow cc`.
 *
 * A comment `jp FUNCTION: ITEM; ITEM` on a line names join points that
 * tests/e2e/flow.rs expects there at -O2. ITEM is `entry` or
 * `STRUCT.MEMBER load|store|addr`, then operand names that must be listed
 * (`a=b`: both listed, at one location; `n=$7`: at that location; `!x`:
 * not listed). */
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

__attribute__((noinline)) struct pkt *pkt_alloc(unsigned len, unsigned seed) {  /* jp pkt_alloc: entry $arg0=len $arg1=seed */
  struct pkt *p = malloc(sizeof *p);
  char *buf = malloc(len);
  for (unsigned i = 0; i < len; i++)
    buf[i] = (char)(seed * 31 + i);
  p->data = buf;  /* jp pkt_alloc: pkt.data store $base=p buf len seed */
  p->len = len;  /* jp pkt_alloc: pkt.len store $base=p */
  p->flags = seed & 3;  /* jp pkt_alloc: pkt.flags store $base=p */
  p->next = NULL;  /* jp pkt_alloc: pkt.next store $base=p */
  return p;
}

__attribute__((noinline)) struct pkt *pkt_clone(const struct pkt *skb) {  /* jp pkt_clone: entry $arg0=skb */
  struct pkt *n = malloc(sizeof *n);
  n->len = skb->len;  /* jp pkt_clone: pkt.len load $base=skb n; pkt.len store $base=n skb */
  n->flags = skb->flags | 4;  /* jp pkt_clone: pkt.flags load $base=skb n; pkt.flags store $base=n skb */
  n->data = malloc(skb->len);  /* jp pkt_clone: pkt.data store $base=n skb */
  memcpy(n->data, skb->data, skb->len);  /* jp pkt_clone: pkt.data load $base=skb n */
  n->next = NULL;  /* jp pkt_clone: pkt.next store $base=n skb */
  return n;
}

__attribute__((noinline)) void queue_push(struct queue *q, struct pkt *p) {  /* jp queue_push: entry $arg0=q $arg1=p */
  if (q->tail)  /* jp queue_push: queue.tail load $base=q p */
    q->tail->next = p;
  else
    q->head = p;
  q->tail = p;  /* jp queue_push: queue.tail store $base=q p */
  q->count++;  /* jp queue_push: queue.count load $base=q; queue.count store $base=q */
}

__attribute__((noinline)) unsigned long checksum(const struct queue *q) {  /* jp checksum: entry $arg0=q */
  unsigned long sum = 0;
  for (const struct pkt *p = q->head; p; p = p->next)  /* jp checksum: queue.head load $base=q */
    for (unsigned i = 0; i < p->len; i++)
      sum = sum * 131 + (unsigned char)p->data[i] + p->flags;
  return sum;
}

__attribute__((noinline)) void pkt_free(struct pkt *p) {  /* jp pkt_free: entry $arg0=p */
  free(p->data);  /* jp pkt_free: pkt.data load $base=p */
  free(p);
}

int main(int argc, char **argv) {  /* jp main: entry $arg0=argc $arg1=argv */
  int n = argc > 1 ? atoi(argv[1]) : 100;
  struct queue q = {0};
  for (int i = 0; i < n; i++) {
    struct pkt *p = pkt_alloc(16 + i % 50, (unsigned)i);
    queue_push(&q, p);
    if (i % 7 == 0)
      queue_push(&q, pkt_clone(p));
  }
  printf("packets %ld checksum %lu\n", q.count, checksum(&q));
  for (struct pkt *p = q.head, *next; p; p = next) {
    next = p->next;  /* jp main: pkt.next load $base=p */
    pkt_free(p);
  }
  return 0;
}
