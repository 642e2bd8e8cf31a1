/* records: what woven advice does, written by hand, so that `bunkai flow
 * dump` and `report` can be tested on real buffers before `bunkai flow
 * weave` exists. Built with `bunkai flow cc` (so it has a join-point table)
 * and linked with libbunkai-flow. Usage: records N JP_ALLOC JP_CLONE JP_SEND
 * JP_RECV JP_FREE, where each JP_ is the index of that function's entry
 * join point (from `bunkai flow points`).
 *
 * A front end (the parent) allocates N packets; each starts a flow
 * (get_new_flowid, register_flowid). Every third is cloned: the clone joins
 * the flow (copy). front_send packs the ID into a header that goes through
 * a pipe (xin_move: the packet leaves the flow) to a back end (a child
 * process), which registers it for its own packet (xout_move) and frees it
 * (quit). The parent frees the clones (quit). At each step the ID's record
 * is STORE_DATA2(len, id). Prints what it did, one line per process.
 * RECORDS_LEAK=K leaves the last K clones' keys in the table at exit. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "bunkai_flow.h"

struct pkt {
  unsigned len;
  unsigned flags;
  char data[48];
};
struct hdr { /* the ring slot's header, like netif_tx_request */
  uint64_t id;
  uint32_t len, flags;
};

static uint32_t JP[5];
static struct bkf_table *T;

/* STORE_DATA2(len, id) at join point jp, if key is in the flow */
static void rec(uint32_t jp, const struct pkt *key) {
  uint64_t id = get_flowid(T, key);
  if (id) {
    uint64_t v[2] = {key->len, id};
    bkf_store((uint64_t)__builtin_return_address(0), jp, 2, v);
  }
}

__attribute__((noinline)) struct pkt *pkt_alloc(unsigned len) {
  struct pkt *p = calloc(1, sizeof *p);
  p->len = len;
  register_flowid(T, p, get_new_flowid()); /* start */
  rec(JP[0], p);
  return p;
}

__attribute__((noinline)) struct pkt *pkt_clone(const struct pkt *skb) {
  struct pkt *n = malloc(sizeof *n);
  memcpy(n, skb, sizeof *n);
  register_flowid(T, n, get_flowid(T, skb)); /* copy from skb to n */
  rec(JP[1], n);
  return n;
}

__attribute__((noinline)) void front_send(int fd, struct pkt *p) {
  rec(JP[2], p);
  struct hdr h = {get_flowid(T, p), p->len, p->flags};
  remove_flowid(T, p); /* xin_move: the ID travels in the header */
  if (write(fd, &h, sizeof h) != sizeof h) exit(1);
  free(p);
}

__attribute__((noinline)) struct pkt *back_recv(const struct hdr *h) {
  struct pkt *q = calloc(1, sizeof *q);
  q->len = h->len;
  register_flowid(T, q, h->id); /* xout_move */
  rec(JP[3], q);
  return q;
}

__attribute__((noinline)) void pkt_free(struct pkt *p) {
  rec(JP[4], p);
  remove_flowid(T, p); /* quit */
  free(p);
}

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: records N JP_ALLOC JP_CLONE JP_SEND JP_RECV JP_FREE\n");
    return 2;
  }
  int n = atoi(argv[1]);
  for (int k = 0; k < 5; k++) JP[k] = (uint32_t)strtoul(argv[2 + k], 0, 0);
  T = bkf_table("pktflow");
  int fds[2];
  if (pipe(fds)) return 1;
  pid_t child = fork();
  if (child == 0) {
    close(fds[1]);
    struct hdr h;
    int got = 0;
    while (read(fds[0], &h, sizeof h) == sizeof h) {
      pkt_free(back_recv(&h));
      got++;
    }
    printf("back end: %d packets\n", got);
    return 0;
  }
  close(fds[0]);
  struct pkt *clones[1024];
  int nc = 0;
  for (int i = 0; i < n; i++) {
    struct pkt *p = pkt_alloc(16 + (unsigned)i);
    if (i % 3 == 0 && nc < 1024) clones[nc++] = pkt_clone(p);
    front_send(fds[1], p);
  }
  close(fds[1]);
  /* RECORDS_LEAK=K: the last K clones end without their quit (their keys
   * stay in the table, as an aspect without a <quit> leaves them) */
  const char *leak = getenv("RECORDS_LEAK");
  int keep = leak ? atoi(leak) : 0;
  for (int k = 0; k < nc; k++) {
    if (k >= nc - keep) continue;
    pkt_free(clones[k]);
  }
  int st;
  waitpid(child, &st, 0);
  printf("front end: %d packets, %d clones\n", n, nc);
  fflush(stdout);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
