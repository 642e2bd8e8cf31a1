/* runtime.h: what the files of libbunkai-flow share, the flow-ID runtime
 * of `bunkai flow` (seed 003, XenLASY §4.1): get_new_flowid, the per-flow
 * tables that map a struct instance's address to its flow ID
 * (register_flowid / get_flowid / remove_flowid), the per-process record
 * buffer that STORE_DATA appends to (bkf_store), and weaving. The contract
 * is flow/include/bunkai_flow.h.
 *
 * Rules for every file of this runtime (it runs inside someone else's
 * process: preloaded as libbunkai-flow.so, or linked from libbunkai-flow.a
 * into an advice module that bunkai mod's linker loads, which refuses TLS
 * and constructors):
 *   - No libc calls. System calls are raw `syscall` instructions (libc's
 *     wrappers may be intercepted, and may take locks); the only libc
 *     references are weak data/addresses (environ, gnu_get_libc_version),
 *     which are null when nothing defines them. Time stamps come from rdtsc
 *     or the vDSO's clock_gettime, found by hand from the aux vector.
 *   - No malloc: memory comes from mmap and is never returned to libc.
 *   - No constructors, no TLS, no stack protector: everything is set up
 *     lazily by the first call that needs it, and is race-free when several
 *     threads make that first call at once.
 *   - Exported symbols: the API of bunkai_flow.h and the __bunkai_ prefix;
 *     everything else is static or hidden.
 *   - get_flowid and bkf_store are async-signal-safe (no locks, no waiting).
 *     bkf_table, register_flowid and remove_flowid take a per-table lock:
 *     advice that runs in a signal handler must not call them.
 *
 * Files: util.c (the environment, the host's name), clock.c (the
 * vDSO's clock_gettime, TSC time stamps), process.c (the per-process page,
 * fork, the global state), flowid.c (flow IDs), table.c (the flow tables),
 * buffer.c (the record buffer, bkf_store), exit.c (what the tables still
 * hold at exit: the shared library's one destructor), weave.c (stubs, guards,
 * patching, the dispatch) and trampoline_x86_64.S (the common trampoline);
 * syscall_x86_64.h holds the raw system calls, and
 * common/runtime/bunkai_rt_util.h the string helpers shared with share's
 * runtime. The library is one object: CMakeLists.txt links the files'
 * objects into one (ld -r) before packaging it as the .so and the .a.
 *
 * Names shared between files are hidden and carry the __bunkai_flow_ prefix
 * (the archive is linked into advice modules, whose own names must not
 * clash with ours); the short names the code uses are macros for them.
 * Small helpers of the fast paths stay inline here, as they were.
 *
 * Environment (read when the thing is created): BUNKAI_FLOW_BUF (buffer
 * size: bytes, or with K, M, G: 0 disables recording), BUNKAI_FLOW_POPULATE=1
 * (fault the whole buffer in at creation), BUNKAI_FLOW_DIR (instead of
 * BKF_BUF_DIR), BUNKAI_FLOW_IDS (instead of BKF_IDS_PATH), BUNKAI_FLOW_CLOCK
 * (ns or tsc: what records' time stamps hold).
 */
#ifndef BUNKAI_FLOW_RUNTIME_H
#define BUNKAI_FLOW_RUNTIME_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>

#include "bunkai_flow.h"
#include "bunkai_rt_util.h" /* rt_slen, rt_sequal: shared with share's runtime */
#include "syscall_x86_64.h"

#define API __attribute__((visibility("default")))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define NOINLINE __attribute__((noinline))
#define COLD __attribute__((noinline, cold))
#define HIDDEN __attribute__((visibility("hidden"), used))

#define LD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define LD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define ST(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define ST_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define CAS(p, o, n) __atomic_compare_exchange_n((p), (o), (n), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)
#define ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)

#define PAGE 4096ul
#define GOLDEN 0x9e3779b97f4a7c15ull
#define LOW48 ((1ull << 48) - 1)

/* Everything declared below is internal to the library (hidden): calls
 * between the files bind locally, never through the PLT. */
#pragma GCC visibility push(hidden)

