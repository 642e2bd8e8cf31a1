/* executor.c: the control part (§4.2, §5.1) on the home host: placement
 * of new threads, and the executor threads that run a remote thread's
 * system calls as the home process. Rules: runtime.h.
 *
 * The placement point is pthread_create. A thread placed on a node is
 * created on the home host by glibc as usual; that home thread is its
 * executor: it moves to a private stack, asks the node to start the start
 * routine on the thread's own stack and thread pointer, and then runs
 * every call the remote thread forwards, with the process's identity,
 * descriptors and working directory. Calls that change mappings are
 * answered only with the control sequence the node must reach first
 * (BKS_RES_MAPS_CHANGED), so the thread never uses an address its node
 * has not caught up with. When the start routine returns on the node, the
 * executor returns the same value, so pthread_join, thread-specific data
 * destructors and stack reuse happen in glibc on the home host. */
#include "runtime.h"
#include <sys/prctl.h>
#include <asm/prctl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#ifndef MADV_DONTNEED_LOCKED
#define MADV_DONTNEED_LOCKED 24
#endif

struct xbox {
  void *(*fn)(void *);
  void *arg;
  uint32_t thread, host;
  uint64_t app_sp, fs;
};

static int thread_slot(uint32_t no) { return (int)(no < BKS_MAX_THREADS ? no : BKS_MAX_THREADS - 1); }

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
         !page_here((uint64_t)res);
}

/* Calls after which the caller's node must catch up with the manager
 * before the thread goes on: they change mappings, or return an address
 * that an unmap the node has not applied yet may still cover. */
static int is_mapping_call(long nr) {
  return nr == SYS_mmap || nr == SYS_munmap || nr == SYS_mremap || nr == SYS_brk || nr == SYS_shmat ||
         nr == SYS_shmdt || nr == SYS_remap_file_pages;
}

static int is_zap(long nr, const struct bks_syscall *s) {
  long advice = (long)s->arg[2];
  return nr == SYS_madvise && (advice == MADV_DONTNEED || advice == MADV_FREE || advice == MADV_DONTNEED_LOCKED);
}

static long forbidden(long nr) {
  return nr == SYS_clone || nr == SYS_clone3 || nr == SYS_fork || nr == SYS_vfork || nr == SYS_execve ||
         nr == SYS_execveat || nr == SYS_rt_sigreturn;
}

/* A home thread about to end hands its TID word to the manager. The
 * kernel clears that word and wakes its joiners when the thread exits, but
 * takes no userfault for an exiting thread: if a node held the page then
 * (a joiner on a node reads the word), the clear would be lost and the
 * joiner would wait for ever. So the kernel is told to clear a word of
 * ours instead (set_tid_address), and the manager, once the thread's pidfd
 * says it has gone, makes the page home's, clears the real word and wakes
 * its waiters, as the kernel would have. Nothing is held meanwhile: the
 * thread's destructors may still need that page from a node. */
void hand_over_tid_word(void) {
  uint64_t tidp = 0;
  if (sc2(SYS_prctl, PR_GET_TID_ADDRESS, &tidp) || !tidp) return;
  int pidfd = (int)sc2(SYS_pidfd_open, sc0(SYS_gettid), 0x80 /* PIDFD_THREAD */);
  if (pidfd < 0) return; /* the kernel clears it, as natively */
  struct item *it = item_get(); /* the manager keeps it until the thread is gone */
  it->kind = ITEM_TID, it->page = tidp, it->pidfd = hide_fd(pidfd);
  sc1(SYS_set_tid_address, &it->tid_sink);
  ask_manager(it);
}

/* Connects to node h's thread listener from the address that node knows
 * us by and sends our hello with START behind it (one flight: no round
 * trip before the thread starts), then waits for the replica to show it
 * holds the run key. A replica busy with peers that say nothing closes
 * the connection before it reads anything: that is tried again, with a
 * new hello, for up to 30 s; anything else ends the run. */
