/* weave.c: weaving (bunkai_flow.h §4): stubs, guards, the dispatch the
 * common trampoline (trampoline_x86_64.S) calls, patching. Rules:
 * runtime.h.
 *
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

#include "runtime.h"

#define WEAVE_SLOTS 65536
extern char __bunkai_flow_tramp[]; /* trampoline_x86_64.S */
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
  uint32_t pid;                  /* the process that registered the membarrier commands */
} W;

/* Read by the trampoline (trampoline_x86_64.S, by name). */
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

#define MEMBARRIER_SYNC_CORE (1 << 5)          /* MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE */
#define MEMBARRIER_REGISTER_SYNC_CORE (1 << 6) /* ..._REGISTER_PRIVATE_EXPEDITED_SYNC_CORE */
#define MEMBARRIER_EXPEDITED (1 << 3)          /* MEMBARRIER_CMD_PRIVATE_EXPEDITED */
#define MEMBARRIER_REGISTER_EXPEDITED (1 << 4) /* MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED */

static void sync_cores(void) {
  if (W.membarrier) sc3(SYS_membarrier, MEMBARRIER_SYNC_CORE, 0, 0);
}

/* A fork child inherits W but is a new mm: its membarrier commands are
 * registered again (registering is idempotent) before it weaves or
 * unweaves, or its sync-core and expedited fences would fail with EPERM. */
static COLD void membarrier_again(void) {
  uint32_t pid = (uint32_t)getpid_raw();
  if (W.pid == pid) return;
  W.pid = pid;
  if (W.membarrier) W.membarrier = sc3(SYS_membarrier, MEMBARRIER_REGISTER_SYNC_CORE, 0, 0) == 0;
  if (W.fast && sc3(SYS_membarrier, MEMBARRIER_REGISTER_EXPEDITED, 0, 0) != 0) W.fast = 0;
}

static COLD int weave_setup(void) {
  if (W.ready > 0) membarrier_again();
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
  /* A fork child sees the per-thread counts as zeros: the threads that were
   * in advice when another thread forked do not exist in it, and their
   * counts would make its unweave wait for ever. Without wipe-on-fork the
   * shared count is used (a child of a fork during advice then waits). */
  W.fast = sc3(SYS_madvise, W.threads, THREAD_SLOTS * sizeof(struct tcount), MADV_WIPEONFORK) == 0 &&
           sc3(SYS_membarrier, MEMBARRIER_REGISTER_EXPEDITED, 0, 0) == 0;
  W.pid = (uint32_t)getpid_raw();
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
  if (W.ready > 0) membarrier_again();
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
