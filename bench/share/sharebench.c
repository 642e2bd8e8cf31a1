/* sharebench: the measurements of seed 002's evaluation, run as an ordinary
 * multithreaded program. Under `bunkai share run --place remote` its worker
 * thread runs on a node and every call it makes is forwarded (the paper's
 * case C); with `--place home` the worker runs on the home host under the
 * runtime (B); run directly it is the plain case A.
 *
 *   sharebench syscalls DIR N   Table 1: open, close, mkdir, rmdir, symlink,
 *                               flock on files in DIR (5 levels deep, as the
 *                               paper's NFS directory), plus a null call
 *                               (getppid); N repetitions, medians in ns.
 *   sharebench read DIR N       Figure 9: read(2) of 1..32 KiB files, then
 *                               the buffer is read by the worker (the pages
 *                               the home host's kernel filled come over).
 *   sharebench pages N          page transfer latency: read fault of a page
 *                               the home host wrote; write fault of a page
 *                               the home host holds (the copy moves); write
 *                               fault of a page both hold read-only (the
 *                               other copy is invalidated, no data moves).
 *   sharebench tcp-server PORT / tcp-client IP PORT N
 *                               the network floor for the above: TCP round
 *                               trips of 32 B and of 4 KiB + 32 B.
 *   sharebench pingpong N       two threads pass a turn back and forth N
 *                               times through a pthread mutex and two
 *                               condition variables (futexes); the time per
 *                               round trip. Under --place rr the two threads
 *                               are on the two nodes.
 * Output: one JSON object per line on stdout. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static int cmp64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}
static uint64_t median(uint64_t *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp64);
  return v[n / 2];
}
static void die(const char *what) {
  fprintf(stderr, "sharebench: %s: %s\n", what, strerror(errno));
  exit(1);
}

static const char *dir;
static int reps;

/* ---- Table 1 ---- */
static void *syscalls(void *unused) {
  (void)unused;
  uint64_t *t[7];
  for (int k = 0; k < 7; k++) t[k] = calloc((size_t)reps, sizeof(uint64_t));
  char path[512], path2[512];
  snprintf(path, sizeof path, "%s/file", dir);
  int fd0 = open(path, O_CREAT | O_RDWR, 0644);
  if (fd0 < 0) die("create the test file");
  close(fd0);
  for (int i = 0; i < reps; i++) {
    /* the path is built by this thread each time, as a program would: the
     * page holding it is this thread's, so a forwarded call fetches it */
    snprintf(path, sizeof path, "%s/file", dir);
    uint64_t a = now();
    int fd = open(path, O_RDONLY);
    uint64_t b = now();
    if (fd < 0) die("open");
    close(fd);
    uint64_t c = now();
    t[0][i] = b - a, t[1][i] = c - b;
    snprintf(path, sizeof path, "%s/d%d", dir, i & 1);
    a = now();
    if (mkdir(path, 0755)) die("mkdir");
    b = now();
    if (rmdir(path)) die("rmdir");
    c = now();
    t[2][i] = b - a, t[3][i] = c - b;
    snprintf(path, sizeof path, "%s/file", dir);
    snprintf(path2, sizeof path2, "%s/link%d", dir, i & 1);
    a = now();
    if (symlink(path, path2)) die("symlink");
    b = now();
    unlink(path2);
    t[4][i] = b - a;
    fd = open(path, O_RDONLY);
    a = now();
    if (flock(fd, LOCK_EX)) die("flock");
    b = now();
    flock(fd, LOCK_UN);
    close(fd);
    t[5][i] = b - a;
    a = now();
    (void)getppid();
    b = now();
    t[6][i] = b - a;
  }
  const char *names[7] = {"open", "close", "mkdir", "rmdir", "symlink", "flock", "getppid"};
  for (int k = 0; k < 7; k++) printf("{\"call\":\"%s\",\"median_ns\":%llu,\"n\":%d}\n", names[k], (unsigned long long)median(t[k], reps), reps);
  fflush(stdout);
  return 0;
}

/* ---- Figure 9 ---- */
static void *reads(void *unused) {
  (void)unused;
  static char buf[32768] __attribute__((aligned(4096)));
  uint64_t *t = calloc((size_t)reps, sizeof(uint64_t));
  for (int kib = 1; kib <= 32; kib *= 2) {
    char path[512];
    snprintf(path, sizeof path, "%s/r%d", dir, kib);
    int fd = open(path, O_RDONLY);
    if (fd < 0) die("open a read file");
    for (int i = 0; i < reps; i++) {
      /* dirty the buffer here first, as the paper's process had its buffer */
      for (int k = 0; k < kib * 1024; k += 4096) buf[k] = 1;
      uint64_t a = now();
      if (pread(fd, buf, (size_t)kib * 1024, 0) != kib * 1024) die("pread");
      long s = 0;
      for (int k = 0; k < kib * 1024; k += 64) s += buf[k];
      uint64_t b = now();
      t[i] = b - a;
      if (s < 0) puts("");
    }
    close(fd);
    printf("{\"read_kib\":%d,\"median_ns\":%llu,\"n\":%d}\n", kib, (unsigned long long)median(t, reps), reps);
    fflush(stdout);
  }
  return 0;
}

