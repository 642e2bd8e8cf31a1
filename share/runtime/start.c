/* start.c: how sharing starts (bunkai_share.h section 1), and the calls
 * the runtime takes over: pthread_create (the placement point),
 * pthread_exit (a home thread's exit pins its TID word), and the doorbell
 * the audit library rings when the dynamic linker has loaded objects
 * (audit.c). Rules: runtime.h. */
#include "runtime.h"
#include <dlfcn.h>
#include <sys/prctl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#ifndef SA_RESTORER
#define SA_RESTORER 0x04000000
#endif

/* ------------------------------------------------------------------ */
/* The placement point                                                 */

__attribute__((visibility("default"))) int pthread_create(pthread_t *t, const pthread_attr_t *attr,
                                                          void *(*fn)(void *), void *arg) {
  if (g.role == ROLE_HOME) return home_create(t, attr, fn, arg);
  if (g.role == ROLE_REPLICA) {
    /* a remote thread creates a thread: the home host creates and places it */
    struct rthread *self = me();
    if (!self) return EAGAIN;
    struct bks_msg m;
    uint64_t a = (uint64_t)arg;
    send_msg(self->fd, BKS_CREATE, (uint64_t)t, (uint64_t)attr, (uint64_t)fn, &a, sizeof a);
    int e = recv_msg(self->fd, &m, 0, 0);
    if (e) home_ended(e, "a thread waited for pthread_create at home");
    return (int)m.a;
  }
  if (!g.real_create) g.real_create = dlsym(RTLD_NEXT, "pthread_create");
  return g.real_create(t, attr, fn, arg);
}

/* A home thread ending through pthread_exit hands its TID word to the
 * manager as one that returns does (executor.c). On a node, pthread_exit
 * is forwarded like any call that is not the thread's own business: not
 * here. */
__attribute__((visibility("default"), noreturn)) void pthread_exit(void *ret) {
  if (g.role == ROLE_HOME && g.nhosts > 1 && (uint32_t)sc0(SYS_getpid) == g.home_pid) hand_over_tid_word();
  if (!g.real_exit) g.real_exit = dlsym(RTLD_NEXT, "pthread_exit");
  g.real_exit(ret);
}

/* ------------------------------------------------------------------ */
/* The doorbell: the first page of the private region, at the same
 * address in every namespace of the process. The audit library
 * (libbunkai-share-audit.so, loaded by LD_AUDIT in a namespace of its own,
 * so it cannot see `g`) calls `loaded` after the dynamic linker has mapped
 * new objects and before it relocates them: their writable parts become
 * shared memory before anything is written there (home_manager.c, prepare). */

#define DOORBELL_MAGIC 0x6c6c65626f6f6442ull /* "Bdoobell" */
struct doorbell {
  uint64_t magic;
  uint32_t pid;
  uint32_t pad;
  void (*loaded)(const uint64_t *bases, int n);
};

/* bases: the new objects' load addresses; n < 0: unknown (too many).
 * Runs on the thread that is loading them: it converts their writable
 * file mappings itself (convert.c), then has the manager register them. */
