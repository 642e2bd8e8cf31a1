/* buffer.c: the per-process record buffer and bkf_store (bunkai_flow.h
 * section 3). Rules: runtime.h.
 *
 * Record buffer: the first bkf_store of a process creates
 * BKF_BUF_DIR/bunkai-flow.<pid>.buf (sparse, bkf_buffer_size's or
 * BUNKAI_FLOW_BUF bytes, default 64 MiB), fills the header and maps it MAP_SHARED. A thread reserves a
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
 */
#include "runtime.h"

#include <sys/statfs.h>

#define MAX_VALS 1024 /* values per record; more are cut (the record says how many it holds) */
#define DEFAULT_BUF (64ull << 20)

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

API int bkf_buffer_size(uint64_t bytes) {
  if (!bytes) return -EINVAL;
  ST(&G.buf_size, bytes);
  struct proc *p = LD_ACQ(&G.proc);
  return p && LD_ACQ(&p->state) == 2 && LD_ACQ(&p->buf_any) && p->pid == (uint32_t)getpid_raw() ? 1 : 0;
}

static COLD struct bkf_buf_header *buf_create(struct proc *p) {
  uint64_t size = DEFAULT_BUF;
  const char *s = env("BUNKAI_FLOW_BUF");
  if (s && *s) {
    int64_t v = parse_size(s);
    if (v >= 0) size = (uint64_t)v;
  }
  if (LD(&G.buf_size)) size = LD(&G.buf_size);
  if (size == 0) return 0;
  size = (size + PAGE - 1) & ~(PAGE - 1);
  if (size < 2 * PAGE) size = 2 * PAGE;

  char path[512], *q = path; /* small: this may run on a signal stack */
  const char *dir = env("BUNKAI_FLOW_DIR");
  if (!dir || !*dir) dir = BKF_BUF_DIR;
  if (rt_slen(dir) > sizeof path - 64) return 0;
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

/* A record; its time is tsc when records hold the TSC and tsc is one
 * (not 0, not before the buffer's tsc0), else the clock read here. */
static inline void store(uint64_t pc, uint32_t jp, int n, const uint64_t *vals, uint64_t tsc) {
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
    t = likely(tsc) && likely(tsc >= h->tsc0) ? tsc : rdtsc();
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

API void bkf_store(uint64_t pc, uint32_t jp, int n, const uint64_t *vals) { store(pc, jp, n, vals, 0); }

/* Generated advice's STORE_DATA (bunkai_flow.h): the TSC its DO_RDTSC
 * read in this pass is the record's time, so a record costs one rdtsc,
 * not two (a third of the store waited for rdtsc in Apache). */
API void bkf_store_tsc(uint64_t pc, uint32_t jp, int n, const uint64_t *vals, uint64_t tsc) { store(pc, jp, n, vals, tsc); }