static int connect_node(int h, const struct bks_start *st) {
  uint64_t deadline = now_ns() + 30ull * 1000000000ull;
  for (;;) {
    struct sockaddr_in local;
    int alen = sizeof local;
    sc3(SYS_getsockname, g.hosts[h].fd, &local, &alen);
    int fd = hide_fd((int)sc3(SYS_socket, AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd < 0) return fd;
    local.sin_port = 0;
    sc3(SYS_bind, fd, &local, sizeof local);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = __builtin_bswap16(g.hosts[h].port),
                            .sin_addr = {g.hosts[h].ip}};
    long r;
    do r = sc3(SYS_connect, fd, &a, sizeof a);
    while (r == -EINTR);
    if (r) {
      sc1(SYS_close, fd);
      return (int)r; /* the replica is gone */
    }
    tune_socket(fd);
    struct bks_auth_hello ah;
    int e = auth_hello(fd, BKS_ROLE_THREAD, h, &ah);
    if (!e) {
      send_msg(fd, BKS_START, 0, 0, 0, st, sizeof *st);
      e = auth_check(fd, &ah);
    }
    if (!e) return fd;
    sc1(SYS_close, fd);
    if (e != AUTH_IO) die("node %d's replica failed the handshake (%s)", h, (long)auth_error(e), 0, 0);
    if (now_ns() > deadline) die("node %d's replica refused our connections for 30 s (%s)", h, (long)auth_error(e), 0, 0);
    sleep_ms(50);
  }
}

