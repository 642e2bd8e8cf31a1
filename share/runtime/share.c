/* libbunkai-share.so: the runtime of `bunkai share`, preloaded into the shared
 * process on the home host and into its replica on every node (seed 002:
 * the memory control part (§3) and the system-call control part (§4-5)).
 *
 * Rules for this file (it lives inside someone else's process, and on the
 * nodes inside a process whose libc data belongs to the home host):
 *   - No libc calls after the constructor, except dlsym at start-up on the
 *     home host. Every system call is the raw `syscall` instruction in this
 *     library's text: on the nodes that range is the only one Syscall User
 *     Dispatch lets through, and libc's own data (errno, locks, tunables
 *     that memcpy reads) is shared memory that only the program may touch.
 *   - No TLS, no stack protector (fs points into the program's memory).
 *   - Our memory is ours: this library's data and bss and the private
 *     region at BKS_PRIVATE_BASE (same address on every host, never
 *     shared). Nothing of ours goes on the program's heap or stacks.
 *   - Exported symbols: pthread_create (the thread placement point),
 *     pthread_exit (a home thread's exit pins its TID word) and the
 *     __bunkai_ prefix; everything else is static or hidden.
 *   - No global constructors besides the one that starts sharing.
 *
 * Home host: the program runs normally (no interception of its own
 * syscalls). A manager thread (the "memory control part") owns the page
 * directory and serves page faults of every host through userfaultfd. When
 * the program creates a thread that is placed on a node, the new glibc thread
 * on the home host becomes that thread's executor (§5.1): it moves to a
 * private stack, asks the node to run the start routine on the same stack
 * and thread pointer, and then runs every syscall the remote thread forwards.
 *
 * Node (replica): the same program, the same layout (ASLR off), stopped in
 * this constructor before main. Its writable memory is emptied and
 * registered with userfaultfd; the main thread becomes the node's manager.
 * Remote threads run with Syscall User Dispatch on: the SIGSYS handler runs
 * a few thread-local calls itself and forwards every other one.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <errno.h>
#include <linux/futex.h>
#include <sys/ioctl.h>
#include <linux/userfaultfd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/ucontext.h>
#include <sys/uio.h>
#include <asm/prctl.h>
#include <linux/sched.h>

#include "bunkai_share.h"

#ifndef SA_RESTORER
#define SA_RESTORER 0x04000000
#endif
#define HIDDEN __attribute__((visibility("hidden")))
#define NOINLINE __attribute__((noinline))
#define PAGE 4096ul
#define PAGE_DOWN(x) ((uint64_t)(x) & ~(PAGE - 1))
#define PAGE_UP(x) (((uint64_t)(x) + PAGE - 1) & ~(PAGE - 1))

/* ------------------------------------------------------------------ */
/* Raw system calls                                                    */

static inline long sc6(long n, long a, long b, long c, long d, long e, long f) {
  register long r10 __asm__("r10") = d;
  register long r8 __asm__("r8") = e;
  register long r9 __asm__("r9") = f;
  long ret;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                   : "rcx", "r11", "memory");
  return ret;
}
#define sc0(n) sc6(n, 0, 0, 0, 0, 0, 0)
#define sc1(n, a) sc6(n, (long)(a), 0, 0, 0, 0, 0)
#define sc2(n, a, b) sc6(n, (long)(a), (long)(b), 0, 0, 0, 0)
#define sc3(n, a, b, c) sc6(n, (long)(a), (long)(b), (long)(c), 0, 0, 0)
#define sc4(n, a, b, c, d) sc6(n, (long)(a), (long)(b), (long)(c), (long)(d), 0, 0)
#define sc5(n, a, b, c, d, e) sc6(n, (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), 0)

/* ------------------------------------------------------------------ */
/* Memory and strings (ours: libc's memcpy reads libc data)           */

HIDDEN void *memcpy(void *d, const void *s, size_t n) {
  void *r = d;
  __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
  return r;
}
HIDDEN void *memset(void *d, int c, size_t n) {
  void *r = d;
  __asm__ volatile("rep stosb" : "+D"(d), "+c"(n) : "a"(c) : "memory");
  return r;
}
static size_t slen(const char *s) {
  size_t n = 0;
  while (s[n]) n++;
  return n;
}
static int sprefix(const char *s, const char *p) {
  while (*p)
    if (*s++ != *p++) return 0;
  return 1;
}
static int sequal(const char *a, const char *b) {
  while (*a && *a == *b) a++, b++;
  return *a == *b;
}
static uint64_t parse_u(const char **p, int base) {
  uint64_t v = 0;
  const char *s = *p;
  for (;; s++) {
    int d;
    if (*s >= '0' && *s <= '9') d = *s - '0';
    else if (base == 16 && *s >= 'a' && *s <= 'f') d = *s - 'a' + 10;
    else break;
    v = v * base + d;
  }
  *p = s;
  return v;
}

/* A small formatter: %s %d %u %x %c (longs for the numbers). */
static size_t fmt(char *out, size_t cap, const char *f, const long *args) {
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

static void wr_all(int fd, const void *b, size_t n);

/* ------------------------------------------------------------------ */
/* Global state (this library's bss: private to each host)             */

enum { ROLE_NONE, ROLE_HOME, ROLE_REPLICA };

struct host {
  int fd;              /* control connection (home: to the node; node: to home) */
  uint32_t ip;         /* network order */
  uint16_t port;       /* the node's thread listener */
  uint32_t pid;
  uint64_t sent;       /* control messages sent to it (home) */
};

/* A remote thread on a node. */
struct rthread {
  int fd;                  /* thread connection to its executor */
  int ktid;                /* its kernel TID on this node */
  uint32_t thread, tid, pid;
  uint64_t fn, arg, sp, fs;
  uint64_t last_fault;     /* the same fault over and over is a real one */
  int repeats;
  volatile uint8_t selector;
};

struct queue_item {
  int kind;                /* 1 pin, 2 barrier, 3 protect everywhere, then barrier,
                              4 barrier, then give [page, page + len) to host */
  int host;
  uint64_t page;
  int pidfd;
  volatile uint32_t done;
  uint64_t result;
  uint64_t len, prot;
};

static struct {
  int role;
  int verbose;
  int uffd;
  int nhosts;              /* 1 + nodes */
  int self;                /* 0 on home, the host index on a node */
  int place;               /* 0 rr, 1 remote, 2 home */
  char token[33];
  struct host hosts[BKS_MAX_HOSTS];
  struct bks_stats *stats;
  uint64_t lib_lo, lib_hi;        /* this library's mappings */
  uint64_t text_lo, text_hi;      /* its text (the SUD-allowed range) */
  volatile uint64_t priv_next;    /* bump pointer in the private region */
  uint32_t home_pid;
  volatile uint32_t next_thread;
  int (*real_create)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
  void (*real_exit)(void *) __attribute__((noreturn));
  /* home: executor -> manager queue */
  volatile int qlock;
  struct queue_item *queue[64];
  volatile int qlen;
  int qevent;                     /* eventfd */
  /* node: remote threads and the manager's progress */
  int listen_fd;
  struct rthread *threads[BKS_MAX_THREADS];
  volatile uint32_t processed;    /* control messages handled by the node manager */
  volatile uint32_t processed_waiters;
} g;

/* ------------------------------------------------------------------ */
/* Errors                                                              */

static void say(const char *f, long a0, long a1, long a2, long a3) {
  long args[4] = {a0, a1, a2, a3};
  char b[512];
  size_t n = fmt(b, sizeof b - 1, f, args);
  b[n++] = '\n';
  sc3(SYS_write, 2, b, n);
}

/* A fatal error: one line on stderr, recorded in the stats page (home) or
 * sent to the home host (node), then the whole process ends. */
static void __attribute__((noreturn)) die(const char *f, long a0, long a1, long a2, long a3) {
  static volatile int dying;
  if (__atomic_exchange_n(&dying, 1, __ATOMIC_SEQ_CST))
    for (;;) sc0(SYS_pause); /* another thread is reporting; it ends the process */
  long args[4] = {a0, a1, a2, a3};
  char line[400], b[460];
  fmt(line, sizeof line, f, args);
  long a[2] = {(long)(g.role == ROLE_REPLICA ? "bunkai share: node " : "bunkai share: "), (long)line};
  size_t n;
  if (g.role == ROLE_REPLICA) {
    long a3b[3] = {a[0], g.self, (long)line};
    n = fmt(b, sizeof b - 1, "%s%d: %s", a3b);
  } else {
    n = fmt(b, sizeof b - 1, "%s%s", a);
  }
  if (g.role == ROLE_HOME && g.stats && !g.stats->error[0])
    memcpy(g.stats->error, line, slen(line) < 255 ? slen(line) : 255);
  if (g.role == ROLE_REPLICA && g.hosts[0].fd > 0) {
    struct bks_msg m = {BKS_ERROR, (uint32_t)slen(line), 0, 0, 0};
    struct iovec v[2] = {{&m, sizeof m}, {line, m.len}};
    sc3(SYS_writev, g.hosts[0].fd, v, 2);
  }
  b[n++] = '\n';
  /* at home, `bunkai share run` prints the stats page's error line */
  if (!(g.role == ROLE_HOME && g.stats)) sc3(SYS_write, 2, b, n);
  sc1(SYS_exit_group, 125);
  __builtin_unreachable();
}

/* ------------------------------------------------------------------ */
/* The private region                                                  */

static void *priv_alloc(uint64_t size) {
  size = PAGE_UP(size);
  uint64_t at = __atomic_fetch_add(&g.priv_next, size + PAGE, __ATOMIC_SEQ_CST); /* + a guard page */
  if (at + size > BKS_PRIVATE_BASE + BKS_PRIVATE_SIZE) die("private region exhausted", 0, 0, 0, 0);
  long r = sc3(SYS_mprotect, at, size, PROT_READ | PROT_WRITE);
  if (r) die("mprotect of the private region failed (%d)", r, 0, 0, 0);
  return (void *)at;
}

/* ------------------------------------------------------------------ */
/* Locks (spin, then futex)                                            */

static void lock(volatile int *l) {
  int spins = 0;
  while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE)) {
    if (++spins > 100) {
      sc6(SYS_futex, (long)l, FUTEX_WAIT_PRIVATE, 1, 0, 0, 0);
    }
  }
}
static void unlock(volatile int *l) {
  __atomic_store_n(l, 0, __ATOMIC_RELEASE);
  sc6(SYS_futex, (long)l, FUTEX_WAKE_PRIVATE, 1, 0, 0, 0);
}