/* ------------------------------------------------------------------ */
/* Strings (util.c has the environment). rt_slen and rt_sequal are in
 * common/runtime/bunkai_rt_util.h, shared with share's runtime; these are
 * flow's own (share copies with memcpy, and formats numbers with fmt).  */

/* Copies at most cap-1 bytes and terminates; returns the length copied. */
static inline uint64_t scopy(char *d, uint64_t cap, const char *s) {
  uint64_t n = 0;
  while (s[n] && n + 1 < cap) {
    ((volatile char *)d)[n] = s[n]; /* volatile: no memcpy call from the compiler */
    n++;
  }
  d[n] = 0;
  return n;
}
static inline char *put_u64(char *p, uint64_t v) {
  char b[24];
  int n = 0;
  do b[n++] = (char)('0' + v % 10), v /= 10; while (v);
  while (n) *p++ = b[--n];
  return p;
}
static inline uint32_t fnv1a(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

#define env __bunkai_flow_env
#define parse_size __bunkai_flow_parse_size
#define host_name __bunkai_flow_host_name
#define host_tag16 __bunkai_flow_host_tag16
/* The value of environment variable name, or 0. */
const char *env(const char *name);
/* "65536", "64K", "64M", "1G" (binary units, optional "iB"/"B"); -1 if bad. */
int64_t parse_size(const char *s);
/* The host's name (uname's nodename), cut to cap - 1 bytes. */
void host_name(char *out, uint64_t cap);
/* A 16-bit hash of the host's name (the top bits of flow IDs). */
uint32_t host_tag16(void);

/* ------------------------------------------------------------------ */
/* The lock of a table's writers (0 free, 1 held). Writers hold it for tens
 * of nanoseconds except while rebuilding, so a waiter spins a little, then
 * yields the CPU until it is free; unlocking is a plain release store. One
 * locked instruction per lock and unlock (a futex mutex needs a second, an
 * exchange on unlock to see whether anyone sleeps: 8-10 ns on some VMs). */

static inline void lock(int *l) {
  int z = 0;
  if (likely(CAS(l, &z, 1))) return;
  for (unsigned i = 0;; i++) {
    if (i < 200) cpu_relax();
    else sc0(SYS_sched_yield);
    z = 0;
    if (LD(l) == 0 && CAS(l, &z, 1)) return;
  }
}
static inline void unlock(int *l) { ST_REL(l, 0); }

/* ------------------------------------------------------------------ */
/* Global state (this copy of the runtime's bss; defined in process.c) */

struct slot {
  uint64_t key, val; /* key 0: never used; val 0: not in the flow (dead) */
};

struct arr {
  uint64_t gen;     /* even: published; odd: retired or being filled */
  uint64_t shift;   /* 64 - log2(capacity); 64-bit so that get loads all of
                       %rcx, not %cl alone: a byte load merges with the old
                       %rcx and would wait for whatever the caller left there
                       (a cache miss of the previous call, on AMD) */
  uint64_t mask;    /* capacity - 1: fixed for the life of the mapping */
  uint64_t maplen;  /* bytes mapped (0: the static empty array) */
  struct arr *next; /* pool link (writers only) */
  uint32_t log2;
  uint32_t pad[5];  /* slots start on their own cache line */
  struct slot s[];
};
_Static_assert(offsetof(struct arr, s) == 64, "slots start at a cache line");

struct bkf_table {
  /* Read by every get and every bkf_table lookup. */
  struct arr *cur;
  struct bkf_table *next; /* registry list, immutable once published */
  uint8_t *filter;        /* FILTER_SIZE counters of live keys by filter_of(key) (guards, §4); 0: none */
  uint32_t namehash;
  char pad0[36];
  /* Writers only (under lock). */
  int lock;
  uint32_t pad1;
  uint64_t live, used, rebuilds, mapped;
  char pad2[16];
  struct arr *pool[64]; /* retired arrays by log2(capacity) */
  char name[];
};
_Static_assert(offsetof(struct bkf_table, lock) == 64, "writers' line apart from readers'");

/* The per-process page (MADV_WIPEONFORK: zero again in a fork child). */
struct proc {
  uint32_t state;                 /* 0 not set up in this process, BUSY(tid) being set up, 2 ready */
  uint32_t pid;
  uint32_t buf_state;             /* 0 none, BUSY(tid) being created, 2 ready, 3 failed or disabled */
  uint32_t tid_fast;              /* glibc's tid at %fs:0x2d0 is usable */
  struct bkf_buf_header *buf;     /* set when ready (the fast path's pointer) */
  struct bkf_buf_header *buf_any; /* the same, also without wipe-on-fork */
  uint64_t early_drops;           /* stores while the buffer was being created */
  struct bthread *threads;        /* writers' chunks (set before buf; 0: every record reserves its own bytes) */
};

typedef int (*clock_fn)(clockid_t, struct timespec *);

struct globals {
  struct bkf_table *tables; /* registry: a list, pushed at the head under reg_lock */
  int reg_lock;
  int nowipe;               /* MADV_WIPEONFORK failed: compare pids instead */
  struct proc *proc;
  uint64_t *ids;            /* the counter (file or fallback page) */
  uint64_t tag;             /* host tag << 48, set before ids is published */
  int ids_mode;             /* 1 shared file, 2 process-local fallback */
  uint32_t setup_pid;       /* the last process that set up (not wiped: tells a fork child) */
  clock_fn vclock;          /* the vDSO's clock_gettime, or 0 */
  int vclock_state;         /* 0 not looked up, 1 looking, 2 done */
  int no_populate;          /* no populating ahead: MADV_POPULATE_WRITE is not there (Linux < 5.14), or the buffer was populated whole */
  struct bkf_buf_header *last_buf; /* the mapping the last process created (a child unmaps it) */
  uint64_t last_len;
  struct bthread *last_threads;    /* and its writers' chunks (wiped in a child: unmapped too) */
  uint64_t buf_size;        /* bkf_buffer_size's, for buffers made from now on (0: the environment's) */
};
#define G __bunkai_flow_G
extern struct globals G;

/* ------------------------------------------------------------------ */
/* clock.c: time stamps                                                */

static inline uint64_t rdtsc(void) {
  uint32_t lo, hi;
  __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
  return (uint64_t)hi << 32 | lo;
}

#define now_ns __bunkai_flow_now_ns
#define choose_clock __bunkai_flow_choose_clock
#define time_pair __bunkai_flow_time_pair
#define cal_step __bunkai_flow_cal_step
#define recalibrate __bunkai_flow_recalibrate
#define CAL_MIN (1ull << 14) /* cycles: the second pair, and the first step... */
#define CAL_MAX (1ull << 31) /* ...doubling up to this */
uint64_t now_ns(void); /* CLOCK_REALTIME */
int choose_clock(void);
struct bkf_buf_time_pair time_pair(uint64_t *real);
uint64_t cal_step(const struct bkf_buf_header *h, uint64_t tsc);
COLD void recalibrate(struct bkf_buf_header *h);

/* ------------------------------------------------------------------ */
/* process.c: the per-process page and fork                            */

static inline uint32_t glibc_tid(void) {
  uint32_t t;
  __asm__ volatile("movl %%fs:0x2d0, %0" : "=r"(t));
  return t;
}

/* A one-time job's state word while a thread does it: the thread's kernel
 * tid is in the same word, published by the one CAS that claims the job, so
 * a waiter always knows whose job it is (tids are below 2^22). */
#define BUSY(tid) ((uint32_t)(tid) << 2 | 1)
#define IS_BUSY(s) (((s) & 3) == 1)

#define wait_other __bunkai_flow_wait_other
#define proc_setup __bunkai_flow_proc_setup
/* Waits while *state is BUSY, i.e. another thread does some one-time work,
 * unless that thread is this one (a signal handler interrupted it: the
 * wait would never end); 0 then. */
int wait_other(uint32_t *state);
/* Sets this process up once (and again in every fork child); waits for
 * another thread doing it. 0 when out of memory or when the set-up is this
 * thread's own, interrupted. */
COLD struct proc *proc_setup(void);

/* Writers call this first: cheap when this process is set up. */
static inline void proc_enter(void) {
  struct proc *p = LD_ACQ(&G.proc);
  if (likely(p && LD_ACQ(&p->state) == 2 && !LD(&G.nowipe))) return;
  proc_setup();
}

#pragma GCC visibility pop

#endif
