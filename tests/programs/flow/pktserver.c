/* pktserver: the packets workload of packets.c as a long-running process,
 * for weaving tests. Reads commands on stdin: "go N" processes N packets
 * (allocate, queue, clone every 7th, checksum, free) and prints the
 * checksum; end of input ends it. Built with `bunkai flow cc`; run with
 * libbunkai-host.so and libbunkai-flow.so preloaded so that `bunkai flow
 * weave` can load advice into it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the workload itself: packets.c's functions (its main renamed away) */
#define main packets_main
#include "packets.c"
#undef main

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
