/* table.c: the flow tables: register_flowid, get_flowid, remove_flowid,
 * bkf_table. Rules: runtime.h.
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
 */
#include "runtime.h"

static struct arr empty_arr = {.gen = 2, .shift = 63, .log2 = 0, .mask = 0, .s = {{0, 0}}};

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
    if (t->namehash == h && rt_sequal(t->name, name)) return t;
  proc_enter();
  lock(&G.reg_lock);
  struct bkf_table *t;
  for (t = LD_ACQ(&G.tables); t; t = t->next)
    if (t->namehash == h && rt_sequal(t->name, name)) break;
  if (!t) {
    uint64_t len = rt_slen(name);
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
