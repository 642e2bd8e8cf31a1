/*
 * host.c - libbunkai-host: the host side of `bunkai mod` (DKM, seed 004).
 *
 * A host program links this library (or gets it through LD_PRELOAD with
 * BUNKAI_HOST=1) and plays the part of DKM's kernel: it owns the memory
 * modules live in, the registry through which it calls them, and the table
 * of loaded modules. The module server (`bunkai mod`, Rust) does the checks,
 * the dependency walk and the linking, and drives this library over a Unix
 * socket with the protocol in mod/include/bunkai_mod.h.
 *
 * Rules for this file, which runs inside the host program:
 *   - Exported symbols start with bunkai_ (the public host API in
 *     bunkai_mod.h) or __bunkai_; everything else is static.
 *   - No constructor unless preloaded: preload.c holds the one that starts
 *     the command thread when BUNKAI_HOST=1.
 *   - One command thread serves one connection at a time; a connection is a
 *     transaction. What it allocated or staged is undone unless it commits,
 *     so a server that dies half-way leaves the host exactly as it was.
 *   - The program's threads never block on the command thread: calls go
 *     through bunkai_acquire/bunkai_release, two atomic adds, and read a
 *     function table that is replaced with one atomic store. Unloading waits
 *     for the calls in flight in the old generation to finish (a grace
 *     period, as in RCU) before it frees anything.
 *   - Only the host's owner or root may talk to it (SO_PEERCRED).
 *   - The command thread blocks every signal, so the program's signal
 *     handling is unchanged.
 */
#define _GNU_SOURCE
#include "../include/bunkai_mod.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_MSG (256u << 20) /* a 4 MB module is far below this */

/* ---- the registry --------------------------------------------------------- */

struct provider {
  uint32_t module;
  const void **table;
  char **names; /* the functions' names, for bunkai_lookup */
  uint32_t nfn;
  struct provider *next; /* older providers: an unload reverts to them */
};

struct bunkai_iface {
  char *name;
  _Atomic(const void *) table; /* the top provider's table, or NULL */
  struct provider *providers;  /* guarded by reg_lock */
  struct bunkai_iface *next;
};

struct expect {
  char *name, *text;
  struct expect *next;
};

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct bunkai_iface *ifaces;
static struct expect *expects;

/* Grace periods: readers count themselves in the generation they entered. */
static _Atomic uint32_t gen;
static _Atomic int64_t readers[2];

EXPORT bunkai_iface_t *bunkai_iface(const char *name) {
  pthread_mutex_lock(&reg_lock);
  struct bunkai_iface *h;
  for (h = ifaces; h; h = h->next)
    if (!strcmp(h->name, name))
      break;
  if (!h) {
    h = calloc(1, sizeof *h);
    if (h && !(h->name = strdup(name))) {
      free(h);
      h = NULL;
    }
    if (h) {
      h->next = ifaces;
      ifaces = h;
    }
  }
  pthread_mutex_unlock(&reg_lock);
  return h;
}

EXPORT const void *bunkai_acquire(bunkai_iface_t *h, struct bunkai_guard *g) {
  uint32_t e;
  for (;;) {
    e = atomic_load(&gen);
    atomic_fetch_add(&readers[e & 1], 1);
    if (atomic_load(&gen) == e)
      break;
    atomic_fetch_sub(&readers[e & 1], 1);
  }
  g->gen = e;
  return h ? atomic_load(&h->table) : NULL;
}

EXPORT void bunkai_release(struct bunkai_guard *g) {
  atomic_fetch_sub(&readers[g->gen & 1], 1);
}

/* Waits until no call that may have seen the old tables is in flight. */
static void grace_period(void) {
  uint32_t e = atomic_load(&gen);
  atomic_store(&gen, e + 1);
  while (atomic_load(&readers[e & 1]) != 0)
    sched_yield();
}

