/* flow.c: the flow-ID runtime of `bunkai flow` (seed 003, XenLASY §4.1):
 * get_new_flowid, the per-flow tables that map a struct instance's address
 * to its flow ID (register_flowid / get_flowid / remove_flowid), and the
 * per-process record buffer that STORE_DATA appends to (bkf_store). The
 * contract is flow/include/bunkai_flow.h, sections 2 and 3.
 *
 * Rules for this file (it runs inside someone else's process: preloaded as
 * libbunkai-flow.so, or linked from libbunkai-flow.a into an advice module
 * that bunkai mod's linker loads, which refuses TLS and constructors):
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
 * Tables (the scheme; why each piece is there):
 *   A table is an open-addressing array of 16-byte slots {key, value}, linear
 *   probing, Fibonacci hashing of the address (the top bits of key * 2^64/phi,
 *   so aligned pointers spread well). Writers (register, remove) serialise on
 *   one lock per table (spin, then yield); get takes no lock and writes nothing.
 *   - A key, once written into a slot, stays in that slot for the life of
 *     that array: remove only stores 0 in the value (a "dead" slot keeps its
 *     key), and registering the key again reuses its slot. So a reader that
 *     finds the key finds it where it will stay, and the value is one atomic
 *     64-bit word: no torn {key, value} pair, no ABA on reused slots. A new
 *     key is published value first, then key (release); readers load the key
 *     with acquire.
 *   - Dead slots are cleaned up by rebuilding: when live + dead slots exceed
 *     3/4 of the array, the writer copies the live entries into a fresh array
 *     sized so that they fill at most half of it (growing, staying or
 *     shrinking), then publishes it in t->cur (release). When a large array
 *     (>= 64Ki slots) falls below 1/64 live on remove, it shrinks the same
 *     way. Rebuilding costs O(capacity) once per >= capacity/4 insertions.
 *   - Old arrays are never unmapped (a reader may still be walking one), so
 *     readers never touch freed memory. They are retired into a per-table
 *     pool, one list per size, and reused by later rebuilds of that size;
 *     a size never has more than two arrays (the current one and one spare),
 *     so memory stays below 4x the largest array (spares of 1 MiB and more
 *     are given back to the kernel with MADV_DONTNEED; they read as zeros).
 *   - Each array has a generation word, a seqlock of its incarnations: even
 *     while the array is published, odd while it is retired or being filled.
 *     get reads the generation, probes, then (acquire fence) reads it again
 *     and retries if it changed or was odd. A reader that loaded an array
 *     just before it was replaced reads it frozen as it was when it was
 *     replaced (writers only write the current array): that is still a state
 *     the table had during the call. A reader whose array was retired, zeroed
 *     or refilled meanwhile sees the generation move and starts again from
 *     t->cur. An array's capacity never changes (pools are per size), so the
 *     probe's mask is always right for the memory it walks, and the probe is
 *     bounded by the capacity whatever the slots hold.
 *   - Fresh tables point at a static empty array, so get on an empty table is
 *     one probe of a zero slot.
 *
 * Flow IDs: bits 0..47 come from a counter in the shared file BKF_IDS_PATH
 * (one `lock xadd`; every process of the host that maps it shares it, and
 * a fork child inherits the mapping); bits 48..63 are a 16-bit hash of the
 * host name. The counter starts at 1, so an ID is never 0. If the file cannot
 * be used, the counter lives in an anonymous shared page (shared with fork
 * children) starting at pid << 24, so unrelated processes seldom collide.
 *
 * Record buffer: the first bkf_store of a process creates
 * BKF_BUF_DIR/bunkai-flow.<pid>.buf (sparse, BUNKAI_FLOW_BUF bytes, default
 * 64 MiB), fills the header and maps it MAP_SHARED. A thread reserves a
 * chunk of the area at a time with one atomic add on head and writes its
 * records into it with plain stores, each marked complete last (flags =
 * BKF_REC_DONE, release); when a reservation does not fit it adds one to
 * dropped instead. Pages are faulted in 256 KiB ahead of the records
 * (MADV_POPULATE_WRITE), and time stamps are the TSC where the kernel keeps
 * time by it (rdtsc; a new (tsc, CLOCK_MONOTONIC) pair for readers at
 * doubling steps). A thread that stores while another creates the
 * buffer waits for it (a millisecond at most), except a signal handler that
 * interrupted the creating thread itself: waiting would never end, so that
 * record is dropped, and counted in `dropped` once the buffer exists.
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
 *
 * Environment (read when the thing is created): BUNKAI_FLOW_BUF (buffer
 * size: bytes, or with K, M, G: 0 disables recording), BUNKAI_FLOW_POPULATE=1
 * (fault the whole buffer in at creation), BUNKAI_FLOW_DIR (instead of
 * BKF_BUF_DIR), BUNKAI_FLOW_IDS (instead of BKF_IDS_PATH), BUNKAI_FLOW_CLOCK
 * (ns or tsc: what records' time stamps hold).
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <time.h>

#include "bunkai_flow.h"

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
#define MAX_VALS 1024 /* values per record; more are cut (the record says how many it holds) */
#define DEFAULT_BUF (64ull << 20)

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

static void *map_anon(uint64_t len, int flags) {
  long r = sc6(SYS_mmap, 0, (long)len, PROT_READ | PROT_WRITE, flags | MAP_ANONYMOUS, -1, 0);
  return r < 0 && r > -4096 ? 0 : (void *)r;
}
static int getpid_raw(void) { return (int)sc0(SYS_getpid); }
static int gettid_raw(void) { return (int)sc0(SYS_gettid); }
static void yield_raw(void) { sc0(SYS_sched_yield); }
static inline void cpu_relax(void) { __asm__ volatile("pause" ::: "memory"); }

/* ------------------------------------------------------------------ */
/* Strings and the environment                                         */

