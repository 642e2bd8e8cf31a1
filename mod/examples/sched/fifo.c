/* fifo.c - module "fifo": first come, first served; never preempts. */
#include "sched.h"

static int fifo_pick(const struct job *ready, int n, long now, int current) {
  (void)now;
  if (current >= 0)
    return current;
  int best = 0;
  for (int i = 1; i < n; i++)
    if (ready[i].arrival < ready[best].arrival ||
        (ready[i].arrival == ready[best].arrival && ready[i].id < ready[best].id))
      best = i;
  return best;
}
static long fifo_quantum(void) { return 1L << 40; }
static const char *fifo_name(void) { return "fifo"; }

BUNKAI_MODULE("fifo", "1.0");
BUNKAI_IMPLEMENTS(sched_policy, SCHED_POLICY, fifo_pick, fifo_quantum, fifo_name);