EXPORT void *bunkai_lookup(const char *iface, const char *name) {
  void *fn = NULL;
  pthread_mutex_lock(&reg_lock);
  for (struct bunkai_iface *h = ifaces; h; h = h->next)
    if (!strcmp(h->name, iface) && h->providers)
      for (uint32_t i = 0; i < h->providers->nfn; i++)
        if (!strcmp(h->providers->names[i], name))
          fn = (void *)h->providers->table[i];
  pthread_mutex_unlock(&reg_lock);
  return fn;
}

EXPORT int bunkai_host_expect(const char *name, const char *text) {
  struct expect *e = calloc(1, sizeof *e);
  if (!e || !(e->name = strdup(name)) || !(e->text = strdup(text))) {
    free(e);
    return -1;
  }
  pthread_mutex_lock(&reg_lock);
  e->next = expects;
  expects = e;
  pthread_mutex_unlock(&reg_lock);
  bunkai_iface(name);
  return 0;
}

/* ---- modules and memory ---------------------------------------------------- */

struct reg {
  struct bunkai_iface *iface;
  const void **table;
  char **names;
  uint32_t nfn;
};

static void free_strv(char **v, uint32_t n) {
  for (uint32_t k = 0; v && k < n; k++)
    free(v[k]);
  free(v);
}

static void free_reg(struct reg *r) {
  for (uint32_t k = 0; r->names && k < r->nfn; k++)
    free(r->names[k]);
  free(r->names);
  free(r->table);
}

struct module {
  uint32_t id;
  char *name;   /* the module's name, and those of the modules it needs */
  char **deps;  /* (from COMMIT; the blob has them too, as JSON) */
  uint32_t ndeps;
  char *blob;
  uint32_t blob_len;
  void *mem;
  size_t mem_len;
  void (*exit_fn)(void);
  uint32_t nregs;
  struct reg *regs;
  struct module *next;
};

struct staged {
  void *mem;
  size_t rx_len, mem_len;
  int sealed; /* the RX part is final (PROTECT or MAP): no more WRITEs to it */
  struct staged *next;
};

static struct module *modules; /* guarded by the command thread (only writer)
                                  and mod_lock for provider names */
static pthread_mutex_t mod_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t next_id = 1;
static uint64_t budget, used;

EXPORT void bunkai_host_set_budget(uint64_t bytes) { budget = bytes; }

EXPORT const char *bunkai_provider(const char *iface, char *buf,
                                   unsigned long len) {
  const char *out = NULL;
  pthread_mutex_lock(&reg_lock);
  struct bunkai_iface *h;
  for (h = ifaces; h; h = h->next)
    if (!strcmp(h->name, iface))
      break;
  uint32_t id = h && h->providers ? h->providers->module : 0;
  pthread_mutex_unlock(&reg_lock);
  if (!id)
    return NULL;
  pthread_mutex_lock(&mod_lock);
  for (struct module *m = modules; m; m = m->next)
    if (m->id == id) {
      /* The blob is JSON starting {"name":"..." */
      const char *k = strstr(m->blob, "\"name\":\"");
      if (k && len) {
        k += 8;
        size_t i = 0;
        while (k[i] && k[i] != '"' && i + 1 < len) {
          buf[i] = k[i];
          i++;
        }
        buf[i] = 0;
        out = buf;
      }
    }
  pthread_mutex_unlock(&mod_lock);
  return out;
}

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Takes module m's entries off the provider stacks of its interfaces.
 * Caller holds reg_lock and republishes the tables. */
static void drop_providers(const struct module *m) {
  for (uint32_t i = 0; i < m->nregs; i++) {
    struct bunkai_iface *h = m->regs[i].iface;
    for (struct provider **pp = &h->providers; *pp;) {
      if ((*pp)->module == m->id) {
        struct provider *dead = *pp;
        *pp = dead->next;
        free(dead);
      } else {
        pp = &(*pp)->next;
      }
    }
  }
}

/* Publishes each interface's top provider (caller holds reg_lock). */
static void publish_tables(void) {
  for (struct bunkai_iface *h = ifaces; h; h = h->next)
    atomic_store(&h->table, h->providers ? (const void *)h->providers->table
                                         : NULL);
}

/* Removes module m's registrations and republishes the tables. */
static void unregister(struct module *m) {
  pthread_mutex_lock(&reg_lock);
  drop_providers(m);
  publish_tables();
  pthread_mutex_unlock(&reg_lock);
}

