/* sched.h - the interfaces of the job-scheduling example (DKM's measurement
 * 1 used RT-Mach's scheduling-policy modules; these are their user-space
 * counterparts). Included by the host and by every policy module. */
#ifndef SCHED_H
#define SCHED_H

#include "bunkai_mod.h"

struct job {
  int id;
  int priority; /* larger is more urgent */
  long arrival, burst, remaining, deadline;
};

/* A scheduling policy: which ready job runs next, and for how long. */
#define SCHED_POLICY(X)                                                        \
  X(int, pick, (const struct job *ready, int n, long now, int current))        \
  X(long, quantum, (void))                                                     \
  X(const char *, name, (void))
BUNKAI_INTERFACE(sched_policy, SCHED_POLICY)

/* Helpers some policies share, in a module of their own (a dependency). */
#define JOB_UTIL(X)                                                            \
  X(long, slack, (const struct job *j, long now))                              \
  X(int, better, (long a, long b, int ia, int ib))
BUNKAI_INTERFACE(job_util, JOB_UTIL)

#endif
