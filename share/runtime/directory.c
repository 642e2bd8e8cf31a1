/* directory.c: the home manager's tables (home_manager.c owns them; no
 * other thread touches them):
 *   - the page directory: for each page some host other than home holds,
 *     its owner or its copy set. A page with no entry, or an entry with
 *     owner 0, is the home host's alone (the default: whatever home's own
 *     memory holds there, zeros where it holds nothing);
 *   - sets of address ranges (the registered ranges, `regs`; a node's
 *     fresh ranges), sorted and disjoint.
 * Rules: runtime.h. */
#include "runtime.h"

static struct dent *dir;
static uint64_t dir_cap, dir_used;

static uint64_t hash(uint64_t page) { return (page >> 12) * 0x9E3779B97F4A7C15ull; }

struct dent *dir_find(uint64_t page, int create) {
  if (!dir || (create && dir_used * 2 >= dir_cap)) {
    uint64_t ncap = dir ? dir_cap : 1 << 16;
    /* grow only when the live entries need it; otherwise compact */
    uint64_t live = 0;
    for (uint64_t i = 0; dir && i < dir_cap; i++)
      if (dir[i].page && dir[i].owner != 0) live++;
    while (live * 4 >= ncap) ncap *= 2;
    struct dent *nd = priv_alloc(ncap * sizeof *nd);
    uint64_t nused = 0;
    for (uint64_t i = 0; dir && i < dir_cap; i++) {
      struct dent *e = &dir[i];
      if (!e->page || e->owner == 0) continue; /* home's alone is the default */
      for (uint64_t k = hash(e->page) & (ncap - 1);; k = (k + 1) & (ncap - 1))
        if (!nd[k].page) { nd[k] = *e; nused++; break; }
    }
    if (dir) sc2(SYS_munmap, dir, PAGE_UP(dir_cap * sizeof *dir)); /* our region: no event */
    dir = nd, dir_cap = ncap, dir_used = nused;
  }
  for (uint64_t k = hash(page) & (dir_cap - 1);; k = (k + 1) & (dir_cap - 1)) {
    if (dir[k].page == page) return &dir[k];
    if (!dir[k].page) {
      if (!create) return 0;
      dir[k].page = page, dir[k].owner = 0, dir[k].copyset = 0;
      dir_used++;
      return &dir[k];
    }
  }
}

/* Calls f on every entry in [s, e): page by page for a small range, else
 * the whole table. */
#define FOR_RANGE(s, e, ...)                                                    \
  do {                                                                          \
    if (!dir) break;                                                            \
    if (((e) - (s)) / PAGE <= dir_cap / 8) {                                    \
      for (uint64_t p_ = (s); p_ < (e); p_ += PAGE) {                           \
        struct dent *d = dir_find(p_, 0);                                       \
        if (d) { __VA_ARGS__; }                                                      \
      }                                                                         \
    } else {                                                                    \
      for (uint64_t i_ = 0; i_ < dir_cap; i_++) {                               \
        struct dent *d = &dir[i_];                                              \
        if (d->page && d->page >= (s) && d->page < (e)) { __VA_ARGS__; }             \
      }                                                                         \
    }                                                                           \
  } while (0)

/* The memory is gone (unmapped, or dropped everywhere): home's alone. */
void dir_forget(uint64_t s, uint64_t e) {
  FOR_RANGE(s, e, { d->owner = 0, d->copyset = 0; });
}

void dir_set_owner(uint64_t s, uint64_t e, int host) {
  for (uint64_t a = s; a < e; a += PAGE) {
    struct dent *d = dir_find(a, 1);
    d->owner = (uint8_t)host, d->copyset = 0;
  }
}

/* mremap moved [from, from + len) to to: the entries move with the pages. */
void dir_move(uint64_t from, uint64_t to, uint64_t len) {
  static struct dent *moved;
  static uint64_t moved_cap;
  uint64_t nm = 0;
  FOR_RANGE(from, from + len, {
    if (d->owner != 0) {
      if (nm == moved_cap) {
        uint64_t nc = moved_cap ? moved_cap * 2 : 4096;
        struct dent *n = priv_alloc(nc * sizeof *n);
        if (moved) memcpy(n, moved, nm * sizeof *n);
        moved = n, moved_cap = nc;
      }
      moved[nm++] = *d;
      d->owner = 0, d->copyset = 0;
    }
  });
  dir_forget(to, to + len); /* whatever was there is gone (an unmap event said so first) */
  for (uint64_t k = 0; k < nm; k++) {
    struct dent *d = dir_find(moved[k].page - from + to, 1);
    d->owner = moved[k].owner, d->copyset = moved[k].copyset;
  }
}

/* ------------------------------------------------------------------ */
/* Range sets: sorted by start, disjoint.                              */

/* The index of the first range whose end is above a. */
static int first_above(const struct rangeset *s, uint64_t a) {
  int lo = 0, hi = s->n;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (s->r[mid].end <= a) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

int rs_find(const struct rangeset *s, uint64_t a) {
  int i = first_above(s, a);
  return i < s->n && s->r[i].start <= a;
}

int rs_overlaps(const struct rangeset *s, uint64_t a, uint64_t b) {
  int i = first_above(s, a);
  return i < s->n && s->r[i].start < b;
}

static void insert_at(struct rangeset *s, int i, uint64_t a, uint64_t b) {
  if (s->n == s->cap) {
    int nc = s->cap ? s->cap * 2 : 1024;
    struct range *n = priv_alloc((uint64_t)nc * sizeof *n);
    if (s->r) {
      memcpy(n, s->r, (size_t)s->n * sizeof *n);
      sc2(SYS_munmap, s->r, PAGE_UP((uint64_t)s->cap * sizeof *n));
    }
    s->r = n, s->cap = nc;
  }
  for (int k = s->n; k > i; k--) s->r[k] = s->r[k - 1];
  s->r[i] = (struct range){a, b};
  s->n++;
}

/* Removes [a, b) from the set, keeping the parts of ranges outside it
 * unless keep is 0 (then a range overlapping [a, b) goes whole); returns
 * whether any range overlapped it. */
int rs_cut(struct rangeset *s, uint64_t a, uint64_t b, int keep) {
  int i = first_above(s, a), hit = 0;
  while (i < s->n && s->r[i].start < b) {
    struct range r = s->r[i];
    for (int k = i; k + 1 < s->n; k++) s->r[k] = s->r[k + 1];
    s->n--;
    hit = 1;
    if (keep && r.start < a) insert_at(s, i++, r.start, a);
    if (keep && r.end > b) insert_at(s, i++, b, r.end);
  }
  return hit;
}

void rs_add(struct rangeset *s, uint64_t a, uint64_t b) {
  rs_cut(s, a, b, 1);
  insert_at(s, first_above(s, a), a, b);
}
