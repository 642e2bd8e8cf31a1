/* remote_thread.c: a thread of the program placed on this node. It runs
 * the start routine on its own stack and thread pointer, with Syscall User
 * Dispatch on: the SIGSYS handler runs the few calls that concern the
 * thread itself locally and forwards every other one to its executor on
 * the home host (§4.3); the SIGSEGV handler asks home how the faulting
 * address is mapped there and waits until this node's manager has mapped
 * it. Rules: runtime.h. */
#include "runtime.h"
#include <linux/futex.h>
#include <sys/prctl.h>
#include <sys/ucontext.h>

#ifndef PR_SET_SYSCALL_USER_DISPATCH
#define PR_SET_SYSCALL_USER_DISPATCH 59
#endif

static volatile int nthreads_hi; /* slots in g.threads ever used */

struct rthread *me(void) {
  int ktid = (int)sc0(SYS_gettid);
  int n = __atomic_load_n(&nthreads_hi, __ATOMIC_ACQUIRE);
  for (int i = 0; i < n; i++) {
    struct rthread *t = g.threads[i];
    if (t && t->ktid == ktid) return t;
  }
  return 0;
}

static long rpc(struct rthread *t, uint32_t type, uint64_t a, uint64_t b, uint64_t c, const void *pl, uint32_t len,
                struct bks_msg *reply) {
  send_msg(t->fd, type, a, b, c, pl, len);
  int r = recv_msg(t->fd, reply, 0, 0);
  if (r) home_ended(r, "a thread waited for its executor");
  return (long)reply->a;
}

/* Waits until this node's manager has handled control message seq. */
void wait_processed(uint32_t seq) {
  while ((int32_t)(__atomic_load_n(&g.processed, __ATOMIC_ACQUIRE) - seq) < 0) {
    __atomic_fetch_add(&g.processed_waiters, 1, __ATOMIC_SEQ_CST);
    uint32_t v = __atomic_load_n(&g.processed, __ATOMIC_ACQUIRE);
    if ((int32_t)(v - seq) < 0) sc6(SYS_futex, (long)&g.processed, FUTEX_WAIT_PRIVATE, v, 0, 0, 0);
    __atomic_fetch_sub(&g.processed_waiters, 1, __ATOMIC_SEQ_CST);
  }
}

void sigsys(int sig, siginfo_t *si, void *ctxp) {
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
  case SYS_exit: __bunkai_remote_exit(0);
  default: {
    /* everything else, madvise and the mapping calls included, runs at
     * home; a call that changed mappings comes back with the control
     * message this node must have handled before the thread goes on */
    struct bks_syscall s = {(uint64_t)nr, {(uint64_t)a0, (uint64_t)a1, (uint64_t)a2, (uint64_t)a3, (uint64_t)a4, (uint64_t)a5}};
    struct bks_msg m;
    res = rpc(t, BKS_SYSCALL, 0, 0, 0, &s, sizeof s, &m);
    if (m.b & BKS_RES_MAPS_CHANGED) wait_processed((uint32_t)m.c);
  }
  }
  r[REG_RAX] = res;
}

static NORETURN void crash(struct rthread *t, int sig, uint64_t addr) {
  send_msg(t->fd, BKS_CRASH, (uint64_t)sig, addr, 0, 0, 0);
  for (;;) sc0(SYS_pause); /* home ends the process */
}

void sigsegv(int sig, siginfo_t *si, void *ctxp) {
  ucontext_t *uc = ctxp;
  uint64_t addr = (uint64_t)si->si_addr;
  struct rthread *t = me();
  if (!t) die("signal %d at 0x%x outside the program's threads", sig, (long)addr, 0, 0);
  uint64_t err = (uint64_t)uc->uc_mcontext.gregs[REG_ERR];
  int access = (err & 16) ? 2 : (err & 2) ? 1 : 0; /* instruction fetch, write, read */
  /* Home answered the last fault here "mapped", and the node manager has
   * changed none of our mappings since, yet the access faults again: after
   * a few such, it is the program's fault. A new mapping at the same place
   * (a loop mapping, using and unmapping memory) is not a repeat. */
  uint32_t layout = __atomic_load_n(&g.layout, __ATOMIC_ACQUIRE);
  if (PAGE_DOWN(addr) == t->last_fault && layout == t->last_layout && ++t->repeats > 4) {
    say("thread %d faults at 0x%x again and again, which home says is mapped: taken as the program's fault",
        t->thread, (long)addr, 0, 0);
    crash(t, sig, addr);
  }
  if (PAGE_DOWN(addr) != t->last_fault || layout != t->last_layout) t->repeats = 0;
  t->last_fault = PAGE_DOWN(addr), t->last_layout = layout;
  if (sig != SIGSEGV) crash(t, sig, addr);
  struct bks_msg m;
  long st = rpc(t, BKS_MAPINFO, addr, (uint64_t)access, 0, 0, 0, &m);
  if (st == BKS_MAPPED_SHARED)
    die("thread %d touched 0x%x, in a MAP_SHARED mapping, which bunkai share does not keep coherent across hosts "
        "(share memory between threads with private mappings)", t->thread, (long)addr, 0, 0);
  if (st != BKS_MAPPED_OK) crash(t, sig, addr);
  wait_processed((uint32_t)m.c); /* then the access runs again */
}

void __bunkai_remote_exit(uint64_t ret) {
  struct rthread *t = me();
  if (t) {
    send_msg(t->fd, BKS_EXIT, ret, 0, 0, 0, 0);
    sc1(SYS_close, t->fd);
    for (int i = 0; i < BKS_MAX_THREADS; i++)
      if (g.threads[i] == t) __atomic_store_n(&g.threads[i], 0, __ATOMIC_RELEASE);
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
  /* the start routine's result goes home from a stack of ours (see
   * thread_x86_64.S); the signal stack is free once the routine returned */
  __bunkai_run_on(t->sp, t->fn, t->arg, (uint64_t)alt.ss_sp + alt.ss_size);
}

/* A thread connection has started a thread (a handshake worker,
 * node_manager.c; they run concurrently). Home numbers its threads once
 * each: a START for a number one of ours has is refused, so a routine never
 * runs twice. */
static volatile int threads_lock;
int remote_thread_spawn(int fd, const struct bks_start *st) {
  int slot = -1;
  lock(&threads_lock);
  for (int i = 0; i < nthreads_hi; i++)
    if (g.threads[i] && g.threads[i]->thread == st->thread) {
      unlock(&threads_lock);
      return -EEXIST;
    }
  struct rthread *t = priv_alloc(sizeof *t);
  t->fd = fd, t->thread = st->thread, t->tid = st->tid, t->pid = st->pid;
  t->fn = st->fn, t->arg = st->arg, t->sp = st->sp, t->fs = st->fs;
  for (int i = 0; i < BKS_MAX_THREADS && slot < 0; i++)
    if (!g.threads[i]) slot = i;
  if (slot < 0) die("more than %d threads on this node", BKS_MAX_THREADS, 0, 0, 0);
  __atomic_store_n(&g.threads[slot], t, __ATOMIC_RELEASE);
  if (slot + 1 > nthreads_hi) __atomic_store_n(&nthreads_hi, slot + 1, __ATOMIC_RELEASE);
  unlock(&threads_lock);
  char *stack = priv_alloc(64 * 1024);
  long r = __bunkai_clone(THREAD_FLAGS | CLONE_SETTLS, stack + 64 * 1024, st->fs, remote_thread, t, 0);
  if (r < 0) die("cannot create a thread (%d)", r, 0, 0, 0);
  return 0;
}
