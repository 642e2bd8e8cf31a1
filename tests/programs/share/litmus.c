#define _GNU_SOURCE
/* bunkai share test: memory-model litmus tests, run with the program's
 * threads on different hosts. Usage:
 *   litmus TEST LAYOUT KIND ITERATIONS [SKEW]
 *     TEST    sb (store buffering), mp (message passing), lb (load
 *             buffering), iriw (independent reads of independent writes),
 *             2+2w (two writes each, opposite orders)
 *     LAYOUT  same (x and y on one page, different cache lines) or split
 *             (different pages)
 *     KIND    plain (ordinary loads and stores; sb puts an mfence between
 *             its store and its load), atomic (seq_cst atomics), lock
 *             (each access inside the variable's pthread mutex: futexes),
 *             or nofence: sb without the mfence, where x86-TSO allows
 *             0/0 (counted as forbidden: a control that shows the check
 *             sees a relaxed outcome when one happens)
 *     SKEW    threads made and joined first, to move the test's threads to
 *             other hosts (placement is round robin by creation order)
 * Prints one line per outcome seen ("outcome r0=.. r1=..: count") and
 * "forbidden N of ITERATIONS"; exits 1 when N > 0. The forbidden outcomes
 * are those x86-TSO forbids (what the program can see natively): sb 0/0
 * (with the fence), mp 1/0, lb 1/1, iriw 1,0/1,0, 2+2w final x=1 y=1.
 *
 * Each iteration uses its own slot of variables (SLOTS of them, reused
 * round robin and reset half a round ahead by thread 0), and the threads
 * meet at a barrier before each iteration, so they race on every one. */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define PAGE 4096
#define SLOTS 64
#define MAXT 4

enum { SB, MP, LB, IRIW, W22 };
enum { PLAIN, ATOMIC, LOCK, NOFENCE };
/* The settings on a page of their own: read on every access, they must
 * not share a page with what the threads write. */
static struct {
  int test, kind, split, nthreads;
  long iters;
} cfg __attribute__((aligned(4096)));
#define test cfg.test
#define kind cfg.kind
#define split cfg.split
#define nthreads cfg.nthreads
#define iters cfg.iters

/* Slot s's variables: x at xs[s], y at ys[s]; on one page per slot (same)
 * or two (split); 64 bytes apart either way. */
static char *area;
static volatile int *xvar(int s) { return (volatile int *)(area + (size_t)s * 2 * PAGE); }
static volatile int *yvar(int s) { return (volatile int *)(area + (size_t)s * 2 * PAGE + (split ? PAGE : 64)); }
static pthread_mutex_t xm[SLOTS], ym[SLOTS];

/* A sense-reversing barrier for nthreads threads, on its own page. */
static volatile int bar_count __attribute__((aligned(4096))), bar_sense;
static void barrier(int *local) {
  *local = !*local;
  if (__atomic_add_fetch(&bar_count, 1, __ATOMIC_SEQ_CST) == nthreads) {
    __atomic_store_n(&bar_count, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&bar_sense, *local, __ATOMIC_SEQ_CST);
  } else {
    /* spin a little, then yield: more threads than CPUs must not starve
     * the one the others wait for */
    for (int k = 0; __atomic_load_n(&bar_sense, __ATOMIC_SEQ_CST) != *local; k++) {
      if (k < 64) __builtin_ia32_pause();
      else sched_yield();
    }
  }
}

#define CB() __asm__ volatile("" ::: "memory")

static void store(volatile int *p, pthread_mutex_t *m, int v) {
  if (kind == ATOMIC) __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
  else if (kind == LOCK) { pthread_mutex_lock(m); *p = v; pthread_mutex_unlock(m); }
  else { CB(); *p = v; CB(); }
}
static int load(volatile int *p, pthread_mutex_t *m) {
  int v;
  if (kind == ATOMIC) v = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  else if (kind == LOCK) { pthread_mutex_lock(m); v = *p; pthread_mutex_unlock(m); }
  else { CB(); v = *p; CB(); }
  return v;
}

/* results[t][i]: what thread t read in iteration i (two reads, packed) */
static int *results[MAXT];
static int finals[2]; /* 2+2w: x and y after each iteration, checked by thread 0 */
static long w22_bad;
static long w22_seen[4];