static uint64_t executor(void *p) {
  struct xbox *x = p;
  int h = (int)x->host;
  int tid = (int)sc0(SYS_gettid);
  struct bks_thread_stats *ts = &g.stats->thread[thread_slot(x->thread)];
  ts->thread = x->thread, ts->host = x->host, ts->tid = (uint32_t)tid;
  if (g.stats->nthreads < x->thread + 1 && x->thread < BKS_MAX_THREADS) g.stats->nthreads = x->thread + 1;
  __atomic_fetch_add(&g.stats->host[h].threads, 1, __ATOMIC_RELAXED);
  struct bks_start st = {(uint64_t)x->fn, (uint64_t)x->arg, x->app_sp, x->fs, x->thread, (uint32_t)tid, g.home_pid, 0};
  int fd = connect_node(h, &st);
  if (fd < 0) node_gone(h, fd);
  uint64_t ret = 0;
  for (;;) {
    struct bks_msg m;
    union { struct bks_syscall s; uint64_t arg; char raw[64]; } pl;
    int r = recv_msg(fd, &m, &pl, sizeof pl);
    if (r) node_gone(h, r);
    if (m.type == BKS_SYSCALL && m.len == sizeof pl.s) {
      long nr = (long)pl.s.nr;
      long res;
      uint64_t flags = 0, seq = 0;
      if (nr < 0 || nr > 1023 || forbidden(nr)) {
        res = -ENOSYS; /* §5.2 (3): not a valid call here */
      } else if (is_zap(nr, &pl.s)) {
        struct item it = {.kind = ITEM_ZAP, .host = h, .page = pl.s.arg[0], .len = PAGE_UP(pl.s.arg[1]), .prot = pl.s.arg[2]};
        if (pl.s.arg[0] & (PAGE - 1)) {
          res = -EINVAL;
        } else {
          seq = ask_manager(&it);
          res = (long)it.result_status;
          flags = BKS_RES_MAPS_CHANGED;
        }
      } else {
        if (nr == SYS_exit_group) sc1(SYS_exit_group, pl.s.arg[0]);
        res = sc6(nr, (long)pl.s.arg[0], (long)pl.s.arg[1], (long)pl.s.arg[2], (long)pl.s.arg[3],
                  (long)pl.s.arg[4], (long)pl.s.arg[5]);
        if (is_fresh_mapping(nr, &pl.s, res)) {
          struct item it = {.kind = ITEM_FRESH, .host = h, .page = (uint64_t)res, .len = PAGE_UP(pl.s.arg[1]),
                            .prot = pl.s.arg[2]};
          seq = ask_manager(&it);
          flags = BKS_RES_MAPS_CHANGED;
        } else if ((nr == SYS_mprotect || nr == SYS_pkey_mprotect) && res == 0) {
          struct item it = {.kind = ITEM_PROTECT, .host = h, .page = pl.s.arg[0], .len = pl.s.arg[1], .prot = pl.s.arg[2]};
          seq = ask_manager(&it);
          flags = BKS_RES_MAPS_CHANGED;
        } else if (is_mapping_call(nr)) {
          struct item it = {.kind = ITEM_BARRIER, .host = h};
          seq = ask_manager(&it);
          flags = BKS_RES_MAPS_CHANGED;
        }
      }
      ts->syscalls++;
      __atomic_fetch_add(&g.stats->host[h].syscalls, 1, __ATOMIC_RELAXED);
      send_msg(fd, BKS_RESULT, (uint64_t)res, flags, seq, 0, 0);
    } else if (m.type == BKS_MAPINFO) {
      struct item it;
      uint64_t seq;
      for (int tries = 0;; tries++) {
        it = (struct item){.kind = ITEM_MAPINFO, .host = h, .page = m.a, .len = m.b};
        seq = ask_manager(&it);
        if (it.result_status != BKS_MAPPED_CONVERT) break;
        if (tries > 100) die("the mapping at 0x%x keeps changing while a node maps it", (long)m.a, 0, 0, 0);
        convert_at(m.a); /* a file mapping: here, not in the manager (convert.c) */
      }
      send_msg(fd, BKS_MAPPED, it.result_status, it.prot, seq, 0, 0);
    } else if (m.type == BKS_CREATE && m.len == 8) {
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
  hand_over_tid_word();
  return ret;
}

/* Executors' private stacks, reused: a program that makes threads all
 * day must not run out of the private region. */
#define XSTACK (256 * 1024)
static volatile int xstack_lock;
static char *xstacks[64];
static int nxstacks;

static void *exec_start(void *p) {
  struct xbox *x = p;
  sc2(SYS_arch_prctl, ARCH_GET_FS, &x->fs);
  /* the remote thread's frames go below ours, with a margin */
  uint64_t sp;
  __asm__ volatile("mov %%rsp, %0" : "=r"(sp));
  x->app_sp = (sp - 1024) & ~15ull;
  lock(&xstack_lock);
  char *stack = nxstacks ? xstacks[--nxstacks] : 0;
  unlock(&xstack_lock);
  if (!stack) stack = priv_alloc(XSTACK);
  void *r = (void *)__bunkai_call_on(stack + XSTACK, executor, x);
  lock(&xstack_lock);
  if (nxstacks < 64) xstacks[nxstacks++] = stack;
  unlock(&xstack_lock);
  return r;
}

/* A thread placed on the home host: the program's start routine, then its
 * TID word goes to the manager (hand_over_tid_word). */
static void *home_thread(void *p) {
  struct xbox *x = p;
  void *r = x->fn(x->arg);
  hand_over_tid_word();
  return r;
}

static int place(uint32_t no) {
  int nodes = g.nhosts - 1;
  if (nodes <= 0 || g.place == 2) return 0;
  if (g.place == 1) return 1 + (int)((no - 1) % (uint32_t)nodes);
  return (int)(no % (uint32_t)g.nhosts);
}

int home_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
  if ((uint32_t)sc0(SYS_getpid) != g.home_pid) return g.real_create(t, attr, fn, arg); /* a forked child: unshared */
  uint32_t no = __atomic_add_fetch(&g.next_thread, 1, __ATOMIC_SEQ_CST);
  int h = place(no);
  if (h == 0) {
    struct bks_thread_stats *ts = &g.stats->thread[thread_slot(no)];
    ts->thread = no, ts->host = 0;
    if (g.stats->nthreads < no + 1 && no < BKS_MAX_THREADS) g.stats->nthreads = no + 1;
    __atomic_fetch_add(&g.stats->host[0].threads, 1, __ATOMIC_RELAXED);
  }
  if (h == 0 && g.nhosts == 1) return g.real_create(t, attr, fn, arg);
  struct xbox *x = priv_alloc(sizeof *x);
  x->fn = fn, x->arg = arg, x->thread = no, x->host = (uint32_t)h;
  return g.real_create(t, attr, h == 0 ? home_thread : exec_start, x);
}