static void loaded(const uint64_t *bases, int n) {
  if (g.role != ROLE_HOME || g.nhosts < 2 || (uint32_t)sc0(SYS_getpid) != g.home_pid) return;
  struct item *it = item_get();
  it->kind = ITEM_PREPARE;
  it->nbases = convert_loaded(bases, n, it->bases, ITEM_BASES);
  if (it->nbases) ask_manager(it);
  item_put(it);
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
 * registers every shared mapping; on a node, also empties them. Runs
 * before the program has threads. */
void home_register(uint64_t s, uint64_t e);
static void prepare_memory(char *buf, long cap, int empty) {
  read_maps(buf, cap);
  const char *p = buf;
  struct vma v;
  /* first pass: conversions (they change the maps) */
  while (next_vma(&p, &v))
    if (is_shared_mem(&v) && v.inode != 0 && make_anonymous(&v))
      die("cannot make %s's data anonymous", (long)v.path, 0, 0, 0);
  read_maps(buf, cap);
  p = buf;
  while (next_vma(&p, &v)) {
    if (!is_shared_mem(&v)) continue;
    if (g.role == ROLE_REPLICA && sequal(v.path, "[stack]")) {
      /* the replica's stack is emptied and never used by the replica: a
       * plain mapping in its place, so it does not grow down by itself
       * into addresses home has not shared (the home stack's growth is
       * learned like any mapping) */
      long r = sc6(SYS_mmap, v.start, v.end - v.start, v.prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
      if (r != (long)v.start) die("cannot replace the replica's stack (%d)", r, 0, 0, 0);
    }
    if (g.role == ROLE_HOME) {
      home_register(v.start, v.end);
    } else {
      long r = uffd_register(v.start, v.end);
      if (r) die("cannot register 0x%x-0x%x %s with userfaultfd (%d)", (long)v.start, (long)v.end, (long)v.path, r);
    }
    if (empty) sc3(SYS_madvise, v.start, v.end - v.start, MADV_DONTNEED);
  }
}

/* The run key, from the descriptor the CLI or the node left us. */
static void read_key(int fd) {
  uint8_t k[BKS_KEY_BYTES];
  int n = 0;
  while (n < (int)sizeof k) {
    long r = sc3(SYS_read, fd, k + n, sizeof k - (size_t)n);
    if (r == -EINTR) continue;
    if (r <= 0) die("no run key on descriptor %d (start programs with `bunkai share run`)", fd, 0, 0, 0);
    n += (int)r;
  }
  sc1(SYS_close, fd);
  memcpy(g.key, k, sizeof k);
}

static void ip_text(uint32_t ip, char *out) {
  long a[4] = {ip & 255, (ip >> 8) & 255, (ip >> 16) & 255, ip >> 24};
  fmt(out, 16, "%d.%d.%d.%d", a);
}

/* Replicas calling in (home_start). */
#define CALLERS 16
static struct caller {
  volatile int tid; /* nonzero while its worker lives */
  int fd;
  struct sockaddr_in a;
  char *stack;
} callers[CALLERS];
static volatile int hosts_lock, called_in;
static int g_nodes;

static void refuse_caller(int fd, const struct sockaddr_in *a, const char *why) {
  char ip[16];
  ip_text(a->sin_addr.s_addr, ip);
  say("bunkai share: refused a connection from %s:%d (%s)", (long)ip, __builtin_bswap16(a->sin_port), (long)why, 0);
  __atomic_fetch_add(&g.stats->refused, 1, __ATOMIC_RELAXED);
  sc1(SYS_close, fd);
}

static void hello(void *p) {
  struct caller *c = p;
  block_signals();
  int from = 0;
  int e = auth_server(c->fd, BKS_ROLE_CONTROL, &from);
  if (e) {
    refuse_caller(c->fd, &c->a, auth_error(e));
    return;
  }
  tune_socket(c->fd);
  struct bks_msg m;
  struct bks_hello hi;
  uint64_t deadline = now_ns() + (uint64_t)BKS_AUTH_MS * 1000000ull;
  if (rd_deadline(c->fd, &m, sizeof m, deadline) || m.type != BKS_HELLO || m.len != sizeof hi ||
      rd_deadline(c->fd, &hi, sizeof hi, deadline) || hi.magic != BKS_MAGIC || hi.version != BKS_VERSION ||
      hi.host < 1 || (int)hi.host > g_nodes || (int)hi.host != from) {
    refuse_caller(c->fd, &c->a, "no valid HELLO after the handshake");
    return;
  }
  lock(&hosts_lock);
  int dup = g.hosts[hi.host].fd != 0;
  if (!dup) {
    g.hosts[hi.host] = (struct host){c->fd, c->a.sin_addr.s_addr, hi.port, hi.pid, 0};
    __atomic_add_fetch(&called_in, 1, __ATOMIC_RELEASE);
  }
  unlock(&hosts_lock);
  if (dup) refuse_caller(c->fd, &c->a, "a second HELLO for the same host");
}

static void home_start(const char *s, char *buf, long cap) {
  /* "home <listen fd> <nodes> <stats fd> <place> <key fd>" */
  int lfd = (int)parse_u(&s, 10);
  s++;
  int nodes = (int)parse_u(&s, 10);
  s++;
  int sfd = (int)parse_u(&s, 10);
  s++;
  g.place = sprefix(s, "remote") ? 1 : sprefix(s, "home") ? 2 : 0;
  while (*s && *s != ' ') s++;
  if (*s) s++;
  int kfd = (int)parse_u(&s, 10);
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
  read_key(kfd);
  g.home_pid = (uint32_t)sc0(SYS_getpid);
  g.real_create = dlsym(RTLD_NEXT, "pthread_create");
  if (!g.real_create || !g.real_exit) die("cannot find the real pthread_create and pthread_exit", 0, 0, 0, 0);
  lfd = hide_fd(lfd);
  /* the replicas call in; each proves the run key before it is heard, on
   * a thread of its own (at most CALLERS at once), so that peers that
   * connect and say nothing cannot keep the nodes out */
  uint64_t deadline = now_ns() + 30ull * 1000000000ull;
  g_nodes = nodes;
  while (__atomic_load_n(&called_in, __ATOMIC_ACQUIRE) < nodes) {
    struct pollfd pf = {lfd, POLLIN, 0};
    uint64_t now = now_ns();
    if (now >= deadline)
      die("%d of %d nodes did not call in within 30 s (check the nodes' logs)", nodes - called_in, nodes, 0, 0);
    if (sc3(SYS_poll, &pf, 1, 100) <= 0) continue;
    struct sockaddr_in a;
    int alen = sizeof a;
    int fd = (int)sc4(SYS_accept4, lfd, &a, &alen, SOCK_CLOEXEC);
    if (fd < 0) continue;
    fd = hide_fd(fd);
    struct caller *c = 0;
    for (int i = 0; i < CALLERS && !c; i++)
      if (!__atomic_load_n(&callers[i].tid, __ATOMIC_ACQUIRE)) c = &callers[i];
    if (!c) {
      refuse_caller(fd, &a, "16 handshakes in progress already");
      continue;
    }
    if (!c->stack) c->stack = priv_alloc(64 * 1024);
    c->fd = fd, c->a = a, c->tid = 1;
    if (__bunkai_clone(THREAD_FLAGS | CLONE_CHILD_CLEARTID, c->stack + 64 * 1024, 0, hello, c, &c->tid) < 0) {
      c->tid = 0;
      refuse_caller(fd, &a, "no thread for its handshake");
    }
  }
  sc1(SYS_close, lfd);
  uffd_open(1);
  prepare_memory(buf, cap, 0);
  g.stats->started_ns = now_ns();
  home_manager_start();
  /* the doorbell rings from now on */
  struct doorbell *d = (struct doorbell *)BKS_PRIVATE_BASE;
  d->pid = g.home_pid, d->loaded = loaded;
  __atomic_store_n(&d->magic, DOORBELL_MAGIC, __ATOMIC_RELEASE);
}

static uint64_t replica_main(void *buf) {
  prepare_memory(buf, 1 << 20, 1);
  install(SIGSYS, sigsys);
  install(SIGSEGV, sigsegv);
  install(SIGBUS, sigsegv);
  uint64_t all = ~0ull;
  sc4(SYS_rt_sigprocmask, SIG_SETMASK, &all, 0, 8);
  sc2(SYS_set_robust_list, 0, 0);
  start_acceptor();
  node_manager();
  return 0;
}

static void replica_start(const char *s, char *buf) {
  /* "replica <host> <a.b.c.d:port> <key fd>" */
  g.self = (int)parse_u(&s, 10);
  s++;
  uint32_t ip = 0;
  for (int k = 0; k < 4; k++) {
    ip |= (uint32_t)parse_u(&s, 10) << (8 * k);
    s++;
  }
  uint16_t port = (uint16_t)parse_u(&s, 10);
  if (*s) s++;
  int kfd = (int)parse_u(&s, 10);
  if (g.self < 1 || g.self >= BKS_MAX_HOSTS || !port) die("bad BUNKAI_SHARE for a replica", 0, 0, 0, 0);
  read_key(kfd);
  g.home_ip = ip;
  int fd = -1;
  uint64_t deadline = now_ns() + 10ull * 1000000000ull;
  while ((fd = tcp_connect(ip, port)) < 0) {
    if (now_ns() > deadline) die("cannot reach the home host (%d)", fd, 0, 0, 0);
    sleep_ms(20);
  }
  struct bks_auth_hello ah;
  int e = auth_hello(fd, BKS_ROLE_CONTROL, 0, &ah);
  if (e) die("the home host failed the handshake (%s)", (long)auth_error(e), 0, 0, 0);
  /* our listener for thread connections, on the address home reached us
   * at, nowhere else */
  struct sockaddr_in a;
  int alen = sizeof a;
  sc3(SYS_getsockname, fd, &a, &alen);
  a.sin_port = 0;
  int lfd = hide_fd((int)sc3(SYS_socket, AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  alen = sizeof a;
  if (sc3(SYS_bind, lfd, &a, sizeof a) || sc2(SYS_listen, lfd, 128) || sc3(SYS_getsockname, lfd, &a, &alen))
    die("cannot listen for threads", 0, 0, 0, 0);
  g.listen_fd = lfd;
  struct bks_hello hi = {BKS_MAGIC, BKS_VERSION, (uint32_t)g.self, __builtin_bswap16(a.sin_port), 0,
                         (uint32_t)sc0(SYS_getpid)};
  send_msg(fd, BKS_HELLO, 0, 0, 0, &hi, sizeof hi);
  /* HELLO went with our hello; home's word is heard only once it has
   * shown it holds the run key */
  e = auth_check(fd, &ah);
  if (e) die("the home host failed the handshake (%s)", (long)auth_error(e), 0, 0, 0);
  /* only now is it home's: die() reports there from here on, never to a
   * peer that has not proven itself */
  g.hosts[0].fd = fd;
  uffd_open(0);
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
  /* keep our copy; children of the program (and what they exec) see
   * BUNKAI_SHARE=- and run unshared */
  char spec[128];
  size_t n = slen(val) < sizeof spec - 1 ? slen(val) : sizeof spec - 1;
  memcpy(spec, val, n);
  spec[n] = 0;
  val[0] = '-';
  for (char *c = val + 1; *c; c++) *c = ' ';
  g.role = home ? ROLE_HOME : ROLE_REPLICA;
  g.real_exit = dlsym(RTLD_NEXT, "pthread_exit"); /* now: a replica may not call libc later */
  sc2(SYS_prctl, PR_SET_THP_DISABLE, 1);
  long r = sc6(SYS_mmap, BKS_PRIVATE_BASE, BKS_PRIVATE_SIZE, PROT_NONE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (r != (long)BKS_PRIVATE_BASE) die("cannot reserve the private region at 0x%x (%d)", (long)BKS_PRIVATE_BASE, r, 0, 0);
  /* page 0: the doorbell (readable on every host, so the audit library
   * may look); our allocations start after it and a guard page */
  sc3(SYS_mprotect, BKS_PRIVATE_BASE, PAGE, PROT_READ | PROT_WRITE);
  g.priv_next = BKS_PRIVATE_BASE + 2 * PAGE;
  g.mem_fd = hide_fd((int)sc4(SYS_openat, AT_FDCWD, "/proc/self/mem", O_RDONLY | O_CLOEXEC, 0));
  g.pagemap_fd = hide_fd((int)sc4(SYS_openat, AT_FDCWD, "/proc/self/pagemap", O_RDONLY | O_CLOEXEC, 0));
  if (home) g.memw_fd = hide_fd((int)sc4(SYS_openat, AT_FDCWD, "/proc/self/mem", O_RDWR | O_CLOEXEC, 0));
  if (g.mem_fd < 0 || g.pagemap_fd < 0) die("cannot open /proc/self/mem and /proc/self/pagemap", 0, 0, 0, 0);
  char *buf = priv_alloc(1 << 20);
  find_self(buf, 1 << 20);
  if (home) home_start(spec + 5, buf, 1 << 20);
  else replica_start(spec + 8, buf);
}
