/* maps.c: what the kernel says about our own address space:
 * /proc/self/maps (mappings), /proc/self/mem (reading memory without
 * touching it: a page that is not here fails with EIO instead of faulting
 * into our own userfaultfd, and protections do not stop the read) and
 * /proc/self/pagemap (whether a page is here). Rules: runtime.h. */
#include "runtime.h"

/* Reads /proc/self/maps into the caller's buffer; returns its length. */
long read_maps(char *buf, long cap) {
  int fd = (int)sc4(SYS_openat, AT_FDCWD, "/proc/self/maps", O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) die("cannot read /proc/self/maps (%d)", fd, 0, 0, 0);
  long n = 0;
  for (;;) {
    long r = sc3(SYS_read, fd, buf + n, cap - 1 - n);
    if (r == -EINTR) continue;
    if (r <= 0) break;
    n += r;
    if (n >= cap - 1) die("/proc/self/maps is larger than %d bytes", cap, 0, 0, 0);
  }
  sc1(SYS_close, fd);
  buf[n] = 0;
  return n;
}

/* Parses the line at *p into v, advancing *p; 0 at the end. */
int next_vma(const char **p, struct vma *v) {
  const char *s = *p;
  if (!*s) return 0;
  v->start = parse_u(&s, 16);
  s++;
  v->end = parse_u(&s, 16);
  s++;
  v->prot = (s[0] == 'r' ? PROT_READ : 0) | (s[1] == 'w' ? PROT_WRITE : 0) | (s[2] == 'x' ? PROT_EXEC : 0);
  v->shared = s[3] == 's';
  s += 5;
  v->offset = parse_u(&s, 16);
  s++;
  while (*s && *s != ' ') s++; /* dev */
  s++;
  v->inode = parse_u(&s, 10);
  while (*s == ' ') s++;
  size_t k = 0;
  while (*s && *s != '\n') {
    if (k < sizeof v->path - 1) v->path[k++] = *s;
    s++;
  }
  v->path[k] = 0;
  if (*s == '\n') s++;
  *p = s;
  return 1;
}

/* Is anything mapped at addr? Unlike a read of /proc/self/maps, which
 * this kernel does without the mmap lock and so can catch a mremap
 * between unmapping its destination and putting the moved mapping there,
 * mincore holds the lock: it sees before or after a change, never the
 * middle. */
int mapped_at(uint64_t addr) {
  unsigned char v;
  return sc3(SYS_mincore, PAGE_DOWN(addr), PAGE, &v) != -ENOMEM;
}

/* The mapping holding addr; 0 if none. */
int find_vma(char *buf, long cap, uint64_t addr, struct vma *v) {
  read_maps(buf, cap);
  const char *p = buf;
  while (next_vma(&p, v))
    if (addr >= v->start && addr < v->end) return 1;
  return 0;
}

int ours(const struct vma *v) {
  if (v->start >= BKS_PRIVATE_BASE && v->end <= BKS_PRIVATE_BASE + BKS_PRIVATE_SIZE) return 1;
  if (v->end > g.lib_lo && v->start < g.lib_hi) return 1;
  /* the kernel's own: vdso, vvar, vsyscall (not [heap], [stack], or the
   * program's named anonymous memory, [anon:NAME]) */
  if (sequal(v->path, "[vdso]") || sequal(v->path, "[vvar]") || sequal(v->path, "[vvar_vclock]") ||
      sequal(v->path, "[vsyscall]") || sequal(v->path, "[uprobes]"))
    return 1;
  return 0;
}

/* Is this mapping's memory shared page by page? Private writable memory
 * (anonymous, heap, stacks, data and bss after conversion) and anonymous
 * memory of any protection (guard areas that may become writable). */
int is_shared_mem(const struct vma *v) {
  if (ours(v) || v->shared) return 0;
  if (v->prot & PROT_WRITE) return 1;
  return v->inode == 0 && (v->path[0] == 0 || v->path[0] == '[');
}

/* Copies [addr, addr + len) into buf, whatever its protection. A page
 * that is not here (never touched, or dropped) reads as zeros. Returns the
 * number of pages that were here. */
int mem_read(uint64_t addr, void *buf, uint64_t len) {
  int here = 0;
  for (uint64_t off = 0; off < len;) {
    uint64_t n = len - off;
    long r = sc4(SYS_pread64, g.mem_fd, (char *)buf + off, n, addr + off);
    if (r == -EINTR) continue;
    if (r > 0) {
      off += (uint64_t)r;
      here += (int)((uint64_t)r / PAGE);
      continue;
    }
    /* the page at addr + off is missing: zeros, then go on after it */
    uint64_t next = PAGE_DOWN(addr + off) + PAGE;
    memset((char *)buf + off, 0, next - (addr + off));
    off = next - addr;
  }
  return here;
}

#define PM_PRESENT (1ull << 63)
#define PM_SWAPPED (1ull << 62)

/* Does this process hold the page (in memory or swapped out)? */
int page_here(uint64_t page) {
  uint64_t e = 0;
  long r = sc4(SYS_pread64, g.pagemap_fd, &e, 8, (page / PAGE) * 8);
  if (r != 8) return 0;
  return (e & (PM_PRESENT | PM_SWAPPED)) != 0;
}