static uint64_t slen(const char *s) {
  uint64_t n = 0;
  while (s[n]) n++;
  return n;
}
static int sequal(const char *a, const char *b) {
  while (*a && *a == *b) a++, b++;
  return *a == *b;
}
/* Copies at most cap-1 bytes and terminates; returns the length copied. */
static uint64_t scopy(char *d, uint64_t cap, const char *s) {
  uint64_t n = 0;
  while (s[n] && n + 1 < cap) {
    ((volatile char *)d)[n] = s[n]; /* volatile: no memcpy call from the compiler */
    n++;
  }
  d[n] = 0;
  return n;
}
static char *put_u64(char *p, uint64_t v) {
  char b[24];
  int n = 0;
  do b[n++] = (char)('0' + v % 10), v /= 10; while (v);
  while (n) *p++ = b[--n];
  return p;
}
static uint32_t fnv1a(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

extern char **environ __attribute__((weak));

static const char *env(const char *name) {
  char **e = &environ ? environ : 0;
  if (!e) return 0;
  uint64_t n = slen(name);
  for (; *e; e++) {
    const char *s = *e;
    uint64_t i = 0;
    while (i < n && s[i] == name[i]) i++;
    if (i == n && s[n] == '=') return s + n + 1;
  }
  return 0;
}

/* "65536", "64K", "64M", "1G" (binary units, optional "iB"/"B"); -1 if bad. */
static int64_t parse_size(const char *s) {
  uint64_t v = 0;
  int digits = 0;
  for (; *s >= '0' && *s <= '9'; s++, digits++) {
    if (v > (1ull << 50)) return -1;
    v = v * 10 + (uint64_t)(*s - '0');
  }
  if (!digits) return -1;
  int sh = 0;
  if (*s == 'K' || *s == 'k') sh = 10, s++;
  else if (*s == 'M' || *s == 'm') sh = 20, s++;
  else if (*s == 'G' || *s == 'g') sh = 30, s++;
  if (sh && *s == 'i') s++;
  if (*s == 'B') s++;
  if (*s || v > (1ull << 40) >> sh) return -1;
  return (int64_t)(v << sh);
}

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
/* Global state (this copy of the runtime's bss)                       */

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

static struct {
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
} G;

static struct arr empty_arr = {.gen = 2, .shift = 63, .log2 = 0, .mask = 0, .s = {{0, 0}}};

/* ------------------------------------------------------------------ */
/* Host name, host tag, program name                                  */

struct utsname_raw {
  char sysname[65], nodename[65], release[65], version[65], machine[65], domain[65];
};

static void host_name(char *out, uint64_t cap) {
  struct utsname_raw u;
  out[0] = 0;
  if (sc1(SYS_uname, &u) == 0) scopy(out, cap, u.nodename);
}

static uint32_t host_tag16(void) {
  char h[65];
  host_name(h, sizeof h);
  uint32_t x = fnv1a(h);
  return (x ^ (x >> 16)) & 0xffff;
}

/* ------------------------------------------------------------------ */
/* The vDSO's clock_gettime (found in the ELF image the kernel maps; its
 * address is the AT_SYSINFO_EHDR entry of the process's auxiliary vector).
 * The vector comes from prctl(PR_GET_AUXV) (Linux 6.4), else from
 * /proc/self/auxv; else the vDSO's line in /proc/self/maps gives the base.
 * Not /proc/self/auxv alone: a server that drops privileges (httpd, as
 * nobody) is no longer dumpable, its /proc files are root's and that open
 * fails (maps stays readable to the process itself); without the vDSO every
 * record's time stamp was a system call (Apache: 84,400 a second).       */

#ifndef PR_GET_AUXV
#define PR_GET_AUXV 0x41555856
#endif

static uint64_t auxv_find(const uint64_t *auxv, long bytes, uint64_t type) {
  for (long i = 0; i + 1 < bytes / 8; i += 2)
    if (auxv[i] == type) return auxv[i + 1];
  return 0;
}

/* The start of the mapping named [vdso] in /proc/self/maps, or 0. (Not
 * inlined, nor is vdso_from_auxv: this may run on a signal stack, and only
 * one of their buffers should be on it at a time.) */
static __attribute__((noinline)) uint64_t vdso_from_maps(void) {
  int fd = (int)sc3(SYS_open, "/proc/self/maps", O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return 0;
  char b[256], tail[8] = {0}; /* the line's last 7 characters */
  uint64_t start = 0, found = 0;
  int in_addr = 1;
  for (long n; !found && (n = sc3(SYS_read, fd, b, sizeof b)) > 0;)
    for (long i = 0; i < n && !found; i++) {
      char c = b[i];
      if (c == '\n') {
        if (sequal(tail, " [vdso]")) found = start; /* the whole name: not a file called x[vdso] */
        start = 0, in_addr = 1;
        for (int k = 0; k < 8; k++) tail[k] = 0;
        continue;
      }
      if (in_addr) {
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) in_addr = 0;
        else start = start << 4 | (uint64_t)d;
      }
      for (int k = 0; k < 7; k++) tail[k] = tail[k + 1];
      tail[6] = c, tail[7] = 0;
    }
  sc1(SYS_close, fd);
  return found;
}

static __attribute__((noinline)) uint64_t vdso_from_auxv(void) {
  uint64_t auxv[2 * 24]; /* AT_SYSINFO_EHDR comes first on x86-64 */
  long n = sc3(SYS_prctl, PR_GET_AUXV, auxv, sizeof auxv);
  /* n is the vector's full size; what did not fit was cut off. */
  if (n > 0) {
    uint64_t b = auxv_find(auxv, n < (long)sizeof auxv ? n : (long)sizeof auxv, AT_SYSINFO_EHDR);
    if (b) return b;
  }
  uint64_t base = 0;
  int fd = (int)sc3(SYS_open, "/proc/self/auxv", O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return 0;
  for (;;) {
    long r = sc3(SYS_read, fd, auxv, sizeof auxv); /* /proc gives whole entries */
    if (r <= 0) break;
    uint64_t b = auxv_find(auxv, r, AT_SYSINFO_EHDR);
    if (b) base = b;
  }
  sc1(SYS_close, fd);
  return base;
}

static uint64_t vdso_base(void) {
  uint64_t b = vdso_from_auxv();
  return b ? b : vdso_from_maps();
}

static clock_fn vdso_lookup(void) {
  uint64_t base = vdso_base();
  if (!base) return 0;
  const Elf64_Ehdr *eh = (const Elf64_Ehdr *)base;
  if (eh->e_ident[0] != 0x7f || eh->e_ident[1] != 'E' || eh->e_ident[4] != ELFCLASS64) return 0;
  const Elf64_Phdr *ph = (const Elf64_Phdr *)(base + eh->e_phoff);
  uint64_t load = 0, dyn = 0;
  int have_load = 0;
  for (int i = 0; i < eh->e_phnum; i++) {
    if (ph[i].p_type == PT_LOAD && !have_load) load = base + ph[i].p_offset - ph[i].p_vaddr, have_load = 1;
    if (ph[i].p_type == PT_DYNAMIC) dyn = base + ph[i].p_offset;
  }
  if (!have_load || !dyn) return 0;
  const Elf64_Sym *sym = 0;
  const char *str = 0;
  const uint32_t *hash = 0;
  for (const Elf64_Dyn *d = (const Elf64_Dyn *)dyn; d->d_tag != DT_NULL; d++) {
    if (d->d_tag == DT_SYMTAB) sym = (const Elf64_Sym *)(load + d->d_un.d_ptr);
    if (d->d_tag == DT_STRTAB) str = (const char *)(load + d->d_un.d_ptr);
    if (d->d_tag == DT_HASH) hash = (const uint32_t *)(load + d->d_un.d_ptr);
  }
  if (!sym || !str || !hash) return 0;
  for (uint32_t i = 0; i < hash[1]; i++) /* nchain = number of symbols */
    if (sym[i].st_shndx != SHN_UNDEF && ELF64_ST_TYPE(sym[i].st_info) == STT_FUNC &&
        sequal(str + sym[i].st_name, "__vdso_clock_gettime"))
      return (clock_fn)(load + sym[i].st_value);
  return 0;
}

static uint64_t clock_ns(clockid_t c) {
  struct timespec ts;
  clock_fn f = LD_ACQ(&G.vclock);
  if (unlikely(!f)) {
    int s = LD_ACQ(&G.vclock_state), z = 0;
    if (s == 0 && CAS(&G.vclock_state, &z, 1)) {
      f = vdso_lookup();
      ST_REL(&G.vclock, f);
      ST_REL(&G.vclock_state, 2);
    }
  }
  if (!f || f(c, &ts) != 0) sc2(SYS_clock_gettime, c, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t now_ns(void) { return clock_ns(CLOCK_REALTIME); }

/* ------------------------------------------------------------------ */
/* TSC time stamps (bunkai_flow.h §3): rdtsc is 10 ns here, the vDSO's
 * clock_gettime 22. Records hold the TSC when the kernel's clocksource is
 * the TSC (it checked that the TSC is invariant and in step across CPUs);
 * the header's clock readings at creation and (tsc, CLOCK_MONOTONIC) pairs
 * let a reader convert. */

static inline uint64_t rdtsc(void) {
  uint32_t lo, hi;
  __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
  return (uint64_t)hi << 32 | lo;
}

/* CPUID 0x80000007 EDX bit 8: the TSC runs at a constant rate in every
 * power state (<cpuid.h> is the compiler's, inline, no libc). */
static int tsc_invariant(void) {
  unsigned a, b, c, d;
  return __get_cpuid(0x80000007u, &a, &b, &c, &d) && (d >> 8 & 1);
}

/* BKF_CLOCK_TSC or BKF_CLOCK_NS: BUNKAI_FLOW_CLOCK=ns|tsc, else the TSC when
 * it is the kernel's clocksource. Never the TSC unless the CPU says it is
 * invariant. */
static int choose_clock(void) {
  if (!tsc_invariant()) return BKF_CLOCK_NS;
  const char *e = env("BUNKAI_FLOW_CLOCK");
  if (e && sequal(e, "ns")) return BKF_CLOCK_NS;
  if (e && sequal(e, "tsc")) return BKF_CLOCK_TSC;
  char b[16] = {0};
  int fd = (int)sc3(SYS_open, "/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return BKF_CLOCK_NS;
  long n = sc3(SYS_read, fd, b, sizeof b - 1);
  sc1(SYS_close, fd);
  return n == 4 && sequal(b, "tsc\n") ? BKF_CLOCK_TSC : BKF_CLOCK_NS;
}

/* A (tsc, CLOCK_MONOTONIC) pair, and CLOCK_REALTIME at the same moment
 * when real is not null: the TSC halfway between two reads around the
 * clocks, retried when something (an interrupt) came between them. The
 * rate comes from CLOCK_MONOTONIC, which runs at the wall clock's rate
 * (NTP's slewing included) but never steps, so setting the wall clock
 * during a run moves no record. */
static struct bkf_buf_time_pair time_pair(uint64_t *real) {
  struct bkf_buf_time_pair p;
  for (int i = 0;; i++) {
    uint64_t a = rdtsc();
    p.ns = clock_ns(CLOCK_MONOTONIC);
    if (real) *real = now_ns();
    uint64_t b = rdtsc();
    p.tsc = a + (b - a) / 2;
    if (b - a < 2048 || i == 7) return p;
  }
}

#define CAL_MIN (1ull << 14) /* cycles: the second pair, and the first step... */
#define CAL_MAX (1ull << 31) /* ...doubling up to this */

/* The next step: the span since creation (so no record lies further past
 * the latest pair than that pair lies from the first), within bounds. */
static uint64_t cal_step(const struct bkf_buf_header *h, uint64_t tsc) {
  uint64_t span = tsc - h->tsc0;
  return span < CAL_MIN ? CAL_MIN : span > CAL_MAX ? CAL_MAX : span;
}

/* A record's TSC reached cal_next: one writer takes a new pair into the
 * slot readers are not using, then publishes it; the others go on. A
 * writer that wins the sequence just after another published (it loaded
 * the old cal_next) gives it back unchanged, so pairs are published at
 * least a step apart and a reader's copy of the header is not torn by two
 * publications in a row. (A thread killed in here leaves cal_seq odd: no
 * more pairs for this buffer, whose times then stretch the last rate.) */
static COLD void recalibrate(struct bkf_buf_header *h) {
  uint32_t s = LD_ACQ(&h->cal_seq);
  if ((s & 1) || !CAS(&h->cal_seq, &s, s + 1)) return;
  if (rdtsc() < LD(&h->cal_next)) {
    ST_REL(&h->cal_seq, s);
    return;
  }
  struct bkf_buf_time_pair p = time_pair(0);
  h->cal[((s >> 1) + 1) & 1] = p;
  ST(&h->cal_next, p.tsc + cal_step(h, p.tsc));
  ST_REL(&h->cal_seq, s + 2);
}

/* ------------------------------------------------------------------ */
/* The per-process page and fork                                      */

extern const char *gnu_get_libc_version(void) __attribute__((weak));

static inline uint32_t glibc_tid(void) {
  uint32_t t;
  __asm__ volatile("movl %%fs:0x2d0, %0" : "=r"(t));
  return t;
}

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

/* A one-time job's state word while a thread does it: the thread's kernel
 * tid is in the same word, published by the one CAS that claims the job, so
 * a waiter always knows whose job it is (tids are below 2^22). */
#define BUSY(tid) ((uint32_t)(tid) << 2 | 1)
#define IS_BUSY(s) (((s) & 3) == 1)

/* Waits while *state is BUSY, i.e. another thread does some one-time work,
 * unless that thread is this one (a signal handler interrupted it: the
 * wait would never end); 0 then. */
static int wait_other(uint32_t *state) {
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
static COLD struct proc *proc_setup(void) {
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

/* Writers call this first: cheap when this process is set up. */
static inline void proc_enter(void) {
  struct proc *p = LD_ACQ(&G.proc);
  if (likely(p && LD_ACQ(&p->state) == 2 && !LD(&G.nowipe))) return;
  proc_setup();
}

/* ------------------------------------------------------------------ */
/* Flow IDs                                                            */

static COLD uint64_t *ids_init(void) {
  uint64_t *c = LD_ACQ(&G.ids);
  if (c) return c;
  uint64_t tag = (uint64_t)host_tag16() << 48;
  const char *path = env("BUNKAI_FLOW_IDS");
  if (!path || !*path) path = BKF_IDS_PATH;
  int mode = 1;
  int fd = (int)sc3(SYS_open, path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd >= 0) {
    sc2(SYS_fchmod, fd, 0666); /* other users' processes share it too; fails unless ours */
    struct { uint64_t dev, ino, nlink; uint32_t mode, uid, gid, pad; uint64_t rdev; int64_t size; uint64_t rest[12]; } st;
    if (sc2(SYS_fstat, fd, &st) == 0 && st.size < (int64_t)PAGE) sc2(SYS_ftruncate, fd, PAGE);
    long r = sc6(SYS_mmap, 0, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    sc1(SYS_close, fd);
    c = r < 0 && r > -4096 ? 0 : (uint64_t *)r;
  }
  if (!c) {
    /* Process-local: shared with fork children, apart from other processes
     * by the pid in bits 24..47. */
    mode = 2;
    c = map_anon(PAGE, MAP_SHARED);
    if (!c) {
      static uint64_t last_resort;
      c = &last_resort, mode = 3;
    }
    if (!LD(c)) ST(c, ((uint64_t)getpid_raw() & 0x7fffff) << 24);
  }
  ST(&G.tag, tag);
  ST(&G.ids_mode, mode < 3 ? mode : 2);
  uint64_t *z = 0;
  if (!CAS(&G.ids, &z, c)) { /* another thread was first */
    if (mode < 3) sc2(SYS_munmap, c, PAGE);
    c = z;
  }
  return c;
}

API bkf_id get_new_flowid(void) {
  uint64_t *c = LD_ACQ(&G.ids);
  if (unlikely(!c)) c = ids_init();
  uint64_t n;
  do n = (ADD(c, 1) + 1) & LOW48; /* 0 only after 2^48 IDs: skip it */
  while (unlikely(n == 0));
  return LD(&G.tag) | n;
}

/* ------------------------------------------------------------------ */
/* Tables                                                              */

static inline uint64_t hash_of(uint64_t k) { return k * GOLDEN; }

/* The filter a weave guard reads (bunkai_flow.h §4): one byte per 16-bit
 * hash, the number of live keys with that hash, saturating at 255 (then it
 * stays: a false positive forever, never a false negative). Writers keep
 * it under the table lock, counting a key up before it is published and
 * down after its value is cleared. A guard stub computes the same index
 * with MULX and RORX: the top 16 bits of key * GOLDEN. */
#define FILTER_SIZE 65536
static inline uint64_t filter_of(uint64_t k) { return hash_of(k) >> 48; }
static inline void filter_count(struct bkf_table *t, uint64_t k, int up) {
  if (!t->filter) return;
  uint8_t *c = &t->filter[filter_of(k)];
  uint8_t v = *c;
  if (v != 255) ST_REL(c, (uint8_t)(up ? v + 1 : v - 1));
}

API bkf_id get_flowid(struct bkf_table *t, const void *key) {
  uint64_t k = (uint64_t)(uintptr_t)key;
  if (unlikely(!t || !k)) return 0;
  uint64_t h = hash_of(k);
  for (;;) {
    struct arr *a = LD_ACQ(&t->cur);
    uint64_t g = LD_ACQ(&a->gen);
    uint64_t m = a->mask, i = (h >> LD(&a->shift)) & m, v = 0; /* LD: a full 8-byte load (see struct arr) */
    for (uint64_t n = 0; n <= m; n++) { /* bounded: a stale array may hold anything */
      uint64_t kk = LD_ACQ(&a->s[i].key);
      if (kk == k) {
        v = LD(&a->s[i].val);
        break;
      }
      if (kk == 0) break;
      i = (i + 1) & m;
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (likely(LD(&a->gen) == g && !(g & 1))) return v;
    cpu_relax();
  }
}

static struct arr *arr_new(struct bkf_table *t, uint32_t log2) {
  uint64_t cap = 1ull << log2;
  uint64_t len = (64 + cap * sizeof(struct slot) + PAGE - 1) & ~(PAGE - 1);
  struct arr *a = map_anon(len, MAP_PRIVATE);
  if (!a) return 0;
  if (len >= (2ull << 20)) sc3(SYS_madvise, a, len, MADV_HUGEPAGE); /* fewer TLB misses at millions of entries */
  a->gen = 1; /* odd until filled */
  a->log2 = log2;
  a->shift = 64 - log2;
  a->mask = cap - 1;
  a->maplen = len;
  t->mapped += len;
  return a;
}

/* Retires a replaced array: readers still on it see its generation move;
 * its slots are zeroed for the next incarnation and it joins the pool. */
static void arr_retire(struct bkf_table *t, struct arr *a) {
  ST(&a->gen, a->gen + 1); /* odd */
  __atomic_thread_fence(__ATOMIC_RELEASE);
  uint64_t cap = a->mask + 1;
  uint64_t bytes = cap * sizeof(struct slot);
  uint64_t from = 0, to = cap; /* slots zeroed by hand */
  if (bytes >= (1ull << 20)) {
    /* Give whole pages back (they read as zeros); the first page holds
     * the header and stays. */
    uint64_t len = a->maplen - PAGE;
    if (sc3(SYS_madvise, (char *)a + PAGE, len, MADV_DONTNEED) == 0) to = (PAGE - 64) / sizeof(struct slot);
  }
  for (uint64_t i = from; i < to; i++) {
    ST(&a->s[i].key, 0);
    ST(&a->s[i].val, 0);
  }
  a->next = t->pool[a->log2];
  t->pool[a->log2] = a;
}

/* Replaces t->cur by an array holding its live entries, sized so that
 * need entries fill at most half of it. Returns 0 when out of memory. */
static NOINLINE int rebuild(struct bkf_table *t, uint64_t need) {
  uint32_t log2 = 4;
  while ((1ull << log2) < 2 * need) log2++;
  struct arr *old = t->cur, *n = t->pool[log2];
  if (n) t->pool[log2] = n->next;
  else if (!(n = arr_new(t, log2))) return 0;
  uint64_t m = n->mask, live = 0;
  for (uint64_t j = 0; j <= old->mask; j++) {
    uint64_t k = old->s[j].key, v = old->s[j].val;
    if (!k || !v) continue;
    uint64_t i = (hash_of(k) >> n->shift) & m;
    while (n->s[i].key) i = (i + 1) & m;
    ST(&n->s[i].val, v);
    ST(&n->s[i].key, k);
    live++;
  }
  ST_REL(&n->gen, n->gen + 1); /* even: filled */
  ST_REL(&t->cur, n);
  ST(&t->live, live);
  t->used = live;
  t->rebuilds++;
  if (old != &empty_arr) arr_retire(t, old);
  return 1;
}

static void remove_key(struct bkf_table *t, uint64_t k);

API void register_flowid(struct bkf_table *t, const void *key, bkf_id id) {
  uint64_t k = (uint64_t)(uintptr_t)key;
  if (unlikely(!t || !k)) return;
  if (unlikely(!id)) { /* registering "no flow" is leaving the flow */
    remove_key(t, k);
    return;
  }
  proc_enter();
  lock(&t->lock);
  uint64_t h = hash_of(k);
  struct arr *a = t->cur;
  uint64_t m = a->mask, i = (h >> LD(&a->shift)) & m, probes = 0;
  for (;;) {
    uint64_t kk = a->s[i].key;
    if (kk == k) {
      if (!a->s[i].val) {
        filter_count(t, k, 1);
        ST(&t->live, t->live + 1); /* ST: bkf_table_size reads it without the lock */
      }
      ST_REL(&a->s[i].val, id); /* after the filter's count */
      break;
    }
    /* The fill limit comes from the array itself, and a probe through the
     * whole array rebuilds too: a fork child may inherit the counters of a
     * rebuild its parent's thread left half done. */
    if (kk == 0 || ++probes > m) {
      if (unlikely(t->used >= (m + 1) / 4 * 3 || kk != 0)) {
        if (!rebuild(t, t->live + 1)) break; /* out of memory: not registered */
        a = t->cur;
        m = a->mask;
        i = (h >> LD(&a->shift)) & m;
        probes = 0;
        continue;
      }
      filter_count(t, k, 1);
      ST(&a->s[i].val, id);
      ST_REL(&a->s[i].key, k);
      t->used++;
      ST(&t->live, t->live + 1);
      break;
    }
    i = (i + 1) & m;
  }
  unlock(&t->lock);
}

API void remove_flowid(struct bkf_table *t, const void *key) {
  uint64_t k = (uint64_t)(uintptr_t)key;
  if (unlikely(!t || !k)) return;
  remove_key(t, k);
}

static void remove_key(struct bkf_table *t, uint64_t k) {
  proc_enter();
  lock(&t->lock);
  struct arr *a = t->cur;
  uint64_t m = a->mask, i = (hash_of(k) >> LD(&a->shift)) & m;
  for (;;) {
    uint64_t kk = a->s[i].key;
    if (kk == k) {
      if (a->s[i].val) {
        ST(&a->s[i].val, 0);
        filter_count(t, k, 0); /* a release store: after the value's */
        ST(&t->live, t->live - 1);
        if (unlikely(m >= 65535 && t->live * 64 < m)) rebuild(t, t->live); /* give memory back */
      }
      break;
    }
    if (kk == 0) break;
    i = (i + 1) & m;
  }
  unlock(&t->lock);
}

API uint64_t bkf_table_size(struct bkf_table *t) { return t ? LD(&t->live) : 0; }

API struct bkf_table *bkf_table(const char *name) {
  if (!name) return 0;
  uint32_t h = fnv1a(name);
  for (struct bkf_table *t = LD_ACQ(&G.tables); t; t = t->next)
    if (t->namehash == h && sequal(t->name, name)) return t;
  proc_enter();
  lock(&G.reg_lock);
  struct bkf_table *t;
  for (t = LD_ACQ(&G.tables); t; t = t->next)
    if (t->namehash == h && sequal(t->name, name)) break;
  if (!t) {
    uint64_t len = slen(name);
    uint64_t sz = (sizeof(struct bkf_table) + len + 1 + PAGE - 1) & ~(PAGE - 1);
    if ((t = map_anon(sz, MAP_PRIVATE))) {
      t->cur = &empty_arr;
      t->filter = map_anon(FILTER_SIZE, MAP_PRIVATE); /* 0 if that fails: no guards on this table */
      t->namehash = h;
      scopy(t->name, len + 1, name);
      t->next = G.tables;
      ST_REL(&G.tables, t);
    }
  }
  unlock(&G.reg_lock);
  return t;
}

/* For tests and the memory experiment: 0 live entries, 1 used slots (live
 * and dead), 2 capacity, 3 rebuilds, 4 bytes mapped for arrays, 5 the lock
 * word (0 free). Racy. */
API uint64_t __bunkai_flow_table_stat(struct bkf_table *t, int what) {
  if (!t) return 0;
  switch (what) {
  case 0: return LD(&t->live);
  case 1: return LD(&t->used);
  case 2: return LD_ACQ(&t->cur)->mask + 1;
  case 3: return LD(&t->rebuilds);
  case 4: return LD(&t->mapped);
  case 5: return (uint64_t)LD(&t->lock);
  }
  return 0;
}

/* 0 no ID yet, 1 IDs from the shared counter file, 2 process-local. */
API int __bunkai_flow_ids_mode(void) { return LD(&G.ids_mode); }

/* ------------------------------------------------------------------ */
/* The record buffer                                                   */

#define POP_STEP (256ul << 10)
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* Faults in the record area's steps k..k + n - 1 (as far as the buffer
 * goes). Errors are ignored: the pages then fault one by one, as before. */
static COLD void populate_steps(struct bkf_buf_header *h, uint64_t k, uint64_t n) {
  if (LD(&G.no_populate)) return;
  uint64_t end = (uint64_t)(uintptr_t)(h + 1) + h->capacity;
  uint64_t a = ((uint64_t)(uintptr_t)(h + 1) + k * POP_STEP) & ~(PAGE - 1);
  uint64_t b = a + n * POP_STEP;
  if (b > end) b = end;
  if (a >= b) return;
  if (sc3(SYS_madvise, a, b - a, MADV_POPULATE_WRITE) == -EINVAL) ST(&G.no_populate, 1);
}

/* Writers' chunks. A thread reserves CHUNK bytes of the area at a time
 * (one atomic add on head) and writes its records into them with plain
 * stores: the locked add on a line every writer shares was half of a
 * record's cost in a tight loop, and more where threads on other CPUs
 * record too (the line moves at every record). A thread finds its state
 * by its thread pointer (%fs:0; no TLS here) and its tid, in a table of
 * one cache line per thread, written by that thread only, in a private
 * mapping that a fork child sees as zeros (MADV_WIPEONFORK; without it, or with no
 * thread pointer, or when the table has no room, records reserve their
 * own bytes as before). A thread's records are in order in its chunks;
 * readers sort by time. A record in a signal handler that interrupted its
 * thread's store (busy) reserves its own bytes too, as does a record
 * larger than a quarter chunk that does not fit in the rest of its
 * thread's chunk (which the thread keeps). A chunk's unused tail is zeros,
 * which end a reader's walk of it. A new thread on a dead one's thread
 * pointer takes its entry over and starts a new chunk. (A thread that left
 * a store by siglongjmp from a signal handler stays busy: its records then
 * reserve their own bytes.) */
#define CHUNK ((uint64_t)BKF_CHUNK)
#define CHUNK_THREADS 4096
struct bthread {
  uint64_t key;                  /* the thread pointer; 0: free; set once (CAS) */
  uint64_t pos, end;             /* the next record's offset in the area, the chunk's end */
  uint32_t busy;                 /* in bkf_store (the thread's signal handlers see it) */
  uint32_t tid;                  /* the owner (CAS): with key, who may write pos and end */
  uint64_t pad[4];
};
_Static_assert(sizeof(struct bthread) == 64, "one cache line per writer");

static COLD struct bthread *bthreads_new(void) {
  if (LD(&G.nowipe)) return 0;
  struct bthread *t = map_anon(CHUNK_THREADS * sizeof *t, MAP_PRIVATE);
  if (t && sc3(SYS_madvise, t, CHUNK_THREADS * sizeof *t, MADV_WIPEONFORK) != 0) {
    sc2(SYS_munmap, t, CHUNK_THREADS * sizeof *t);
    t = 0;
  }
  return t;
}

/* No entry of (tp, tid) among the probes from i: one whose owner, on the
 * same thread pointer, has exited (a new thread on a dead one's stack and
 * TCB), taken over, with its chunk given up; or 0 (the caller's records
 * then reserve their own bytes). The kernel may still find an exited
 * owner for a moment after its stack is free for reuse (until it is
 * reaped): the new thread's records reserve their own bytes meanwhile.
 * Threads with distinct tids never share an entry; threads that share a
 * TLS block (clone without CLONE_SETTLS, which no pthread does) also share
 * glibc's cached tid, and so an entry (docs/flow.md, Limits). */
static COLD struct bthread *bthread_takeover(struct bthread *t, uint32_t i, uint64_t tp, uint32_t tid) {
  int pid = getpid_raw();
  for (uint32_t n = 0; n < 8; n++, i = (i + 1) & (CHUNK_THREADS - 1)) {
    struct bthread *e = &t[i];
    uint32_t old = LD(&e->tid);
    if (LD(&e->key) != tp || old == tid || sc3(SYS_tgkill, pid, old, 0) != -ESRCH) continue;
    if (!CAS(&e->tid, &old, tid)) continue;
    /* busy while pos and end change: a signal handler of this thread
     * that finds the entry now must not see half of them */
    e->busy = 1;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    e->pos = e->end = 0;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    e->busy = 0;
    return e;
  }
  return 0;
}

/* The calling thread's entry (claimed on its first record), or 0. */
static inline struct bthread *bthread_of(struct bthread *t, uint32_t tid) {
  uint64_t tp;
  __asm__("mov %%fs:0, %0" : "=r"(tp));
  if (unlikely(!tp)) return 0;
  uint32_t i0 = (uint32_t)((tp * GOLDEN) >> 52) & (CHUNK_THREADS - 1), i = i0;
  for (uint32_t n = 0; n < 8; n++, i = (i + 1) & (CHUNK_THREADS - 1)) {
    uint64_t k = LD(&t[i].key);
    if (likely(k == tp) && likely(LD(&t[i].tid) == tid)) return &t[i];
    if (k == 0 && CAS(&t[i].key, &k, tp)) k = tp;
    if (k == tp) {
      /* a free entry (or one a signal handler on this thread, or another
       * thread on this thread pointer, claimed meanwhile): its key first,
       * then its owner, who writes its chunk */
      uint32_t z = 0;
      if (CAS(&t[i].tid, &z, tid) || z == tid) return &t[i];
    }
  }
  return bthread_takeover(t, i0, tp, tid);
}

static COLD struct bkf_buf_header *buf_create(struct proc *p) {
  uint64_t size = DEFAULT_BUF;
  const char *s = env("BUNKAI_FLOW_BUF");
  if (s && *s) {
    int64_t v = parse_size(s);
    if (v >= 0) size = (uint64_t)v;
  }
  if (size == 0) return 0;
  size = (size + PAGE - 1) & ~(PAGE - 1);
  if (size < 2 * PAGE) size = 2 * PAGE;

  char path[512], *q = path; /* small: this may run on a signal stack */
  const char *dir = env("BUNKAI_FLOW_DIR");
  if (!dir || !*dir) dir = BKF_BUF_DIR;
  if (slen(dir) > sizeof path - 64) return 0;
  q += scopy(q, sizeof path - 64, dir);
  q += scopy(q, 64, "/bunkai-flow.");
  q = put_u64(q, p->pid);
  scopy(q, 8, ".buf");

  /* The file is sparse on tmpfs: a page written when the file system is
   * full would raise SIGBUS in the program. Take at most half of what is
   * free now (other processes' buffers grow too); too little, no buffer. */
  struct statfs fs;
  if (sc2(SYS_statfs, dir, &fs) == 0) {
    uint64_t half = (uint64_t)fs.f_bavail * (uint64_t)fs.f_bsize / 2 & ~(uint64_t)(PAGE - 1);
    if (half < size) size = half;
    if (size < 2 * PAGE) return 0;
  }
  int fd = (int)sc3(SYS_open, path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return 0;
  long r = -1;
  /* Sparse: pages are allocated as records reach them, 256 KiB ahead (a
   * page costs 1.45-1.9 us on a KVM guest, 20-35 ns per typical record);
   * BUNKAI_FLOW_POPULATE=1 pays them all here instead, and the whole size
   * in memory. */
  const char *pop = env("BUNKAI_FLOW_POPULATE");
  int populate = pop && pop[0] == '1' ? MAP_POPULATE : 0;
  if (sc2(SYS_ftruncate, fd, size) == 0)
    r = sc6(SYS_mmap, 0, (long)size, PROT_READ | PROT_WRITE, MAP_SHARED | populate, fd, 0);
  sc1(SYS_close, fd);
  if (r < 0 && r > -4096) return 0;
  struct bkf_buf_header *h = (struct bkf_buf_header *)r;
  h->version = BKF_BUF_VERSION;
  h->pid = p->pid;
  h->host_tag = host_tag16();
  h->capacity = size - sizeof *h;
  h->clock = choose_clock();
  uint64_t real;
  struct bkf_buf_time_pair t0 = time_pair(&real);
  h->tsc0 = t0.tsc;
  h->mono0 = t0.ns;
  h->ns0 = h->started_ns = real;
  host_name(h->host, sizeof h->host);
  long n = sc3(SYS_readlink, "/proc/self/exe", h->exe, sizeof h->exe - 1);
  h->exe[n > 0 ? n : 0] = 0;
  /* Records are written from the start of the area, so its first two steps
   * are faulted in now; each later step when records reach the one before
   * (bkf_store). One MADV_POPULATE_WRITE for 64 pages costs 1.45 us a page
   * here against 1.9 for 64 first touches, and it keeps the writer's path
   * free of faults. Linux 5.14; earlier kernels fault page by page. */
  if (populate) ST(&G.no_populate, 1); /* all there already */
  else populate_steps(h, 0, 2);
  if (h->clock == BKF_CLOCK_TSC) {
    /* a second pair CAL_MIN cycles later, so that a reader has a rate
     * before the first recalibration */
    while (rdtsc() - h->tsc0 < CAL_MIN) __asm__ volatile("pause");
    h->cal[0] = time_pair(0);
    h->cal_next = h->cal[0].tsc + cal_step(h, h->cal[0].tsc);
  } else {
    h->cal_next = ~0ull;
  }
  ST_REL(&h->magic, BKF_BUF_MAGIC); /* a reader trusts the header once it sees the magic */
  return h;
}

static COLD struct bkf_buf_header *buf_slow(void) {
  struct proc *p = proc_setup();
  if (!p) {
    if ((p = LD_ACQ(&G.proc)) && LD_ACQ(&p->state) != 2) ADD(&p->early_drops, 1);
    return 0;
  }
  struct bkf_buf_header *h;
  for (;;) {
    if ((h = LD_ACQ(&p->buf_any))) return h;
    uint32_t s = LD_ACQ(&p->buf_state), z = 0;
    if (s == 3) return 0;
    if (IS_BUSY(s) && !wait_other(&p->buf_state)) {
      ADD(&p->early_drops, 1);
      return 0;
    }
    if (s == 0 && CAS(&p->buf_state, &z, BUSY(gettid_raw()))) break;
  }
  /* A fork child still maps its parent's buffer: let it go. */
  struct bkf_buf_header *old = G.last_buf;
  if (old && old->pid != p->pid) {
    sc2(SYS_munmap, old, G.last_len);
    G.last_buf = 0;
  }
  h = buf_create(p);
  if (!h) {
    ST_REL(&p->buf_state, 3);
    return 0;
  }
  G.last_buf = h;
  G.last_len = h->capacity + sizeof *h;
  if (G.last_threads) sc2(SYS_munmap, G.last_threads, CHUNK_THREADS * sizeof(struct bthread));
  G.last_threads = bthreads_new();
  ST(&p->threads, G.last_threads);
  ST_REL(&p->buf_any, h);
  if (!LD(&G.nowipe)) ST_REL(&p->buf, h); /* else every store checks the pid */
  ST_REL(&p->buf_state, 2);
  uint64_t early = __atomic_exchange_n(&p->early_drops, 0, __ATOMIC_ACQ_REL);
  if (early) ADD(&h->dropped, early);
  return h;
}

/* *pop: the step of the area to fault in once the record is complete
 * (0: none), when the reservation of len bytes at off enters a step
 * (buf_create did the first two): the step after it. */
static inline void pop_entered(uint64_t off, uint64_t len, uint64_t *pop) {
  if (unlikely((off ^ (off + len)) >= POP_STEP)) *pop = (off + len) / POP_STEP + 1;
}

/* A record's own reservation, as every record had before chunks; ~0 when
 * it does not fit (counted). *pop as for pop_entered. */
static uint64_t reserve_own(struct bkf_buf_header *h, uint64_t size, uint64_t *pop) {
  uint64_t off = ADD(&h->head, size);
  if (unlikely(off + size > h->capacity)) {
    ADD(&h->dropped, 1);
    return ~0ull;
  }
  pop_entered(off, size, pop);
  return off;
}

/* The thread's chunk cannot take a record of size bytes: the record's
 * offset in a new chunk (the end of the area may make it shorter), or ~0
 * when the area is full (counted). *pop as for pop_entered. */
static NOINLINE uint64_t chunk_take(struct bkf_buf_header *h, struct bthread *bt, uint64_t size, uint64_t *pop) {
  if (size > CHUNK / 4) return reserve_own(h, size, pop);
  uint64_t cap = h->capacity, c;
  if (LD(&h->head) >= cap || (c = ADD(&h->head, CHUNK)) >= cap) {
    ADD(&h->dropped, 1);
    return ~0ull;
  }
  uint64_t len = cap - c < CHUNK ? cap - c : CHUNK;
  ST((uint64_t *)((char *)(h + 1) + c), len | (uint64_t)BKF_REC_CHUNK << 48);
  bt->end = c + len;
  pop_entered(c, len, pop);
  if (unlikely(8 + size > len)) {
    bt->pos = c + 8;
    ADD(&h->dropped, 1);
    return ~0ull;
  }
  bt->pos = c + 8 + size;
  return c + 8;
}

API void bkf_store(uint64_t pc, uint32_t jp, int n, const uint64_t *vals) {
  struct proc *p = LD_ACQ(&G.proc);
  struct bkf_buf_header *h;
  if (unlikely(!p || !(h = LD_ACQ(&p->buf)))) {
    if (!(h = buf_slow())) return;
    p = LD(&G.proc);
  }
  if (unlikely(n < 0 || !vals)) n = 0;
  if (unlikely(n > MAX_VALS)) n = MAX_VALS;
  uint64_t size = 32 + 8 * (uint64_t)n, off, pop = 0;
  uint32_t tid = likely(p->tid_fast) ? glibc_tid() : (uint32_t)gettid_raw();
  struct bthread *bt = LD(&p->threads);
  if (likely(bt) && likely((bt = bthread_of(bt, tid)) != 0) && likely(!bt->busy)) {
    bt->busy = 1;
    __atomic_signal_fence(__ATOMIC_SEQ_CST); /* busy before the state it guards, for this thread's handlers */
    off = bt->pos;
    if (likely(off + size <= bt->end)) bt->pos = off + size;
    else off = chunk_take(h, bt, size, &pop);
  } else {
    bt = 0;
    off = reserve_own(h, size, &pop);
  }
  if (unlikely(off == ~0ull)) goto out;
  uint64_t t;
  if (likely(h->clock == BKF_CLOCK_TSC)) {
    t = rdtsc();
    if (unlikely(t >= LD(&h->cal_next))) recalibrate(h);
  } else {
    t = now_ns();
  }
  char *r = (char *)(h + 1) + off;
  ST((uint64_t *)r, size | (uint64_t)n << 32); /* size, nvals, flags 0: a reader can skip it */
  ((uint64_t *)r)[1] = t;
  ((uint64_t *)r)[2] = pc;
  ((uint64_t *)r)[3] = tid | (uint64_t)jp << 32;
  for (int i = 0; i < n; i++) ((volatile uint64_t *)r)[4 + i] = vals[i];
  ST_REL((uint16_t *)(r + 6), (uint16_t)BKF_REC_DONE);
out:
  if (bt) {
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    bt->busy = 0;
  }
  /* pages ahead, once the record is complete (its time stamp is not late
   * by the 90 us this takes) */
  if (unlikely(pop)) populate_steps(h, pop, 1);
}

/* ------------------------------------------------------------------ */
/* Weaving: stubs, the common trampoline, patching (bunkai_flow.h §4)  */
/*
 * Every sled that is ever woven gets a slot and a 24-byte stub in a page of
 * ours within rel32 reach of the sled, below the program's text when there
 * is room (above it the heap grows; a 2 MiB region there, in a huge page,
 * made the split driver's woven runs 6% slower):
 *
 *     0   push $slot
 *     5   jmp *16(%rip-relative)     to the trampoline
 *     16  .quad __bunkai_flow_tramp
 *
 * An unguarded sled calls its stub. A guarded one (bkf_weave_guarded) calls
 * its guard directly: code made once per distinct bkf_guard and weave mode
 * (in a page within reach of the sleds, the same way), shared by every sled
 * that needs those tests. It tests the registers against the tables'
 * filters (or a header member) and returns straight to the sled when no
 * test holds, before anything is saved; otherwise it pushes -1 (or -2,
 * vector-free) instead of a slot and jumps to the trampoline, whose
 * dispatch finds the slot from the return address in the return map. A pass
 * that is turned away is a direct call, a few instructions of code every
 * sled of the aspect shares, and a return: a server woven at thousands of
 * sleds passes hundreds per request, and code (or a stub, or an indirect
 * jump's prediction) of its own for each would be a miss at each; a stub in
 * the way made Apache's turned-away passes cost 20 ns. Slots, stubs, guards
 * and their pages are never given back: a thread may sit between a sled's
 * `66 90` and its call when the sled is unwoven, and the call must still
 * land somewhere harmless (the trampoline finds no handler).
 *
 * The trampoline saves the registers, the flags and, unless the weave is
 * vector-free, the vector state (XSAVE, every component the OS enabled), then calls
 * the slot's handler if one is set. Handlers are published and cleared with
 * seq_cst stores. bkf_unweave returns only when no thread can still be
 * running one: each thread counts its own calls in progress in a slot of
 * its own (found by its thread pointer, %fs:0), with plain stores, and
 * unweave, after clearing the handlers, runs membarrier(PRIVATE_EXPEDITED)
 * before it reads the counts. The membarrier puts a full fence in every
 * running thread, so a thread either has its count visible to the scan or
 * loads the cleared handler (the asymmetric fence of userspace RCU). Two
 * locked instructions per call were half the cost of a woven sled. Without
 * that membarrier (old kernels), or for a thread without a thread pointer
 * or a slot, one shared `inflight` count with atomic adds does the job.
 *
 * Text is written with the page made writable and executable for the
 * moment of the write (other threads may be running code on it), following
 * the protocol of §1 with MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE between
 * the steps when the kernel has it. One weave or unweave at a time. */

#define WEAVE_SLOTS 65536
extern char __bunkai_flow_tramp[]; /* below, in asm */
#define TRAMP ((uint64_t)(uintptr_t)__bunkai_flow_tramp)
#define STUB_SIZE 24
#define STUB_TARGET 16           /* offset of the target in a stub */
#define GUARD_CODES 4096         /* distinct guards per process, at most */
#define GUARD_MAX_BYTES 288      /* one guard's code and data, at most */

/* One cache line each, what the dispatch reads first for a call from a
 * stub (at 56 bytes, a quarter of the slots had h..jp across two lines);
 * a call from a guard reads the copy in the return map's entry. */
struct wslot {
  bkf_handler h;                 /* seq_cst */
  void *arg;
  uint32_t jp;
  int patched;                   /* bytes 2..10 written once: from now on only their rel32 changes */
  uint64_t sled;                 /* 0: free */
  uint64_t stub;
  uint64_t call;                 /* what the woven sled calls: the stub or a guard */
  uint64_t pad[2];
};

struct wpage {
  uint64_t base, used;           /* bytes used, thunk included */
};

#define THREAD_SLOTS 4096        /* threads with a count of their own */
struct tcount {
  uint64_t key;                  /* the thread pointer (%fs:0); 0: free; set once (CAS) */
  uint64_t count;                /* calls in progress; written by that thread only */
  uint64_t pad[6];               /* one cache line each */
};
/* W.slots follows W.threads in one page-aligned mapping: both stay on lines */
_Static_assert(sizeof(struct wslot) == 64 && sizeof(struct tcount) == 64, "slots on cache lines");

static struct {
  int lock;
  int ready;                     /* 1 set up, -1 cannot weave here */
  int membarrier;                /* sync-core registered */
  int fast;                      /* private expedited membarrier registered: per-thread counts */
  struct wslot *slots;
  struct tcount *threads;        /* THREAD_SLOTS, open addressing on the thread pointer */
  uint32_t *index;               /* sled -> slot + 1, open addressing, 2 * WEAVE_SLOTS */
  uint32_t nslots;
  struct wpage pages[256];       /* stub pages */
  uint32_t npages;
  struct wpage gpage;            /* where the next guard goes */
  struct { struct bkf_guard spec; uint64_t code; unsigned mode; } *guards; /* GUARD_CODES, made so far; mode: weave flags | GUARD_VIA_STUB */
  uint32_t nguards;
  int bmi2;                      /* MULX and RORX: guards possible */
  uint64_t inflight;
} W;

/* Read by the trampoline (named: top-level asm takes no operands). */
HIDDEN uint64_t __bunkai_flow_xsize;          /* XSAVE area bytes + 64 for alignment */
HIDDEN uint32_t __bunkai_flow_xlo, __bunkai_flow_xhi; /* XSAVE components (XCR0) */
/* Per slot: BKF_WEAVE_NO_VECTOR when its handler touches no vector
 * register (the trampoline then skips XSAVE/XRSTOR and passes no area). */
HIDDEN uint8_t *__bunkai_flow_modes;

/* The calling thread's count of calls in progress, or 0 (then the shared
 * atomic count is used). */
static uint64_t *thread_count(void) {
  if (!W.fast) return 0;
  uint64_t tp;
  __asm__("mov %%fs:0, %0" : "=r"(tp));
  if (!tp) return 0;
  uint32_t i = (uint32_t)((tp * 0x9e3779b97f4a7c15ull) >> 52) & (THREAD_SLOTS - 1);
  for (uint32_t n = 0; n < 16; n++, i = (i + 1) & (THREAD_SLOTS - 1)) {
    struct tcount *t = &W.threads[i];
    uint64_t k = __atomic_load_n(&t->key, __ATOMIC_ACQUIRE);
    if (k == tp) return &t->count;
    if (k == 0) {
      /* a new thread (or a new thread on a dead one's stack: same slot,
       * and the dead one's count is 0) */
      if (__atomic_compare_exchange_n(&t->key, &k, tp, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return &t->count;
      if (k == tp) return &t->count;
    }
  }
  return 0;
}

/* The slot of a woven sled, for a guard's call (whose return address is
 * all the trampoline has), without the lock: the return map. Each entry
 * holds the key (sled >> 1) << 17 | (slot + 1) and a copy of what the
 * dispatch needs from the slot (handler, argument, join point, mode), 32
 * bytes, two to a cache line: a followed pass costs one line of the map
 * and no line of W.slots (the index's entry and then its slot's sled were
 * two cache misses a followed pass in Apache, 70% of the dispatch; the
 * map's entry and then the slot, two misses, 58% of it). The map is sized
 * to the slots in use (at least twice as many entries), so its lines are
 * few and stay cached. It only gains entries (key last, release) or is
 * replaced by a bigger copy made from the slots, published with release
 * once complete; replaced maps are kept (`older`) for readers still
 * probing them, and weave and unweave, under W.lock, change an entry's
 * copy in every map (arg, jp, mode, then the handler, seq_cst), so a
 * reader of any map sees the handler unweave cleared. */
struct rent {
  uint64_t key;                  /* 0: free */
  bkf_handler h;                 /* seq_cst, as the slot's */
  void *arg;
  uint32_t jp;
  uint32_t mode;                 /* BKF_WEAVE_NO_VECTOR, as __bunkai_flow_modes */
};
struct rmap {
  uint64_t mask;
  struct rmap *older;            /* the map this one replaced */
  uint64_t pad[2];               /* entries on 32-byte boundaries */
  struct rent e[];
};
_Static_assert(sizeof(struct rent) == 32 && sizeof(struct rmap) == 32, "two entries a line");
static struct rmap *rmap;

/* A sled the map can hold: its key keeps bits 1..47 (user space below 2^47,
 * unless 5-level paging was asked for). Others always call their stub. */
static int rmap_fits(uint64_t sled) { return sled < (1ull << 47); }

static uint64_t rmap_hash(uint64_t sled) { return (sled >> 1) * 0x9E3779B97F4A7C15ull >> 32; }

/* The entry of sled in map t, or 0 (lock-free). */
static inline struct rent *rent_find(struct rmap *t, uint64_t sled) {
  for (uint64_t n = 0, i = rmap_hash(sled) & t->mask; n <= t->mask; n++, i = (i + 1) & t->mask) {
    uint64_t k = __atomic_load_n(&t->e[i].key, __ATOMIC_ACQUIRE);
    if (!k) return 0;
    if (k >> 17 == sled >> 1) return &t->e[i];
  }
  return 0;
}

/* Under W.lock: entry e takes slot's handler, argument, join point and
 * mode (the handler last). */
static void rent_copy(struct rent *e, uint32_t slot) {
  /* relaxed: they change only while h is 0 (weave refuses a woven sled),
   * and dispatch reads them after h */
  __atomic_store_n(&e->arg, W.slots[slot].arg, __ATOMIC_RELAXED);
  __atomic_store_n(&e->jp, W.slots[slot].jp, __ATOMIC_RELAXED);
  __atomic_store_n(&e->mode, (uint32_t)__atomic_load_n(&__bunkai_flow_modes[slot], __ATOMIC_RELAXED), __ATOMIC_SEQ_CST);
  __atomic_store_n(&e->h, __atomic_load_n(&W.slots[slot].h, __ATOMIC_RELAXED), __ATOMIC_SEQ_CST);
}

static void rmap_put(struct rmap *t, uint64_t sled, uint32_t slot) {
  uint64_t i = rmap_hash(sled) & t->mask;
  while (t->e[i].key) i = (i + 1) & t->mask;
  rent_copy(&t->e[i], slot);
  __atomic_store_n(&t->e[i].key, (sled >> 1) << 17 | (slot + 1), __ATOMIC_RELEASE);
}

/* Under W.lock: slot n of sled goes into the map, grown first if needed. */
static int rmap_add(uint64_t sled, uint32_t n) {
  struct rmap *t = rmap;
  if (!t || 2 * (uint64_t)(n + 1) > t->mask + 1) {
    uint64_t cap = t ? 2 * (t->mask + 1) : 1024;
    struct rmap *b = map_anon(sizeof *b + cap * sizeof(struct rent), MAP_PRIVATE);
    if (!b) return 0;
    b->mask = cap - 1;
    b->older = t;
    for (uint32_t k = 0; k < n; k++)
      if (rmap_fits(W.slots[k].sled)) rmap_put(b, W.slots[k].sled, k);
    __atomic_store_n(&rmap, b, __ATOMIC_RELEASE);
    t = b;
  }
  rmap_put(t, sled, n);
  return 1;
}

/* Under W.lock, after the slot changed: its entry in every map. */
static void rmap_update(uint32_t slot) {
  uint64_t sled = W.slots[slot].sled;
  if (!rmap_fits(sled)) return;
  for (struct rmap *t = rmap; t; t = t->older) {
    struct rent *e = rent_find(t, sled);
    if (e) rent_copy(e, slot);
  }
}

/* For tests: what = 0, the entries of every return map, replaced ones
 * included, whose copy differs from their slot; 1, the maps. */
API uint64_t __bunkai_flow_rmap_stat(int what) {
  lock(&W.lock);
  uint64_t stale = 0, maps = 0;
  for (struct rmap *t = rmap; t; t = t->older, maps++)
    for (uint64_t i = 0; i <= t->mask; i++) {
      struct rent *e = &t->e[i];
      if (!e->key) continue;
      uint32_t slot = (uint32_t)(e->key & 0x1ffff) - 1;
      struct wslot *s = &W.slots[slot];
      stale += e->h != s->h || e->arg != s->arg || e->jp != s->jp || e->mode != __bunkai_flow_modes[slot];
    }
  unlock(&W.lock);
  return what == 0 ? stale : maps;
}

HIDDEN void __bunkai_flow_dispatch(struct bkf_frame *f, void *xsave) {
  struct rent *e = 0;
  struct wslot *s = 0;
  if ((int64_t)f->slot < 0) { /* from a guard: the sled is the one that called it */
    struct rmap *t = __atomic_load_n(&rmap, __ATOMIC_ACQUIRE);
    if (!t || !(e = rent_find(t, f->ret - 7))) return;
    f->slot = (e->key & 0x1ffff) - 1;
  } else {
    s = &W.slots[f->slot];
  }
  uint64_t *mine = thread_count();
  /* plain load and store: only this thread writes it (a signal handler
   * that nests here leaves it as it found it) */
  if (mine) __atomic_store_n(mine, __atomic_load_n(mine, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
  else __atomic_fetch_add(&W.inflight, 1, __ATOMIC_SEQ_CST);
  /* the count's store stays before the handler's load in the code (an
   * acquire load alone would let the compiler sink a relaxed store below
   * it); the CPU's order is unweave's membarrier's business */
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  bkf_handler h = __atomic_load_n(e ? &e->h : &s->h, __ATOMIC_SEQ_CST);
  /* Without an XSAVE area, run only a handler woven vector-free. The
   * trampoline read the mode before this thread counted as in flight, so an
   * unweave and a new weave of this sled may have happened since; weave
   * stores the mode before it publishes the handler, so this load sees the
   * new handler's mode. (That one call is skipped then: a weave race.) A
   * vector-free handler always gets no area, as bunkai_flow.h says. */
  if (h) {
    int novec = (e ? (int)__atomic_load_n(&e->mode, __ATOMIC_SEQ_CST)
                   : __atomic_load_n(&__bunkai_flow_modes[f->slot], __ATOMIC_SEQ_CST)) & BKF_WEAVE_NO_VECTOR;
    uint32_t jp = e ? __atomic_load_n(&e->jp, __ATOMIC_RELAXED) : s->jp;
    void *arg = e ? __atomic_load_n(&e->arg, __ATOMIC_RELAXED) : s->arg;
    if (novec) h(f, 0, jp, arg);
    else if (xsave) h(f, xsave, jp, arg);
  }
  /* release: the handler's accesses come before (x86 keeps them in order) */
  if (mine) __atomic_store_n(mine, __atomic_load_n(mine, __ATOMIC_RELAXED) - 1, __ATOMIC_RELEASE);
  else __atomic_fetch_sub(&W.inflight, 1, __ATOMIC_SEQ_CST);
}

/* [rsp] = slot (pushed by the stub), [rsp+8] = the sled's return address. */
__asm__(".text\n"
        ".globl __bunkai_flow_tramp\n"
        ".hidden __bunkai_flow_tramp\n"
        ".type __bunkai_flow_tramp,@function\n"
        "__bunkai_flow_tramp:\n"
        "  pushfq\n"
        "  push %rax\n push %rcx\n push %rdx\n push %rbx\n push %rbp\n"
        "  push %rsi\n push %rdi\n push %r8\n push %r9\n push %r10\n"
        "  push %r11\n push %r12\n push %r13\n push %r14\n push %r15\n"
        "  cld\n"
        "  mov %rsp, %rbp\n"                      /* the frame */
        "  mov 128(%rsp), %rax\n"                 /* frame->slot */
        "  test %rax, %rax\n"
        "  js 3f\n"                               /* from a guard: -1 full, -2 vector-free */
        "  mov __bunkai_flow_modes(%rip), %rcx\n"
        "  testb $1, (%rcx,%rax)\n"               /* BKF_WEAVE_NO_VECTOR */
        "  jnz 2f\n"
        "1:\n"
        "  sub __bunkai_flow_xsize(%rip), %rsp\n"
        "  and $-64, %rsp\n"
        "  mov %rsp, %rbx\n"                      /* the XSAVE area, kept across the call */
        "  xor %eax, %eax\n"
        "  mov %rax, 512(%rbx)\n mov %rax, 520(%rbx)\n mov %rax, 528(%rbx)\n mov %rax, 536(%rbx)\n"
        "  mov %rax, 544(%rbx)\n mov %rax, 552(%rbx)\n mov %rax, 560(%rbx)\n mov %rax, 568(%rbx)\n"
        "  mov __bunkai_flow_xlo(%rip), %eax\n"
        "  mov __bunkai_flow_xhi(%rip), %edx\n"
        "  xsave64 (%rbx)\n"
        "  mov %rbp, %rdi\n"
        "  mov %rbx, %rsi\n"
        "  call __bunkai_flow_dispatch\n"
        "  mov __bunkai_flow_xlo(%rip), %eax\n"
        "  mov __bunkai_flow_xhi(%rip), %edx\n"
        "  xrstor64 (%rbx)\n"
        "  mov %rbp, %rsp\n"
        "  pop %r15\n pop %r14\n pop %r13\n pop %r12\n pop %r11\n"
        "  pop %r10\n pop %r9\n pop %r8\n pop %rdi\n pop %rsi\n"
        "  pop %rbp\n pop %rbx\n pop %rdx\n pop %rcx\n pop %rax\n"
        "  popfq\n"
        "  lea 8(%rsp), %rsp\n"                   /* the slot; lea leaves the flags alone */
        "  ret\n"
        "3:\n"
        "  cmp $-2, %rax\n"
        "  jne 1b\n"
        /* vector-free handler: no XSAVE area (the handler and what it
         * calls, the runtime, are built with -mgeneral-regs-only) */
        "2:\n"
        "  and $-16, %rsp\n"
        "  mov %rbp, %rdi\n"
        "  xor %esi, %esi\n"
        "  call __bunkai_flow_dispatch\n"
        "  mov %rbp, %rsp\n"
        "  pop %r15\n pop %r14\n pop %r13\n pop %r12\n pop %r11\n"
        "  pop %r10\n pop %r9\n pop %r8\n pop %rdi\n pop %rsi\n"
        "  pop %rbp\n pop %rbx\n pop %rdx\n pop %rcx\n"
        /* the arithmetic flags back without popfq (microcoded, a fifth of
         * the fast path): CF PF AF ZF SF through sahf, OF by an add that
         * overflows exactly when it was set. DF stays clear, as the ABI
         * has it wherever compiled code can be; no other flag changed. */
        "  movzbl 8(%rsp), %eax\n"
        "  shl $8, %eax\n"
        "  testb $8, 9(%rsp)\n"                  /* OF is bit 11 */
        "  setnz %al\n"
        "  add $0x7f, %al\n"
        "  sahf\n"
        "  pop %rax\n"
        "  lea 16(%rsp), %rsp\n"                 /* the flags and the slot */
        "  ret\n"
        ".size __bunkai_flow_tramp, .-__bunkai_flow_tramp\n");

#define MEMBARRIER_SYNC_CORE (1 << 5)          /* MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE */
#define MEMBARRIER_REGISTER_SYNC_CORE (1 << 6) /* ..._REGISTER_PRIVATE_EXPEDITED_SYNC_CORE */
#define MEMBARRIER_EXPEDITED (1 << 3)          /* MEMBARRIER_CMD_PRIVATE_EXPEDITED */
#define MEMBARRIER_REGISTER_EXPEDITED (1 << 4) /* MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED */

static void sync_cores(void) {
  if (W.membarrier) sc3(SYS_membarrier, MEMBARRIER_SYNC_CORE, 0, 0);
}

static COLD int weave_setup(void) {
  if (W.ready) return W.ready > 0;
  uint32_t a, b, c, d;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
  if (!(c & (1u << 27))) { /* OSXSAVE: the OS manages XSAVE state */
    W.ready = -1;
    return 0;
  }
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0xd), "c"(0));
  __bunkai_flow_xlo = lo, __bunkai_flow_xhi = hi;
  __bunkai_flow_xsize = ((uint64_t)b + 63) / 64 * 64 + 64;
  uint64_t bytes = THREAD_SLOTS * sizeof(struct tcount) + WEAVE_SLOTS * sizeof(struct wslot) +
                   2 * WEAVE_SLOTS * sizeof(uint32_t) + WEAVE_SLOTS + 8 + GUARD_CODES * sizeof(*W.guards);
  long r = sc6(SYS_mmap, 0, (long)bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r < 0 && r > -4096) {
    W.ready = -1;
    return 0;
  }
  W.threads = (struct tcount *)r;
  W.slots = (struct wslot *)(W.threads + THREAD_SLOTS);
  W.index = (uint32_t *)(W.slots + WEAVE_SLOTS);
  __bunkai_flow_modes = (uint8_t *)(W.index + 2 * WEAVE_SLOTS);
  W.guards = (void *)((uintptr_t)(__bunkai_flow_modes + WEAVE_SLOTS + 7) & ~(uintptr_t)7);
  W.membarrier = sc3(SYS_membarrier, MEMBARRIER_REGISTER_SYNC_CORE, 0, 0) == 0;
  W.fast = sc3(SYS_membarrier, MEMBARRIER_REGISTER_EXPEDITED, 0, 0) == 0;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
  if (a >= 7) {
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    W.bmi2 = (b >> 8) & 1;
  }
  W.ready = 1;
  return 1;
}

static int in_reach(uint64_t from_end, uint64_t to) {
  int64_t d = (int64_t)(to - from_end);
  return d == (int32_t)d;
}

static uint8_t *put_le(uint8_t *p, uint64_t v, int n) {
  for (int k = 0; k < n; k++) *p++ = (uint8_t)(v >> (8 * k));
  return p;
}

/* In a guard, after `push %rcx; push %rdx`: emits `mov R, D` for D %rcx (1)
 * or %rdx (2), R's value as at the sled (%rcx and %rdx from the stack, at
 * 8(%rsp) and 0(%rsp)). */
static uint8_t *guard_mov(uint8_t *p, uint8_t r, uint8_t d) {
  if (r == 1 || r == 2) { /* mov disp8(%rsp), D */
    *p++ = 0x48, *p++ = 0x8b, *p++ = (uint8_t)(0x44 | (d << 3)), *p++ = 0x24, *p++ = (uint8_t)(r == 1 ? 8 : 0);
  } else { /* mov %R, D */
    *p++ = (uint8_t)(0x48 | (r >= 8 ? 0x04 : 0)), *p++ = 0x89, *p++ = (uint8_t)(0xc0 | ((r & 7) << 3) | d);
  }
  return p;
}

/* Where sled is, or goes, in the index. */
static uint32_t *index_of(uint64_t sled) {
  uint64_t m = 2 * WEAVE_SLOTS - 1, i = ((sled >> 1) * 0x9E3779B97F4A7C15ull >> 40) & m;
  while (W.index[i] && W.slots[W.index[i] - 1].sled != sled) i = (i + 1) & m;
  return &W.index[i];
}

/* A new page of code within rel32 reach of the code at near: the first free
 * page below near's, in 1 MiB steps, then above; 0 if none. */
static uint64_t page_near(uint64_t near) {
  for (int64_t step = 1; step < 1024; step++) {
    for (int dir = -1; dir <= 1; dir += 2) {
      uint64_t hint = ((near & ~(uint64_t)(PAGE - 1)) + (uint64_t)(dir * step) * (1ull << 20));
      if (!in_reach(near + 7, hint) || !in_reach(near + 7, hint + PAGE)) continue;
      long r = sc6(SYS_mmap, (long)hint, PAGE, PROT_READ | PROT_WRITE | PROT_EXEC,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
      if (r == (long)hint) return hint;
      if (r > 0) sc2(SYS_munmap, r, PAGE); /* old kernels: a hint, not fixed */
    }
  }
  return 0;
}

/* A stub for a sled: its slot's, or a new one in a page within reach. */
static uint64_t stub_for(uint64_t sled, uint32_t *slot) {
  uint32_t *ix = index_of(sled);
  if (*ix) {
    *slot = *ix - 1;
    return W.slots[*slot].stub;
  }
  if (W.nslots == WEAVE_SLOTS) return 0;
  struct wpage *pg = 0;
  for (uint32_t i = 0; i < W.npages && !pg; i++)
    if (W.pages[i].used + STUB_SIZE <= PAGE && in_reach(sled + 7, W.pages[i].base) &&
        in_reach(sled + 7, W.pages[i].base + PAGE))
      pg = &W.pages[i];
  if (!pg) {
    if (W.npages == sizeof W.pages / sizeof W.pages[0]) return 0;
    uint64_t base = page_near(sled);
    if (!base) return 0;
    pg = &W.pages[W.npages++];
    pg->base = base, pg->used = 0;
  }
  uint32_t n = W.nslots;
  uint8_t *st = (uint8_t *)(pg->base + pg->used), *p = st;
  *p++ = 0x68, p = put_le(p, n, 4);                             /* push $slot (sign-extended imm32) */
  *p++ = 0xff, *p++ = 0x25, p = put_le(p, STUB_TARGET - 11, 4); /* jmp *target(%rip) */
  while (p < st + STUB_TARGET) *p++ = 0xcc;                     /* int3 */
  put_le(p, TRAMP, 8);
  pg->used += STUB_SIZE;
  W.slots[n].sled = sled;
  W.slots[n].stub = (uint64_t)(uintptr_t)st;
  W.slots[n].call = W.slots[n].stub;
  /* (a failed add leaves the stub's bytes unused; a sled past 2^47 is never
   * guarded, so never looked up: its key would not fit) */
  if (rmap_fits(sled) && !rmap_add(sled, n)) return 0;
  W.nslots = n + 1;
  *ix = n + 1;
  *slot = n;
  return W.slots[n].stub;
}

static const uint8_t SLED_NOP[BKF_SLED_SIZE] = {0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00};

/* The sled's bytes 2..10 when it calls stub. */
static void call_bytes(uint64_t sled, uint64_t stub, uint8_t out[9]) {
  int32_t rel = (int32_t)(int64_t)(stub - (sled + 7));
  out[0] = 0xe8;
  for (int k = 0; k < 4; k++) out[1 + k] = (uint8_t)((uint32_t)rel >> (8 * k));
  out[5] = 0x0f, out[6] = 0x1f, out[7] = 0x40, out[8] = 0x00;
}

static int same(const uint8_t *a, const uint8_t *b, int n) {
  for (int i = 0; i < n; i++)
    if (a[i] != b[i]) return 0;
  return 1;
}

/* Makes the pages of [lo, hi) writable as well (prot 1) or gives them back
 * read + execute (prot 0). */
static int text_writable(uint64_t lo, uint64_t hi, int on) {
  lo &= ~(uint64_t)(PAGE - 1);
  hi = (hi + PAGE - 1) & ~(uint64_t)(PAGE - 1);
  return (int)sc3(SYS_mprotect, lo, hi - lo, PROT_READ | PROT_EXEC | (on ? PROT_WRITE : 0));
}

/* Guards (bunkai_flow.h §4). A guard is code of ours, called by the sled,
 * [rsp] = the sled's return address:
 *
 *       push %rcx; push %rdx
 *   per key test, register R and table T:
 *       mov R, %rdx                   (R is %rcx/%rdx: from the stack)
 *       mulx golden(%rip), %rcx, %rdx (%rcx = low half of R * GOLDEN)
 *       rorx $48, %rcx, %rcx
 *       movzwl %cx, %ecx              (filter_of(R))
 *       movabs $T->filter, %rdx
 *       movzbl (%rdx,%rcx), %ecx
 *       jrcxz 1f                      (no live key with that hash)
 *       jmp hit
 *     1:
 *   per field test, register R, member at OFF of width W, MASK:
 *       mov R, %rcx                   (R is %rcx/%rdx: from the stack)
 *       jrcxz 1f                      (NULL)
 *       mov{zbl,zwl,l,q} OFF(%rcx), %ecx/%rcx
 *       pext mask(%rip), %rcx, %rcx
 *       jrcxz 1f                      (none of MASK's bits set)
 *       jmp hit
 *     1:
 *       pop %rdx; pop %rcx
 *       ret                           (back to the sled)
 *   hit:
 *       pop %rdx; pop %rcx
 *       push $-1                      (-2 for a vector-free weave: the slot
 *       jmp *tramp(%rip)               is found from the return address)
 *   tramp:  .quad __bunkai_flow_tramp
 *   golden: .quad GOLDEN
 *   mask:   .quad MASK                (per field test)
 *
 * Not one of these writes the flags, so there is nothing to restore. */
static int guard_valid(const struct bkf_guard *g) {
  if (g->n > BKF_GUARD_MAX) return 0;
  for (uint32_t k = 0; k < g->n; k++) {
    if (g->reg[k] > 15 || g->reg[k] == 4) return 0;
    if (g->kind[k] == BKF_GUARD_KEY && !g->table[k]) return 0;
    if (g->kind[k] == BKF_GUARD_FIELD) {
      uint8_t w = g->width[k];
      if ((w != 1 && w != 2 && w != 4 && w != 8) || !g->mask[k] || g->off[k] > 0x7fffffff) return 0;
      if (w < 8 && (g->mask[k] >> (8 * w))) return 0;
    }
    if (g->kind[k] > BKF_GUARD_FIELD) return 0;
  }
  return 1;
}

static int guard_same(const struct bkf_guard *a, const struct bkf_guard *b) {
  if (a->n != b->n) return 0;
  for (uint32_t k = 0; k < a->n; k++) {
    if (a->kind[k] != b->kind[k] || a->reg[k] != b->reg[k]) return 0;
    if (a->kind[k] == BKF_GUARD_KEY && a->table[k] != b->table[k]) return 0;
    if (a->kind[k] == BKF_GUARD_FIELD && (a->off[k] != b->off[k] || a->width[k] != b->width[k] || a->mask[k] != b->mask[k]))
      return 0;
  }
  return 1;
}

/* Code at a and code at b within a jump of each other (with room to spare:
 * a guard is under a page). */
static int near_enough(uint64_t a, uint64_t b) {
  return in_reach(a, b) && in_reach(a, b + PAGE) && in_reach(b, a) && in_reach(b + PAGE, a);
}

#define GUARD_VIA_STUB 0x100u /* in a guard's mode: entered from a stub, the slot on the stack */

/* The guard code for g (n > 0) and mode (weave flags, GUARD_VIA_STUB),
 * within a call of sled, made now or found among those made, or 0: no BMI2,
 * a table without a filter, no memory, too many guards. */
static uint64_t guard_make(const struct bkf_guard *g, unsigned mode, uint64_t sled) {
  for (uint32_t i = 0; i < W.nguards; i++)
    if (guard_same(&W.guards[i].spec, g) && W.guards[i].mode == mode && near_enough(sled + 7, W.guards[i].code))
      return W.guards[i].code;
  if (!W.bmi2 || W.nguards == GUARD_CODES) return 0;
  for (uint32_t k = 0; k < g->n; k++)
    if (g->kind[k] == BKF_GUARD_KEY && !g->table[k]->filter) return 0;
  if (!W.gpage.base || W.gpage.used + GUARD_MAX_BYTES > PAGE || !near_enough(sled + 7, W.gpage.base)) {
    uint64_t r = page_near(sled);
    if (!r) return 0;
    W.gpage.base = r, W.gpage.used = 0;
  }
  uint8_t *start = (uint8_t *)(W.gpage.base + W.gpage.used), *p = start;
  uint8_t *to_hit[BKF_GUARD_MAX], *to_data[BKF_GUARD_MAX];
  *p++ = 0x51, *p++ = 0x52;
  for (uint32_t k = 0; k < g->n; k++) {
    uint8_t r = g->reg[k];
    if (g->kind[k] == BKF_GUARD_FIELD) {
      p = guard_mov(p, r, 1); /* the header pointer into %rcx */
      uint8_t *null_jump = p;
      *p++ = 0xe3, *p++ = 0; /* jrcxz next (set below) */
      switch (g->width[k]) { /* load the member, zero-extended */
      case 1: *p++ = 0x0f, *p++ = 0xb6, *p++ = 0x89; break;             /* movzbl off(%rcx),%ecx */
      case 2: *p++ = 0x0f, *p++ = 0xb7, *p++ = 0x89; break;             /* movzwl off(%rcx),%ecx */
      case 4: *p++ = 0x8b, *p++ = 0x89; break;                          /* mov off(%rcx),%ecx */
      default: *p++ = 0x48, *p++ = 0x8b, *p++ = 0x89; break;            /* mov off(%rcx),%rcx */
      }
      p = put_le(p, g->off[k], 4);
      *p++ = 0xc4, *p++ = 0xe2, *p++ = 0xf2, *p++ = 0xf5, *p++ = 0x0d;  /* pext mask(%rip),%rcx,%rcx */
      to_data[k] = p, p += 4;
      *p++ = 0xe3, *p++ = 0x05;                                         /* jrcxz over the jmp */
      *p++ = 0xe9, to_hit[k] = p, p += 4;                               /* jmp hit */
      null_jump[1] = (uint8_t)(p - (null_jump + 2));
      continue;
    }
    p = guard_mov(p, r, 2); /* the key into %rdx, MULX's implicit operand */
    *p++ = 0xc4, *p++ = 0xe2, *p++ = 0xf3, *p++ = 0xf6, *p++ = 0x15;     /* mulx golden(%rip),%rcx,%rdx */
    to_data[k] = p, p += 4;
    *p++ = 0xc4, *p++ = 0xe3, *p++ = 0xfb, *p++ = 0xf0, *p++ = 0xc9, *p++ = 48; /* rorx $48,%rcx,%rcx */
    *p++ = 0x0f, *p++ = 0xb7, *p++ = 0xc9;                                  /* movzwl %cx,%ecx */
    *p++ = 0x48, *p++ = 0xba, p = put_le(p, (uint64_t)(uintptr_t)g->table[k]->filter, 8); /* movabs $filter,%rdx */
    *p++ = 0x0f, *p++ = 0xb6, *p++ = 0x0c, *p++ = 0x0a;                     /* movzbl (%rdx,%rcx),%ecx */
    *p++ = 0xe3, *p++ = 0x05;                                               /* jrcxz over the jmp */
    *p++ = 0xe9, to_hit[k] = p, p += 4;                                     /* jmp hit */
  }
  *p++ = 0x5a, *p++ = 0x59; /* pop %rdx; pop %rcx */
  if (mode & GUARD_VIA_STUB)
    *p++ = 0x48, *p++ = 0x8d, *p++ = 0x64, *p++ = 0x24, *p++ = 0x08; /* lea 8(%rsp),%rsp: the slot */
  *p++ = 0xc3;              /* ret */
  uint8_t *hit = p;
  *p++ = 0x5a, *p++ = 0x59;
  if (!(mode & GUARD_VIA_STUB))
    *p++ = 0x6a, *p++ = (mode & BKF_WEAVE_NO_VECTOR) ? 0xfe : 0xff; /* push $-2 / $-1 */
  *p++ = 0xff, *p++ = 0x25, p = put_le(p, 0, 4); /* jmp *tramp(%rip): the quad right after */
  p = put_le(p, TRAMP, 8);
  uint8_t *golden = p;
  p = put_le(p, GOLDEN, 8);
  for (uint32_t k = 0; k < g->n; k++) {
    put_le(to_hit[k], (uint64_t)(uint32_t)(int32_t)(hit - (to_hit[k] + 4)), 4);
    uint8_t *data = golden;
    if (g->kind[k] == BKF_GUARD_FIELD) data = p, p = put_le(p, g->mask[k], 8);
    put_le(to_data[k], (uint64_t)(uint32_t)(int32_t)(data - (to_data[k] + 4)), 4);
  }
  W.gpage.used += ((uint64_t)(p - start) + 63) & ~63ull; /* each on cache lines of its own */
  W.guards[W.nguards].spec = *g;
  W.guards[W.nguards].mode = mode;
  W.guards[W.nguards].code = (uint64_t)(uintptr_t)start;
  W.nguards++;
  return (uint64_t)(uintptr_t)start;
}

/* The call's rel32 (bytes 3..6 of the sled) crosses a cache line: it cannot
 * be replaced with one atomic store. */
static int rel32_split(uint64_t sled) { return ((sled + 3) & 63) > 60; }

/* What sled (slot) calls, woven with guard g (NULL or n == 0: none) and
 * flags mode: its guard, or its stub; the stub's target is set here. A
 * sled woven before may be woven again with another target while a thread
 * sits between its `66 90` and its call (preempted there, say): the new
 * target is then one aligned-within-a-line 4-byte store of the rel32, so
 * that thread calls the old target or the new one, both harmless. A sled
 * whose rel32 straddles a cache line always calls its stub, and so does one
 * outside the return map's 47-bit range (5-level paging): its stub's
 * target, an aligned quad, changes instead, to the trampoline or to a guard
 * entered from a stub (the slot on the stack: slower, one more jump). */
static uint64_t call_target(const struct bkf_guard *g, unsigned mode, uint64_t sled, uint32_t slot) {
  uint64_t stub = W.slots[slot].stub;
  if (rel32_split(sled) || !rmap_fits(sled)) {
    uint64_t code = g && g->n ? guard_make(g, mode | GUARD_VIA_STUB, stub) : 0;
    __atomic_store_n((uint64_t *)(uintptr_t)(stub + STUB_TARGET), code ? code : TRAMP, __ATOMIC_SEQ_CST);
    return stub;
  }
  __atomic_store_n((uint64_t *)(uintptr_t)(stub + STUB_TARGET), TRAMP, __ATOMIC_SEQ_CST);
  uint64_t code = g && g->n ? guard_make(g, mode, sled) : 0;
  return code ? code : stub;
}

/* 1 if the sled's bytes 2..10 are a call of ours (its stub, or a guard). */
static int calls_ours(const uint8_t *s, uint64_t sled, uint32_t slot) {
  uint8_t cb[9];
  call_bytes(sled, W.slots[slot].stub, cb);
  if (!same(s + 7, cb + 5, 4) || s[2] != 0xe8) return 0;
  int32_t rel = (int32_t)((uint32_t)s[3] | (uint32_t)s[4] << 8 | (uint32_t)s[5] << 16 | (uint32_t)s[6] << 24);
  uint64_t to = sled + 7 + (uint64_t)(int64_t)rel;
  if (to == W.slots[slot].stub) return 1;
  for (uint32_t i = 0; i < W.nguards; i++)
    if (to == W.guards[i].code) return 1;
  return 0;
}

/* 1 if sled's stub goes through a guard now, 0 if straight to the
 * trampoline, -1 if it was never woven (for tests and `weave -v`). */
API int __bunkai_flow_guarded(uint64_t sled) {
  lock(&W.lock);
  int r = -1;
  if (W.ready > 0) {
    uint32_t *ix = index_of(sled);
    if (*ix) {
      struct wslot *w = &W.slots[*ix - 1];
      r = w->call != w->stub || __atomic_load_n((uint64_t *)(uintptr_t)(w->stub + STUB_TARGET), __ATOMIC_RELAXED) != TRAMP;
    }
  }
  unlock(&W.lock);
  return r;
}

API int bkf_weave(int n, const uint64_t *sleds, const uint32_t *jps, bkf_handler h, void *arg) {
  return bkf_weave_guarded(n, sleds, jps, h, arg, 0, 0);
}

API int bkf_weave_ex(int n, const uint64_t *sleds, const uint32_t *jps, bkf_handler h, void *arg, unsigned flags) {
  return bkf_weave_guarded(n, sleds, jps, h, arg, flags, 0);
}

API int bkf_weave_guarded(int n, const uint64_t *sleds, const uint32_t *jps, bkf_handler h, void *arg, unsigned flags,
                          const struct bkf_guard *guards) {
  if (n < 0 || (n && (!sleds || !jps || !h)) || (flags & ~(unsigned)BKF_WEAVE_NO_VECTOR)) return -EINVAL;
  for (int i = 0; guards && i < n; i++)
    if (!guard_valid(&guards[i])) return -EINVAL;
  if (n == 0) return 0;
  lock(&W.lock);
  int rc = 0;
  if (!weave_setup()) {
    rc = -ENOSYS;
    goto out;
  }
  /* check every sled and find its stub before touching any */
  uint64_t lo = ~0ull, hi = 0;
  for (int i = 0; i < n && !rc; i++) {
    const uint8_t *s = (const uint8_t *)(uintptr_t)sleds[i];
    uint32_t slot;
    if (sleds[i] & 1) rc = -EINVAL;
    else if (!stub_for(sleds[i], &slot)) rc = -ENOMEM;
    else {
      int fresh = same(s, SLED_NOP, BKF_SLED_SIZE);
      int jumpform = s[0] == 0xeb && s[1] == 0x09 && calls_ours(s, sleds[i], slot);
      int patched = s[0] == 0x66 && s[1] == 0x90 && calls_ours(s, sleds[i], slot);
      if (patched) rc = -EEXIST;
      else if (!fresh && !jumpform) rc = -EINVAL;
    }
    if (sleds[i] < lo) lo = sleds[i];
    if (sleds[i] + BKF_SLED_SIZE > hi) hi = sleds[i] + BKF_SLED_SIZE;
  }
  if (rc) goto out;
  if (text_writable(lo, hi, 1)) {
    rc = -EACCES;
    goto out;
  }
  /* handlers first: a sled may call its stub from the moment step 5 lands */
  for (int i = 0; i < n; i++) {
    uint32_t slot;
    stub_for(sleds[i], &slot);
    W.slots[slot].jp = jps[i];
    W.slots[slot].arg = arg;
    __atomic_store_n(&__bunkai_flow_modes[slot], (uint8_t)(flags & BKF_WEAVE_NO_VECTOR), __ATOMIC_SEQ_CST);
    __atomic_store_n(&W.slots[slot].h, h, __ATOMIC_SEQ_CST);
    rmap_update(slot);
    W.slots[slot].call = call_target(guards ? &guards[i] : 0, flags & BKF_WEAVE_NO_VECTOR, sleds[i], slot);
  }
  /* (1) the jump form over the nop; (2) sync; (3) bytes 2..10; (4) sync;
   * (5) 66 90 */
  for (int i = 0; i < n; i++)
    __atomic_store_n((uint16_t *)(uintptr_t)sleds[i], (uint16_t)0x09eb, __ATOMIC_SEQ_CST);
  sync_cores();
  for (int i = 0; i < n; i++) {
    uint32_t slot;
    stub_for(sleds[i], &slot);
    uint8_t cb[9];
    call_bytes(sleds[i], W.slots[slot].call, cb);
    uint8_t *s = (uint8_t *)(uintptr_t)sleds[i];
    if (!W.slots[slot].patched) { /* the 11-byte nop: no thread is inside it */
      for (int k = 0; k < 9; k++) s[2 + k] = cb[k];
      W.slots[slot].patched = 1;
    } else if (!same(s + 3, cb + 1, 4)) { /* a new target: one store (see call_target) */
      uint32_t rel;
      __builtin_memcpy(&rel, cb + 1, 4);
      __asm__ volatile("movl %1, (%0)" : : "r"(s + 3), "r"(rel) : "memory");
    }
  }
  sync_cores();
  for (int i = 0; i < n; i++)
    __atomic_store_n((uint16_t *)(uintptr_t)sleds[i], (uint16_t)0x9066, __ATOMIC_SEQ_CST);
  sync_cores();
  text_writable(lo, hi, 0);
out:
  unlock(&W.lock);
  return rc;
}

API int bkf_unweave(int n, const uint64_t *sleds) {
  if (n < 0 || (n && !sleds)) return -EINVAL;
  if (n == 0) return 0;
  lock(&W.lock);
  int rc = 0;
  uint64_t lo = ~0ull, hi = 0;
  for (int i = 0; i < n; i++) {
    if (sleds[i] < lo) lo = sleds[i];
    if (sleds[i] + BKF_SLED_SIZE > hi) hi = sleds[i] + BKF_SLED_SIZE;
  }
  if (W.ready <= 0 || text_writable(lo, hi, 1)) {
    rc = W.ready <= 0 ? -ENOENT : -EACCES;
    goto out;
  }
  /* the jump form again; bytes 2..10 stay (see the comment above) */
  for (int i = 0; i < n; i++) {
    uint8_t *s = (uint8_t *)(uintptr_t)sleds[i];
    if (s[0] == 0x66 && s[1] == 0x90) __atomic_store_n((uint16_t *)s, (uint16_t)0x09eb, __ATOMIC_SEQ_CST);
  }
  sync_cores();
  text_writable(lo, hi, 0);
  for (int i = 0; i < n; i++) {
    uint32_t *ix = index_of(sleds[i]);
    if (*ix) {
      __atomic_store_n(&W.slots[*ix - 1].h, (bkf_handler)0, __ATOMIC_SEQ_CST);
      rmap_update(*ix - 1);
    }
  }
  /* no thread may still be inside a handler when this returns: a fence in
   * every running thread, then every count (see the comment above) */
  if (W.fast) {
    sc3(SYS_membarrier, MEMBARRIER_EXPEDITED, 0, 0);
    for (uint32_t i = 0; i < THREAD_SLOTS; i++)
      if (__atomic_load_n(&W.threads[i].key, __ATOMIC_ACQUIRE))
        while (__atomic_load_n(&W.threads[i].count, __ATOMIC_ACQUIRE)) sc0(SYS_sched_yield);
  }
  while (__atomic_load_n(&W.inflight, __ATOMIC_SEQ_CST)) sc0(SYS_sched_yield);
out:
  unlock(&W.lock);
  return rc;
}
