#define _GNU_SOURCE
/* bunkai share test: many threads of one host touching memory that host
 * has never seen, at staggered instants. Usage: firsttouch THREADS ROUNDS
 *
 * Each round main maps a fresh region, fills it with a pattern of the
 * round, and publishes it; every thread then waits a delay of its own
 * (growing with the round, different per thread) and reads all of it.
 * The first thread of a host to touch the region makes its host map it;
 * another thread of that host touching it while the mapping is being made
 * must see main's pattern, never zeros (a node that mapped the region
 * before it registered it for sharing gave such a thread the kernel's
 * zero page, for good). main checks every thread's sum, unmaps the region,
 * and starts the next round. Prints one line; exit 0 when every sum was
 * right. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#define MAXT 16
#define PAGES 8
#define LEN (PAGES * 4096)

static uint64_t *volatile region;
static volatile unsigned round_no, done;
static int nt, rounds;
static uint64_t sums[MAXT];

static uint64_t word(unsigned r, size_t i) { return (r + 1) * 0x9E3779B97F4A7C15ull ^ (i * 0xBF58476D1CE4E5B9ull); }

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *worker(void *p) {
  int t = (int)(long)p;
  for (unsigned r = 1; r <= (unsigned)rounds; r++) {
    while (__atomic_load_n(&round_no, __ATOMIC_ACQUIRE) != r) __builtin_ia32_pause();
    /* delays from 0 to 300 us, a different one for every thread and round */
    uint64_t wait = ((r * 37 + (unsigned)t * 101) % 301) * 1000, t0 = now_ns();
    while (now_ns() - t0 < wait) __builtin_ia32_pause();
    const uint64_t *m = region;
    uint64_t s = 0;
    for (size_t i = 0; i < LEN / 8; i++) s += m[i] * (i + 1);
    sums[t] = s;
    __atomic_fetch_add(&done, 1, __ATOMIC_RELEASE);
  }
  return 0;
}

int main(int argc, char **argv) {
  nt = argc > 1 ? atoi(argv[1]) : 4;
  rounds = argc > 2 ? atoi(argv[2]) : 200;
  if (nt < 1 || nt > MAXT || rounds < 1) return 2;
  pthread_t th[MAXT];
  for (int t = 0; t < nt; t++) pthread_create(&th[t], 0, worker, (void *)(long)t);
  long bad = 0;
  for (unsigned r = 1; r <= (unsigned)rounds; r++) {
    uint64_t *m = mmap(0, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 3;
    uint64_t want = 0;
    for (size_t i = 0; i < LEN / 8; i++) m[i] = word(r, i), want += m[i] * (i + 1);
    region = m;
    __atomic_store_n(&done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&round_no, r, __ATOMIC_RELEASE);
    while (__atomic_load_n(&done, __ATOMIC_ACQUIRE) != (unsigned)nt) __builtin_ia32_pause();
    for (int t = 0; t < nt; t++)
      if (sums[t] != want) {
        if (bad < 5) fprintf(stderr, "firsttouch: round %u thread %d read a wrong region\n", r, t);
        bad++;
      }
    munmap(m, LEN);
  }
  for (int t = 0; t < nt; t++) pthread_join(th[t], 0);
  printf("firsttouch: %d threads, %d rounds, %ld wrong reads\n", nt, rounds, bad);
  return bad != 0;
}
