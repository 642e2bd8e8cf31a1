/* acquire.c - what a call through the module registry costs the host's
 * threads: BUNKAI_ACQUIRE + bunkai_release (the handle kept by the call
 * site), the same with the handle looked up by name on every call (what
 * the macro did before), and a plain indirect call through a function
 * table (the baseline: what a host without modules pays).
 *
 *   acquire [ITERATIONS]    prints: name ns_per_iteration (median of 9 runs)
 *
 * No module provides the interface, so the acquire variants measure the
 * guard alone (acquire and release, no call).
 *
 * Rules: a benchmark program, not code that runs in a host; it links
 * libbunkai-host statically and never starts the command thread. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bunkai_mod.h"

#define BENCH_IFACE(X) X(int, get, (int x))
BUNKAI_INTERFACE(bench_iface, BENCH_IFACE)

static int get_impl(int x) { return x + 1; }
static const struct bench_iface_ops table = {get_impl};
static const struct bench_iface_ops *volatile direct = &table;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static volatile long sink;

static double cached(long n) {
  double t0 = now();
  for (long i = 0; i < n; i++) {
    struct bunkai_guard g;
    const struct bench_iface_ops *p = BUNKAI_ACQUIRE(bench_iface, &g);
    sink += p ? p->get((int)i) : 1;
    bunkai_release(&g);
  }
  return (now() - t0) / n;
}

static double by_name(long n) {
  double t0 = now();
  for (long i = 0; i < n; i++) {
    struct bunkai_guard g;
    const struct bench_iface_ops *p = bunkai_acquire(bunkai_iface("bench_iface"), &g);
    sink += p ? p->get((int)i) : 1;
    bunkai_release(&g);
  }
  return (now() - t0) / n;
}

static double plain(long n) {
  double t0 = now();
  for (long i = 0; i < n; i++)
    sink += direct->get((int)i);
  return (now() - t0) / n;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 5000000;
  /* A registered interface with a few others before it in the registry, as
   * in a host that expects several. */
  bunkai_iface("other_a");
  bunkai_iface("other_b");
  bunkai_iface("bench_iface");
  struct {
    const char *name;
    double (*f)(long);
  } m[] = {{"acquire_release", cached}, {"acquire_release_by_name", by_name}, {"indirect_call", plain}};
  for (int k = 0; k < 3; k++) {
    double r[9];
    for (int j = 0; j < 9; j++)
      r[j] = m[k].f(n);
    qsort(r, 9, sizeof r[0], cmp);
    printf("%s %.2f\n", m[k].name, r[4]);
  }
  return 0;
}