/* After unregister + grace period: nobody can be running the module. */
static void destroy(struct module *m) {
  if (m->exit_fn)
    m->exit_fn();
  munmap(m->mem, m->mem_len);
  used -= m->mem_len;
  for (uint32_t i = 0; i < m->nregs; i++)
    free_reg(&m->regs[i]);
  free(m->regs);
  free(m->blob);
  free(m->name);
  free_strv(m->deps, m->ndeps);
  free(m);
}

static struct module *find_module(uint32_t id) {
  pthread_mutex_lock(&mod_lock);
  struct module *m = modules;
  while (m && m->id != id)
    m = m->next;
  pthread_mutex_unlock(&mod_lock);
  return m;
}

static struct module *unlink_module(uint32_t id) {
  pthread_mutex_lock(&mod_lock);
  struct module *found = NULL;
  for (struct module **pp = &modules; *pp; pp = &(*pp)->next)
    if ((*pp)->id == id) {
      found = *pp;
      *pp = found->next;
      break;
    }
  pthread_mutex_unlock(&mod_lock);
  return found;
}

/* Once nothing can reach module m any more (its tables are off the stacks):
 * waits for the calls in flight, then frees it. */
static void retire(struct module *m) {
  grace_period();
  unlink_module(m->id);
  destroy(m);
}

static void remove_module(struct module *m) {
  unregister(m);
  retire(m);
}

/* ---- wire ------------------------------------------------------------------ */

struct msg {
  unsigned char *p;
  size_t len, off;
  int bad;
};

/* Reads exactly len bytes. A file descriptor passed with SCM_RIGHTS (MAP's
 * memfd) arrives with the bytes it was sent with; it is kept in *passed for
 * the message that uses it (an earlier one never claimed is closed). recvmsg
 * everywhere: a plain read() would silently drop the descriptor. */
static int read_full(int fd, void *buf, size_t len, int *passed) {
  unsigned char *b = buf;
  while (len) {
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(4 * sizeof(int))];
    } ctl;
    struct iovec iov = {b, len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1,
                        .msg_control = &ctl, .msg_controllen = sizeof ctl};
    ssize_t n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
        continue;
      size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t k = 0; k < nfd; k++) {
        int got;
        memcpy(&got, CMSG_DATA(c) + k * sizeof(int), sizeof got);
        if (*passed >= 0)
          close(*passed);
        *passed = got;
      }
    }
    b += n;
    len -= (size_t)n;
  }
  return 0;
}