/* ------------------------------------------------------------------ */
/* /proc/self/maps                                                     */

struct vma {
  uint64_t start, end, offset, inode;
  int prot, shared;
  char path[256];
};

/* Reads /proc/self/maps into the caller's buffer; returns its length. */
static long read_maps(char *buf, long cap) {
  int fd = (int)sc4(SYS_openat, AT_FDCWD, "/proc/self/maps", O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) die("cannot read /proc/self/maps (%d)", fd, 0, 0, 0);
  long n = 0;
  for (;;) {
    long r = sc3(SYS_read, fd, buf + n, cap - 1 - n);
    if (r <= 0) break;
    n += r;
    if (n >= cap - 1) die("/proc/self/maps is larger than %d bytes", cap, 0, 0, 0);
  }
  sc1(SYS_close, fd);
  buf[n] = 0;
  return n;
}

/* Parses the line at *p into v, advancing *p; 0 at the end. */
static int next_vma(const char **p, struct vma *v) {
  const char *s = *p;
  if (!*s) return 0;
  v->start = parse_u(&s, 16);
  s++;
  v->end = parse_u(&s, 16);
  s++;
  v->prot = (s[0] == 'r' ? PROT_READ : 0) | (s[1] == 'w' ? PROT_WRITE : 0) | (s[2] == 'x' ? PROT_EXEC : 0);
  v->shared = s[3] == 's';
  s += 5;
  v->offset = parse_u(&s, 16);
  s++;
  while (*s && *s != ' ') s++; /* dev */
  s++;
  v->inode = parse_u(&s, 10);
  while (*s == ' ') s++;
  size_t k = 0;
  while (*s && *s != '\n') {
    if (k < sizeof v->path - 1) v->path[k++] = *s;
    s++;
  }
  v->path[k] = 0;
  if (*s == '\n') s++;
  *p = s;
  return 1;
}

static int ours(const struct vma *v) {
  if (v->start >= BKS_PRIVATE_BASE && v->end <= BKS_PRIVATE_BASE + BKS_PRIVATE_SIZE) return 1;
  if (v->end > g.lib_lo && v->start < g.lib_hi) return 1;
  if (v->path[0] == '[' && !sequal(v->path, "[heap]") && !sequal(v->path, "[stack]")) return 1; /* vdso, vvar, vsyscall */
  return 0;
}

/* Is this mapping's memory shared page by page? Private writable memory
 * (anonymous, heap, stacks, data and bss after conversion) and anonymous
 * memory of any protection (guard areas that may become writable). */
static int is_shared_mem(const struct vma *v) {
  if (ours(v) || v->shared) return 0;
  if (v->prot & PROT_WRITE) return 1;
  return v->inode == 0 && (v->path[0] == 0 || v->path[0] == '[');
}

/* A writable private file mapping (a library's .data) cannot be registered
 * with userfaultfd: replace it, in place, by anonymous memory with the same
 * contents. */
