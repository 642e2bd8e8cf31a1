/* edf.c - module "edf": earliest deadline first, preemptive. */
#include "sched.h"

static int edf_pick(const struct job *ready, int n, long now, int current) {
  (void)now;
  (void)current;
  struct bunkai_guard g;
  const struct job_util_ops *u = BUNKAI_ACQUIRE(job_util, &g);
  int best = 0;
  for (int i = 1; i < n; i++)
    if (u ? u->better(ready[i].deadline, ready[best].deadline, ready[i].id, ready[best].id)
          : ready[i].deadline < ready[best].deadline)
      best = i;
  bunkai_release(&g);
  return best;
}
static long edf_quantum(void) { return 1; }
static const char *edf_name(void) { return "edf"; }

BUNKAI_MODULE("edf", "1.0");
BUNKAI_IMPLEMENTS(sched_policy, SCHED_POLICY, edf_pick, edf_quantum, edf_name);
BUNKAI_REQUIRES(job_util, JOB_UTIL);