/* ---- page transfers ---- */
static volatile char *pa, *pb, *pc;
static void *pages(void *unused) {
  (void)unused;
  uint64_t *t = calloc((size_t)reps, sizeof(uint64_t));
  const char *names[3] = {"read_fault", "write_fault_move", "write_fault_invalidate"};
  for (int k = 0; k < 3; k++) {
    for (int i = 0; i < reps; i++) {
      volatile char *p = (k == 0 ? pa : k == 1 ? pb : pc) + (size_t)i * 4096;
      if (k == 2) (void)p[0]; /* take a read-only copy first */
      uint64_t a = now();
      if (k == 0) (void)p[0];
      else p[0] = 2;
      t[i] = now() - a;
    }
    printf("{\"page\":\"%s\",\"median_ns\":%llu,\"n\":%d}\n", names[k], (unsigned long long)median(t, reps), reps);
    fflush(stdout);
  }
  return 0;
}

/* ---- the network floor ---- */
static void full(int fd, void *b, size_t n, int rd) {
  char *p = b;
  while (n) {
    ssize_t r = rd ? read(fd, p, n) : write(fd, p, n);
    if (r <= 0) die(rd ? "read" : "write");
    p += r, n -= (size_t)r;
  }
}
static int tcp_server(int port) {
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (bind(l, (void *)&a, sizeof a) || listen(l, 1)) die("listen");
  printf("{\"listening\":%d}\n", port);
  fflush(stdout);
  static char b[4096 + 32];
  for (;;) { /* one client at a time (readiness probes connect and leave) */
    int fd = accept(l, 0, 0);
    if (fd < 0) continue;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (;;) {
      uint32_t n;
      if (read(fd, &n, 4) != 4 || n > 4096 + 28) break;
      full(fd, b, n, 1);
      full(fd, b, 32, 0); /* a reply the size of our header */
    }
    close(fd);
  }
}
static int tcp_client(const char *ip, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, ip, &a.sin_addr);
  if (connect(fd, (void *)&a, sizeof a)) die("connect");
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  uint64_t *t = calloc((size_t)reps, sizeof(uint64_t));
  static char b[4096 + 64];
  uint32_t sizes[2] = {28, 4096 + 28};
  const char *names[2] = {"rtt_32B", "rtt_4KiB"};
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < reps; i++) {
      uint64_t s = now();
      memcpy(b, &sizes[k], 4);
      full(fd, b, 4 + sizes[k], 0);
      full(fd, b, 32, 1);
      t[i] = now() - s;
    }
    printf("{\"net\":\"%s\",\"median_ns\":%llu,\"n\":%d}\n", names[k], (unsigned long long)median(t, reps), reps);
  }
  return 0;
}

static pthread_mutex_t pm = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pc0 = PTHREAD_COND_INITIALIZER, pc1 = PTHREAD_COND_INITIALIZER;
static int turn;
static void *pinger(void *p) {
  int me = (int)(long)p;
  for (int i = 0; i < reps; i++) {
    pthread_mutex_lock(&pm);
    while (turn != me) pthread_cond_wait(me ? &pc1 : &pc0, &pm);
    turn = 1 - me;
    pthread_cond_signal(me ? &pc0 : &pc1);
    pthread_mutex_unlock(&pm);
  }
  return 0;
}
static int pingpong(void) {
  pthread_t a, b;
  uint64_t s = now();
  pthread_create(&a, 0, pinger, (void *)0);
  pthread_create(&b, 0, pinger, (void *)1);
  pthread_join(a, 0);
  pthread_join(b, 0);
  printf("{\"pingpong_round_ns\":%llu,\"n\":%d}\n", (unsigned long long)((now() - s) / (uint64_t)reps), reps);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: sharebench syscalls|read DIR N | pages N | tcp-server PORT | tcp-client IP PORT N\n");
    return 2;
  }
  const char *mode = argv[1];
  if (!strcmp(mode, "tcp-server")) return tcp_server(atoi(argv[2]));
  if (!strcmp(mode, "pingpong")) {
    reps = atoi(argv[2]);
    return pingpong();
  }
  if (!strcmp(mode, "tcp-client")) {
    reps = argc > 4 ? atoi(argv[4]) : 1000;
    return tcp_client(argv[2], atoi(argv[3]));
  }
  void *(*fn)(void *) = 0;
  if (!strcmp(mode, "syscalls") || !strcmp(mode, "read")) {
    dir = argv[2];
    reps = argc > 3 ? atoi(argv[3]) : 1000;
    fn = mode[0] == 's' ? syscalls : reads;
    if (mode[0] == 'r') {
      static char b[32768];
      memset(b, 'x', sizeof b);
      for (int kib = 1; kib <= 32; kib *= 2) {
        char path[512];
        snprintf(path, sizeof path, "%s/r%d", dir, kib);
        int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
        if (fd < 0 || write(fd, b, (size_t)kib * 1024) != kib * 1024) die("write a read file");
        close(fd);
      }
    }
  } else if (!strcmp(mode, "pages")) {
    reps = atoi(argv[2]);
    size_t len = (size_t)reps * 4096;
    pa = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    pb = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    pc = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    /* the home host (this thread) writes every page first */
    for (size_t o = 0; o < len; o += 4096) pa[o] = pb[o] = pc[o] = 1;
    fn = pages;
  } else {
    fprintf(stderr, "sharebench: unknown mode %s\n", mode);
    return 2;
  }
  pthread_t t;
  if (pthread_create(&t, 0, fn, 0)) die("pthread_create");
  pthread_join(t, 0);
  return 0;
}
