/* rr.c - module "rr": round robin with a fixed quantum; keeps its own
 * position (module data, reset by its init function). */
#include "sched.h"

static int last_id;
static long quantum = 4;

static int rr_init(void) {
  last_id = -1;
  return 0;
}

static int rr_pick(const struct job *ready, int n, long now, int current) {
  (void)now;
  (void)current;
  /* The next job id after the last one that ran, wrapping around. */
  int best = -1, first = 0;
  for (int i = 0; i < n; i++) {
    if (ready[i].id < ready[first].id)
      first = i;
    if (ready[i].id > last_id && (best < 0 || ready[i].id < ready[best].id))
      best = i;
  }
  if (best < 0)
    best = first;
  last_id = ready[best].id;
  return best;
}
static long rr_quantum(void) { return quantum; }
static const char *rr_name(void) { return "rr"; }

BUNKAI_MODULE("rr", "1.0");
BUNKAI_IMPLEMENTS(sched_policy, SCHED_POLICY, rr_pick, rr_quantum, rr_name);
BUNKAI_MODULE_INIT(rr_init);
