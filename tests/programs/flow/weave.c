/* weave: bkf_weave and bkf_unweave on a running program. Built with
 * `bunkai flow cc` and linked with libbunkai-flow.so. Usage:
 *     weave plain|woven ROUNDS SLED...
 * where each SLED is a join point's link-time address (`bunkai flow points
 * --json`, sled_addr) in this program. Three threads run a workload on
 * struct items (integer and floating point) while, in `woven` mode, the
 * main thread weaves every sled, waits for some calls, and unweaves them,
 * ROUNDS times. Even rounds weave with bkf_weave: the handler counts calls,
 * checks that each comes from the sled its jp names and got an XSAVE area,
 * and clobbers vector registers (the trampoline must save them). Odd rounds
 * weave with bkf_weave_ex(BKF_WEAVE_NO_VECTOR): an integer-only handler
 * that must get no area and a 16-byte aligned stack. Prints the workload's checksums, which must not depend on
 * the mode, and the checks. */
#define _GNU_SOURCE
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bunkai_flow.h"

struct item {
  long count;
  double weight;
  struct item *next;
};

static uint64_t *sleds;
static int nsleds;
static uint64_t calls, bad;
static double scratch[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static uint64_t gpr_calls;

/* BKF_WEAVE_NO_VECTOR: integers only (the program is built with -O2, and
 * nothing here needs a vector register). */
static void handler_gpr(struct bkf_frame *f, void *xsave, uint32_t jp, void *arg) {
  __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
  __atomic_fetch_add(&gpr_calls, 1, __ATOMIC_RELAXED);
  uint64_t sp = (uint64_t)(uintptr_t)__builtin_frame_address(0);
  if ((int)jp >= nsleds || f->ret - 7 != sleds[jp] || arg != (void *)&calls || xsave || sp % 16)
    __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
}

static void handler(struct bkf_frame *f, void *xsave, uint32_t jp, void *arg) {
  __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
  if ((int)jp >= nsleds || f->ret - 7 != sleds[jp] || arg != (void *)&calls || !xsave || (uintptr_t)xsave % 64)
    __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
  /* floating point and vector work in the handler */
  double acc = 0;
  for (int i = 0; i < 16; i++) acc += scratch[i] * 1.0001;
  char buf[256];
  memset(buf, (int)acc & 0x7f, sizeof buf);
  if (buf[17] == 1) scratch[0] += 0.0;
}

__attribute__((noinline)) double step(struct item *it, double x) {
  it->count += 1;
  it->weight = it->weight * 0.999 + x;
  if (it->next) it->next->count += it->count & 1;
  return it->weight;
}

struct work {
  int id;
  long iterations;
  double sum;
  long counts;
};

static void *worker(void *p) {
  struct work *w = p;
  struct item items[8];
  for (int i = 0; i < 8; i++) items[i] = (struct item){0, i * 0.5, i < 7 ? &items[i + 1] : 0};
  double s = 0;
  for (long k = 0; k < w->iterations; k++) s += step(&items[k & 7], (double)(k % 13) * 0.25);
  w->sum = s;
  for (int i = 0; i < 8; i++) w->counts += items[i].count;
  return 0;
}

static uint64_t bias;
static int first(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size, (void)data;
  bias = info->dlpi_addr;
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: weave plain|woven ROUNDS SLED...\n");
    return 2;
  }
  int woven = !strcmp(argv[1], "woven");
  int rounds = atoi(argv[2]);
  dl_iterate_phdr(first, 0);
  nsleds = argc - 3;
  sleds = calloc((size_t)nsleds, sizeof *sleds);
  uint32_t *jps = calloc((size_t)nsleds, sizeof *jps);
  for (int i = 0; i < nsleds; i++) {
    sleds[i] = bias + strtoull(argv[3 + i], 0, 0);
    jps[i] = (uint32_t)i;
  }
  if (woven) {
    /* refusals first: not a sled, then twice */
    uint64_t not_sled = (uint64_t)(uintptr_t)&main;
    printf("not a sled: %s\n", bkf_weave(1, &not_sled, jps, handler, &calls) == -EINVAL ? "refused" : "ACCEPTED");
    int r1 = bkf_weave(nsleds, sleds, jps, handler, &calls);
    int r2 = bkf_weave(nsleds, sleds, jps, handler, &calls);
    printf("weave: %d, again: %s\n", r1, r2 == -EEXIST ? "refused" : "ACCEPTED");
    printf("unknown flag: %s\n", bkf_weave_ex(nsleds, sleds, jps, handler, &calls, 2) == -EINVAL ? "refused" : "ACCEPTED");
    bkf_unweave(nsleds, sleds);
  }
  struct work w[3];
  pthread_t t[3];
  for (int i = 0; i < 3; i++) {
    w[i] = (struct work){i, 3000000, 0, 0};
    pthread_create(&t[i], 0, worker, &w[i]);
  }
  int done = 0, failed = 0;
  if (woven) {
    for (; done < rounds; done++) {
      uint64_t before = __atomic_load_n(&calls, __ATOMIC_RELAXED);
      if (done & 1 ? bkf_weave_ex(nsleds, sleds, jps, handler_gpr, &calls, BKF_WEAVE_NO_VECTOR)
                   : bkf_weave(nsleds, sleds, jps, handler, &calls))
        failed++;
      for (int spin = 0; spin < 100000 && __atomic_load_n(&calls, __ATOMIC_RELAXED) == before; spin++) sched_yield();
      if (bkf_unweave(nsleds, sleds)) failed++;
    }
  }
  for (int i = 0; i < 3; i++) pthread_join(t[i], 0);
  uint64_t after = __atomic_load_n(&calls, __ATOMIC_RELAXED);
  struct work extra = {9, 100000, 0, 0};
  worker(&extra); /* unwoven now: no more calls */
  for (int i = 0; i < 3; i++) printf("worker %d: sum %.6f counts %ld\n", i, w[i].sum, w[i].counts);
  if (woven)
    printf("rounds %d, failed %d, calls %s, vector-free calls %s, bad %llu, calls after unweave %llu\n", done, failed,
           after > 0 ? "seen" : "NONE", gpr_calls > 0 ? "seen" : "NONE", (unsigned long long)bad,
           (unsigned long long)(__atomic_load_n(&calls, __ATOMIC_RELAXED) - after));
  return 0;
}
