/*
 * memory.c - a load's staged memory: ALLOC reserves it (low addresses
 * first), WRITE fills it, PROTECT makes its code r-x, MAP replaces it with
 * the server's sealed memfd; a refused COMMIT drops it. Rules: host.h.
 */
#include "host.h"

static size_t page_round(uint64_t n) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  return (size_t)((n + pg - 1) / pg * pg);
}

struct staged *find_staged(struct session *s, uint64_t addr) {
  for (struct staged *st = s->staged; st; st = st->next)
    if ((uint64_t)(uintptr_t)st->mem == addr)
      return st;
  return NULL;
}

/* The staged memory of a refused COMMIT goes at once: nothing of it runs. */
void drop_staged(struct session *s, struct staged *st) {
  for (struct staged **pp = &s->staged; *pp; pp = &(*pp)->next)
    if (*pp == st) {
      *pp = st->next;
      munmap(st->mem, st->mem_len);
      used -= st->mem_len;
      free(st);
      return;
    }
}

int do_alloc(int fd, struct session *s, struct msg *m) {
  uint64_t t0 = now_ns();
  uint64_t rx = get64(m), rw = get64(m);
  if (m->bad || rx > MAX_MSG || rw > MAX_MSG)
    return send_err(fd, "malformed ALLOC");
  size_t rxl = page_round(rx), len = rxl + page_round(rw);
  if (len == 0)
    len = page_round(1), rxl = len;
  if (budget && used - s->evict_bytes + len > budget)
    return send_err(fd,
                    "out of module memory: %llu of %llu bytes in use, %zu more "
                    "needed (unload a module or raise the host's budget)",
                    (unsigned long long)used, (unsigned long long)budget, len);
  /* Low memory first: 32-bit absolute relocations (non-PIC code) and
   * PC-relative references to a non-PIE host stay in range. */
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT, -1, 0);
  if (p == MAP_FAILED)
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
             -1, 0);
  if (p == MAP_FAILED)
    return send_err(fd, "cannot map %zu bytes: %s", len, strerror(errno));
  struct staged *st = calloc(1, sizeof *st);
  if (!st) {
    munmap(p, len);
    return send_err(fd, "out of memory");
  }
  st->mem = p;
  st->rx_len = rxl;
  st->mem_len = len;
  st->next = s->staged;
  s->staged = st;
  used += len;
  struct out o = {0};
  put64(&o, (uint64_t)(uintptr_t)p);
  put64(&o, (uint64_t)(uintptr_t)p + rxl);
  put64(&o, now_ns() - t0);
  int rc = send_msg(fd, BUNKAI_MSG_OK, &o);
  free(o.p);
  return rc;
}

int do_write(int fd, struct session *s, struct msg *m) {
  uint64_t t0 = now_ns();
  uint64_t addr = get64(m);
  uint32_t n;
  const unsigned char *data = getbytes(m, &n);
  if (m->bad)
    return send_err(fd, "malformed WRITE");
  for (struct staged *st = s->staged; st; st = st->next) {
    uint64_t base = (uint64_t)(uintptr_t)st->mem;
    if (addr >= base && addr + n <= base + st->mem_len && addr + n >= addr) {
      if (st->sealed && addr < base + st->rx_len)
        return send_err(fd, "WRITE into code that is already protected");
      memcpy((void *)(uintptr_t)addr, data, n);
      return send_ok_since(fd, t0);
    }
  }
  return send_err(fd, "WRITE outside the memory staged for this load");
}

int do_protect(int fd, struct session *s, struct msg *m) {
  uint64_t t0 = now_ns();
  uint64_t addr = get64(m);
  struct staged *st = m->bad ? NULL : find_staged(s, addr);
  if (!st)
    return send_err(fd, "PROTECT of memory not staged for this load");
  if (mprotect(st->mem, st->rx_len, PROT_READ | PROT_EXEC))
    return send_err(fd, "mprotect: %s", strerror(errno));
  st->sealed = 1;
  return send_ok_since(fd, t0);
}