static int write_full(int fd, const void *buf, size_t len) {
  const unsigned char *b = buf;
  while (len) {
    ssize_t n = send(fd, b, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    b += n;
    len -= (size_t)n;
  }
  return 0;
}

static uint32_t get32(struct msg *m) {
  uint32_t v = 0;
  if (m->off + 4 > m->len) {
    m->bad = 1;
    return 0;
  }
  memcpy(&v, m->p + m->off, 4);
  m->off += 4;
  return v;
}

static uint64_t get64(struct msg *m) {
  uint64_t v = 0;
  if (m->off + 8 > m->len) {
    m->bad = 1;
    return 0;
  }
  memcpy(&v, m->p + m->off, 8);
  m->off += 8;
  return v;
}

/* A string; returns a pointer into the message (not NUL-terminated) */
static const unsigned char *getbytes(struct msg *m, uint32_t *len) {
  *len = get32(m);
  if (m->bad || m->off + *len > m->len) {
    m->bad = 1;
    *len = 0;
    return NULL;
  }
  const unsigned char *p = m->p + m->off;
  m->off += *len;
  return p;
}

static char *getstr(struct msg *m) {
  uint32_t n;
  const unsigned char *p = getbytes(m, &n);
  if (!p)
    return NULL;
  char *s = malloc(n + 1);
  if (!s)
    return NULL;
  memcpy(s, p, n);
  s[n] = 0;
  return s;
}

struct out {
  unsigned char *p;
  size_t len, cap;
};

static void put(struct out *o, const void *d, size_t n) {
  if (o->len + n > o->cap) {
    size_t cap = o->cap ? o->cap * 2 : 256;
    while (cap < o->len + n)
      cap *= 2;
    unsigned char *p = realloc(o->p, cap);
    if (!p)
      abort(); /* the command thread cannot answer without memory */
    o->p = p;
    o->cap = cap;
  }
  memcpy(o->p + o->len, d, n);
  o->len += n;
}
static void put32(struct out *o, uint32_t v) { put(o, &v, 4); }
static void put64(struct out *o, uint64_t v) { put(o, &v, 8); }
static void putstr(struct out *o, const char *s, size_t n) {
  put32(o, (uint32_t)n);
  put(o, s, n);
}

static int send_msg(int fd, uint32_t type, struct out *body) {
  uint32_t hdr[2] = {(uint32_t)(4 + (body ? body->len : 0)), type};
  if (write_full(fd, hdr, sizeof hdr))
    return -1;
  return body && body->len ? write_full(fd, body->p, body->len) : 0;
}

static int send_err(int fd, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  struct out o = {0};
  putstr(&o, buf, strlen(buf));
  int rc = send_msg(fd, BUNKAI_MSG_ERR, &o);
  free(o.p);
  return rc;
}

/* ---- one transaction -------------------------------------------------------- */

/* OK carrying the time the command took (ns since t0). */
static int send_ok_since(int fd, uint64_t t0) {
  struct out o = {0};
  put64(&o, now_ns() - t0);
  int rc = send_msg(fd, BUNKAI_MSG_OK, &o);
  free(o.p);
  return rc;
}

struct session {
  struct staged *staged;
  int passed_fd; /* a descriptor received with SCM_RIGHTS, not yet used */
  uint32_t evict[64]; /* modules to unload when the first COMMIT lands */
  uint32_t nevict;
  uint64_t evict_bytes;
};

static struct staged *find_staged(struct session *s, uint64_t addr) {
  for (struct staged *st = s->staged; st; st = st->next)
    if ((uint64_t)(uintptr_t)st->mem == addr)
      return st;
  return NULL;
}

static void rollback(struct session *s) {
  if (s->passed_fd >= 0)
    close(s->passed_fd);
  s->passed_fd = -1;
  s->nevict = 0;
  s->evict_bytes = 0;
  while (s->staged) {
    struct staged *st = s->staged;
    s->staged = st->next;
    munmap(st->mem, st->mem_len);
    used -= st->mem_len;
    free(st);
  }
}

static size_t page_round(uint64_t n) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  return (size_t)((n + pg - 1) / pg * pg);
}

static int do_hello(int fd) {
  struct out o = {0};
  put32(&o, BUNKAI_MOD_ABI);
  put32(&o, (uint32_t)getpid());
  put64(&o, budget);
  put64(&o, used);
  pthread_mutex_lock(&reg_lock);
  uint32_t n = 0;
  for (struct expect *e = expects; e; e = e->next)
    n++;
  put32(&o, n);
  for (struct expect *e = expects; e; e = e->next) {
    putstr(&o, e->name, strlen(e->name));
    putstr(&o, e->text, strlen(e->text));
  }
  pthread_mutex_unlock(&reg_lock);
  pthread_mutex_lock(&mod_lock);
  n = 0;
  for (struct module *m = modules; m; m = m->next)
    n++;
  put32(&o, n);
  for (struct module *m = modules; m; m = m->next) {
    put32(&o, m->id);
    put64(&o, (uint64_t)(uintptr_t)m->mem);
    put64(&o, m->mem_len);
    putstr(&o, m->blob, m->blob_len);
  }
  pthread_mutex_unlock(&mod_lock);
  int rc = send_msg(fd, BUNKAI_MSG_OK, &o);
  free(o.p);
  return rc;
}

/* The registry API resolves to this library's own functions even when the
 * host was linked without -rdynamic (dlsym cannot see an executable's
 * symbols then); everything else is looked up in the host's global scope. */
