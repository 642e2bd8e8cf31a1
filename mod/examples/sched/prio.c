/* prio.c - module "prio": highest priority first, preemptive; ties by
 * least slack (from the sched-util module it requires). */
#include "sched.h"

static int prio_pick(const struct job *ready, int n, long now, int current) {
  (void)current;
  struct bunkai_guard g;
  const struct job_util_ops *u = BUNKAI_ACQUIRE(job_util, &g);
  int best = 0;
  for (int i = 1; i < n; i++) {
    if (ready[i].priority != ready[best].priority) {
      if (ready[i].priority > ready[best].priority)
        best = i;
    } else if (u && u->better(u->slack(&ready[i], now), u->slack(&ready[best], now),
                              ready[i].id, ready[best].id)) {
      best = i;
    }
  }
  bunkai_release(&g);
  return best;
}
static long prio_quantum(void) { return 2; }
static const char *prio_name(void) { return "prio"; }

BUNKAI_MODULE("prio", "1.0");
BUNKAI_IMPLEMENTS(sched_policy, SCHED_POLICY, prio_pick, prio_quantum, prio_name);
BUNKAI_REQUIRES(job_util, JOB_UTIL);
