#define _GNU_SOURCE
/* bunkai share test: randomized memory stress. Usage: stress THREADS ROUNDS SEED
 *
 * Workers allocate buffers of random sizes (a few bytes to 4 MiB: small
 * chunks, arena chunks, mmap'ed chunks; some with calloc, which must be
 * zeros), fill them with a pattern seeded by (thread, round) and pass them
 * through a shared queue; another worker checks the pattern, grows some
 * with realloc (large ones move with mremap) and checks again, drops some
 * pages with madvise(MADV_DONTNEED) and checks they read zeros, and frees
 * them. So pages are freed and reused all the time, and arenas grow and
 * shrink (malloc_trim every few rounds). Beside them a mapper thread maps
 * a region, fills it, publishes it under a rwlock, moves it with mremap,
 * and unmaps it, while readers check it.
 *
 * Prints one deterministic line: threads, buffers, bytes, regions, errors;
 * every mismatch is printed (first few) and the exit status is 1. */
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int nthreads, rounds;
static uint64_t seed0;
static volatile long errors;

static void error(const char *what, int t, int r, size_t off) {
  long n = __atomic_add_fetch(&errors, 1, __ATOMIC_SEQ_CST);
  if (n <= 10) fprintf(stderr, "stress: %s (buffer of thread %d round %d, byte %zu)\n", what, t, r, off);
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

/* The pattern's byte at off for buffer (t, r). */
static inline uint8_t pat(uint64_t key, size_t off) { return (uint8_t)(mix(key + off / 8) >> (8 * (off % 8))); }

struct buf {
  uint8_t *p;
  size_t size;
  int t, r, zeroed;
};

/* The queue between workers. */
#define QCAP 32
static struct buf queue[QCAP];
static int qhead, qlen;
static pthread_mutex_t qm = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qcv = PTHREAD_COND_INITIALIZER;

static void push(struct buf b) {
  pthread_mutex_lock(&qm);
  while (qlen == QCAP) pthread_cond_wait(&qcv, &qm);
  queue[(qhead + qlen++) % QCAP] = b;
  pthread_cond_broadcast(&qcv);
  pthread_mutex_unlock(&qm);
}
static struct buf pop(void) {
  pthread_mutex_lock(&qm);
  while (qlen == 0) pthread_cond_wait(&qcv, &qm);
  struct buf b = queue[qhead];
  qhead = (qhead + 1) % QCAP, qlen--;
  pthread_cond_broadcast(&qcv);
  pthread_mutex_unlock(&qm);
  return b;
}

static uint64_t key_of(int t, int r) { return mix(seed0 ^ ((uint64_t)t << 32) ^ (uint64_t)r); }

static size_t size_of(int t, int r) {
  uint64_t x = mix(key_of(t, r) + 1);
  switch (x % 8) {
  case 0: case 1: case 2: return 1 + x % 512;                 /* small chunks */
  case 3: case 4: return 4096 + x % (120 << 10);              /* arena chunks */
  case 5: case 6: return (256 << 10) + x % (1 << 20);         /* mmap'ed chunks (until the threshold grows) */
  default: return (1 << 20) + x % (3 << 20);                  /* large */
  }
}

static void check(const struct buf *b, size_t upto) {
  uint64_t k = key_of(b->t, b->r);
  for (size_t i = 0; i < upto; i++)
    if (b->p[i] != pat(k, i)) {
      error("pattern mismatch", b->t, b->r, i);
      return;
    }
}

static long produced_bytes[64];
static long zero_checks[64];

static void *worker(void *p) {
  int t = (int)(long)p;
  for (int r = 0; r < rounds; r++) {
    struct buf b = {0, size_of(t, r), t, r, 0};
    uint64_t k = key_of(t, r);
    b.zeroed = (mix(k + 2) % 5) == 0;
    b.p = b.zeroed ? calloc(1, b.size) : malloc(b.size);
    if (!b.p) { error("allocation failed", t, r, 0); continue; }
    if (b.zeroed)
      for (size_t i = 0; i < b.size; i++)
        if (b.p[i]) { error("calloc gave memory that is not zeros", t, r, i); break; }
    for (size_t i = 0; i < b.size; i++) b.p[i] = pat(k, i);
    produced_bytes[t] += (long)b.size;
    push(b);

    struct buf c = pop();
    check(&c, c.size);
    uint64_t ck = key_of(c.t, c.r);
    if (mix(ck + 3) % 3 == 0) {
      /* grow it: large ones move with mremap; the old bytes must follow */
      size_t ns = c.size * 2 + 4096;
      uint8_t *q = realloc(c.p, ns);
      if (!q) { error("realloc failed", c.t, c.r, 0); free(c.p); continue; }
      c.p = q;
      check(&c, c.size);
      memset(c.p + c.size, 0x5a, ns - c.size);
      c.size = ns;
    }
    if (c.size >= 3 * 4096 && mix(ck + 4) % 4 == 0) {
      /* drop whole pages inside the buffer: they must read zeros */
      uintptr_t lo = ((uintptr_t)c.p + 4095) & ~(uintptr_t)4095;
      uintptr_t hi = lo + 4096 * ((c.size - (lo - (uintptr_t)c.p)) / 4096 / 2);
      if (hi > lo && madvise((void *)lo, hi - lo, MADV_DONTNEED) == 0) {
        for (uintptr_t a = lo; a < hi; a++)
          if (*(volatile uint8_t *)a) { error("a page dropped with MADV_DONTNEED is not zeros", c.t, c.r, a - (uintptr_t)c.p); break; }
        zero_checks[t]++;
      }
    }
    free(c.p);
    if (r % 16 == 15) malloc_trim(0);
  }
  return 0;
}

/* The mapper and its readers. */
static pthread_rwlock_t region_lock = PTHREAD_RWLOCK_INITIALIZER;
static uint8_t *region;
static size_t region_size;
static uint64_t region_key;
static volatile int mapper_done;
static long regions;

static void *mapper(void *p) {
  (void)p;
  for (int k = 0; k < rounds / 2 + 1; k++) {
    size_t size = (size_t)(1 + mix(seed0 + (uint64_t)k) % 64) * 4096;
    uint64_t key = mix(seed0 ^ 0xabcdefull ^ (uint64_t)k);
    uint8_t *m = mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (size_t i = 0; i < size; i++) m[i] = pat(key, i);
    pthread_rwlock_wrlock(&region_lock);
    region = m, region_size = size, region_key = key;
    pthread_rwlock_unlock(&region_lock);
    usleep(200);
    /* move it (the readers wait), then drop it */
    pthread_rwlock_wrlock(&region_lock);
    uint8_t *n = mremap(region, region_size, region_size + 8192, MREMAP_MAYMOVE);
    if (n == MAP_FAILED) error("mremap failed", -1, k, 0);
    else region = n, region_size += 8192;
    for (size_t i = region_size - 8192; i < region_size; i++)
      if (region[i]) { error("an mremap extension is not zeros", -1, k, i); break; }
    for (size_t i = region_size - 8192; i < region_size; i++) region[i] = pat(region_key, i);
    pthread_rwlock_unlock(&region_lock);
    usleep(200);
    pthread_rwlock_wrlock(&region_lock);
    munmap(region, region_size);
    region = 0;
    pthread_rwlock_unlock(&region_lock);
    regions++;
  }
  __atomic_store_n(&mapper_done, 1, __ATOMIC_SEQ_CST);
  return 0;
}

static void *reader(void *p) {
  (void)p;
  while (!__atomic_load_n(&mapper_done, __ATOMIC_SEQ_CST)) {
    pthread_rwlock_rdlock(&region_lock);
    if (region)
      for (size_t i = 0; i < region_size; i += 61)
        if (region[i] != pat(region_key, i)) { error("a mapped region reads wrong", -1, -1, i); break; }
    pthread_rwlock_unlock(&region_lock);
    usleep(100);
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: stress THREADS ROUNDS SEED\n");
    return 2;
  }
  nthreads = atoi(argv[1]);
  rounds = atoi(argv[2]);
  seed0 = strtoull(argv[3], 0, 0);
  if (nthreads < 1 || nthreads > 64 || rounds < 1) return 2;
  pthread_t th[64], m, rd[2];
  pthread_create(&m, 0, mapper, 0);
  for (int k = 0; k < 2; k++) pthread_create(&rd[k], 0, reader, 0);
  for (int t = 0; t < nthreads; t++) pthread_create(&th[t], 0, worker, (void *)(long)t);
  for (int t = 0; t < nthreads; t++) pthread_join(th[t], 0);
  pthread_join(m, 0);
  for (int k = 0; k < 2; k++) pthread_join(rd[k], 0);
  long bytes = 0;
  for (int t = 0; t < nthreads; t++) bytes += produced_bytes[t];
  printf("stress: %d threads x %d buffers, %ld bytes, %ld regions mapped, moved and unmapped, %ld errors\n", nthreads,
         rounds, bytes, regions, errors);
  return errors ? 1 : 0;
}
