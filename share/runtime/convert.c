/* convert.c: a private file mapping made anonymous memory with the same
 * contents, in place. userfaultfd cannot register private file mappings,
 * and home's unmapping of one would not be announced to the manager; as
 * anonymous memory registered for sharing, the mapping's pages go through
 * the directory like any other, and its unmapping reaches the nodes.
 *
 * Done at start-up for every writable one (libraries' data), when the
 * dynamic linker has mapped new objects for their writable ones (data, and
 * RELRO before it is relocated: the doorbell, start.c), and when a node
 * first touches any other (text, read-only data, files the program
 * mapped). The contents are read through /proc/self/mem, whatever the
 * protection; the new memory replaces the old with one mremap. A home
 * thread writing the mapping between the read and the mremap would lose
 * its write: nothing does for text, read-only data or an object not yet
 * relocated; docs/share.md names the rest.
 *
 * Never in the home manager: the mremap replaces whatever is there, and if
 * a home thread had moved registered memory there meanwhile, the unmap
 * would wait for the manager to read its event. The asking thread (an
 * executor, or the thread that loaded the objects) converts, one at a
 * time, and the manager then registers what it finds converted.
 * Rules: runtime.h. */
#include "runtime.h"

/* Larger file mappings are refused rather than copied. */
#define CONVERT_MAX (1ull << 30)

/* 0, or -1 if the mapping was gone when we replaced it. */
static int make_anonymous_now(const struct vma *v) {
  uint64_t len = v->end - v->start;
  if (len > CONVERT_MAX)
    die("a node touched %s, a %d MiB file mapping made after start-up (bunkai share copies such mappings into shared "
        "memory, at most 1024 MiB: map it before the program starts threads, or in smaller pieces)",
        (long)v->path, (long)(len >> 20), 0, 0);
  char *tmp = priv_alloc(len);
  mem_read(v->start, tmp, len);
  /* the copy gets the mapping's protection before it takes its place: a
   * thread running the library's code at that instant must never find it
   * without PROT_EXEC (a node asking how it is mapped would be told it
   * cannot run there; a home thread would fault) */
  sc3(SYS_mprotect, tmp, len, v->prot);
  long r = sc5(SYS_mremap, tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, v->start);
  /* the private region stays reserved where tmp was */
  sc6(SYS_mmap, (long)tmp, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  return r == (long)v->start ? 0 : -1;
}

int make_anonymous(const struct vma *v) { return make_anonymous_now(v); }

static volatile int convert_lock;
static char *maps;
#define CONVERT_MAPS (8l << 20)

/* A node touched addr and home's mapping there is a file mapping (the
 * manager said BKS_MAPPED_CONVERT): convert it if it still is. */
void convert_at(uint64_t addr) {
  lock(&convert_lock);
  if (!maps) maps = priv_alloc(CONVERT_MAPS);
  struct vma v;
  if (find_vma(maps, CONVERT_MAPS, addr, &v) && !ours(&v) && !v.shared && v.inode != 0 && !make_anonymous_now(&v))
    __atomic_fetch_add(&g.stats->converted, 1, __ATOMIC_RELAXED);
  unlock(&convert_lock);
}

/* The dynamic linker has mapped objects at these load addresses (n < 0:
 * unknown): convert the writable file mappings of their files, at and
 * after their first mapping. Returns how many were converted, their
 * ranges in out[]. */
int convert_loaded(const uint64_t *bases, int n, struct range *out, int cap) {
  static uint64_t inodes[ITEM_BASES], lows[ITEM_BASES];
  int ni = 0, k = 0;
  lock(&convert_lock);
  if (!maps) maps = priv_alloc(CONVERT_MAPS);
  read_maps(maps, CONVERT_MAPS);
  const char *p = maps;
  struct vma v;
  while (next_vma(&p, &v))
    for (int b = 0; b < n; b++)
      if (v.inode && bases[b] >= v.start && bases[b] < v.end && ni < ITEM_BASES) inodes[ni] = v.inode, lows[ni++] = v.start;
  static struct vma todo[256];
  int nt = 0;
  p = maps;
  while (next_vma(&p, &v) && nt < 256) {
    if (ours(&v) || v.shared || v.inode == 0 || !(v.prot & PROT_WRITE)) continue;
    int mine = n < 0;
    for (int i = 0; i < ni && !mine; i++) mine = v.inode == inodes[i] && v.start >= lows[i];
    if (mine) todo[nt++] = v;
  }
  for (int i = 0; i < nt && k < cap; i++)
    if (!make_anonymous_now(&todo[i])) out[k++] = (struct range){todo[i].start, todo[i].end};
  unlock(&convert_lock);
  return k;
}
