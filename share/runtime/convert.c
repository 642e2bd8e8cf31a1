/* convert.c: a private file mapping made anonymous memory with the same
 * contents, in place. userfaultfd cannot register private file mappings,
 * and home's unmapping of one would not be announced to the manager; as
 * anonymous memory registered for sharing, the mapping's pages go through
 * the directory like any other, and its unmapping reaches the nodes.
 *
 * Done at start-up for every writable one (libraries' data), after a home
 * thread's dlopen for the written ones (data, relocated RELRO: start.c,
 * ITEM_PREPARE), and when a node first touches any other (text, read-only
 * data, files the program mapped). The contents are read through
 * /proc/self/mem, whatever the protection; the new memory replaces the old
 * with one mremap. A home thread writing the mapping between the read and
 * the mremap would lose its write: nothing does for text, read-only data
 * or a library dlopen has just loaded; docs/share.md names the rest.
 * Rules: runtime.h. */
#include "runtime.h"

/* Larger file mappings are refused rather than copied. */
#define CONVERT_MAX (1ull << 30)

/* 0, or -1 if the mapping was gone when we replaced it. */
int make_anonymous(const struct vma *v) {
  uint64_t len = v->end - v->start;
  if (len > CONVERT_MAX)
    die("a node touched %s, a %d MiB file mapping made after start-up (bunkai share copies such mappings into shared "
        "memory, at most 1024 MiB: map it before the program starts threads, or in smaller pieces)",
        (long)v->path, (long)(len >> 20), 0, 0);
  char *tmp = priv_alloc(len);
  mem_read(v->start, tmp, len);
  long r = sc5(SYS_mremap, tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, v->start);
  /* the private region stays reserved where tmp was */
  sc6(SYS_mmap, (long)tmp, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  if (r != (long)v->start) return -1;
  sc3(SYS_mprotect, v->start, len, v->prot);
  return 0;
}
