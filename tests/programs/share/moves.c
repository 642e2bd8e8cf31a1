#define _GNU_SOURCE
/* bunkai share test: memory moved under threads on other hosts. Usage: moves
 *   1. a worker reads every page of a buffer (read-only copies where it
 *      runs); main moves the buffer with mremap and rewrites it all; the
 *      worker reads it again and writes to it; main checks the write.
 *   2. main's stack grows deep (a large local array filled in a nested
 *      call), and a worker reads and writes it through a pointer.
 * Prints a deterministic transcript; exit 0 when every check passed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static char *buf;
static size_t len = 64 * 4096;
static pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t c = PTHREAD_COND_INITIALIZER;
static int stage;
static long before, after;

static void wait_for(int s) {
  pthread_mutex_lock(&m);
  while (stage != s) pthread_cond_wait(&c, &m);
  pthread_mutex_unlock(&m);
}
static void go(int s) {
  pthread_mutex_lock(&m);
  stage = s;
  pthread_cond_broadcast(&c);
  pthread_mutex_unlock(&m);
}

static void *reader(void *p) {
  (void)p;
  wait_for(1);
  for (size_t i = 0; i < len; i += 4096) before += buf[i];
  go(2);
  wait_for(3);
  for (size_t i = 0; i < 2 * len; i += 4096) after += buf[i];
  buf[0] = 9;
  return 0;
}

static volatile char *deep;
static void *stack_user(void *p) {
  (void)p;
  wait_for(5);
  long sum = 0;
  for (int i = 0; i < 600 * 1024; i += 4096) sum += deep[i], deep[i] = 2;
  printf("stack: worker read %ld\n", sum);
  go(6);
  return 0;
}

static __attribute__((noinline)) void grow(void) {
  char big[600 * 1024];
  memset(big, 1, sizeof big);
  deep = big;
  go(5);
  wait_for(6);
  long sum = 0;
  for (int i = 0; i < (int)sizeof big; i += 4096) sum += big[i];
  printf("stack: main reads %ld after the worker's writes\n", sum);
}

int main(void) {
  buf = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  memset(buf, 1, len);
  pthread_t t, s;
  pthread_create(&t, 0, reader, 0);
  go(1);
  wait_for(2);
  buf = mremap(buf, len, 2 * len, MREMAP_MAYMOVE);
  memset(buf, 3, 2 * len);
  go(3);
  pthread_join(t, 0);
  printf("moved: worker read %ld before, %ld after; main sees its write: %d\n", before, after, buf[0]);
  pthread_create(&s, 0, stack_user, 0);
  grow();
  pthread_join(s, 0);
  return before == 64 && after == 384 && buf[0] == 9 ? 0 : 1;
}
