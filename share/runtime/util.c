/* util.c: the runtime's own small library: memory and strings (libc's
 * memcpy reads libc data, which is the program's), a formatter, errors,
 * the private region, locks, time, random bytes. Rules: runtime.h.
 *
 * What flow's runtime needs too is in common/runtime/bunkai_rt_util.h
 * (slen, sequal). The rest is share's own: memcpy and memset are the
 * functions the compiler calls for a struct copy or a large zeroing, and
 * must exist under those names in this library (flow's runtime never
 * needs them); the lock sleeps on a futex (flow's yields); now_ns is
 * CLOCK_MONOTONIC by system call (flow's is CLOCK_REALTIME from the vDSO);
 * fmt formats in any base (flow's put_u64 writes decimal only). */
#include "runtime.h"
#include "bunkai_rt_util.h"
#include <linux/futex.h>

struct runtime g;

/* A forward copy (rep movsb, the direction flag clear as the ABI keeps
 * it): mb_recv (wire.c) moves a message's start to the front of its
 * buffer with it, over the same bytes. */
void *memcpy(void *d, const void *s, size_t n) {
  void *r = d;
  __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
  return r;
}
void *memset(void *d, int c, size_t n) {
  void *r = d;
  __asm__ volatile("rep stosb" : "+D"(d), "+c"(n) : "a"(c) : "memory");
  return r;
}
/* slen and sequal are the runtimes' shared ones (bunkai_rt_util.h), kept
 * out of line here: the other files call them, as they always did. */
size_t slen(const char *s) { return rt_slen(s); }
int sprefix(const char *s, const char *p) {
  while (*p)
    if (*s++ != *p++) return 0;
  return 1;
}
int sequal(const char *a, const char *b) { return rt_sequal(a, b); }
uint64_t parse_u(const char **p, int base) {
  uint64_t v = 0;
  const char *s = *p;
  for (;; s++) {
    int d;
    if (*s >= '0' && *s <= '9') d = *s - '0';
    else if (base == 16 && *s >= 'a' && *s <= 'f') d = *s - 'a' + 10;
    else break;
    v = v * (uint64_t)base + (uint64_t)d;
  }
  *p = s;
  return v;
}

/* A small formatter: %s %d %u %x %c (longs for the numbers). */
size_t fmt(char *out, size_t cap, const char *f, const long *args) {
  size_t n = 0;
  int k = 0;
#define PUT(c) do { if (n + 1 < cap) out[n] = (c); n++; } while (0)
  for (; *f; f++) {
    if (*f != '%') { PUT(*f); continue; }
    f++;
    if (*f == 's') {
      const char *s = (const char *)args[k++];
      if (!s) s = "(null)";
      while (*s) PUT(*s++);
    } else if (*f == 'c') {
      PUT((char)args[k++]);
    } else if (*f == 'd' || *f == 'u' || *f == 'x') {
      long v = args[k++];
      char b[24];
      int m = 0, neg = 0;
      uint64_t u = (uint64_t)v;
      unsigned base = *f == 'x' ? 16 : 10;
      if (*f == 'd' && v < 0) neg = 1, u = (uint64_t)(-v);
      do { b[m++] = "0123456789abcdef"[u % base]; u /= base; } while (u);
      if (neg) PUT('-');
      while (m) PUT(b[--m]);
    } else {
      PUT('%');
      PUT(*f);
    }
  }
  if (cap) out[n < cap ? n : cap - 1] = 0;
  return n < cap ? n : cap - 1;
#undef PUT
}

void say(const char *f, long a0, long a1, long a2, long a3) {
  long args[4] = {a0, a1, a2, a3};
  char b[512];
  size_t n = fmt(b, sizeof b - 1, f, args);
  b[n++] = '\n';
  sc3(SYS_write, 2, b, n);
}

/* A replica's connection to home ended (err from recv_msg) while `what`:
 * the end of the stream, or a reset (home's process ended with bytes of
 * ours unread), is how a replica learns that the program ended at home, and
 * ends quietly; anything else is an error, said in one line. */
void home_ended(int err, const char *what) {
  if (err == -1 || err == -ECONNRESET) sc1(SYS_exit_group, 0);
  die("the connection to home failed while %s (%d)", (long)what, err, 0, 0);
}

/* A fatal error: one line on stderr, recorded in the stats page (home) or
 * sent to the home host (node), then the whole process ends. */