static void *api_symbol(const char *name) {
  static const struct {
    const char *name;
    void *addr;
  } api[] = {
      {"bunkai_iface", (void *)bunkai_iface},
      {"bunkai_acquire", (void *)bunkai_acquire},
      {"bunkai_release", (void *)bunkai_release},
      {"bunkai_lookup", (void *)bunkai_lookup},
      {"bunkai_provider", (void *)bunkai_provider},
  };
  for (size_t i = 0; i < sizeof api / sizeof api[0]; i++)
    if (!strcmp(api[i].name, name))
      return api[i].addr;
  return NULL;
}

static int do_resolve(int fd, struct msg *m) {
  uint32_t n = get32(m);
  struct out o = {0};
  for (uint32_t i = 0; i < n && !m->bad; i++) {
    char *name = getstr(m);
    void *a = name ? api_symbol(name) : NULL;
    if (name && !a)
      a = dlsym(RTLD_DEFAULT, name);
    free(name);
    put64(&o, (uint64_t)(uintptr_t)a);
  }
  int rc = m->bad ? send_err(fd, "malformed RESOLVE")
                  : send_msg(fd, BUNKAI_MSG_OK, &o);
  free(o.p);
  return rc;
}

static int do_alloc(int fd, struct session *s, struct msg *m) {
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

static int do_write(int fd, struct session *s, struct msg *m) {
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

static int do_protect(int fd, struct session *s, struct msg *m) {
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
 * sealed first: it cannot shrink under the mapping (no SIGBUS later) nor be
 * written through any new mapping or write(). On failure the region is put
 * back as it was (anonymous, read-write), so the server may fall back to
 * WRITE. */
static int do_map(int fd, struct session *s, struct msg *m) {
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
  if (fcntl(mfd, F_ADD_SEALS,
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL))
    why = "cannot seal the module's memfd", err = errno;
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

static int do_commit(int fd, struct session *s, struct msg *m) {
  uint32_t replace = get32(m);
  uint32_t blob_len;
  const unsigned char *blob = getbytes(m, &blob_len);
  uint64_t mem = get64(m);
  (void)get64(m); /* rw address: inside the same mapping */
  uint64_t init = get64(m), exitp = get64(m);
  uint32_t nregs = get32(m);
  if (m->bad || nregs > 1024)
    return send_err(fd, "malformed COMMIT");
  struct staged *st = find_staged(s, mem);
  if (!st)
    return send_err(fd, "COMMIT of memory not staged for this load");
  if (!st->sealed) /* its code would not be executable */
    return send_err(fd, "COMMIT of a module not loaded (no MAP or PROTECT)");
  struct module *old = replace ? find_module(replace) : NULL;
  if (replace && !old)
    return send_err(fd, "module %u to replace is not loaded", replace);
  struct module *mod = calloc(1, sizeof *mod);
  struct reg *regs = calloc(nregs ? nregs : 1, sizeof *regs);
  char *b = malloc(blob_len + 1);
  if (!mod || !regs || !b) {
    free(mod), free(regs), free(b);
    return send_err(fd, "out of memory");
  }
  memcpy(b, blob, blob_len);
  b[blob_len] = 0;
  uint32_t i;
  for (i = 0; i < nregs && !m->bad; i++) {
    char *name = getstr(m);
    uint32_t nfn = get32(m);
    if (!name || m->bad || nfn > 256) {
      free(name);
      m->bad = 1;
      break;
    }
    const void **table = calloc(nfn ? nfn : 1, sizeof *table);
    char **names = calloc(nfn ? nfn : 1, sizeof *names);
    regs[i].table = table;
    regs[i].names = names;
    regs[i].nfn = nfn;
    for (uint32_t k = 0; k < nfn && table && names && !m->bad; k++) {
      names[k] = getstr(m);
      table[k] = (const void *)(uintptr_t)get64(m);
      if (!names[k])
        m->bad = 1;
    }
    regs[i].iface = bunkai_iface(name);
    free(name);
    if (!table || !names || !regs[i].iface)
      m->bad = 1;
  }
  char *mname = m->bad ? NULL : getstr(m);
  uint32_t ndeps = get32(m);
  char **deps = NULL;
  if (!mname || m->bad || ndeps > 1024 ||
      !(deps = calloc(ndeps ? ndeps : 1, sizeof *deps)))
    m->bad = 1;
  for (uint32_t k = 0; k < ndeps && deps && !m->bad; k++)
    if (!(deps[k] = getstr(m)))
      m->bad = 1;
  if (m->bad) {
    for (uint32_t k = 0; k < nregs; k++)
      free_reg(&regs[k]);
    free(mod), free(regs), free(b), free(mname);
    free_strv(deps, ndeps);
    return send_err(fd, "malformed COMMIT");
  }

  /* Evictions staged by this transaction (memory pressure) happen now. */
  for (uint32_t k = 0; k < s->nevict; k++) {
    struct module *ev = find_module(s->evict[k]);
    if (ev)
      remove_module(ev);
  }
  s->nevict = 0;
  s->evict_bytes = 0;

  /* The module's own initialisation runs before anyone can call it. */
  uint64_t t0 = now_ns();
  if (init) {
    int rc = ((int (*)(void))(uintptr_t)init)();
    if (rc != 0) {
      for (uint32_t k = 0; k < nregs; k++)
        free_reg(&regs[k]);
      free(mod), free(regs), free(b), free(mname);
      free_strv(deps, ndeps);
      return send_err(fd, "the module's init function returned %d", rc);
    }
  }
  uint64_t t1 = now_ns();
  mod->blob = b;
  mod->blob_len = blob_len;
  mod->name = mname;
  mod->deps = deps;
  mod->ndeps = ndeps;
  mod->mem = st->mem;
  mod->mem_len = st->mem_len;
  mod->exit_fn = (void (*)(void))(uintptr_t)exitp;
  mod->nregs = nregs;
  mod->regs = regs;

  /* Publication: the new module's tables go on top, and a replaced module's
   * come off, under one lock; each interface changes with one store. */
  pthread_mutex_lock(&mod_lock);
  mod->id = next_id++;
  mod->next = modules;
  modules = mod;
  pthread_mutex_unlock(&mod_lock);
  pthread_mutex_lock(&reg_lock);
  for (i = 0; i < nregs; i++) {
    struct bunkai_iface *h = regs[i].iface;
    struct provider *p = calloc(1, sizeof *p);
    if (!p)
      abort();
    p->module = mod->id;
    p->table = regs[i].table;
    p->names = regs[i].names;
    p->nfn = regs[i].nfn;
    if (old) {
      /* Swap: take the old module's place in the stack. */
      struct provider **pp = &h->providers;
      while (*pp && (*pp)->module != old->id)
        pp = &(*pp)->next;
      p->next = *pp;
      *pp = p;
    } else {
      p->next = h->providers;
      h->providers = p;
    }
  }
  if (old)
    drop_providers(old);
  publish_tables();
  pthread_mutex_unlock(&reg_lock);
  /* The staged memory now belongs to the module. */
  for (struct staged **pp = &s->staged; *pp; pp = &(*pp)->next)
    if (*pp == st) {
      *pp = st->next;
      free(st);
      break;
    }
  uint64_t t2 = now_ns();
  if (old)
    retire(old);
  struct out o = {0};
  put32(&o, mod->id);
  put64(&o, t1 - t0);
  put64(&o, t2 - t1);
  int rc = send_msg(fd, BUNKAI_MSG_OK, &o);
  free(o.p);
  return rc;
}

static int do_unload(int fd, struct msg *m) {
  uint64_t t0 = now_ns();
  uint32_t id = get32(m);
  if (m->bad)
    return send_err(fd, "malformed UNLOAD");
  struct module *mod = find_module(id);
  if (!mod)
    return send_err(fd, "module %u is not loaded", id);
  remove_module(mod);
  return send_ok_since(fd, t0);
}

/* Whether module x needs the module called `name`. */
static int needs(const struct module *x, const char *name) {
  for (uint32_t k = 0; k < x->ndeps; k++)
    if (!strcmp(x->deps[k], name))
      return 1;
  return 0;
}

/* UNLOAD_NAME: `bunkai mod unload NAME` in one round trip. The module is
 * unloaded unless another module needs it; the answer says which case. */
static int do_unload_name(int fd, struct msg *m) {
  uint64_t t0 = now_ns();
  char *name = getstr(m);
  if (!name || m->bad) {
    free(name);
    return send_err(fd, "malformed UNLOAD_NAME");
  }
  struct out o = {0};
  struct module *target = NULL;
  uint32_t nusers = 0;
  pthread_mutex_lock(&mod_lock);
  for (struct module *x = modules; x; x = x->next)
    if (x->name && !strcmp(x->name, name))
      target = x;
  for (struct module *x = modules; target && x; x = x->next)
    nusers += x != target && needs(x, name);
  if (!target) {
    put32(&o, 1);
  } else if (nusers) {
    put32(&o, 2);
    put32(&o, nusers);
    for (struct module *x = modules; x; x = x->next)
      if (x != target && needs(x, name))
        putstr(&o, x->name, strlen(x->name));
  }
  pthread_mutex_unlock(&mod_lock);
  free(name);
  if (target && !nusers) {
    uint32_t id = target->id;
    remove_module(target);
    put32(&o, 0);
    put32(&o, id);
    put64(&o, now_ns() - t0);
  }
  int rc = send_msg(fd, BUNKAI_MSG_OK, &o);
  free(o.p);
  return rc;
}

static int do_evict(int fd, struct session *s, struct msg *m) {
  uint32_t id = get32(m);
  if (m->bad)
    return send_err(fd, "malformed EVICT");
  if (s->nevict == sizeof s->evict / sizeof s->evict[0])
    return send_err(fd, "too many evictions in one load");
  struct module *mod = find_module(id);
  if (!mod)
    return send_err(fd, "module %u is not loaded", id);
  s->evict[s->nevict++] = id;
  s->evict_bytes += mod->mem_len;
  return send_msg(fd, BUNKAI_MSG_OK, NULL);
}

/* One receive buffer, grown as needed and kept: a fresh malloc per 1 MB
 * message would map and fault new pages each time (glibc serves big blocks
 * with mmap), making load times depend on the host's history. */
static unsigned char *rbuf;
static size_t rcap;

static void serve(int fd) {
  struct session s = {.passed_fd = -1};
  for (;;) {
    uint32_t hdr[2];
    if (read_full(fd, hdr, 4, &s.passed_fd))
      break;
    if (hdr[0] < 4 || hdr[0] > MAX_MSG) {
      send_err(fd, "message of %u bytes refused", hdr[0]);
      break;
    }
    struct msg m = {0};
    m.len = hdr[0] - 4;
    if (m.len + 1 > rcap) {
      unsigned char *p = realloc(rbuf, m.len + 1);
      if (!p) {
        send_err(fd, "out of memory for a %zu-byte message", m.len);
        break;
      }
      rbuf = p;
      rcap = m.len + 1;
    }
    m.p = rbuf;
    if (read_full(fd, &hdr[1], 4, &s.passed_fd) ||
        (m.len && read_full(fd, m.p, m.len, &s.passed_fd)))
      break;
    int rc;
    switch (hdr[1]) {
    case BUNKAI_MSG_HELLO:
      rc = do_hello(fd);
      break;
    case BUNKAI_MSG_RESOLVE:
      rc = do_resolve(fd, &m);
      break;
    case BUNKAI_MSG_ALLOC:
      rc = do_alloc(fd, &s, &m);
      break;
    case BUNKAI_MSG_WRITE:
      rc = do_write(fd, &s, &m);
      break;
    case BUNKAI_MSG_PROTECT:
      rc = do_protect(fd, &s, &m);
      break;
    case BUNKAI_MSG_COMMIT:
      rc = do_commit(fd, &s, &m);
      break;
    case BUNKAI_MSG_UNLOAD:
      rc = do_unload(fd, &m);
      break;
    case BUNKAI_MSG_EVICT:
      rc = do_evict(fd, &s, &m);
      break;
    case BUNKAI_MSG_MAP:
      rc = do_map(fd, &s, &m);
      break;
    case BUNKAI_MSG_UNLOAD_NAME:
      rc = do_unload_name(fd, &m);
      break;
    default:
      rc = send_err(fd, "unknown message type %u", hdr[1]);
    }
    if (rc)
      break;
  }
  /* Whatever this connection staged and did not commit goes away. */
  rollback(&s);
}

/* ---- the command thread ------------------------------------------------------ */

static char sock_path[108];
static int listen_fd = -1;

static void *command_thread(void *arg) {
  (void)arg;
  for (;;) {
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      return NULL;
    }
    struct ucred cred;
    socklen_t cl = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0 &&
        (cred.uid == getuid() || cred.uid == 0)) {
      serve(fd);
    } else {
      send_err(fd, "permission denied: only the host's owner or root may load "
                   "code into it");
    }
    close(fd);
  }
}

static void remove_socket(void) {
  if (sock_path[0])
    unlink(sock_path);
}

EXPORT const char *bunkai_host_socket(void) {
  return sock_path[0] ? sock_path : NULL;
}

/* Sockets left by hosts that died without their atexit (killed): removed
 * when another host starts in the default directory. A socket is taken for
 * dead only when no process has its pid here and connecting to it is
 * refused. A host binds a temporary name, listens, and only then renames
 * it to PID.sock (bunkai_host_start), so a PID.sock always had a listener:
 * a live host in another pid namespace (its pid dead here) answers and
 * keeps its socket, even when its pid is reused here meanwhile. The probe
 * does not block: a listener with a full backlog (EAGAIN) is alive. */
static void sweep_dead_sockets(const char *dir) {
  DIR *d = opendir(dir);
  if (!d)
    return;
  struct dirent *e;
  while ((e = readdir(d))) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (end == e->d_name || pid <= 0 || strcmp(end, ".sock") != 0 ||
        pid == (long)getpid())
      continue;
    if (kill((pid_t)pid, 0) == 0 || errno == EPERM)
      continue; /* alive */
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if ((size_t)snprintf(a.sun_path, sizeof a.sun_path, "%s/%s", dir,
                         e->d_name) >= sizeof a.sun_path)
      continue;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
      break;
    int dead = connect(fd, (struct sockaddr *)&a, sizeof a) != 0 &&
               errno == ECONNREFUSED;
    close(fd);
    if (dead)
      unlink(a.sun_path);
  }
  closedir(d);
}

EXPORT int bunkai_host_start(const char *path) {
  if (listen_fd >= 0)
    return 0;
  char def[108];
  if (!path)
    path = getenv("BUNKAI_HOST_SOCKET");
  if (!path || !*path) {
    snprintf(def, sizeof def, "/tmp/bunkai-mod-%u", (unsigned)getuid());
    if (mkdir(def, 0700) && errno != EEXIST)
      return -1;
    struct stat st;
    if (lstat(def, &st) || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
        (st.st_mode & 077)) {
      fprintf(stderr, "bunkai host: %s is not a private directory of ours\n",
              def);
      return -1;
    }
    sweep_dead_sockets(def);
    snprintf(def + strlen(def), sizeof def - strlen(def), "/%d.sock",
             (int)getpid());
    path = def;
  }
  if (strlen(path) >= sizeof sock_path)
    return -1;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  /* Listening before the socket has its name: bind PATH.tmp, listen, then
   * rename (another host's sweep must never find PATH without a listener). */
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if ((size_t)snprintf(a.sun_path, sizeof a.sun_path, "%s.tmp", path) >= sizeof a.sun_path)
    strcpy(a.sun_path, path); /* no room for the suffix: the name at once */
  unlink(a.sun_path);
  if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 16) ||
      chmod(a.sun_path, 0600) ||
      (strcmp(a.sun_path, path) && rename(a.sun_path, path))) {
    unlink(a.sun_path);
    close(fd);
    return -1;
  }
  strcpy(sock_path, path);
  listen_fd = fd;
  atexit(remove_socket);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t t;
  int rc = pthread_create(&t, NULL, command_thread, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    close(fd);
    listen_fd = -1;
    unlink(path);
    sock_path[0] = 0;
    return -1;
  }
  pthread_detach(t);
  return 0;
}