/* MAP: the zero-copy load. The server linked the module straight into a
 * memfd laid out like the staged region (RX part, then the RW part's data)
 * and passed it with SCM_RIGHTS; it replaces the start of the reservation in
 * place. Both parts are private mappings, as ld.so maps a library: code
 * r-x, data rw- and copy-on-write, so a fork of the host gets its own copy of
 * the module's variables, exactly as with anonymous memory. The rest of the
 * RW part (bss) stays the reservation's anonymous zero pages. The memfd is
 * sealed first, fully: it cannot shrink under the mapping (no SIGBUS later),
 * nor be written by anyone, through a mapping or write(). On failure the region is put
 * back as it was (anonymous, read-write), so the server may fall back to
 * WRITE. */
int do_map(int fd, struct session *s, struct msg *m) {
  uint64_t t0 = now_ns();
  uint64_t addr = get64(m), flen = get64(m);
  int mfd = s->passed_fd;
  s->passed_fd = -1;
  struct staged *st = m->bad ? NULL : find_staged(s, addr);
  const char *why = NULL;
  int err = 0;
  if (mfd < 0)
    why = "MAP without a file descriptor";
  else if (!st)
    why = "MAP of memory not staged for this load";
  else if (st->sealed)
    why = "MAP of memory already loaded";
  else if (flen < st->rx_len || flen > st->mem_len || flen % page_round(1))
    why = "MAP of a file that does not fit the staged memory";
  if (why) {
    if (mfd >= 0)
      close(mfd);
    return send_err(fd, "%s", why);
  }
  struct stat sb;
  /* Fully sealed before it is mapped: no write, no resize, no more seals.
   * F_SEAL_WRITE cannot be set while anyone still has a shared writable
   * mapping of it, so a sender keeping one could change the code after
   * this check: such a memfd is refused. The server seals it itself (after
   * unmapping its own mapping); the host adds what is missing. */
  const int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;
  int have = fcntl(mfd, F_GET_SEALS);
  if (have < 0)
    why = "the descriptor sent is not a sealable memfd", err = errno;
  else if ((have & want) != want && (have & F_SEAL_SEAL))
    why = "the module's memfd is sealed, but not against writes and resizing";
  else if ((have & want) != want && fcntl(mfd, F_ADD_SEALS, want & ~have))
    why = errno == EBUSY ? "the module's memfd is still mapped writable "
                           "elsewhere (its sender must unmap it before MAP)"
                         : "cannot seal the module's memfd",
    err = errno == EBUSY ? 0 : errno;
  else if ((fcntl(mfd, F_GET_SEALS) & want) != want)
    why = "the module's memfd is not fully sealed";
  else if (fstat(mfd, &sb))
    why = "fstat", err = errno;
  else if ((uint64_t)sb.st_size < flen)
    why = "the module's memfd is shorter than announced";
  else if (st->rx_len && mmap(st->mem, st->rx_len, PROT_READ | PROT_EXEC,
                              MAP_PRIVATE | MAP_FIXED, mfd, 0) == MAP_FAILED)
    why = "cannot map the module's code", err = errno;
  else if (flen > st->rx_len &&
           mmap((char *)st->mem + st->rx_len, flen - st->rx_len,
                PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, mfd,
                (off_t)st->rx_len) == MAP_FAILED)
    why = "cannot map the module's data", err = errno;
  close(mfd);
  if (why && flen) {
    /* Back to the reservation ALLOC made; the same address range, so a
     * fixed mapping cannot fail for want of room. */
    mmap(st->mem, flen, PROT_READ | PROT_WRITE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  }
  if (why) {
    return err ? send_err(fd, "%s: %s", why, strerror(err))
               : send_err(fd, "%s", why);
  }
  st->sealed = 1;
  return send_ok_since(fd, t0);
}