void die(const char *f, long a0, long a1, long a2, long a3) {
  static volatile int dying;
  if (__atomic_exchange_n(&dying, 1, __ATOMIC_SEQ_CST))
    for (;;) sc0(SYS_pause); /* another thread is reporting; it ends the process */
  long args[4] = {a0, a1, a2, a3};
  char line[400], b[460];
  fmt(line, sizeof line, f, args);
  size_t n;
  if (g.role == ROLE_REPLICA) {
    long a[2] = {g.self, (long)line};
    n = fmt(b, sizeof b - 1, "bunkai share: node %d: %s", a);
  } else {
    long a[1] = {(long)line};
    n = fmt(b, sizeof b - 1, "bunkai share: %s", a);
  }
  if (g.role == ROLE_HOME && g.stats && !g.stats->error[0])
    memcpy(g.stats->error, line, slen(line) < 255 ? slen(line) : 255);
  if (g.role == ROLE_REPLICA && g.hosts[0].fd > 0) {
    /* the node manager writes there too: wait for it to finish its
     * message (not for ever: it may be the one dying) */
    for (int k = 0; k < 100000 && __atomic_exchange_n(&g.ctrl_lock, 1, __ATOMIC_ACQUIRE); k++) sc0(SYS_sched_yield);
    struct bks_msg m = {BKS_ERROR, (uint32_t)slen(line), 0, 0, 0};
    wr_all(g.hosts[0].fd, &m, sizeof m);
    wr_all(g.hosts[0].fd, line, m.len);
  }
  b[n++] = '\n';
  /* at home, `bunkai share run` prints the stats page's error line */
  if (!(g.role == ROLE_HOME && g.stats)) sc3(SYS_write, 2, b, n);
  sc1(SYS_exit_group, 125);
  __builtin_unreachable();
}

void *priv_alloc(uint64_t size) {
  size = PAGE_UP(size);
  uint64_t at = __atomic_fetch_add(&g.priv_next, size + PAGE, __ATOMIC_SEQ_CST); /* + a guard page */
  if (at + size > BKS_PRIVATE_BASE + BKS_PRIVATE_SIZE) die("private region exhausted", 0, 0, 0, 0);
  long r = sc3(SYS_mprotect, at, size, PROT_READ | PROT_WRITE);
  if (r) die("mprotect of the private region failed (%d)", r, 0, 0, 0);
  return (void *)at;
}

/* Locks: spin, then futex. The word is 0 (free), 1 (held) or 2 (held,
 * and someone may sleep on it), so that an unlock without waiters is one
 * atomic store and no system call (the page path takes the node's control
 * lock on every request). */
void lock(volatile int *l) {
  for (int spins = 0; spins < 100; spins++) {
    int c = 0;
    if (__atomic_compare_exchange_n(l, &c, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return;
    cpu_relax();
  }
  while (__atomic_exchange_n(l, 2, __ATOMIC_ACQUIRE)) sc6(SYS_futex, (long)l, FUTEX_WAIT_PRIVATE, 2, 0, 0, 0);
}
void unlock(volatile int *l) {
  if (__atomic_exchange_n(l, 0, __ATOMIC_RELEASE) == 2) sc6(SYS_futex, (long)l, FUTEX_WAKE_PRIVATE, 1, 0, 0, 0);
}

uint64_t now_ns(void) {
  struct timespec ts;
  sc2(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A manager's wait for any of pf: first by polling without sleeping for a
 * while after the last activity (*last; a sleeping manager costs a
 * cross-core wakeup, about 9 us here, on every page transfer; an idle
 * virtual CPU's more), yielding the core between looks to a runnable
 * thread of the program; then blocking. The clock is read every eighth
 * look only (a look is a poll and a yield, about 1.2 us here; two clock
 * reads by system call made it 1.9): the spin may last up to eight looks
 * longer. */
#define SPIN_NS 100000
long spin_poll(struct pollfd *pf, int n, uint64_t *last) {
  if (now_ns() - *last < SPIN_NS) {
    for (unsigned i = 1;; i++) {
      long r = sc3(SYS_poll, pf, n, 0);
      if (r) {
        *last = now_ns();
        return r;
      }
      sc0(SYS_sched_yield);
      if (!(i % 8) && now_ns() - *last > SPIN_NS) break;
    }
  }
  long r = sc3(SYS_poll, pf, n, -1);
  *last = now_ns();
  return r;
}

void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
  sc2(SYS_nanosleep, &ts, 0);
}

/* Moves a descriptor of ours out of the program's way: the lowest free
 * number from 1000 up (numbers are reused as ours are closed, so they stay
 * under the usual limit of 1024). */
int hide_fd(int fd) {
  if (fd < 0) return fd;
  long r = sc3(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 1000);
  if (r < 0) return fd;
  sc1(SYS_close, fd);
  return (int)r;
}

int random_bytes(void *b, size_t n) {
  char *p = b;
  while (n) {
    long r = sc3(SYS_getrandom, p, n, 0);
    if (r == -EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

/* The runtime's own threads (managers, acceptor, handshake workers) take
 * no signal: a process-directed signal must reach one of the program's
 * threads, whose handlers expect the program's stack and thread pointer. */
void block_signals(void) {
  uint64_t all = ~0ull;
  sc4(SYS_rt_sigprocmask, SIG_SETMASK, &all, 0, 8);
}
