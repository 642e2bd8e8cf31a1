#define _GNU_SOURCE
/* bunkai share test: synchronisation across hosts. Usage: sync MODE
 *   pingpong  two threads alternate through a mutex and condition variables
 *   atomic    four threads add to one atomic counter and to a mutex counter
 *   malloc    four threads malloc, fill, check and free concurrently
 *   mmap      a thread maps and unmaps regions while others read a table
 *   nested    a thread creates and joins threads of its own
 *   crash     a thread writes through a null pointer (the run must end
 *             with SIGSEGV, as it does natively)
 *   fresh     a thread maps 64 MiB and writes its 16,384 pages in a
 *             scattered order (first touches out of order); the main
 *             thread then checks every page
 *   badcall   a thread makes a call with an invalid number and an
 *             unsupported one (fork): both fail with ENOSYS or succeed
 *             natively; prints what it got
 *   sleep     a thread sleeps in a loop for argv[2] seconds (fault tests)
 *   file      threads open, write, read back and unlink files in a
 *             directory that exists on the home host only (argv[2])
 * Each prints a deterministic transcript; exit 0 when every check passed. */
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <errno.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define N 4
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int turn, rounds = 200;
static long log_[512];
static int nlog;

static void *pinger(void *p) {
  long me = (long)p;
  for (int i = 0; i < rounds; i++) {
    pthread_mutex_lock(&mu);
    while (turn != me) pthread_cond_wait(&cv, &mu);
    log_[nlog++] = me;
    turn = 1 - me;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
  }
  return 0;
}

static atomic_long counter;
static long locked_counter;
static atomic_int go;
static void *adder(void *p) {
  (void)p;
  while (!atomic_load(&go)) sched_yield(); /* all threads contend at once */
  for (int i = 0; i < 20000; i++) {
    atomic_fetch_add(&counter, 1);
    if (i % 10 == 0) {
      pthread_mutex_lock(&mu);
      locked_counter++;
      pthread_mutex_unlock(&mu);
    }
  }
  return 0;
}

static void *mallocer(void *p) {
  long k = (long)p, bad = 0;
  for (int i = 0; i < 2000; i++) {
    size_t n = 16 + (size_t)((i * 37 + k) % 5000);
    unsigned char *b = malloc(n);
    memset(b, (int)(k + i) & 0xff, n);
    for (size_t j = 0; j < n; j++) bad += b[j] != (unsigned char)((k + i) & 0xff);
    free(b);
  }
  return (void *)bad;
}

static long *volatile table;
static atomic_int stop;
static void *mapper(void *p) {
  (void)p;
  for (int i = 0; i < 200; i++) {
    long *m = mmap(0, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (int j = 0; j < (1 << 20) / 8; j += 512) m[j] = i;
    long s = 0;
    for (int j = 0; j < (1 << 20) / 8; j += 512) s += m[j];
    if (s != (long)i * ((1 << 17) / 512)) return (void *)1;
    munmap(m, 1 << 20);
  }
  atomic_store(&stop, 1);
  return 0;
}
static void *reader(void *p) {
  (void)p;
  long bad = 0;
  while (!atomic_load(&stop))
    for (int j = 0; j < 1024; j++) bad += table[j] != j * 3;
  return (void *)bad;
}

static void *leaf(void *p) { return (void *)((long)p * 2); }
static void *parent(void *p) {
  long k = (long)p, sum = 0;
  for (long i = 1; i <= 3; i++) {
    pthread_t c;
    void *r;
    if (pthread_create(&c, 0, leaf, (void *)(k * 10 + i))) return (void *)-1;
    pthread_join(c, &r);
    sum += (long)r;
  }
  return (void *)sum;
}

static void *crasher(void *p) {
  (void)p;
  *(volatile int *)(long)(p ? 8 : 16) = 1;
  return 0;
}
static void *sleeper(void *p) {
  long secs = (long)p;
  for (long i = 0; i < secs * 10; i++) {
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, 0);
    table[0]++; /* keep a page moving */
  }
  return 0;
}