static void *worker(void *p) {
  int t = (int)(long)p, sense = 0;
  int *res = malloc(sizeof(int) * (size_t)iters); /* this thread's host owns it */
  memset(res, 0, sizeof(int) * (size_t)iters);
  for (long i = 0; i < iters; i++) {
    int s = (int)(i % SLOTS);
    volatile int *x = xvar(s), *y = yvar(s);
    if (t == 0) {
      /* reset the slot half a round ahead (not touched until then) */
      int r = (int)((i + SLOTS / 2) % SLOTS);
      *xvar(r) = 0, *yvar(r) = 0;
    }
    barrier(&sense);
    int a = 0, b = 0;
    switch (test) {
    case SB:
      if (t == 0) { store(x, &xm[s], 1); if (kind == PLAIN) __builtin_ia32_mfence(); a = load(y, &ym[s]); }
      else { store(y, &ym[s], 1); if (kind == PLAIN) __builtin_ia32_mfence(); a = load(x, &xm[s]); }
      break;
    case MP:
      if (t == 0) { store(x, &xm[s], 1); store(y, &ym[s], 1); }
      else { a = load(y, &ym[s]); b = load(x, &xm[s]); }
      break;
    case LB:
      if (t == 0) { a = load(x, &xm[s]); store(y, &ym[s], 1); }
      else { a = load(y, &ym[s]); store(x, &xm[s], 1); }
      break;
    case IRIW:
      if (t == 0) store(x, &xm[s], 1);
      else if (t == 1) store(y, &ym[s], 1);
      else if (t == 2) { a = load(x, &xm[s]); b = load(y, &ym[s]); }
      else { a = load(y, &ym[s]); b = load(x, &xm[s]); }
      break;
    case W22:
      if (t == 0) { store(x, &xm[s], 1); store(y, &ym[s], 2); }
      else { store(y, &ym[s], 1); store(x, &xm[s], 2); }
      break;
    }
    res[i] = a | b << 1;
    if (test == W22) {
      barrier(&sense);
      if (t == 0) {
        int fx = load(x, &xm[s]), fy = load(y, &ym[s]);
        w22_seen[(fx - 1) * 2 + (fy - 1)]++;
        if (fx == 1 && fy == 1) w22_bad++;
      }
    }
  }
  results[t] = res;
  return 0;
}

static void *nothing(void *p) { return p; }

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: litmus sb|mp|lb|iriw|2+2w same|split plain|atomic|lock ITERATIONS [SKEW]\n");
    return 2;
  }
  const char *tn[] = {"sb", "mp", "lb", "iriw", "2+2w"};
  test = -1;
  for (int k = 0; k < 5; k++)
    if (!strcmp(argv[1], tn[k])) test = k;
  split = !strcmp(argv[2], "split");
  kind = !strcmp(argv[3], "atomic") ? ATOMIC : !strcmp(argv[3], "lock") ? LOCK : !strcmp(argv[3], "nofence") ? NOFENCE : PLAIN;
  iters = atol(argv[4]);
  int skew = argc > 5 ? atoi(argv[5]) : 0;
  if (test < 0 || iters <= 0) return 2;
  nthreads = test == IRIW ? 4 : 2;
  area = mmap(0, (size_t)SLOTS * 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  for (int s = 0; s < SLOTS; s++) pthread_mutex_init(&xm[s], 0), pthread_mutex_init(&ym[s], 0);
  for (int k = 0; k < skew; k++) {
    pthread_t t;
    pthread_create(&t, 0, nothing, 0);
    pthread_join(t, 0);
  }
  pthread_t th[MAXT];
  for (int t = 0; t < nthreads; t++) pthread_create(&th[t], 0, worker, (void *)(long)t);
  for (int t = 0; t < nthreads; t++) pthread_join(th[t], 0);

  long counts[256] = {0}, forbidden = 0;
  for (long i = 0; i < iters; i++) {
    int o = 0, bad = 0;
    int r0 = results[0][i], r1 = results[1][i];
    switch (test) {
    case SB: o = (r0 & 1) | (r1 & 1) << 1; bad = o == 0; break;
    case MP: o = r1 & 3; bad = o == 1; break;                   /* y=1 then x=0 */
    case LB: o = (r0 & 1) | (r1 & 1) << 1; bad = o == 3; break;
    case IRIW: {
      int r2 = results[2][i], r3 = results[3][i];
      o = (r2 & 3) | (r3 & 3) << 2;
      bad = r2 == 1 && r3 == 1; /* saw x before y, and y before x */
      break;
    }
    case W22: o = 0; break;
    }
    counts[o]++;
    forbidden += bad;
  }
  if (test == W22) {
    for (int k = 0; k < 4; k++)
      if (w22_seen[k]) printf("outcome x=%d y=%d: %ld\n", k / 2 + 1, k % 2 + 1, w22_seen[k]);
    forbidden = w22_bad;
  } else {
    for (int o = 0; o < 256; o++) {
      if (!counts[o]) continue;
      if (test == IRIW) printf("outcome x,y=%d,%d y,x=%d,%d: %ld\n", o & 1, o >> 1 & 1, o >> 2 & 1, o >> 3 & 1, counts[o]);
      else if (test == MP) printf("outcome y=%d x=%d: %ld\n", o & 1, o >> 1 & 1, counts[o]);
      else printf("outcome r0=%d r1=%d: %ld\n", o & 1, o >> 1 & 1, counts[o]);
    }
  }
  printf("forbidden %ld of %ld\n", forbidden, iters);
  return forbidden ? 1 : 0;
}
