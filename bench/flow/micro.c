/* micro.c: the flow-ID runtime's microbenchmark, seed 003's Table 1 (§5.1)
 * plus what the paper did not measure, and two baselines in the same run.
 *
 *   micro [--quick]     prints one line per row: name<TAB>mean<TAB>sd (ns)
 *   micro --store NAME  only the bkf_store row, called NAME (run.sh runs it
 *                       again with BUNKAI_FLOW_POPULATE=1)
 *
 * As in §5.1: each function is called 2,000 times in a row, 100 times over
 * (--quick: 20); the time of each batch of 2,000 divided by 2,000 is one
 * sample, and a row is the mean and standard deviation of its 100 samples.
 * Batches are timed with clock_gettime(CLOCK_MONOTONIC) (the paper read the
 * TSC); one unrecorded batch goes first. The thread stays on one CPU.
 *
 * Rows, as the paper's: get_new_flowid; get_flowid on an empty table;
 * changeID: keys (addresses, 64 bytes apart, new ones in every batch) and
 * IDs both counting up, register 2,000 then get them then remove them;
 * sameID: the same with one ID for every key. Then: get_flowid on a table
 * holding 2M entries (random keys among them: cache and TLB misses), once
 * as independent calls (the loop above: misses overlap) and once each key
 * depending on the previous result (the latency of one call), and
 * bkf_store of three values (STORE_DATA3 of the paper's Fig. 8 advice, with
 * the TSC read left out: that is the advice's cost, not the runtime's).
 * Baselines: "plain", a non-thread-safe open-addressing table (same hash,
 * no atomics, no lock, backward-shift deletion; in huge pages like ours)
 * compiled into this program;
 * "locked", a chained hash with a malloc'd node per entry behind a pthread
 * mutex (what std::unordered_map + std::mutex would be).
 *
 * Woven sleds (bunkai_flow.h §4): a call of a function that is one sled and
 * a ret, with a key in %rdi, unpatched (the baseline), then woven with a
 * handler that does what xflow()-filtered advice does first,
 * get_flowid(table, key), under each trampoline: full state (XSAVE),
 * vector-free, and vector-free behind a guard on %rdi (the key not in the
 * flow: the guard returns; in the flow: the handler runs). */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bunkai_flow.h"

uint64_t __bunkai_flow_table_stat(struct bkf_table *t, int what); /* 2: capacity, 3: rebuilds, 4: bytes of arrays */
int __bunkai_flow_guarded(uint64_t sled);

/* msled(key): one sled, key in %rdi. */
void msled(uint64_t key);
extern char msled_sled[];
__asm__(".text\n.p2align 4\n.globl msled\n.type msled,@function\nmsled:\nmsled_sled:\n"
        "  .byte 0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0\n  ret\n.size msled, .-msled\n");
static struct bkf_table *sled_table;
static uint64_t sled_hits;
static void sled_handler(struct bkf_frame *f, void *xsave, uint32_t jp, void *arg) {
  (void)xsave, (void)jp, (void)arg;
  if (get_flowid(sled_table, (void *)f->rdi)) sled_hits++;
}

#define BATCH 2000
#define BIG (2u << 20) /* entries of the large table: 2M */
static int reps = 100;

static uint64_t now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void row(const char *name, const double *s, int n) {
  double m = 0, v = 0;
  for (int i = 0; i < n; i++) m += s[i];
  m /= n;
  for (int i = 0; i < n; i++) v += (s[i] - m) * (s[i] - m);
  printf("%s\t%.2f\t%.2f\n", name, m, n > 1 ? sqrt(v / (n - 1)) : 0.0);
  fflush(stdout);
}

/* Keys: addresses 64 bytes apart, from a heap-like base, new ones as the
 * benchmark goes (like sk_buffs from a slab). */
static uintptr_t next_key = 0x555555a00000ull;
static uintptr_t keys[BATCH];
static void new_keys(void) {
  for (int i = 0; i < BATCH; i++) keys[i] = next_key, next_key += 64;
}

static volatile uint64_t sink;

/* ------------------------------------------------------------------ */
/* Baseline 1: plain open addressing, not thread-safe                  */

struct pslot {
  uint64_t key, val;
};
static struct pslot *pt;
static uint64_t pmask, pcount;
static uint64_t pshift;

