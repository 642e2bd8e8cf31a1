/* bunkai share test: threads created on other hosts compute, write to
 * shared memory, make syscalls (getpid, write) and are joined. Prints a
 * deterministic transcript. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long results[8];
static char *buffers[8];

static void *work(void *p) {
  long k = (long)p, s = 0;
  for (long i = 0; i < 1000000; i++) s += (i * (k + 1)) % 7;
  results[k] = s;
  buffers[k] = malloc(100);
  snprintf(buffers[k], 100, "thread %ld sum %ld pid-same %d\n", k, s, getpid() == (pid_t)(long)results[7]);
  char line[64];
  int n = snprintf(line, sizeof line, "hello from thread %ld\n", k);
  write(1, line, n);
  return (void *)(k * 10);
}

int main(void) {
  results[7] = getpid();
  pthread_t t[4];
  for (long k = 0; k < 4; k++) {
    if (pthread_create(&t[k], 0, work, (void *)k)) { perror("pthread_create"); return 1; }
    void *r;
    pthread_join(t[k], &r);
    printf("joined %ld -> %ld: %s", k, (long)r, buffers[k]);
    fflush(stdout);
  }
  return 0;
}