#define FRESH_PAGES 16384
static void *fresher(void *p) {
  (void)p;
  long *m = mmap(0, (size_t)FRESH_PAGES * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return 0;
  /* 7919 is prime, so k * 7919 mod FRESH_PAGES visits every page once */
  for (long k = 0; k < FRESH_PAGES; k++) {
    long pg = (k * 7919) % FRESH_PAGES;
    m[pg * 512] = pg * 3 + 1;
    m[pg * 512 + 511] = -pg;
  }
  return m;
}

static void *badcall(void *p) {
  (void)p;
  long r = syscall(5000);
  printf("badcall: syscall(5000) = %ld errno %s\n", r, r < 0 && errno == ENOSYS ? "ENOSYS" : "other");
  fflush(stdout);
  return 0;
}

static const char *dir;
static void *filer(void *p) {
  long k = (long)p;
  char path[512], buf[64], back[64];
  for (int i = 0; i < 50; i++) {
    snprintf(path, sizeof path, "%s/f%ld-%d", dir, k, i);
    int n = snprintf(buf, sizeof buf, "thread %ld file %d\n", k, i);
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    if (fd < 0 || write(fd, buf, (size_t)n) != n) return (void *)1;
    close(fd);
    fd = open(path, O_RDONLY);
    if (fd < 0 || read(fd, back, sizeof back) != n || memcmp(buf, back, (size_t)n)) return (void *)2;
    close(fd);
    if (unlink(path)) return (void *)3;
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "pingpong";
  pthread_t t[N];
  long bad = 0;
  void *r;
  if (!strcmp(mode, "pingpong")) {
    for (long k = 0; k < 2; k++) pthread_create(&t[k], 0, pinger, (void *)k);
    for (int k = 0; k < 2; k++) pthread_join(t[k], 0);
    for (int i = 0; i < nlog; i++) bad += log_[i] != (i & 1);
    printf("pingpong: %d turns, %ld out of order\n", nlog, bad);
  } else if (!strcmp(mode, "atomic")) {
    for (long k = 0; k < N; k++) pthread_create(&t[k], 0, adder, 0);
    atomic_store(&go, 1);
    for (int k = 0; k < N; k++) pthread_join(t[k], 0);
    printf("atomic: %ld (want %d), locked %ld (want %d)\n", atomic_load(&counter), N * 20000, locked_counter, N * 2000);
    bad = atomic_load(&counter) != N * 20000 || locked_counter != N * 2000;
  } else if (!strcmp(mode, "malloc")) {
    for (long k = 0; k < N; k++) pthread_create(&t[k], 0, mallocer, (void *)k);
    for (int k = 0; k < N; k++) pthread_join(t[k], &r), bad += (long)r;
    printf("malloc: %d threads x 2000 blocks, %ld bad bytes\n", N, bad);
  } else if (!strcmp(mode, "mmap")) {
    long *tb = malloc(1024 * sizeof *tb);
    for (int j = 0; j < 1024; j++) tb[j] = j * 3;
    table = tb;
    pthread_create(&t[0], 0, mapper, 0);
    for (long k = 1; k < 3; k++) pthread_create(&t[k], 0, reader, 0);
    for (int k = 0; k < 3; k++) pthread_join(t[k], &r), bad += (long)r;
    printf("mmap: 200 map/unmap rounds beside 2 readers, %ld bad\n", bad);
  } else if (!strcmp(mode, "nested")) {
    for (long k = 0; k < 2; k++) pthread_create(&t[k], 0, parent, (void *)k);
    for (int k = 0; k < 2; k++) {
      pthread_join(t[k], &r);
      long want = 2 * (k * 30 + 6);
      printf("nested %d: %ld (want %ld)\n", k, (long)r, want);
      bad += (long)r != want;
    }
  } else if (!strcmp(mode, "fresh")) {
    pthread_create(&t[0], 0, fresher, 0);
    pthread_join(t[0], &r);
    long *m = r;
    if (!m) return 1;
    for (long pg = 0; pg < FRESH_PAGES; pg++) {
      bad += m[pg * 512] != pg * 3 + 1 || m[pg * 512 + 511] != -pg;
      for (int j = 1; j < 511; j++) bad += m[pg * 512 + j] != 0;
    }
    printf("fresh: %d pages written out of order, %ld bad\n", FRESH_PAGES, bad);
  } else if (!strcmp(mode, "badcall")) {
    pthread_create(&t[0], 0, badcall, 0);
    pthread_join(t[0], 0);
  } else if (!strcmp(mode, "crash")) {
    pthread_create(&t[0], 0, crasher, 0);
    pthread_join(t[0], 0);
    puts("crash: survived");
  } else if (!strcmp(mode, "sleep")) {
    table = calloc(1, 4096);
    printf("sleep: started\n");
    fflush(stdout);
    pthread_create(&t[0], 0, sleeper, (void *)(argc > 2 ? atol(argv[2]) : 30));
    for (long i = 0; i < 1000000; i++) {
      struct timespec ts = {0, 50 * 1000 * 1000};
      nanosleep(&ts, 0);
      table[1]++;
      if (pthread_tryjoin_np(t[0], 0) == 0) break;
    }
    puts("sleep: done");
  } else if (!strcmp(mode, "file")) {
    dir = argc > 2 ? argv[2] : "/tmp";
    for (long k = 0; k < N; k++) pthread_create(&t[k], 0, filer, (void *)k);
    for (int k = 0; k < N; k++) pthread_join(t[k], &r), bad += (long)r;
    printf("file: %d threads x 50 files, %ld failures\n", N, bad);
  } else {
    fprintf(stderr, "sync: unknown mode %s\n", mode);
    return 2;
  }
  return bad != 0;
}