static void plain_init(unsigned log2) {
  static size_t len;
  if (pt) munmap(pt, len);
  len = ((size_t)1 << log2) * sizeof *pt;
  pt = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  madvise(pt, len, MADV_HUGEPAGE);
  pmask = (1ull << log2) - 1, pshift = 64 - log2, pcount = 0;
}
/* The shift is loaded whole (an atomic load cannot be narrowed): clang
 * otherwise loads its low byte into %cl, which merges with the old %rcx, and
 * on this CPU every call then waits for the previous call's cache miss. The
 * runtime does the same (see struct arr in flow.c). */
static inline uint64_t plain_home(uint64_t k) { return (k * 0x9e3779b97f4a7c15ull) >> __atomic_load_n(&pshift, __ATOMIC_RELAXED); }
static __attribute__((noinline)) void plain_register(uint64_t k, uint64_t v) {
  uint64_t i = plain_home(k);
  while (pt[i].key && pt[i].key != k) i = (i + 1) & pmask;
  if (!pt[i].key) pcount++;
  pt[i].key = k, pt[i].val = v;
}
static __attribute__((noinline)) uint64_t plain_get(uint64_t k) {
  for (uint64_t i = plain_home(k);; i = (i + 1) & pmask) {
    if (pt[i].key == k) return pt[i].val;
    if (!pt[i].key) return 0;
  }
}
static __attribute__((noinline)) void plain_remove(uint64_t k) {
  uint64_t i = plain_home(k);
  while (pt[i].key != k) {
    if (!pt[i].key) return;
    i = (i + 1) & pmask;
  }
  /* backward shift: pull later entries of the run into the hole */
  for (uint64_t j = (i + 1) & pmask; pt[j].key; j = (j + 1) & pmask) {
    uint64_t h = plain_home(pt[j].key);
    if (((j - h) & pmask) >= ((j - i) & pmask)) pt[i] = pt[j], i = j;
  }
  pt[i].key = 0, pt[i].val = 0;
  pcount--;
}

/* ------------------------------------------------------------------ */
/* Baseline 2: chained hash + mutex + malloc (std::unordered_map-like)  */

struct node {
  struct node *next;
  uint64_t key, val;
};
static struct node **lt;
static uint64_t lbuckets, lcount;
static pthread_mutex_t lmu = PTHREAD_MUTEX_INITIALIZER;

static void locked_init(uint64_t buckets) {
  lt = calloc(buckets, sizeof *lt);
  lbuckets = buckets, lcount = 0;
}
static inline uint64_t locked_bucket(uint64_t k) { return (k * 0x9e3779b97f4a7c15ull >> 20) % lbuckets; }
static void locked_grow(void) {
  uint64_t nb = lbuckets * 2;
  struct node **n = calloc(nb, sizeof *n);
  for (uint64_t b = 0; b < lbuckets; b++)
    for (struct node *e = lt[b], *nx; e; e = nx) {
      nx = e->next;
      uint64_t h = (e->key * 0x9e3779b97f4a7c15ull >> 20) % nb;
      e->next = n[h], n[h] = e;
    }
  free(lt);
  lt = n, lbuckets = nb;
}
static __attribute__((noinline)) void locked_register(uint64_t k, uint64_t v) {
  pthread_mutex_lock(&lmu);
  struct node **p = &lt[locked_bucket(k)];
  for (struct node *e = *p; e; e = e->next)
    if (e->key == k) {
      e->val = v;
      pthread_mutex_unlock(&lmu);
      return;
    }
  struct node *e = malloc(sizeof *e);
  e->key = k, e->val = v, e->next = *p, *p = e;
  if (++lcount > lbuckets) locked_grow();
  pthread_mutex_unlock(&lmu);
}
static __attribute__((noinline)) uint64_t locked_get(uint64_t k) {
  pthread_mutex_lock(&lmu);
  uint64_t v = 0;
  for (struct node *e = lt[locked_bucket(k)]; e; e = e->next)
    if (e->key == k) {
      v = e->val;
      break;
    }
  pthread_mutex_unlock(&lmu);
  return v;
}
static __attribute__((noinline)) void locked_remove(uint64_t k) {
  pthread_mutex_lock(&lmu);
  for (struct node **p = &lt[locked_bucket(k)]; *p; p = &(*p)->next)
    if ((*p)->key == k) {
      struct node *e = *p;
      *p = e->next;
      free(e);
      lcount--;
      break;
    }
  pthread_mutex_unlock(&lmu);
}

