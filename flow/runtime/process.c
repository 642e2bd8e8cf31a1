/* process.c: the per-process page and fork, the one-time set-up of a
 * process (and of every fork child), and the global state. Rules:
 * runtime.h.
 *
 * Fork: per-process state lives in one page marked MADV_WIPEONFORK, which a
 * fork child sees as zeros. A child therefore finds no buffer and creates its
 * own, and unmaps the parent's; it never writes into the parent's file. The
 * check is the load of a pointer the fast path loads anyway. Writers check
 * the same page: the first writer of a child process resets every table lock
 * (a parent thread may have held one at fork; that thread does not exist in
 * the child) before any other child thread may take one. Tables themselves
 * are inherited: the child has the same objects at the same addresses.
 * (Without MADV_WIPEONFORK, before Linux 4.14, the pid is compared with a
 * getpid system call instead: correct, slower.)
 *
 * Thread ids in records: glibc keeps the kernel tid in its thread descriptor
 * at %fs:0x2d0 (glibc 2.26 and later on x86-64); the runtime uses it when the
 * process runs glibc and the value agrees with gettid() once, and a gettid
 * system call per record otherwise.
 */
#include "runtime.h"

/* The global state (runtime.h): this copy of the runtime's bss. */
struct globals G;

extern const char *gnu_get_libc_version(void) __attribute__((weak));

static struct proc *proc_page(void) {
  struct proc *p = LD_ACQ(&G.proc);
  if (p) return p;
  p = map_anon(PAGE, MAP_PRIVATE);
  if (!p) return 0;
  if (sc3(SYS_madvise, p, PAGE, MADV_WIPEONFORK) != 0) ST(&G.nowipe, 1);
  struct proc *z = 0;
  if (!CAS(&G.proc, &z, p)) {
    sc2(SYS_munmap, p, PAGE);
    p = z;
  }
  return p;
}

/* Waits while *state is BUSY, i.e. another thread does some one-time work,
 * unless that thread is this one (a signal handler interrupted it: the
 * wait would never end); 0 then. */
int wait_other(uint32_t *state) {
  uint32_t me = 0, s;
  while (IS_BUSY(s = LD_ACQ(state))) {
    if (!me) me = BUSY(gettid_raw());
    if (s == me) return 0;
    yield_raw();
  }
  return 1;
}

/* Sets this process up once (and again in every fork child); waits for
 * another thread doing it. 0 when out of memory or when the set-up is this
 * thread's own, interrupted. */
COLD struct proc *proc_setup(void) {
  struct proc *p = proc_page();
  if (!p) return 0;
  for (;;) {
    uint32_t s = LD_ACQ(&p->state);
    if (s == 2) {
      if (!LD(&G.nowipe) || p->pid == (uint32_t)getpid_raw()) return p;
      /* No wipe-on-fork: a child sees its parent's page; start it over. */
      uint32_t two = 2;
      if (CAS(&p->state, &two, 0)) {
        ST(&p->buf, 0);
        ST(&p->buf_any, 0);
        ST(&p->buf_state, 0);
        ST(&p->early_drops, 0);
      }
      continue;
    }
    uint32_t zero = 0;
    if (s == 0 && CAS(&p->state, &zero, BUSY(gettid_raw()))) break;
    if (IS_BUSY(s) && !wait_other(&p->state)) return 0;
  }
  uint32_t pid = (uint32_t)getpid_raw();
  uint32_t before = LD(&G.setup_pid);
  if (before && before != pid) {
    /* A fork child: the threads that held these locks in the parent do not
     * exist here. No thread of this process takes one before state is 2. */
    ST(&G.reg_lock, 0);
    for (struct bkf_table *t = LD_ACQ(&G.tables); t; t = t->next) ST(&t->lock, 0);
  }
  ST(&G.setup_pid, pid);
  p->pid = pid;
  p->tid_fast = &gnu_get_libc_version != 0 && glibc_tid() == (uint32_t)gettid_raw();
  ST_REL(&p->state, 2);
  return p;
}

