/* util.c - module "sched-util": helpers that the priority and EDF policies
 * require (loaded automatically as their dependency). */
#include "sched.h"

static long util_slack(const struct job *j, long now) {
  return j->deadline - now - j->remaining;
}

/* Smaller key first; ties go to the lower job id, so runs are
 * deterministic. */
static int util_better(long a, long b, int ia, int ib) {
  return a < b || (a == b && ia < ib);
}

BUNKAI_MODULE("sched-util", "1.0");
BUNKAI_IMPLEMENTS(job_util, JOB_UTIL, util_slack, util_better);