/* ------------------------------------------------------------------ */

/* register, get, remove of fresh keys, reps batches each. */
#define TRIPLE(prefix, REG, GET, REM)                                  \
  do {                                                                 \
    double sr[reps], sg[reps], sx[reps];                               \
    for (int r = -1; r < reps; r++) {                                  \
      new_keys();                                                      \
      uint64_t t0 = now();                                             \
      for (int i = 0; i < BATCH; i++) REG;                             \
      uint64_t t1 = now();                                             \
      for (int i = 0; i < BATCH; i++) sink += GET;                     \
      uint64_t t2 = now();                                             \
      for (int i = 0; i < BATCH; i++) REM;                             \
      uint64_t t3 = now();                                             \
      if (r < 0) continue; /* warm-up */                               \
      sr[r] = (double)(t1 - t0) / BATCH;                               \
      sg[r] = (double)(t2 - t1) / BATCH;                               \
      sx[r] = (double)(t3 - t2) / BATCH;                               \
    }                                                                  \
    row(prefix " register", sr, reps);                                 \
    row(prefix " get", sg, reps);                                      \
    row(prefix " remove", sx, reps);                                   \
  } while (0)

/* One operation over a fixed set of keys, reps batches. */
#define SINGLE(name, K, OP)                                            \
  do {                                                                 \
    double s[reps];                                                    \
    for (int r = -1; r < reps; r++) {                                  \
      const uintptr_t *ks = (K) + (size_t)(r < 0 ? 0 : r) * BATCH;     \
      (void)ks;                                                        \
      uint64_t t0 = now();                                             \
      for (int i = 0; i < BATCH; i++) OP;                              \
      uint64_t t1 = now();                                             \
      if (r >= 0) s[r] = (double)(t1 - t0) / BATCH;                    \
    }                                                                  \
    row(name, s, reps);                                                \
  } while (0)

/* What a first touch of a page of a sparse tmpfs file costs here (the
 * record buffer's pages): ns per 4 KiB page. */
