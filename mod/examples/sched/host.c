/* host.c - sched-host: a job-scheduling simulation whose scheduling policy
 * is a module loaded at run time with `bunkai mod` (DKM's measurement 1 ran
 * RT-Mach's scheduling-policy modules). It keeps running while policies are
 * loaded, swapped and unloaded; with no policy it uses a built-in FIFO.
 *
 *   sched-host [--rounds N] [--jobs N] [--pace-us N] [--budget BYTES]
 *              [--socket PATH] [--wait-policy] [--seed N]
 *
 * --wait-policy: start the first round only once a policy is loaded.
 * --seed N: every round schedules the same jobs (made from N), so all the
 *   rounds of one policy hash the same (by default round R's jobs come
 *   from R).
 *
 * Prints "socket PATH" once it is ready, then one line per round:
 *   round R policy NAME decisions D bad B hash H turnaround T misses M
 * where NAME is the policy that made most of the round's decisions (or
 * "builtin"), B counts answers out of range (a broken module), and H hashes
 * the order in which jobs ran, so two runs of one policy can be compared. */
#include "sched.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAXJOBS 4096
#define MAXNAMES 8

static volatile sig_atomic_t stop;
static void on_signal(int s) {
  (void)s;
  stop = 1;
}

static int builtin_fifo(const struct job *r, int n, long now, int current) {
  (void)now;
  if (current >= 0)
    return current;
  int best = 0;
  for (int i = 1; i < n; i++)
    if (r[i].arrival < r[best].arrival ||
        (r[i].arrival == r[best].arrival && r[i].id < r[best].id))
      best = i;
  return best;
}

static unsigned long lcg(unsigned long *s) {
  *s = *s * 6364136223846793005UL + 1442695040888963407UL;
  return *s >> 33;
}

int main(int argc, char **argv) {
  long rounds = 0, njobs = 200, pace_us = 1000;
  unsigned long budget = 0;
  const char *sock = NULL;
  int wait_policy = 0;
  long fixed_seed = -1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--rounds") && v)
      rounds = atol(v), i++;
    else if (!strcmp(a, "--jobs") && v)
      njobs = atol(v), i++;
    else if (!strcmp(a, "--pace-us") && v)
      pace_us = atol(v), i++;
    else if (!strcmp(a, "--budget") && v)
      budget = strtoul(v, NULL, 0), i++;
    else if (!strcmp(a, "--socket") && v)
      sock = v, i++;
    else if (!strcmp(a, "--wait-policy"))
      wait_policy = 1;
    else if (!strcmp(a, "--seed") && v)
      fixed_seed = atol(v), i++;
    else {
      fprintf(stderr, "sched-host: unknown option %s (see the comment at the top of host.c)\n", a);
      return 2;
    }
  }
  if (njobs < 1 || njobs > MAXJOBS) {
    fprintf(stderr, "sched-host: --jobs must be 1..%d\n", MAXJOBS);
    return 2;
  }
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  bunkai_host_set_budget(budget);
  BUNKAI_EXPECT(sched_policy);
  if (bunkai_host_start(sock)) {
    fprintf(stderr, "sched-host: cannot open the module socket\n");
    return 1;
  }
  printf("socket %s\n", bunkai_host_socket());
  fflush(stdout);
  bunkai_iface_t *policy = bunkai_iface("sched_policy");
  while (wait_policy && !stop) {
    struct bunkai_guard g;
    const void *p = bunkai_acquire(policy, &g);
    bunkai_release(&g);
    if (p)
      break;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }

  static struct job all[MAXJOBS], ready[MAXJOBS];
  static int where[MAXJOBS];
  for (long r = 1; !stop && (rounds == 0 || r <= rounds); r++) {
    unsigned long seed = (unsigned long)(fixed_seed >= 0 ? fixed_seed : r);
    long t = 0;
    for (int i = 0; i < njobs; i++) {
      t += (long)(lcg(&seed) % 4);
      all[i].id = i;
      all[i].arrival = t;
      all[i].burst = all[i].remaining = 1 + (long)(lcg(&seed) % 9);
      all[i].priority = (int)(lcg(&seed) % 5);
      all[i].deadline = t + all[i].burst + (long)(lcg(&seed) % 40);
    }
    char names[MAXNAMES][32];
    long counts[MAXNAMES] = {0};
    int nnames = 0;
    long decisions = 0, bad = 0, done = 0, misses = 0, turnaround = 0;
    unsigned long hash = 1469598103934665603UL;
    long now = 0, slice = 0;
    int current = -1; /* job id running */
    while (done < njobs) {
      int n = 0;
      for (int i = 0; i < njobs; i++)
        if (all[i].arrival <= now && all[i].remaining > 0) {
          where[n] = i;
          ready[n++] = all[i];
        }
      if (n == 0) {
        now++;
        current = -1;
        continue;
      }
      int cur_idx = -1;
      for (int k = 0; k < n; k++)
        if (ready[k].id == current)
          cur_idx = k;
      int pick;
      char name[32];
      long quantum;
      if (cur_idx >= 0 && slice > 0) {
        pick = cur_idx; /* within its quantum */
        name[0] = 0;
        quantum = slice;
      } else {
        struct bunkai_guard g;
        const struct sched_policy_ops *p = BUNKAI_ACQUIRE(sched_policy, &g);
        if (p) {
          pick = p->pick(ready, n, now, cur_idx);
          quantum = p->quantum();
          snprintf(name, sizeof name, "%s", p->name());
        } else {
          pick = builtin_fifo(ready, n, now, cur_idx);
          quantum = 1L << 40;
          snprintf(name, sizeof name, "builtin");
        }
        bunkai_release(&g);
        (void)policy;
        decisions++;
        if (pick < 0 || pick >= n) {
          bad++;
          pick = 0;
        }
        int k;
        for (k = 0; k < nnames && strcmp(names[k], name); k++)
          ;
        if (k == nnames && nnames < MAXNAMES)
          snprintf(names[nnames++], 32, "%s", name);
        if (k < MAXNAMES)
          counts[k]++;
        if (quantum < 1)
          quantum = 1;
      }
      struct job *j = &all[where[pick]];
      if (j->id != current)
        slice = quantum;
      current = j->id;
      hash = (hash ^ (unsigned long)j->id) * 1099511628211UL;
      j->remaining--;
      slice--;
      now++;
      if (j->remaining == 0) {
        done++;
        turnaround += now - j->arrival;
        if (now > j->deadline)
          misses++;
        current = -1;
        slice = 0;
      }
    }
    int top = 0;
    for (int k = 1; k < nnames; k++)
      if (counts[k] > counts[top])
        top = k;
    printf("round %ld policy %s decisions %ld bad %ld hash %016lx turnaround %.2f misses %ld\n",
           r, nnames ? names[top] : "none", decisions, bad, hash,
           (double)turnaround / (double)njobs, misses);
    fflush(stdout);
    if (pace_us > 0) {
      struct timespec ts = {pace_us / 1000000, (pace_us % 1000000) * 1000};
      nanosleep(&ts, NULL);
    }
  }
  return 0;
}