static void make_anonymous(const struct vma *v) {
  uint64_t len = v->end - v->start;
  void *tmp = priv_alloc(len);
  memcpy(tmp, (void *)v->start, len);
  long r = sc5(SYS_mremap, tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, v->start);
  if (r != (long)v->start) die("cannot make %s's data anonymous (%d)", (long)v->path, r, 0, 0);
  sc3(SYS_mprotect, v->start, len, v->prot);
  sc6(SYS_mmap, (long)tmp, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}

/* ------------------------------------------------------------------ */
/* userfaultfd                                                         */

static void uffd_open(int events) {
  int fd = (int)sc1(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) die("userfaultfd failed (%d) (run as root or set vm.unprivileged_userfaultfd=1)", fd, 0, 0, 0);
  struct uffdio_api api = {.api = UFFD_API,
                           .features = UFFD_FEATURE_THREAD_ID |
                                       (events ? UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMAP : 0)};
  long r = sc3(SYS_ioctl, fd, UFFDIO_API, &api);
  if (r) die("userfaultfd API handshake failed (%d)", r, 0, 0, 0);
  g.uffd = fd;
}

static long uffd_register(uint64_t start, uint64_t end) {
  struct uffdio_register reg = {.range = {start, end - start},
                                .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP};
  long r = sc3(SYS_ioctl, g.uffd, UFFDIO_REGISTER, &reg);
  if (!r) sc3(SYS_madvise, start, end - start, MADV_NOHUGEPAGE);
  return r;
}

static void uffd_wp(uint64_t page, int on) {
  struct uffdio_writeprotect w = {.range = {page, PAGE}, .mode = on ? UFFDIO_WRITEPROTECT_MODE_WP : 0};
  sc3(SYS_ioctl, g.uffd, UFFDIO_WRITEPROTECT, &w);
}
static void uffd_wake(uint64_t page) {
  struct uffdio_range r = {page, PAGE};
  sc3(SYS_ioctl, g.uffd, UFFDIO_WAKE, &r);
}
/* Installs data at a missing page (read-only when ro); if the page is
 * there already, only fixes its protection. */
static void uffd_install(uint64_t page, const void *data, int ro) {
  struct uffdio_copy c = {.dst = page, .src = (uint64_t)data, .len = PAGE, .mode = ro ? UFFDIO_COPY_MODE_WP : 0};
  long r = sc3(SYS_ioctl, g.uffd, UFFDIO_COPY, &c);
  if (r == -EEXIST || (r < 0 && c.copy == -EEXIST)) {
    uffd_wp(page, ro);
    uffd_wake(page);
  } else if (r < 0 && r != -ENOENT) {
    /* -ENOENT: the mapping went away meanwhile (an unmap raced us). */
    uffd_wake(page);
  }
}
static int present(uint64_t page) {
  unsigned char v = 0;
  long r = sc3(SYS_mincore, page, PAGE, &v);
  return r == 0 && (v & 1);
}
static const uint8_t zero_page[PAGE] __attribute__((aligned(4096)));

/* ------------------------------------------------------------------ */
/* Sockets and messages                                                */

static void wr_all(int fd, const void *b, size_t n) {
  const char *p = b;
  while (n) {
    long r = sc4(SYS_sendto, fd, p, n, MSG_NOSIGNAL);
    if (r == -EINTR) continue;
    if (r <= 0) return; /* the reader sees the end of the connection */
    p += r;
    n -= (size_t)r;
  }
}
static int rd_all(int fd, void *b, size_t n) {
  char *p = b;
  while (n) {
    long r = sc3(SYS_read, fd, p, n);
    if (r == -EINTR || r == -EAGAIN) {
      if (r == -EAGAIN) {
        struct pollfd pf = {fd, POLLIN, 0};
        sc3(SYS_poll, &pf, 1, -1);
      }
      continue;
    }
    if (r <= 0) return r == 0 ? -1 : (int)r;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}
static void send_msg(int fd, uint32_t type, uint64_t a, uint64_t b, uint64_t c, const void *pl, uint32_t len) {
  struct bks_msg m = {type, len, a, b, c};
  if (!len) {
    wr_all(fd, &m, sizeof m);
    return;
  }
  struct iovec v[2] = {{&m, sizeof m}, {(void *)pl, len}};
  struct msghdr h = {.msg_iov = v, .msg_iovlen = 2};
  long r = sc3(SYS_sendmsg, fd, &h, MSG_NOSIGNAL);
  if (r > 0 && (size_t)r < sizeof m + len) {
    size_t done = (size_t)r;
    if (done < sizeof m) {
      wr_all(fd, (char *)&m + done, sizeof m - done);
      done = sizeof m;
    }
    wr_all(fd, (const char *)pl + (done - sizeof m), sizeof m + len - done);
  }
}
/* Reads one message; its payload (up to cap bytes) into pl. <0 at the end. */
static int recv_msg(int fd, struct bks_msg *m, void *pl, uint32_t cap) {
  int r = rd_all(fd, m, sizeof *m);
  if (r) return r;
  if (m->len > cap) return -EPROTO;
  if (m->len) return rd_all(fd, pl, m->len);
  return 0;
}

static void tune_socket(int fd) {
  int one = 1, idle = 2, intvl = 1, cnt = 3, uto = 5000;
  sc5(SYS_setsockopt, fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sc5(SYS_setsockopt, fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  sc5(SYS_setsockopt, fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  sc5(SYS_setsockopt, fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  sc5(SYS_setsockopt, fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  sc5(SYS_setsockopt, fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof uto);
}

/* Moves a descriptor of ours out of the program's way: the lowest free
 * number from 1000 up (numbers are reused as ours are closed, so they stay
 * under the usual limit of 1024). */
static int hide_fd(int fd) {
  long r = sc3(SYS_fcntl, fd, F_DUPFD_CLOEXEC, 1000);
  if (r < 0) return fd;
  sc1(SYS_close, fd);
  return (int)r;
}

static int tcp_connect(uint32_t ip, uint16_t port) {
  int fd = (int)sc3(SYS_socket, AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fd;
  fd = hide_fd(fd);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = __builtin_bswap16(port), .sin_addr = {ip}};
  long r;
  do r = sc3(SYS_connect, fd, &a, sizeof a);
  while (r == -EINTR);
  if (r) {
    sc1(SYS_close, fd);
    return (int)r;
  }
  tune_socket(fd);
  return fd;
}

/* ------------------------------------------------------------------ */
/* Assembly: clone, stack switches, the signal restorer                */

/* long __bunkai_clone(flags, stack_top, tls, fn, arg): a raw thread. */
long __bunkai_clone(unsigned long flags, void *stack, uint64_t tls, void (*fn)(void *), void *arg);
__asm__(".text\n"
        ".globl __bunkai_clone\n.hidden __bunkai_clone\n.type __bunkai_clone,@function\n"
        "__bunkai_clone:\n"
        "  and $-16, %rsi\n"
        "  sub $16, %rsi\n"
        "  mov %rcx, 0(%rsi)\n"
        "  mov %r8, 8(%rsi)\n"
        "  mov %rdx, %r8\n"
        "  xor %edx, %edx\n"
        "  xor %r10d, %r10d\n"
        "  mov $56, %eax\n"
        "  syscall\n"
        "  test %rax, %rax\n"
        "  jnz 1f\n"
        "  .cfi_startproc\n  .cfi_undefined rip\n"
        "  xor %ebp, %ebp\n"
        "  pop %rax\n"
        "  pop %rdi\n"
        "  call *%rax\n"
        "  mov $60, %eax\n  xor %edi, %edi\n  syscall\n  hlt\n"
        "  .cfi_endproc\n"
        "1: ret\n");

/* uint64_t __bunkai_call_on(stack_top, fn, arg): runs fn(arg) on another
 * stack and comes back. */
uint64_t __bunkai_call_on(void *stack, uint64_t (*fn)(void *), void *arg);
__asm__(".globl __bunkai_call_on\n.hidden __bunkai_call_on\n.type __bunkai_call_on,@function\n"
        "__bunkai_call_on:\n"
        "  push %rbp\n"
        "  mov %rsp, %rbp\n"
        "  and $-16, %rdi\n"
        "  mov %rdi, %rsp\n"
        "  mov %rdx, %rdi\n"
        "  call *%rsi\n"
        "  mov %rbp, %rsp\n"
        "  pop %rbp\n"
        "  ret\n");

/* noreturn __bunkai_run_on(sp, fn, arg): the remote thread enters the
 * program: fn(arg) on the program's stack, its result to remote_exit. */
void __bunkai_run_on(uint64_t sp, uint64_t fn, uint64_t arg) __attribute__((noreturn));
void __bunkai_remote_exit(uint64_t ret) __attribute__((noreturn));
__asm__(".globl __bunkai_run_on\n.hidden __bunkai_run_on\n.type __bunkai_run_on,@function\n"
        "__bunkai_run_on:\n"
        "  .cfi_startproc\n  .cfi_undefined rip\n"
        "  and $-16, %rdi\n"
        "  mov %rdi, %rsp\n"
        "  xor %ebp, %ebp\n"
        "  mov %rdx, %rdi\n"
        "  call *%rsi\n"
        "  mov %rax, %rdi\n"
        "  call __bunkai_remote_exit\n"
        "  hlt\n"
        "  .cfi_endproc\n");

void __bunkai_restorer(void);
__asm__(".globl __bunkai_restorer\n.hidden __bunkai_restorer\n.type __bunkai_restorer,@function\n"
        "__bunkai_restorer:\n  mov $15, %eax\n  syscall\n  hlt\n");

static inline uint64_t get_sp(void) {
  uint64_t sp;
  __asm__ volatile("mov %%rsp, %0" : "=r"(sp));
  return sp;
}

/* ------------------------------------------------------------------ */
/* Home: the page directory                                            */

#define SHARED_OWNER 0xff
struct dent {
  uint64_t page;     /* 0 = empty slot */
  uint16_t copyset;  /* hosts with a read-only copy, when owner == SHARED_OWNER */
  uint16_t pinned;   /* threads whose exit waits for this page to stay here (see pin_tid_word);
                        a count: a cached stack is reused, and its page pinned again, before
                        the old thread's exit is seen */
  uint8_t owner;     /* the host with the only, writable copy */
};
static struct dent *dir;
static uint64_t dir_cap, dir_used;

static struct dent *dir_find(uint64_t page, int create) {
  if (!dir || (create && dir_used * 2 >= dir_cap)) {
    uint64_t ncap = dir ? dir_cap * 2 : 1 << 16;
    struct dent *nd = priv_alloc(ncap * sizeof *nd);
    uint64_t nused = 0;
    for (uint64_t i = 0; dir && i < dir_cap; i++) {
      struct dent *e = &dir[i];
      if (!e->page || (e->owner == 0 && !e->pinned)) continue; /* home-exclusive is the default */
      uint64_t h = (e->page >> 12) * 0x9E3779B97F4A7C15ull;
      for (uint64_t k = h & (ncap - 1);; k = (k + 1) & (ncap - 1))
        if (!nd[k].page) { nd[k] = *e; nused++; break; }
    }
    /* the old table stays mapped: it is small next to the data it tracked */
    dir = nd, dir_cap = ncap, dir_used = nused;
  }
  uint64_t h = (page >> 12) * 0x9E3779B97F4A7C15ull;
  for (uint64_t k = h & (dir_cap - 1);; k = (k + 1) & (dir_cap - 1)) {
    if (dir[k].page == page) return &dir[k];
    if (!dir[k].page) {
      if (!create) return 0;
      dir[k].page = page, dir[k].owner = 0, dir[k].copyset = 0, dir[k].pinned = 0;
      dir_used++;
      return &dir[k];
    }
  }
}

/* Sets of address ranges [start, end), each behind its own lock. */
struct range { uint64_t start, end; };
struct rangeset {
  struct range *r;
  int n, cap;
  volatile int lock;
};
static int rs_find(const struct rangeset *s, uint64_t a) {
  for (int i = 0; i < s->n; i++)
    if (a >= s->r[i].start && a < s->r[i].end) return 1;
  return 0;
}
static int rs_overlaps(const struct rangeset *s, uint64_t a, uint64_t b) {
  for (int i = 0; i < s->n; i++)
    if (s->r[i].start < b && s->r[i].end > a) return 1;
  return 0;
}
static void rs_add(struct rangeset *s, uint64_t a, uint64_t b) {
  if (s->n == s->cap) {
    int nc = s->cap ? s->cap * 2 : 1024;
    struct range *n = priv_alloc(nc * sizeof *n);
    if (s->r) memcpy(n, s->r, s->n * sizeof *n);
    s->r = n, s->cap = nc; /* the old array stays mapped (the private region only grows) */
  }
  s->r[s->n++] = (struct range){a, b};
}
/* Removes [a, b) from the set, keeping the parts of ranges outside it
 * unless keep is 0 (then a range overlapping [a, b) goes whole); returns
 * whether any range overlapped it. */
static int rs_cut(struct rangeset *s, uint64_t a, uint64_t b, int keep) {
  int hit = 0;
  for (int i = 0; i < s->n; i++)
    if (s->r[i].start < b && s->r[i].end > a) {
      struct range r = s->r[i];
      s->r[i] = s->r[--s->n];
      i--;
      hit = 1;
      if (keep && r.start < a) rs_add(s, r.start, a);
      if (keep && r.end > b) rs_add(s, b, r.end);
    }
  return hit;
}

/* Registered ranges on the home host (regs.lock held by the callers of
 * registered and add_reg). */
static struct rangeset regs;

static int registered(uint64_t a) { return rs_find(&regs, a); }
static void add_reg(uint64_t s, uint64_t e) {
  rs_add(&regs, s, e);
  if (g.stats) g.stats->mappings++;
}
static void drop_regs(uint64_t s, uint64_t e) {
  lock(&regs.lock);
  rs_cut(&regs, s, e, 1);
  unlock(&regs.lock);
}

/* ------------------------------------------------------------------ */
/* Home: the manager                                                   */

struct req {
  int host;
  uint64_t page;
  int write, missing;
  uint64_t t0;
};
static struct req *pending;  /* requests to handle after the current one */
static int npending, pending_cap;
static struct req *deferred; /* remote requests for pinned pages */
static int ndeferred, deferred_cap;
static struct pin { uint64_t page; int pidfd; } pins[BKS_MAX_THREADS];
static int npins;

static void push_req(struct req **q, int *n, int *cap, struct req r) {
  if (*n == *cap) {
    int nc = *cap ? *cap * 2 : 256;
    struct req *nq = priv_alloc(nc * sizeof *nq);
    if (*q) memcpy(nq, *q, *n * sizeof *nq);
    *q = nq, *cap = nc;
  }
  (*q)[(*n)++] = r;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  sc2(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static void host_send(int h, uint32_t type, uint64_t a, uint64_t b, uint64_t c, const void *pl, uint32_t len) {
  send_msg(g.hosts[h].fd, type, a, b, c, pl, len);
  g.hosts[h].sent++;
}

static void __attribute__((noreturn)) node_gone(int h, int err) {
  if (g.stats && !g.stats->failed_host) g.stats->failed_host = (uint32_t)h, g.stats->failed_err = err;
  die("node %d vanished (%s; check that `bunkai share node` still runs there and the link is up)", h,
      (long)(err == -ETIMEDOUT ? "connection timed out" : err == -ECONNRESET ? "connection reset" : "connection closed"),
      0, 0);
}

static void handle_ctrl(int h, struct bks_msg *m, char *pl);

/* Waits for host h's reply of the given type for page; messages that are
 * not the reply are queued as requests. */
static void await(int h, uint32_t type, uint64_t page, void *data) {
  static char pl[PAGE + 512];
  for (;;) {
    struct bks_msg m;
    int r = recv_msg(g.hosts[h].fd, &m, pl, sizeof pl);
    if (r) node_gone(h, r);
    if (m.type == type && m.a == page) {
      if (data && m.len == PAGE) memcpy(data, pl, PAGE);
      return;
    }
    handle_ctrl(h, &m, pl);
  }
}

/* A copy of page from host src: kind FETCH (leave src as it is),
 * DOWNGRADE (src keeps a read-only copy) or TAKE (src drops it). */
static void get_copy(int src, uint64_t page, uint32_t kind, void *data) {
  if (src != 0) {
    host_send(src, kind, page, 0, 0, 0, 0);
    await(src, BKS_DATA, page, data);
    g.stats->host[src].pages_out++;
    return;
  }
  if (!present(page)) {
    /* never touched, or dropped by the program: zeros */
    memset(data, 0, PAGE);
    if (kind == BKS_DOWNGRADE) uffd_install(page, zero_page, 1);
    return;
  }
  if (kind != BKS_FETCH) uffd_wp(page, 1);
  memcpy(data, (void *)page, PAGE);
  if (kind == BKS_TAKE) sc3(SYS_madvise, page, PAGE, MADV_DONTNEED);
}

/* Gives page to host r: data (or none: upgrade / wake) and mode. */
static void grant(int r, uint64_t page, const void *data, int ro) {
  if (r == 0) {
    if (data) uffd_install(page, data, ro);
    else if (!ro) uffd_wp(page, 0), uffd_wake(page);
    else uffd_wake(page);
    return;
  }
  host_send(r, BKS_GRANT, page, ro ? 1 : 2, 0, data, data ? PAGE : 0);
  if (data) g.stats->host[r].pages_in++;
}

static void handle_req(struct req *q) {
  static uint8_t data[PAGE] __attribute__((aligned(64)));
  int r = q->host;
  uint64_t page = q->page;
  struct dent *e = dir_find(page, 0);
  if (e && e->pinned && r != 0) {
    push_req(&deferred, &ndeferred, &deferred_cap, *q);
    return;
  }
  uint64_t t0 = now_ns();
  if (q->write) g.stats->host[r].write_faults++;
  else g.stats->host[r].read_faults++;
  int owner = e ? e->owner : 0;
  uint16_t cs = e ? e->copyset : 0;
  if (q->missing) {
    /* r has no copy, whatever the directory says: if it was the only
     * holder, the contents are gone (dropped by the program): zeros. */
    if (owner == r || (owner == SHARED_OWNER && cs == (1u << r))) {
      e = dir_find(page, 1);
      e->owner = (uint8_t)r, e->copyset = 0;
      if (r == 0) {
        struct uffdio_zeropage z = {.range = {page, PAGE}};
        if (sc3(SYS_ioctl, g.uffd, UFFDIO_ZEROPAGE, &z)) uffd_wake(page);
      } else {
        grant(r, page, zero_page, 0);
      }
      goto out;
    }
    if (owner == SHARED_OWNER) cs &= (uint16_t)~(1u << r);
  }
  if (!q->write) {
    if (owner == r) { grant(r, page, 0, 0); goto out; }
    if (owner != SHARED_OWNER) {
      get_copy(owner, page, BKS_DOWNGRADE, data);
      cs = (uint16_t)((1u << owner) | (1u << r));
    } else {
      if (cs & (1u << r)) { grant(r, page, 0, 1); goto out; }
      int src = (cs & 1) ? 0 : __builtin_ctz(cs);
      get_copy(src, page, BKS_FETCH, data);
      cs |= (uint16_t)(1u << r);
    }
    e = dir_find(page, 1);
    e->owner = SHARED_OWNER, e->copyset = cs;
    grant(r, page, data, 1);
  } else {
    if (owner == r) { grant(r, page, 0, 0); goto out; }
    if (owner != SHARED_OWNER) {
      get_copy(owner, page, BKS_TAKE, data);
      e = dir_find(page, 1);
      e->owner = (uint8_t)r, e->copyset = 0;
      grant(r, page, data, 0);
      goto out;
    }
    int has = (cs >> r) & 1;
    if (!has) {
      int src = (cs & 1) ? 0 : __builtin_ctz(cs);
      get_copy(src, page, BKS_FETCH, data);
    }
    uint16_t others = cs & (uint16_t)~(1u << r);
    for (int s = 1; s < g.nhosts; s++)
      if (others & (1u << s)) host_send(s, BKS_INVALIDATE, page, 0, 0, 0, 0);
    if (others & 1) sc3(SYS_madvise, page, PAGE, MADV_DONTNEED);
    for (int s = 1; s < g.nhosts; s++)
      if (others & (1u << s)) {
        await(s, BKS_ACK, page, 0);
        g.stats->host[s].invalidations++;
      }
    if (others & 1) g.stats->host[0].invalidations++;
    e = dir_find(page, 1);
    e->owner = (uint8_t)r, e->copyset = 0;
    grant(r, page, has ? 0 : data, 0);
  }
out:
  g.stats->host[r].fault_ns += now_ns() - t0;
}

static void handle_ctrl(int h, struct bks_msg *m, char *pl) {
  switch (m->type) {
  case BKS_PAGE_REQ:
    push_req(&pending, &npending, &pending_cap,
             (struct req){h, PAGE_DOWN(m->a), (int)(m->b & 1), !(m->b & 2), 0});
    break;
  case BKS_ERROR:
    pl[m->len < PAGE ? m->len : PAGE - 1] = 0;
    die("node %d: %s", h, (long)pl, 0, 0);
  default:
    die("node %d sent an unexpected message (type %d)", h, m->type, 0, 0);
  }
}

/* The program unmapped or moved memory on the home host. */
static void dir_forget(uint64_t s, uint64_t e) {
  for (uint64_t i = 0; dir && i < dir_cap; i++)
    if (dir[i].page >= s && dir[i].page < e && !dir[i].pinned) dir[i].owner = 0, dir[i].copyset = 0;
}
static void handle_event(struct uffd_msg *m) {
  if (m->event == UFFD_EVENT_PAGEFAULT) {
    uint64_t f = m->arg.pagefault.flags;
    push_req(&pending, &npending, &pending_cap,
             (struct req){0, PAGE_DOWN(m->arg.pagefault.address), (f & (UFFD_PAGEFAULT_FLAG_WRITE | UFFD_PAGEFAULT_FLAG_WP)) != 0,
                          !(f & UFFD_PAGEFAULT_FLAG_WP), 0});
  } else if (m->event == UFFD_EVENT_UNMAP) {
    uint64_t s = m->arg.remove.start, e = m->arg.remove.end;
    dir_forget(s, e);
    drop_regs(s, e);
    for (int h = 1; h < g.nhosts; h++) host_send(h, BKS_UNMAP, s, e, 0, 0, 0);
  } else if (m->event == UFFD_EVENT_REMAP) {
    uint64_t from = m->arg.remap.from, to = m->arg.remap.to, len = m->arg.remap.len;
    /* move the directory entries with the pages */
    static struct dent *moved;
    static uint64_t moved_cap;
    uint64_t nm = 0;
    for (uint64_t i = 0; dir && i < dir_cap; i++)
      if (dir[i].page >= from && dir[i].page < from + len && dir[i].owner != 0) {
        if (nm == moved_cap) {
          uint64_t nc = moved_cap ? moved_cap * 2 : 4096;
          struct dent *n = priv_alloc(nc * sizeof *n);
          if (moved) memcpy(n, moved, nm * sizeof *n);
          moved = n, moved_cap = nc;
        }
        moved[nm++] = dir[i];
        dir[i].owner = 0, dir[i].copyset = 0;
      }
    for (uint64_t k = 0; k < nm; k++) {
      struct dent *d = dir_find(moved[k].page - from + to, 1);
      d->owner = moved[k].owner, d->copyset = moved[k].copyset;
    }
    lock(&regs.lock);
    add_reg(to, to + len);
    unlock(&regs.lock);
    drop_regs(from, from + len);
    for (int h = 1; h < g.nhosts; h++) host_send(h, BKS_REMAP, from, to, len, 0, 0);
  }
}

static void drain_uffd(void) {
  struct uffd_msg msgs[16];
  for (;;) {
    long r = sc3(SYS_read, g.uffd, msgs, sizeof msgs);
    if (r <= 0) break;
    for (long i = 0; i < r / (long)sizeof msgs[0]; i++) handle_event(&msgs[i]);
  }
}

static void run_queue(void) {
  for (;;) {
    struct queue_item *it = 0;
    lock(&g.qlock);
    if (g.qlen) {
      it = g.queue[0];
      for (int i = 1; i < g.qlen; i++) g.queue[i - 1] = g.queue[i];
      g.qlen--;
    }
    unlock(&g.qlock);
    if (!it) return;
    if (it->kind == 1) {
      /* a pin without a record of its pidfd would never end: with the
       * table full, the thread goes unpinned (as before pins existed) */
      if (npins < BKS_MAX_THREADS) {
        dir_find(it->page, 1)->pinned++;
        pins[npins++] = (struct pin){it->page, it->pidfd};
      } else {
        sc1(SYS_close, it->pidfd);
      }
    } else if (it->kind == 2 || it->kind == 3 || it->kind == 4) {
      drain_uffd();
      if (it->kind == 3)
        for (int h = 1; h < g.nhosts; h++) host_send(h, BKS_PROTECT, it->page, it->len, it->prot, 0, 0);
      if (it->kind == 4) {
        /* first touch: the new mapping's pages belong to the host whose
         * thread made it, as zeros; no other host can know the address yet */
        for (uint64_t a = it->page; a < it->page + it->len; a += PAGE) {
          struct dent *e = dir_find(a, 1);
          e->owner = (uint8_t)it->host, e->copyset = 0;
        }
        g.stats->host[it->host].fresh_pages += it->len / PAGE;
      }
      it->result = g.hosts[it->host].sent;
    }
    __atomic_store_n(&it->done, 1, __ATOMIC_RELEASE);
    sc6(SYS_futex, (long)&it->done, FUTEX_WAKE_PRIVATE, 1, 0, 0, 0);
  }
}

/* An executor asks the manager something and waits for the answer. */
static uint64_t ask_manager(struct queue_item *it) {
  for (;;) {
    lock(&g.qlock);
    if (g.qlen < 64) {
      g.queue[g.qlen++] = it;
      unlock(&g.qlock);
      break;
    }
    unlock(&g.qlock);
    sc0(SYS_sched_yield);
  }
  uint64_t one = 1;
  sc3(SYS_write, g.qevent, &one, 8);
  while (!__atomic_load_n(&it->done, __ATOMIC_ACQUIRE)) sc6(SYS_futex, (long)&it->done, FUTEX_WAIT_PRIVATE, 0, 0, 0, 0);
  return it->result;
}

/* Waits for any of pf: first by polling without sleeping for a while after
 * the last activity (a sleeping manager costs a cross-core wakeup, about
 * 9 us here, on every page transfer), then blocking. */
static uint64_t spin_ns = 100000;
static long spin_poll(struct pollfd *pf, int n) {
  static uint64_t last;
  uint64_t t = now_ns();
  if (t - last < spin_ns) {
    for (;;) {
      long r = sc3(SYS_poll, pf, n, 0);
      if (r) {
        last = now_ns();
        return r;
      }
      sc0(SYS_sched_yield); /* let a runnable thread of the program have the core */
      if (now_ns() - last > spin_ns) break;
    }
  }
  long r = sc3(SYS_poll, pf, n, -1);
  last = now_ns();
  return r;
}

static void home_manager(void *unused) {
  (void)unused;
  struct pollfd pf[2 + BKS_MAX_HOSTS + BKS_MAX_THREADS];
  static char pl[PAGE + 512];
  for (;;) {
    while (npending) {
      struct req q = pending[0];
      for (int i = 1; i < npending; i++) pending[i - 1] = pending[i];
      npending--;
      handle_req(&q);
    }
    int n = 0;
    pf[n++] = (struct pollfd){g.uffd, POLLIN, 0};
    pf[n++] = (struct pollfd){g.qevent, POLLIN, 0};
    for (int h = 1; h < g.nhosts; h++) pf[n++] = (struct pollfd){g.hosts[h].fd, POLLIN, 0};
    int pin0 = n, polled = npins; /* run_queue below may add pins: they were not polled */
    for (int i = 0; i < npins; i++) pf[n++] = (struct pollfd){pins[i].pidfd, POLLIN, 0};
    long r = spin_poll(pf, n);
    if (r < 0) continue;
    if (pf[0].revents) drain_uffd();
    if (pf[1].revents) {
      uint64_t v;
      sc3(SYS_read, g.qevent, &v, 8);
      run_queue();
    }
    for (int h = 1; h < g.nhosts; h++) {
      if (!pf[1 + h].revents) continue;
      struct bks_msg m;
      int e = recv_msg(g.hosts[h].fd, &m, pl, sizeof pl);
      if (e) node_gone(h, e);
      handle_ctrl(h, &m, pl);
    }
    for (int i = polled - 1; i >= 0; i--) {
      if (!pf[pin0 + i].revents) continue;
      /* the thread has exited: its TID word is cleared, the page is free */
      struct dent *e = dir_find(pins[i].page, 0);
      if (e && e->pinned) e->pinned--;
      sc1(SYS_close, pins[i].pidfd);
      pins[i] = pins[--npins];
      for (int k = 0; k < ndeferred; k++) push_req(&pending, &npending, &pending_cap, deferred[k]);
      ndeferred = 0;
    }
  }
}

/* ------------------------------------------------------------------ */
/* Home: executors (§5.1)                                              */

struct xbox {
  void *(*fn)(void *);
  void *arg;
  uint32_t thread, host;
  uint64_t app_sp, fs;
};

static int home_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);

static int thread_slot(uint32_t no) {
  return (int)(no < BKS_MAX_THREADS ? no : BKS_MAX_THREADS - 1);
}

/* Maps info for a remote thread's fault at addr. */
static void answer_mapinfo(int fd, uint64_t addr) {
  static volatile int maps_lock;
  struct bks_map info;
  memset(&info, 0, sizeof info);
  lock(&maps_lock);
  static char *buf;
  static long cap = 1 << 20;
  if (!buf) buf = priv_alloc(cap);
  read_maps(buf, cap);
  const char *p = buf;
  struct vma v;
  int found = 0;
  while (next_vma(&p, &v))
    if (addr >= v.start && addr < v.end) { found = 1; break; }
  if (found && !ours(&v)) {
    if (is_shared_mem(&v)) {
      if (v.inode != 0 && !v.shared) {
        make_anonymous(&v); /* a library loaded after start-up */
        v.inode = 0, v.path[0] = 0;
      }
      lock(&regs.lock);
      if (!registered(addr)) {
        long r = uffd_register(v.start, v.end);
        if (!r) add_reg(v.start, v.end);
      }
      unlock(&regs.lock);
      info.kind = BKS_MAP_SHARED_MEM;
    } else if (!(v.prot & PROT_WRITE) && v.inode) {
      info.kind = BKS_MAP_FILE;
      memcpy(info.path, v.path, slen(v.path) + 1);
    }
    info.start = v.start, info.end = v.end, info.offset = v.offset, info.prot = (uint32_t)v.prot;
  }
  unlock(&maps_lock);
  send_msg(fd, BKS_MAP, 0, 0, 0, &info, sizeof info);
}

/* The largest mapping given to a node whole (a directory entry per page):
 * larger ones take the ordinary path, page by page. */
#define FRESH_MAX_BYTES (64ull << 20)

/* A private anonymous writable mapping at an address of the kernel's
 * choosing, not filled in by the kernel (MAP_POPULATE, MAP_LOCKED or
 * mlockall(MCL_FUTURE), seen as a present first page): memory no host has
 * touched. */
static int is_fresh_mapping(long nr, const struct bks_syscall *s, long res) {
  uint64_t prot = s->arg[2], flags = s->arg[3];
  return nr == SYS_mmap && (unsigned long)res < -4095ul && (prot & PROT_WRITE) &&
         (flags & MAP_TYPE) == MAP_PRIVATE && (flags & MAP_ANONYMOUS) && s->arg[1] <= FRESH_MAX_BYTES &&
         !(flags & (MAP_FIXED | MAP_FIXED_NOREPLACE | MAP_GROWSDOWN | MAP_HUGETLB | MAP_POPULATE | MAP_LOCKED)) &&
         !present((uint64_t)res);
}

static int is_mapping_call(long nr, const struct bks_syscall *s) {
  return nr == SYS_munmap || nr == SYS_mremap || nr == SYS_brk || nr == SYS_shmdt ||
         (nr == SYS_mmap && (s->arg[3] & MAP_FIXED));
}

static long forbidden(long nr) {
  return nr == SYS_clone || nr == SYS_clone3 || nr == SYS_fork || nr == SYS_vfork || nr == SYS_execve ||
         nr == SYS_execveat || nr == SYS_rt_sigreturn;
}

/* A home thread about to end keeps the page of its TID word here, writable,
 * until the kernel has cleared the word at its exit (the wake-up that
 * pthread_join waits for): the kernel takes no userfault for an exiting
 * thread, so if a node held the page then (a joiner on a node reads the
 * word), the clear would be lost and the joiner would wait for ever. */
static void pin_tid_word(void) {
  uint64_t tidp = 0;
  if (sc2(SYS_prctl, PR_GET_TID_ADDRESS, &tidp) || !tidp) return;
  int pidfd = (int)sc2(SYS_pidfd_open, sc0(SYS_gettid), 0x80 /* PIDFD_THREAD */);
  if (pidfd >= 0) {
    pidfd = hide_fd(pidfd);
    struct queue_item it = {.kind = 1, .page = PAGE_DOWN(tidp), .pidfd = pidfd};
    ask_manager(&it);
  }
  __atomic_fetch_add((volatile int *)tidp, 0, __ATOMIC_SEQ_CST);
}

/* The executor's life: on a private stack, until the remote thread ends. */
static uint64_t executor(void *p) {
  struct xbox *x = p;
  int h = (int)x->host;
  int tid = (int)sc0(SYS_gettid);
  struct bks_thread_stats *ts = &g.stats->thread[thread_slot(x->thread)];
  ts->thread = x->thread, ts->host = x->host, ts->tid = (uint32_t)tid;
  if (g.stats->nthreads < x->thread + 1 && x->thread < BKS_MAX_THREADS) g.stats->nthreads = x->thread + 1;
  g.stats->host[h].threads++;
  int fd = tcp_connect(g.hosts[h].ip, g.hosts[h].port);
  if (fd < 0) node_gone(h, fd);
  struct bks_start st = {(uint64_t)x->fn, (uint64_t)x->arg, x->app_sp, x->fs, x->thread, (uint32_t)tid, g.home_pid, 0};
  send_msg(fd, BKS_START, 0, 0, 0, &st, sizeof st);
  uint64_t ret = 0;
  for (;;) {
    struct bks_msg m;
    union { struct bks_syscall s; uint64_t arg; char raw[64]; } pl;
    int r = recv_msg(fd, &m, &pl, sizeof pl);
    if (r) node_gone(h, r);
    if (m.type == BKS_SYSCALL) {
      long nr = (long)pl.s.nr;
      long res;
      uint64_t flags = 0, seq = 0;
      if (nr < 0 || nr > 1023) res = -ENOSYS; /* §5.2 (3): not a valid call */
      else if (forbidden(nr)) res = -ENOSYS;
      else {
        if (nr == SYS_exit_group) sc1(SYS_exit_group, pl.s.arg[0]);
        res = sc6(nr, (long)pl.s.arg[0], (long)pl.s.arg[1], (long)pl.s.arg[2], (long)pl.s.arg[3],
                  (long)pl.s.arg[4], (long)pl.s.arg[5]);
        if (is_fresh_mapping(nr, &pl.s, res)) {
          /* register it here now (home threads must fault through the
           * directory), then hand its pages to the caller's host. Not if
           * any of it is still registered: an unmap there whose event the
           * manager has not seen yet would then wipe the new mapping. */
          uint64_t len = PAGE_UP(pl.s.arg[1]);
          lock(&regs.lock);
          int ok = !rs_overlaps(&regs, (uint64_t)res, (uint64_t)res + len) &&
                   !uffd_register((uint64_t)res, (uint64_t)res + len);
          if (ok) add_reg((uint64_t)res, (uint64_t)res + len);
          unlock(&regs.lock);
          if (ok) {
            struct queue_item it = {.kind = 4, .host = h, .page = (uint64_t)res, .len = len};
            seq = ask_manager(&it);
            flags = BKS_RES_MAPS_CHANGED | BKS_RES_FRESH;
          }
        } else if (nr == SYS_mprotect && res == 0) {
          struct queue_item it = {.kind = 3, .host = h, .page = pl.s.arg[0], .len = pl.s.arg[1], .prot = pl.s.arg[2]};
          seq = ask_manager(&it);
          flags = BKS_RES_MAPS_CHANGED;
        } else if (is_mapping_call(nr, &pl.s)) {
          struct queue_item it = {.kind = 2, .host = h};
          seq = ask_manager(&it);
          flags = BKS_RES_MAPS_CHANGED;
        }
      }
      ts->syscalls++;
      g.stats->host[h].syscalls++;
      send_msg(fd, BKS_RESULT, (uint64_t)res, flags, seq, 0, 0);
    } else if (m.type == BKS_MAPINFO) {
      answer_mapinfo(fd, m.a);
    } else if (m.type == BKS_CREATE) {
      int rc = home_create((pthread_t *)m.a, (const pthread_attr_t *)m.b, (void *(*)(void *))m.c, (void *)pl.arg);
      send_msg(fd, BKS_RESULT, (uint64_t)(long)rc, 0, 0, 0, 0);
    } else if (m.type == BKS_EXIT) {
      ret = m.a;
      break;
    } else if (m.type == BKS_CRASH) {
      say("bunkai share: thread %d on node %d: signal %d at address 0x%x", x->thread, h, (long)m.a, (long)m.b);
      struct { void *h; unsigned long f; void *r; uint64_t mask; } dfl = {SIG_DFL, 0, 0, 0};
      sc4(SYS_rt_sigaction, (long)m.a, &dfl, 0, 8);
      sc2(SYS_kill, g.home_pid, (long)m.a);
      sc1(SYS_exit_group, 128 + (long)m.a);
    } else {
      die("thread %d on node %d sent an unexpected message (type %d)", x->thread, h, m.type, 0);
    }
  }
  sc1(SYS_close, fd);
  ts->done = 1;
  pin_tid_word();
  return ret;
}

static void *exec_start(void *p) {
  struct xbox *x = p;
  sc2(SYS_arch_prctl, ARCH_GET_FS, &x->fs);
  /* the remote thread's frames go below ours, with a margin */
  x->app_sp = (get_sp() - 1024) & ~15ull;
  char *stack = priv_alloc(256 * 1024);
  return (void *)__bunkai_call_on(stack + 256 * 1024, executor, x);
}

/* A thread placed on the home host: the program's start routine, then the
 * TID word's page is pinned here (see pin_tid_word). */
static void *home_thread(void *p) {
  struct xbox *x = p;
  void *r = x->fn(x->arg);
  pin_tid_word();
  return r;
}

static int place(uint32_t no) {
  int nodes = g.nhosts - 1;
  if (nodes <= 0 || g.place == 2) return 0;
  if (g.place == 1) return 1 + (int)((no - 1) % (uint32_t)nodes);
  return (int)(no % (uint32_t)g.nhosts);
}

static int home_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
  if ((uint32_t)sc0(SYS_getpid) != g.home_pid) return g.real_create(t, attr, fn, arg); /* a forked child: unshared */
  uint32_t no = __atomic_add_fetch(&g.next_thread, 1, __ATOMIC_SEQ_CST);
  int h = place(no);
  if (h == 0) {
    struct bks_thread_stats *ts = &g.stats->thread[thread_slot(no)];
    ts->thread = no, ts->host = 0;
    if (g.stats->nthreads < no + 1 && no < BKS_MAX_THREADS) g.stats->nthreads = no + 1;
    g.stats->host[0].threads++;
  }
  struct xbox *x = priv_alloc(sizeof *x);
  x->fn = fn, x->arg = arg, x->thread = no, x->host = (uint32_t)h;
  if (h == 0 && g.nhosts == 1) return g.real_create(t, attr, fn, arg);
  return g.real_create(t, attr, h == 0 ? home_thread : exec_start, x);
}

/* ------------------------------------------------------------------ */
/* Node: remote threads                                                */

/* Pages of mappings this node's threads made that are still untouched
 * zeros owned by this node (BKS_RES_FRESH): the manager fills them itself.
 * A page leaves the set when it is filled or when home says anything
 * about it. */
static struct rangeset fresh;

/* Held while a node changes its own view of the mappings (lazy mapping in
 * sigsegv, map_fresh): two threads faulting in one unmapped region must not
 * both map it. */
static volatile int map_lock;

/* First touches out of order split ranges; past this many, a range that
 * would split goes whole instead (its other pages then take the ordinary
 * path, where home answers with zeros: slower, still right), so the set
 * stays small enough to scan on every fault. */
#define FRESH_MAX 4096

static int fresh_take(uint64_t a, uint64_t b) {
  if (!__atomic_load_n(&fresh.n, __ATOMIC_ACQUIRE)) return 0;
  lock(&fresh.lock);
  int hit = rs_cut(&fresh, a, b, fresh.n < FRESH_MAX);
  unlock(&fresh.lock);
  return hit;
}

/* The home host gave this node a new mapping's pages: map it here now. */
static void map_fresh(uint64_t start, uint64_t len, long prot) {
  len = PAGE_UP(len);
  lock(&map_lock);
  long r = sc6(SYS_mmap, start, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE | MAP_NORESERVE, -1, 0);
  if (r == (long)start && uffd_register(start, start + len)) sc2(SYS_munmap, start, len), r = -1;
  if (r == (long)start) {
    lock(&fresh.lock);
    rs_add(&fresh, start, start + len);
    unlock(&fresh.lock);
  }
  /* else mapped here already (another thread faulted in a neighbour that
   * home merged with it): faults ask home, which answers with zeros */
  unlock(&map_lock);
}

static struct rthread *me(void) {
  int ktid = (int)sc0(SYS_gettid);
  for (int i = 0; i < BKS_MAX_THREADS; i++) {
    struct rthread *t = g.threads[i];
    if (t && t->ktid == ktid) return t;
  }
  return 0;
}

static long rpc(struct rthread *t, uint32_t type, uint64_t a, uint64_t b, uint64_t c, const void *pl, uint32_t len,
                struct bks_msg *reply, void *rpl, uint32_t cap) {
  send_msg(t->fd, type, a, b, c, pl, len);
  int r = recv_msg(t->fd, reply, rpl, cap);
  if (r) sc1(SYS_exit_group, 0); /* the program ended at home (or home is gone: the CLI says so) */
  return (long)reply->a;
}

static void wait_processed(uint32_t seq) {
  while ((int32_t)(__atomic_load_n(&g.processed, __ATOMIC_ACQUIRE) - seq) < 0) {
    __atomic_fetch_add(&g.processed_waiters, 1, __ATOMIC_SEQ_CST);
    uint32_t v = __atomic_load_n(&g.processed, __ATOMIC_ACQUIRE);
    if ((int32_t)(v - seq) < 0) sc6(SYS_futex, (long)&g.processed, FUTEX_WAIT_PRIVATE, v, 0, 0, 0);
    __atomic_fetch_sub(&g.processed_waiters, 1, __ATOMIC_SEQ_CST);
  }
}

static void sigsys(int sig, siginfo_t *si, void *ctxp) {
  (void)sig;
  ucontext_t *uc = ctxp;
  greg_t *r = uc->uc_mcontext.gregs;
  struct rthread *t = me();
  t->repeats = 0; /* progress: a later fault at the same place is a new one */
  long nr = si->si_syscall;
  long a0 = r[REG_RDI], a1 = r[REG_RSI], a2 = r[REG_RDX], a3 = r[REG_R10], a4 = r[REG_R8], a5 = r[REG_R9];
  long res;
  switch (nr) {
  case SYS_gettid: res = t->tid; break;
  case SYS_getpid: res = t->pid; break;
  case SYS_set_tid_address: res = t->tid; break;
  case SYS_rseq: res = -ENOSYS; break;
  case SYS_set_robust_list: res = 0; break;
  case SYS_sigaltstack: res = 0; break; /* the thread's signals are handled at home */
  case SYS_arch_prctl:
  case SYS_sched_yield:
  case SYS_nanosleep:
  case SYS_clock_nanosleep:
  case SYS_clock_gettime:
  case SYS_gettimeofday:
  case SYS_getcpu:
    res = sc6(nr, a0, a1, a2, a3, a4, a5);
    break;
  case SYS_madvise: res = 0; break; /* advice only: the home host's copy is the one that matters */
  case SYS_exit: __bunkai_remote_exit(0);
  default: {
    struct bks_syscall s = {(uint64_t)nr, {(uint64_t)a0, (uint64_t)a1, (uint64_t)a2, (uint64_t)a3, (uint64_t)a4, (uint64_t)a5}};
    struct bks_msg m;
    res = rpc(t, BKS_SYSCALL, 0, 0, 0, &s, sizeof s, &m, 0, 0);
    if (m.b & BKS_RES_MAPS_CHANGED) wait_processed((uint32_t)m.c);
    if (m.b & BKS_RES_FRESH) map_fresh((uint64_t)res, (uint64_t)a1, a2);
    if (nr == SYS_munmap && res == 0) sc2(SYS_munmap, a0, a1);
  }
  }
  r[REG_RAX] = res;
}

/* Is the page at a mapped here? (msync fails with ENOMEM where not) */
static int mapped_here(uint64_t a) {
  return sc3(SYS_msync, PAGE_DOWN(a), PAGE, MS_ASYNC) != -ENOMEM;
}

static void sigsegv(int sig, siginfo_t *si, void *ctxp) {
  ucontext_t *uc = ctxp;
  uint64_t addr = (uint64_t)si->si_addr;
  struct rthread *t = me();
  int write = (uc->uc_mcontext.gregs[REG_ERR] & 2) != 0;
  if (!t) die("signal %d at 0x%x outside the program's threads", sig, (long)addr, 0, 0);
  if (PAGE_DOWN(addr) == t->last_fault && ++t->repeats > 4) {
    send_msg(t->fd, BKS_CRASH, (uint64_t)sig, addr, 0, 0, 0);
    for (;;) sc0(SYS_pause);
  }
  if (PAGE_DOWN(addr) != t->last_fault) t->last_fault = PAGE_DOWN(addr), t->repeats = 0;
  struct bks_msg m;
  struct bks_map info;
  rpc(t, BKS_MAPINFO, addr, (uint64_t)write, 0, 0, 0, &m, &info, sizeof info);
  int need = write ? PROT_WRITE : PROT_READ;
  if (info.kind == BKS_MAP_NONE || !(info.prot & (uint32_t)need) || sig != SIGSEGV) {
    send_msg(t->fd, BKS_CRASH, (uint64_t)sig, addr, 0, 0, 0);
    for (;;) sc0(SYS_pause);
  }
  lock(&map_lock);
  if (mapped_here(addr)) {
    /* the protection changed at home, or another thread of ours has just
     * mapped it */
    if (sc3(SYS_mprotect, info.start, info.end - info.start, info.prot))
      sc3(SYS_mprotect, PAGE_DOWN(addr), PAGE, info.prot);
    unlock(&map_lock);
    return;
  }
  /* map the unmapped run around addr within [start, end) */
  uint64_t lo = PAGE_DOWN(addr), hi = lo + PAGE;
  while (lo > info.start && !mapped_here(lo - PAGE)) lo -= PAGE;
  while (hi < info.end && !mapped_here(hi)) hi += PAGE;
  if (info.kind == BKS_MAP_FILE) {
    int fd = (int)sc4(SYS_openat, AT_FDCWD, info.path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) die("cannot open %s, mapped by the program at home (%d)", (long)info.path, fd, 0, 0);
    long r = sc6(SYS_mmap, lo, hi - lo, info.prot, MAP_PRIVATE | MAP_FIXED_NOREPLACE, fd, (long)(info.offset + (lo - info.start)));
    sc1(SYS_close, fd);
    if (r < 0) die("cannot map %s at 0x%x (%d)", (long)info.path, (long)lo, r, 0);
  } else {
    long r = sc6(SYS_mmap, lo, hi - lo, info.prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE | MAP_NORESERVE, -1, 0);
    if (r < 0) die("cannot map 0x%x-0x%x (%d)", (long)lo, (long)hi, r, 0);
    if (uffd_register(lo, hi)) die("cannot register 0x%x-0x%x with userfaultfd", (long)lo, (long)hi, 0, 0);
  }
  unlock(&map_lock);
}

void __bunkai_remote_exit(uint64_t ret) {
  struct rthread *t = me();
  if (t) {
    send_msg(t->fd, BKS_EXIT, ret, 0, 0, 0, 0);
    sc1(SYS_close, t->fd);
    for (int i = 0; i < BKS_MAX_THREADS; i++)
      if (g.threads[i] == t) g.threads[i] = 0;
  }
  sc1(SYS_exit, 0);
  __builtin_unreachable();
}

static void remote_thread(void *p) {
  struct rthread *t = p;
  t->ktid = (int)sc0(SYS_gettid);
  /* only the synchronous signals reach a remote thread: the program's
   * signals are delivered on the home host, to the executor */
  uint64_t mask = ~0ull;
  mask &= ~(1ull << (SIGSYS - 1)) & ~(1ull << (SIGSEGV - 1)) & ~(1ull << (SIGBUS - 1)) & ~(1ull << (SIGILL - 1)) &
          ~(1ull << (SIGFPE - 1)) & ~(1ull << (SIGTRAP - 1));
  sc4(SYS_rt_sigprocmask, SIG_SETMASK, &mask, 0, 8);
  /* our handlers run on a stack of ours: the program's stack may not be
   * mapped here yet, and its pages are better left where they are */
  stack_t alt = {.ss_sp = priv_alloc(64 * 1024), .ss_size = 64 * 1024};
  sc2(SYS_sigaltstack, &alt, 0);
  t->selector = 1; /* SYSCALL_DISPATCH_FILTER_BLOCK */
  long r = sc5(SYS_prctl, PR_SET_SYSCALL_USER_DISPATCH, 1 /* ON */, g.text_lo, g.text_hi - g.text_lo, &t->selector);
  if (r) die("Syscall User Dispatch is not available (%d)", r, 0, 0, 0);
  __bunkai_run_on(t->sp, t->fn, t->arg);
}

static void start_remote(int fd) {
  struct bks_msg m;
  struct bks_start st;
  if (recv_msg(fd, &m, &st, sizeof st) || m.type != BKS_START || m.len != sizeof st) {
    sc1(SYS_close, fd);
    return;
  }
  tune_socket(fd);
  struct rthread *t = priv_alloc(sizeof *t);
  t->fd = fd, t->thread = st.thread, t->tid = st.tid, t->pid = st.pid;
  t->fn = st.fn, t->arg = st.arg, t->sp = st.sp, t->fs = st.fs;
  int slot = -1;
  for (int i = 0; i < BKS_MAX_THREADS && slot < 0; i++)
    if (!g.threads[i]) slot = i;
  if (slot < 0) die("more than %d threads on this node", BKS_MAX_THREADS, 0, 0, 0);
  g.threads[slot] = t;
  char *stack = priv_alloc(64 * 1024);
  long r = __bunkai_clone(CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM | CLONE_SETTLS,
                          stack + 64 * 1024, st.fs, remote_thread, t);
  if (r < 0) die("cannot create a thread (%d)", r, 0, 0, 0);
}

static void node_ctrl(struct bks_msg *m, char *pl) {
  static uint8_t data[PAGE] __attribute__((aligned(64)));
  uint64_t page = m->a;
  switch (m->type) {
  case BKS_GRANT:
  case BKS_FETCH:
  case BKS_DOWNGRADE:
  case BKS_TAKE:
  case BKS_INVALIDATE:
    fresh_take(page, page + PAGE);
    break;
  case BKS_UNMAP:
    fresh_take(m->a, m->b);
    break;
  case BKS_REMAP:
    fresh_take(m->a, m->a + m->c);
    fresh_take(m->b, m->b + m->c);
    break;
  }
  switch (m->type) {
  case BKS_GRANT:
    if (m->len == PAGE) {
      uffd_install(page, pl, m->b == 1);
    } else {
      /* an upgrade of the copy we hold, or "you have it" */
      if (m->b == 2) uffd_wp(page, 0);
      uffd_wake(page);
    }
    break;
  case BKS_FETCH:
  case BKS_DOWNGRADE:
  case BKS_TAKE:
    if (!present(page)) {
      memset(data, 0, PAGE);
    } else {
      if (m->type != BKS_FETCH) uffd_wp(page, 1);
      memcpy(data, (void *)page, PAGE);
    }
    send_msg(g.hosts[0].fd, BKS_DATA, page, 0, 0, data, PAGE);
    if (m->type == BKS_TAKE) sc3(SYS_madvise, page, PAGE, MADV_DONTNEED);
    break;
  case BKS_INVALIDATE:
    sc3(SYS_madvise, page, PAGE, MADV_DONTNEED);
    send_msg(g.hosts[0].fd, BKS_ACK, page, 0, 0, 0, 0);
    break;
  case BKS_UNMAP:
    sc2(SYS_munmap, m->a, m->b - m->a);
    break;
  case BKS_REMAP:
    if (mapped_here(m->a)) {
      sc2(SYS_munmap, m->b, m->c); /* whatever a thread mapped there meanwhile */
      sc5(SYS_mremap, m->a, m->c, m->c, MREMAP_MAYMOVE | MREMAP_FIXED, m->b);
    }
    break;
  case BKS_PROTECT:
    if (mapped_here(m->a)) sc3(SYS_mprotect, m->a, m->b, m->c);
    break;
  case BKS_QUIT:
    sc1(SYS_exit_group, (long)m->a);
    break;
  default:
    die("unexpected message from home (type %d)", m->type, 0, 0, 0);
  }
}

static void node_manager(void) {
  static char pl[PAGE + 512];
  struct pollfd pf[3];
  /* pages this node asked for: 1 read, 2 write */
  static struct { uint64_t page; int mode; } asked[4096];
  for (;;) {
    pf[0] = (struct pollfd){g.uffd, POLLIN, 0};
    pf[1] = (struct pollfd){g.hosts[0].fd, POLLIN, 0};
    pf[2] = (struct pollfd){g.listen_fd, POLLIN, 0};
    long r = spin_poll(pf, 3);
    if (r < 0) continue;
    if (pf[0].revents) {
      struct uffd_msg msgs[16];
      long n = sc3(SYS_read, g.uffd, msgs, sizeof msgs);
      for (long i = 0; n > 0 && i < n / (long)sizeof msgs[0]; i++) {
        if (msgs[i].event != UFFD_EVENT_PAGEFAULT) continue;
        uint64_t f = msgs[i].arg.pagefault.flags;
        uint64_t page = PAGE_DOWN(msgs[i].arg.pagefault.address);
        int write = (f & (UFFD_PAGEFAULT_FLAG_WRITE | UFFD_PAGEFAULT_FLAG_WP)) != 0;
        int mode = write ? 2 : 1;
        if (!(f & UFFD_PAGEFAULT_FLAG_WP) && fresh_take(page, page + PAGE)) {
          uffd_install(page, zero_page, 0);
          continue;
        }
        unsigned k = (unsigned)((page >> 12) & 4095);
        if (asked[k].page == page && asked[k].mode >= mode) continue;
        asked[k].page = page, asked[k].mode = mode;
        send_msg(g.hosts[0].fd, BKS_PAGE_REQ, page, (uint64_t)write | ((f & UFFD_PAGEFAULT_FLAG_WP) ? 2 : 0), 0, 0, 0);
      }
    }
    if (pf[1].revents) {
      struct bks_msg m;
      int e = recv_msg(g.hosts[0].fd, &m, pl, sizeof pl);
      if (e) sc1(SYS_exit_group, 0); /* the program ended at home (or home is gone) */
      if (m.type == BKS_GRANT) {
        unsigned k = (unsigned)((m.a >> 12) & 4095);
        if (asked[k].page == m.a) asked[k].page = 0;
      }
      node_ctrl(&m, pl);
      __atomic_add_fetch(&g.processed, 1, __ATOMIC_RELEASE);
      if (__atomic_load_n(&g.processed_waiters, __ATOMIC_ACQUIRE))
        sc6(SYS_futex, (long)&g.processed, FUTEX_WAKE_PRIVATE, 1 << 30, 0, 0, 0);
    }
    if (pf[2].revents) {
      int fd = (int)sc4(SYS_accept4, g.listen_fd, 0, 0, SOCK_CLOEXEC);
      if (fd >= 0) start_remote(hide_fd(fd));
    }
  }
}

/* ------------------------------------------------------------------ */
/* The placement point                                                 */

__attribute__((visibility("default"))) int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
  if (g.role == ROLE_HOME) return home_create(t, attr, fn, arg);
  if (g.role == ROLE_REPLICA) {
    struct rthread *self = me();
    if (!self) return EAGAIN;
    struct bks_msg m;
    uint64_t a = (uint64_t)arg;
    return (int)rpc(self, BKS_CREATE, (uint64_t)t, (uint64_t)attr, (uint64_t)fn, &a, sizeof a, &m, 0, 0);
  }
  if (!g.real_create) g.real_create = dlsym(RTLD_NEXT, "pthread_create");
  return g.real_create(t, attr, fn, arg);
}

/* A home thread ending through pthread_exit pins its TID word's page as
 * one that returns does (home_thread). On a node, pthread_exit is forwarded
 * like any call that is not the thread's own business: not here. */
__attribute__((visibility("default"), noreturn)) void pthread_exit(void *ret) {
  if (g.role == ROLE_HOME && g.nhosts > 1 && (uint32_t)sc0(SYS_getpid) == g.home_pid) pin_tid_word();
  if (!g.real_exit) g.real_exit = dlsym(RTLD_NEXT, "pthread_exit");
  g.real_exit(ret);
}

/* ------------------------------------------------------------------ */
/* Start-up                                                            */

static void install(int sig, void (*h)(int, siginfo_t *, void *)) {
  struct { void *h; unsigned long flags; void *restorer; uint64_t mask; } sa = {
      (void *)h, SA_SIGINFO | SA_RESTORER | SA_NODEFER | SA_ONSTACK, (void *)__bunkai_restorer, 0};
  sc4(SYS_rt_sigaction, sig, &sa, 0, 8);
}

/* Our own mappings: from this library's first byte to the end of its bss. */
extern const char __ehdr_start[] __attribute__((visibility("hidden")));
extern char _end[] __attribute__((visibility("hidden")));

static void find_self(char *buf, long cap) {
  g.lib_lo = PAGE_DOWN(__ehdr_start);
  g.lib_hi = PAGE_UP(_end);
  read_maps(buf, cap);
  const char *p = buf;
  struct vma v;
  uint64_t here = (uint64_t)(void *)find_self;
  while (next_vma(&p, &v))
    if (here >= v.start && here < v.end) g.text_lo = v.start, g.text_hi = v.end;
}

/* Turns the program's writable file mappings into anonymous memory and
 * registers every shared mapping; on a node, also empties them. */
static void prepare_memory(char *buf, long cap, int empty) {
  read_maps(buf, cap);
  const char *p = buf;
  struct vma v;
  /* first pass: conversions (they change the maps) */
  while (next_vma(&p, &v))
    if (is_shared_mem(&v) && v.inode != 0) make_anonymous(&v);
  read_maps(buf, cap);
  p = buf;
  while (next_vma(&p, &v)) {
    if (!is_shared_mem(&v)) continue;
    long r = uffd_register(v.start, v.end);
    if (r) die("cannot register 0x%x-0x%x %s with userfaultfd (%d)", (long)v.start, (long)v.end, (long)v.path, r);
    if (g.role == ROLE_HOME) add_reg(v.start, v.end);
    if (empty) sc3(SYS_madvise, v.start, v.end - v.start, MADV_DONTNEED);
  }
}

static void parse_token(const char **s) {
  int k = 0;
  while (**s && **s != ' ' && k < 32) g.token[k++] = *(*s)++;
  g.token[k] = 0;
}

static void home_start(const char *s, char *buf, long cap) {
  /* "home <listen fd> <nodes> <stats fd> <place> <token>" */
  int lfd = (int)parse_u(&s, 10);
  s++;
  int nodes = (int)parse_u(&s, 10);
  s++;
  int sfd = (int)parse_u(&s, 10);
  s++;
  g.place = sprefix(s, "remote") ? 1 : sprefix(s, "home") ? 2 : 0;
  while (*s && *s != ' ') s++;
  if (*s) s++;
  parse_token(&s);
  if (nodes < 0 || nodes >= BKS_MAX_HOSTS) die("too many nodes (%d; at most %d)", nodes, BKS_MAX_HOSTS - 1, 0, 0);
  g.nhosts = 1 + nodes;
  long st = sc6(SYS_mmap, 0, BKS_STATS_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
  if (st < 0) die("the stats descriptor %d is not usable (%d) (start programs with `bunkai share run`)", sfd, st, 0, 0);
  /* move the page into our region */
  void *to = priv_alloc(BKS_STATS_SIZE);
  sc5(SYS_mremap, st, BKS_STATS_SIZE, BKS_STATS_SIZE, MREMAP_MAYMOVE | MREMAP_FIXED, to);
  g.stats = to;
  sc1(SYS_close, sfd);
  g.stats->magic = BKS_MAGIC, g.stats->version = BKS_VERSION, g.stats->hosts = (uint32_t)g.nhosts;
  g.home_pid = (uint32_t)sc0(SYS_getpid);
  g.real_create = dlsym(RTLD_NEXT, "pthread_create");
  if (!g.real_create || !g.real_exit) die("cannot find the real pthread_create and pthread_exit", 0, 0, 0, 0);
  lfd = hide_fd(lfd);
  /* the replicas call in */
  uint64_t deadline = now_ns() + 30ull * 1000000000ull;
  for (int got = 0; got < nodes;) {
    struct pollfd pf = {lfd, POLLIN, 0};
    uint64_t now = now_ns();
    if (now >= deadline) die("%d of %d nodes did not call in within 30 s (check the nodes' logs)", nodes - got, nodes, 0, 0);
    if (sc3(SYS_poll, &pf, 1, (long)((deadline - now) / 1000000)) <= 0) continue;
    struct sockaddr_in a;
    int alen = sizeof a;
    int fd = (int)sc4(SYS_accept4, lfd, &a, &alen, SOCK_CLOEXEC);
    if (fd < 0) continue;
    fd = hide_fd(fd);
    tune_socket(fd);
    struct bks_msg m;
    struct bks_hello hi;
    if (recv_msg(fd, &m, &hi, sizeof hi) || m.type != BKS_HELLO || hi.magic != BKS_MAGIC ||
        hi.version != BKS_VERSION || hi.host < 1 || (int)hi.host > nodes || g.hosts[hi.host].fd) {
      sc1(SYS_close, fd);
      continue;
    }
    int ok = 1;
    for (int k = 0; k < 32; k++) ok &= hi.token[k] == g.token[k];
    if (!ok) { sc1(SYS_close, fd); continue; }
    g.hosts[hi.host] = (struct host){fd, a.sin_addr.s_addr, hi.port, hi.pid, 0};
    got++;
  }
  sc1(SYS_close, lfd);
  uffd_open(1);
  g.uffd = hide_fd(g.uffd);
  prepare_memory(buf, cap, 0);
  g.qevent = hide_fd((int)sc2(SYS_eventfd2, 0, O_CLOEXEC));
  g.stats->started_ns = now_ns();
  char *stack = priv_alloc(1 << 20);
  long r = __bunkai_clone(CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM,
                          stack + (1 << 20), 0, home_manager, 0);
  if (r < 0) die("cannot start the manager thread (%d)", r, 0, 0, 0);
}

static uint64_t replica_main(void *buf) {
  prepare_memory(buf, 1 << 20, 1);
  install(SIGSYS, sigsys);
  install(SIGSEGV, sigsegv);
  install(SIGBUS, sigsegv);
  uint64_t all = ~0ull;
  sc4(SYS_rt_sigprocmask, SIG_SETMASK, &all, 0, 8);
  sc2(SYS_set_robust_list, 0, 0);
  node_manager();
  return 0;
}

static void replica_start(const char *s, char *buf) {
  /* "replica <host> <a.b.c.d:port> <token>" */
  g.self = (int)parse_u(&s, 10);
  s++;
  uint32_t ip = 0;
  for (int k = 0; k < 4; k++) {
    ip |= (uint32_t)parse_u(&s, 10) << (8 * k);
    s++;
  }
  uint16_t port = (uint16_t)parse_u(&s, 10);
  if (*s) s++;
  parse_token(&s);
  if (g.self < 1 || g.self >= BKS_MAX_HOSTS || !port) die("bad BUNKAI_SHARE for a replica", 0, 0, 0, 0);
  /* our listener for thread connections */
  int lfd = hide_fd((int)sc3(SYS_socket, AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct sockaddr_in a = {.sin_family = AF_INET};
  int alen = sizeof a;
  if (sc3(SYS_bind, lfd, &a, sizeof a) || sc2(SYS_listen, lfd, 128) || sc3(SYS_getsockname, lfd, &a, &alen))
    die("cannot listen for threads", 0, 0, 0, 0);
  g.listen_fd = lfd;
  int fd = -1;
  uint64_t deadline = now_ns() + 10ull * 1000000000ull;
  while ((fd = tcp_connect(ip, port)) < 0) {
    if (now_ns() > deadline) die("cannot reach the home host (%d)", fd, 0, 0, 0);
    struct timespec ts = {0, 20 * 1000000};
    sc2(SYS_nanosleep, &ts, 0);
  }
  g.hosts[0].fd = fd;
  struct bks_hello hi = {BKS_MAGIC, BKS_VERSION, (uint32_t)g.self, __builtin_bswap16(a.sin_port), 0,
                         (uint32_t)sc0(SYS_getpid), {0}};
  memcpy(hi.token, g.token, 32);
  send_msg(fd, BKS_HELLO, 0, 0, 0, &hi, sizeof hi);
  uffd_open(0);
  g.uffd = hide_fd(g.uffd);
  /* off the program's stack (it is about to be emptied), never to return */
  char *stack = priv_alloc(1 << 20);
  __bunkai_call_on(stack + (1 << 20), replica_main, buf);
  sc1(SYS_exit_group, 0);
}

__attribute__((constructor)) static void bunkai_share_init(int argc, char **argv, char **envp) {
  (void)argc, (void)argv;
  char *val = 0;
  for (char **e = envp; e && *e; e++)
    if (sprefix(*e, "BUNKAI_SHARE=")) val = *e + 13;
  if (!val) return;
  int home = sprefix(val, "home "), replica = sprefix(val, "replica ");
  if (!home && !replica) return;
  /* children of the program (and what they exec) run unshared */
  val[0] = '-';
  g.role = home ? ROLE_HOME : ROLE_REPLICA;
  g.real_exit = dlsym(RTLD_NEXT, "pthread_exit"); /* now: a replica may not call libc later */
  sc2(SYS_prctl, PR_SET_THP_DISABLE, 1);
  long r = sc6(SYS_mmap, BKS_PRIVATE_BASE, BKS_PRIVATE_SIZE, PROT_NONE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (r != (long)BKS_PRIVATE_BASE) die("cannot reserve the private region at 0x%x (%d)", (long)BKS_PRIVATE_BASE, r, 0, 0);
  g.priv_next = BKS_PRIVATE_BASE;
  char *buf = priv_alloc(1 << 20);
  find_self(buf, 1 << 20);
  if (home) home_start(val + 5, buf, 1 << 20);
  else replica_start(val + 8, buf);
}