static double page_touch_ns(void) {
  const char *dir = getenv("BUNKAI_FLOW_DIR");
  char path[512];
  snprintf(path, sizeof path, "%s/micro-pages.%d", dir ? dir : "/dev/shm", getpid());
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  size_t len = 16u << 20;
  if (fd < 0 || ftruncate(fd, (off_t)len)) return 0;
  volatile char *m = mmap(0, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  uint64_t t0 = now();
  for (size_t o = 0; o < len; o += 4096) m[o] = 1;
  uint64_t t1 = now();
  munmap((void *)m, len);
  unlink(path);
  return (double)(t1 - t0) / (double)(len / 4096);
}

static void store_row(const char *name) {
  uint64_t bkf_pc__ = 0x401000, id = 7;
  uint32_t bkf_jp__ = 1;
  bkf_store(0, 0, 0, 0); /* creates the buffer */
  SINGLE(name, keys, STORE_DATA3(bkf_pc__, i, id));
}

int main(int argc, char **argv) {
  cpu_set_t cs;
  CPU_ZERO(&cs);
  CPU_SET(sched_getcpu(), &cs);
  sched_setaffinity(0, sizeof cs, &cs);
  const char *store = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) reps = 20;
    else if (!strcmp(argv[i], "--store") && i + 1 < argc) store = argv[++i];
    else {
      fprintf(stderr, "micro: unknown argument %s (use --quick, --store NAME)\n", argv[i]);
      return 2;
    }
  }
  if (store) {
    store_row(store);
    return 0;
  }

  /* Table 1 of the paper. */
  SINGLE("get_new_flowid", keys, sink += get_new_flowid());
  struct bkf_table *empty = bkf_table("bench.empty");
  new_keys();
  SINGLE("get_flowid(empty)", keys, sink += get_flowid(empty, (void *)keys[i]));

  struct bkf_table *t = bkf_table("bench.change");
  uint64_t id = 0;
  TRIPLE("changeID", register_flowid(t, (void *)keys[i], ++id), get_flowid(t, (void *)keys[i]),
         remove_flowid(t, (void *)keys[i]));
  printf("#\trebuilds(changeID)\t%llu\n#\tcapacity(changeID)\t%llu\n", (unsigned long long)__bunkai_flow_table_stat(t, 3),
         (unsigned long long)__bunkai_flow_table_stat(t, 2));
  struct bkf_table *u = bkf_table("bench.same");
  bkf_id same = get_new_flowid();
  TRIPLE("sameID", register_flowid(u, (void *)keys[i], same), get_flowid(u, (void *)keys[i]),
         remove_flowid(u, (void *)keys[i]));

  /* Beyond the paper: a table of 2M entries, random keys among them. */
  struct bkf_table *big = bkf_table("bench.big");
  uintptr_t *bk = malloc(sizeof *bk * BIG);
  for (uint64_t i = 0; i < BIG; i++) bk[i] = 0x7f0000000000ull + 64 * i;
  for (uint64_t i = 0; i < BIG; i++) register_flowid(big, (void *)bk[i], i + 1);
  uintptr_t *probe = malloc(sizeof *probe * (size_t)BATCH * (reps + 1));
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < (size_t)BATCH * (reps + 1); i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    probe[i] = bk[x % BIG];
  }
  SINGLE("get_flowid(2M)", probe, sink += get_flowid(big, (void *)ks[i]));
  uint64_t dep = 0; /* IDs are below 2^62: adds 0, but the next call waits for this one */
  SINGLE("get_flowid(2M) dependent", probe, dep = get_flowid(big, (void *)(ks[i] + (dep >> 62))));
  sink += dep;

  store_row("bkf_store(3 values)");
  printf("#\tpage_touch_ns\t%.0f\n", page_touch_ns());

  /* Baselines, same keys and pattern. */
  plain_init(12);
  TRIPLE("plain changeID", plain_register(keys[i], ++id), plain_get(keys[i]), plain_remove(keys[i]));
  locked_init(1024);
  TRIPLE("locked changeID", locked_register(keys[i], ++id), locked_get(keys[i]), locked_remove(keys[i]));
  plain_init(22);
  for (uint64_t i = 0; i < BIG; i++) plain_register(bk[i], i + 1);
  SINGLE("plain get(2M)", probe, sink += plain_get(ks[i]));
  SINGLE("plain get(2M) dependent", probe, dep = plain_get(ks[i] + (dep >> 62)));
  locked_init(1024);
  for (uint64_t i = 0; i < BIG; i++) locked_register(bk[i], i + 1);
  SINGLE("locked get(2M)", probe, sink += locked_get(ks[i]));

  /* Woven sleds. */
  sled_table = bkf_table("bench.sled");
  const uint64_t followed = 0x7e0000001000ull, other = 0x7e0000002040ull;
  register_flowid(sled_table, (void *)followed, get_new_flowid());
  uint64_t sl = (uint64_t)(uintptr_t)msled_sled;
  uint32_t jp0 = 0;
  SINGLE("sled unpatched", keys, msled(other));
  if (bkf_weave_ex(1, &sl, &jp0, sled_handler, 0, 0) == 0) {
    SINGLE("sled full state, not followed", keys, msled(other));
    bkf_unweave(1, &sl);
  }
  if (bkf_weave_ex(1, &sl, &jp0, sled_handler, 0, BKF_WEAVE_NO_VECTOR) == 0) {
    SINGLE("sled vector-free, not followed", keys, msled(other));
    SINGLE("sled vector-free, followed", keys, msled(followed));
    bkf_unweave(1, &sl);
  }
  struct bkf_guard g = {.n = 1, .reg = {7}, .table = {sled_table}};
  if (bkf_weave_guarded(1, &sl, &jp0, sled_handler, 0, BKF_WEAVE_NO_VECTOR, &g) == 0) {
    printf("#\tguarded\t%d\n", __bunkai_flow_guarded(sl));
    SINGLE("sled guarded, not followed", keys, msled(other));
    SINGLE("sled guarded, followed", keys, msled(followed));
    bkf_unweave(1, &sl);
  }

  printf("#\tsink\t%llu\n", (unsigned long long)(sink + dep + sled_hits));
  printf("#\tbytes(2M)\t%llu\n", (unsigned long long)__bunkai_flow_table_stat(big, 4));
  printf("#\tcapacity(2M)\t%llu\n", (unsigned long long)__bunkai_flow_table_stat(big, 2));
  return 0;
}
