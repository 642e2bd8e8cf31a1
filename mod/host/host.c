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
 *     through bunkai_acquire/bunkai_release, two atomic adds (BUNKAI_ACQUIRE
 *     keeps the handle per call site), and read a
 *     function table that is replaced with one atomic store. Unloading waits
 *     for the calls in flight in the old generation to finish (a grace
 *     period, as in RCU) before it frees anything.
 *   - Only the host's owner or root may talk to it (SO_PEERCRED), through a
 *     socket in a directory that is ours alone (owner, mode 0700, not a
 *     symbolic link: checked before the socket is made).
 *   - No client can stop the command thread for ever: a connection is
 *     served only once it has sent something, every read and write has a
 *     timeout, and a transaction has a deadline.
 *   - Nothing a client sends is trusted: a COMMIT's code pointers must lie
 *     in the code the same transaction staged, names are bounded and
 *     NUL-free, tables have their interface's length, the record is JSON.
 *   - The command thread blocks every signal, so the program's signal
 *     handling is unchanged.
 */
#define _GNU_SOURCE
#include "../include/bunkai_mod.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
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
#define MAX_NAME 255u          /* module, interface and function names */
#define IO_TIMEOUT_S 10        /* SO_RCVTIMEO/SO_SNDTIMEO of a connection */
#define IDLE_MS 10000          /* a connection that sends nothing is closed */
#define TXN_MS 120000          /* the longest one transaction may take */
#define MAX_PENDING 32         /* connections waiting for their first byte */

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
    if (m->id == id && m->name && len) {
      size_t i = 0;
      while (m->name[i] && i + 1 < len) {
        buf[i] = m->name[i];
        i++;
      }
      buf[i] = 0;
      out = buf;
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
static uint64_t txn_deadline; /* now_ns() after which a read gives up */

static int read_full(int fd, void *buf, size_t len, int *passed) {
  unsigned char *b = buf;
  while (len) {
    if (now_ns() > txn_deadline)
      return -1; /* the transaction took too long: it is rolled back */
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
 * sealed first, fully: it cannot shrink under the mapping (no SIGBUS later),
 * nor be written by anyone, through a mapping or write(). On failure the region is put
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

/* ---- checking what a COMMIT says ----------------------------------------- */

/* A JSON text (RFC 8259, UTF-8) whose top level is an object: the module's
 * record, which every later server reads back. Returns NULL, or what is
 * wrong with *at set to its offset. */
struct jp {
  const unsigned char *p;
  size_t n, i;
  int depth;
};

static void jws(struct jp *j) {
  while (j->i < j->n && (j->p[j->i] == ' ' || j->p[j->i] == '\t' ||
                         j->p[j->i] == '\n' || j->p[j->i] == '\r'))
    j->i++;
}

static int jdigits(struct jp *j) {
  size_t i0 = j->i;
  while (j->i < j->n && j->p[j->i] >= '0' && j->p[j->i] <= '9')
    j->i++;
  return j->i > i0 ? 0 : -1;
}

static int jstring(struct jp *j) {
  if (j->i >= j->n || j->p[j->i] != '"')
    return -1;
  j->i++;
  while (j->i < j->n) {
    unsigned char c = j->p[j->i];
    if (c == '"') {
      j->i++;
      return 0;
    }
    if (c < 0x20)
      return -1;
    if (c == '\\') {
      if (++j->i >= j->n)
        return -1;
      c = j->p[j->i++];
      if (c == 'u') {
        for (int k = 0; k < 4; k++, j->i++)
          if (j->i >= j->n || !strchr("0123456789abcdefABCDEF", j->p[j->i]) ||
              !j->p[j->i])
            return -1;
      } else if (!c || !strchr("\"\\/bfnrt", c)) {
        j->i--;
        return -1;
      }
      continue;
    }
    if (c < 0x80) {
      j->i++;
      continue;
    }
    /* UTF-8: a lead byte and its continuation bytes, shortest form */
    int more = c >= 0xf0 && c <= 0xf4 ? 3 : c >= 0xe0 ? 2 : c >= 0xc2 ? 1 : -1;
    if (more < 0 || c > 0xf4)
      return -1;
    if (j->i + (size_t)more >= j->n)
      return -1;
    unsigned char c1 = j->p[j->i + 1];
    if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 > 0x9f) ||
        (c == 0xf0 && c1 < 0x90) || (c == 0xf4 && c1 > 0x8f))
      return -1;
    for (int k = 1; k <= more; k++)
      if ((j->p[j->i + (size_t)k] & 0xc0) != 0x80)
        return -1;
    j->i += (size_t)more + 1;
  }
  return -1;
}

static int jvalue(struct jp *j) {
  jws(j);
  if (j->i >= j->n)
    return -1;
  unsigned char c = j->p[j->i];
  if (c == '"')
    return jstring(j);
  if (c == '{' || c == '[') {
    if (++j->depth > 64)
      return -1;
    unsigned char close = c == '{' ? '}' : ']';
    j->i++;
    jws(j);
    if (j->i < j->n && j->p[j->i] == close) {
      j->i++;
      j->depth--;
      return 0;
    }
    for (;;) {
      if (c == '{') {
        jws(j);
        if (jstring(j))
          return -1;
        jws(j);
        if (j->i >= j->n || j->p[j->i] != ':')
          return -1;
        j->i++;
      }
      if (jvalue(j))
        return -1;
      jws(j);
      if (j->i >= j->n)
        return -1;
      if (j->p[j->i] == ',') {
        j->i++;
        continue;
      }
      if (j->p[j->i] != close)
        return -1;
      j->i++;
      j->depth--;
      return 0;
    }
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    if (c == '-')
      j->i++;
    if (j->i < j->n && j->p[j->i] == '0')
      j->i++;
    else if (jdigits(j))
      return -1;
    if (j->i < j->n && j->p[j->i] == '.') {
      j->i++;
      if (jdigits(j))
        return -1;
    }
    if (j->i < j->n && (j->p[j->i] == 'e' || j->p[j->i] == 'E')) {
      j->i++;
      if (j->i < j->n && (j->p[j->i] == '+' || j->p[j->i] == '-'))
        j->i++;
      if (jdigits(j))
        return -1;
    }
    return 0;
  }
  static const char *const lit[] = {"true", "false", "null"};
  for (int k = 0; k < 3; k++) {
    size_t l = strlen(lit[k]);
    if (j->n - j->i >= l && !memcmp(j->p + j->i, lit[k], l)) {
      j->i += l;
      return 0;
    }
  }
  return -1;
}

static const char *json_object_error(const unsigned char *p, size_t n,
                                     size_t *at) {
  struct jp j = {p, n, 0, 0};
  jws(&j);
  if (j.i >= n || p[j.i] != '{') {
    *at = j.i;
    return "is not a JSON object";
  }
  if (jvalue(&j)) {
    *at = j.i;
    return "is not valid JSON";
  }
  jws(&j);
  *at = j.i;
  return j.i == n ? NULL : "has bytes after its JSON object";
}

/* A name from the message: 1 to MAX_NAME bytes, no NUL (a NUL would make
 * the C side see a shorter name than the one checked) and no other control
 * character (names appear in one-line answers and logs). Sets *why and
 * returns NULL if it is not one; m->bad if the message ends first. */
static char *getname(struct msg *m, const char *what, char *why, size_t wl) {
  uint32_t n;
  const unsigned char *p = getbytes(m, &n);
  if (!p)
    return NULL;
  int ctl = 0;
  for (uint32_t k = 0; k < n && k <= MAX_NAME; k++)
    ctl |= p[k] < 0x20 || p[k] == 0x7f;
  if (n == 0 || n > MAX_NAME || memchr(p, 0, n) || ctl) {
    snprintf(why, wl, "%s %s", what,
             n == 0              ? "is empty"
             : n > MAX_NAME      ? "is longer than 255 bytes"
             : memchr(p, 0, n)   ? "contains a NUL byte"
                                 : "contains a control character");
    return NULL;
  }
  char *s = malloc(n + 1);
  if (!s) {
    snprintf(why, wl, "out of memory");
    return NULL;
  }
  memcpy(s, p, n);
  s[n] = 0;
  return s;
}

/* How many functions interface `name` has: the prototypes of the text the
 * host expects (one ';' each), else the length of the tables its current
 * providers (other than module `skip`, which a swap takes out) registered;
 * -1 if nobody has said yet. */
static int64_t iface_length(const char *name, uint32_t skip) {
  int64_t n = -1;
  pthread_mutex_lock(&reg_lock);
  for (struct expect *e = expects; e && n < 0; e = e->next)
    if (!strcmp(e->name, name)) {
      int64_t k = 0;
      for (const char *c = e->text; *c; c++)
        k += *c == ';';
      if (k > 0)
        n = k;
    }
  for (struct bunkai_iface *h = ifaces; h && n < 0; h = h->next)
    if (!strcmp(h->name, name))
      for (struct provider *p = h->providers; p && n < 0; p = p->next)
        if (p->module != skip)
          n = p->nfn;
  pthread_mutex_unlock(&reg_lock);
  return n;
}

static struct module *module_named(const char *name, uint32_t skip) {
  struct module *found = NULL;
  pthread_mutex_lock(&mod_lock);
  for (struct module *x = modules; x && !found; x = x->next)
    if (x->id != skip && x->name && !strcmp(x->name, name))
      found = x;
  pthread_mutex_unlock(&mod_lock);
  return found;
}

/* The staged memory of a refused COMMIT goes at once: nothing of it runs. */
static void drop_staged(struct session *s, struct staged *st) {
  for (struct staged **pp = &s->staged; *pp; pp = &(*pp)->next)
    if (*pp == st) {
      *pp = st->next;
      munmap(st->mem, st->mem_len);
      used -= st->mem_len;
      free(st);
      return;
    }
}

static int do_commit(int fd, struct session *s, struct msg *m) {
  char why[400] = "";
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
  /* Code pointers must lie in this module's own code: the RX part of the
   * memory this transaction staged, mapped or protected r-x. */
  uint64_t lo = (uint64_t)(uintptr_t)st->mem, hi = lo + st->rx_len;
#define IN_CODE(a) ((a) >= lo && (a) < hi)
  uint32_t i;
  for (i = 0; i < nregs && !m->bad && !why[0]; i++) {
    char *name = getname(m, "an interface name", why, sizeof why);
    uint32_t nfn = get32(m);
    if (!name || m->bad || nfn > 256) {
      if (name && nfn > 256 && !m->bad)
        snprintf(why, sizeof why, "interface %s with %u functions (at most 256)",
                 name, nfn);
      free(name);
      if (!why[0])
        m->bad = 1;
      break;
    }
    for (uint32_t k = 0; k < i; k++)
      if (!strcmp(regs[k].iface->name, name))
        snprintf(why, sizeof why, "interface %s is implemented twice", name);
    int64_t want = why[0] ? -1 : iface_length(name, replace);
    if (want >= 0 && nfn != (uint64_t)want)
      snprintf(why, sizeof why,
               "interface %s has %lld functions, the table sent has %u", name,
               (long long)want, nfn);
    else if (nfn == 0 && !why[0])
      snprintf(why, sizeof why, "interface %s with an empty table", name);
    const void **table = calloc(nfn ? nfn : 1, sizeof *table);
    char **names = calloc(nfn ? nfn : 1, sizeof *names);
    regs[i].table = table;
    regs[i].names = names;
    regs[i].nfn = nfn;
    for (uint32_t k = 0; k < nfn && table && names && !m->bad && !why[0];
         k++) {
      names[k] = getname(m, "a function name", why, sizeof why);
      uint64_t a = get64(m);
      table[k] = (const void *)(uintptr_t)a;
      if (!names[k] && !why[0])
        m->bad = 1;
      else if (!why[0] && !m->bad && !IN_CODE(a))
        snprintf(why, sizeof why,
                 "%s.%s at %#llx is outside the module's code "
                 "[%#llx, %#llx)",
                 name, names[k], (unsigned long long)a,
                 (unsigned long long)lo, (unsigned long long)hi);
    }
    if (!why[0] && !m->bad) {
      regs[i].iface = bunkai_iface(name);
      if (!table || !names || !regs[i].iface)
        snprintf(why, sizeof why, "out of memory");
    }
    free(name);
  }
  uint32_t nreg_parsed = i; /* regs[0..i] may hold allocations */
  if (nreg_parsed < nregs)
    nreg_parsed++;
  char *mname = m->bad || why[0]
                    ? NULL
                    : getname(m, "the module's name", why, sizeof why);
  uint32_t ndeps = mname ? get32(m) : 0;
  char **deps = NULL;
  if (mname && !m->bad && ndeps > 1024)
    snprintf(why, sizeof why, "%u modules needed (at most 1024)", ndeps);
  else if (mname && !m->bad &&
           !(deps = calloc(ndeps ? ndeps : 1, sizeof *deps)))
    snprintf(why, sizeof why, "out of memory");
  for (uint32_t k = 0; k < ndeps && deps && !m->bad && !why[0]; k++)
    if (!(deps[k] = getname(m, "a needed module's name", why, sizeof why)) &&
        !why[0])
      m->bad = 1;
  if (!why[0] && !m->bad && !mname)
    m->bad = 1;
  if (!why[0] && !m->bad && m->off != m->len)
    snprintf(why, sizeof why, "%zu bytes after the end", m->len - m->off);

  /* What the pieces say together. */
  size_t at;
  const char *jerr;
  if (!why[0] && !m->bad &&
      (jerr = json_object_error((const unsigned char *)b, blob_len, &at)))
    snprintf(why, sizeof why, "the module's record %s (byte %zu)", jerr, at);
  if (!why[0] && !m->bad && init && !IN_CODE(init))
    snprintf(why, sizeof why,
             "init at %#llx is outside the module's code [%#llx, %#llx)",
             (unsigned long long)init, (unsigned long long)lo,
             (unsigned long long)hi);
  if (!why[0] && !m->bad && exitp && !IN_CODE(exitp))
    snprintf(why, sizeof why,
             "exit at %#llx is outside the module's code [%#llx, %#llx)",
             (unsigned long long)exitp, (unsigned long long)lo,
             (unsigned long long)hi);
#undef IN_CODE
  if (!why[0] && !m->bad && module_named(mname, replace))
    snprintf(why, sizeof why, "a module named %s is already loaded", mname);
  for (uint32_t k = 0; k < ndeps && !why[0] && !m->bad; k++) {
    struct module *d = module_named(deps[k], replace);
    int evicted = 0;
    for (uint32_t e = 0; d && e < s->nevict; e++)
      evicted |= s->evict[e] == d->id;
    if (!d || evicted || !strcmp(deps[k], mname))
      snprintf(why, sizeof why, "%s needs module %s, which is %s", mname,
               deps[k],
               !strcmp(deps[k], mname) ? "itself"
               : evicted               ? "being unloaded"
                                       : "not loaded");
  }
  for (uint32_t e = 0; replace && e < s->nevict && !why[0] && !m->bad; e++)
    if (s->evict[e] == replace)
      snprintf(why, sizeof why, "module %u is both replaced and unloaded",
               replace);
  if (m->bad || why[0]) {
    for (uint32_t k = 0; k < nreg_parsed; k++)
      free_reg(&regs[k]);
    free(mod), free(regs), free(b), free(mname);
    free_strv(deps, ndeps);
    drop_staged(s, st);
    if (m->bad)
      return send_err(fd, "malformed COMMIT (the module was not loaded)");
    return send_err(fd, "COMMIT refused: %s (the module was not loaded)", why);
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
      drop_staged(s, st);
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

/* Whether module x needs the module called `name`. */
static int needs(const struct module *x, const char *name) {
  for (uint32_t k = 0; k < x->ndeps; k++)
    if (!strcmp(x->deps[k], name))
      return 1;
  return 0;
}

/* The modules that need module `id`, comma-separated into buf; 0 if none.
 * (By id as by name: a dependent left without its dependency would call
 * into unmapped memory.) */
static int dependents(uint32_t id, char *buf, size_t len) {
  int n = 0;
  size_t off = 0;
  buf[0] = 0;
  pthread_mutex_lock(&mod_lock);
  struct module *t = modules;
  while (t && t->id != id)
    t = t->next;
  for (struct module *x = modules; t && x; x = x->next)
    if (x != t && needs(x, t->name)) {
      int w = snprintf(buf + off, len - off, "%s%s", n ? ", " : "", x->name);
      if (w > 0 && off + (size_t)w < len)
        off += (size_t)w;
      n++;
    }
  pthread_mutex_unlock(&mod_lock);
  return n;
}

static int do_unload(int fd, struct msg *m) {
  uint64_t t0 = now_ns();
  uint32_t id = get32(m);
  if (m->bad || m->off != m->len)
    return send_err(fd, "malformed UNLOAD");
  struct module *mod = find_module(id);
  if (!mod)
    return send_err(fd, "module %u is not loaded", id);
  char users[300];
  if (dependents(id, users, sizeof users))
    return send_err(fd, "module %s (id %u) is needed by %s (unload them first)",
                    mod->name, id, users);
  remove_module(mod);
  return send_ok_since(fd, t0);
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
  for (uint32_t k = 0; k < s->nevict; k++)
    if (s->evict[k] == id)
      return send_err(fd, "module %u is already being unloaded", id);
  char users[300];
  if (dependents(id, users, sizeof users))
    return send_err(fd, "module %s (id %u) is needed by %s (unload them first)",
                    mod->name, id, users);
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

/* Every connection gets timeouts on its reads and writes: a client that
 * stops half-way through a message, or stops reading our answers, is
 * dropped (its transaction rolled back) instead of stopping the host's
 * module server for ever. */
static void set_timeouts(int fd) {
  struct timeval tv = {.tv_sec = IO_TIMEOUT_S};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* Accepts one connection; 1 if it may be served, 0 if it was refused. */
static int admit(int fd) {
  set_timeouts(fd);
  struct ucred cred;
  socklen_t cl = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0 &&
      (cred.uid == getuid() || cred.uid == 0))
    return 1;
  send_err(fd, "permission denied: only the host's owner or root may load "
               "code into it");
  return 0;
}

/* Connections are served one at a time (a connection is a transaction),
 * each only once it has sent something: until then it waits in `pending`,
 * so a client that connects and stays silent holds up nobody, and is
 * closed after IDLE_MS. */
static void *command_thread(void *arg) {
  (void)arg;
  struct {
    int fd;
    uint64_t since;
  } pending[MAX_PENDING];
  int npending = 0;
  for (;;) {
    struct pollfd pf[MAX_PENDING + 1];
    pf[0] = (struct pollfd){.fd = listen_fd, .events = POLLIN};
    for (int k = 0; k < npending; k++)
      pf[k + 1] = (struct pollfd){.fd = pending[k].fd, .events = POLLIN};
    int n = poll(pf, (nfds_t)npending + 1, 1000);
    if (n < 0 && errno != EINTR)
      return NULL;
    uint64_t now = now_ns();
    /* The oldest connection that has sent something (or hung up). */
    int ready = -1;
    for (int k = 0; n > 0 && k < npending && ready < 0; k++)
      if (pf[k + 1].revents)
        ready = k;
    if (ready >= 0) {
      int fd = pending[ready].fd;
      pending[ready] = pending[--npending];
      txn_deadline = now_ns() + (uint64_t)TXN_MS * 1000000u;
      serve(fd);
      close(fd);
      continue;
    }
    for (int k = 0; k < npending;)
      if (now - pending[k].since > (uint64_t)IDLE_MS * 1000000u) {
        close(pending[k].fd);
        pending[k] = pending[--npending];
      } else {
        k++;
      }
    if (n > 0 && (pf[0].revents & POLLIN)) {
      int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE)
          usleep(10000); /* out of descriptors: not a busy loop meanwhile */
        if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN ||
            errno == EMFILE || errno == ENFILE)
          continue;
        return NULL;
      }
      if (!admit(fd)) {
        close(fd);
        continue;
      }
      if (npending == MAX_PENDING) { /* the oldest silent one makes room */
        int old = 0;
        for (int k = 1; k < npending; k++)
          if (pending[k].since < pending[old].since)
            old = k;
        close(pending[old].fd);
        pending[old] = pending[--npending];
      }
      pending[npending].fd = fd;
      pending[npending].since = now_ns();
      npending++;
    }
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

/* Whether `dir` is a directory of ours alone: a real directory (lstat: not
 * a symbolic link to one), owned by us, no permission for group or others.
 * Returns NULL, or what is wrong with it (and its fix) in buf. */
static const char *private_dir_problem(const char *dir, char *buf,
                                       size_t len) {
  struct stat st;
  if (lstat(dir, &st))
    snprintf(buf, len, "cannot use %s: %s", dir, strerror(errno));
  else if (S_ISLNK(st.st_mode))
    snprintf(buf, len, "%s is a symbolic link, not a directory of ours "
                       "(remove it)", dir);
  else if (!S_ISDIR(st.st_mode))
    snprintf(buf, len, "%s is not a directory (remove it)", dir);
  else if (st.st_uid != getuid())
    snprintf(buf, len, "%s belongs to uid %u, not to us (uid %u): another "
                       "user could intercept modules (remove it, or set "
                       "XDG_RUNTIME_DIR or BUNKAI_HOST_SOCKET)",
             dir, (unsigned)st.st_uid, (unsigned)getuid());
  else if (st.st_mode & 077)
    snprintf(buf, len, "%s has mode %04o: group and others may use it "
                     "(chmod 700 %s)",
             dir, (unsigned)(st.st_mode & 07777), dir);
  else
    return NULL;
  return buf;
}

/* The default socket directory: $XDG_RUNTIME_DIR/bunkai-mod when that is
 * set and a private directory of ours (as systemd makes it), else
 * /tmp/bunkai-mod-UID. Created 0700 if missing, and checked either way: a
 * directory another user made first is refused, not used. */
static int default_dir(char *out, size_t len) {
  char why[400];
  const char *x = getenv("XDG_RUNTIME_DIR");
  if (x && x[0] == '/' && !private_dir_problem(x, why, sizeof why) &&
      (size_t)snprintf(out, len, "%s/bunkai-mod", x) < len - 16) {
    /* $XDG_RUNTIME_DIR/bunkai-mod, unless the path is too long */
  } else {
    snprintf(out, len, "/tmp/bunkai-mod-%u", (unsigned)getuid());
  }
  if (mkdir(out, 0700) && errno != EEXIST) {
    fprintf(stderr, "bunkai mod: cannot create %s: %s (check /tmp)\n", out,
            strerror(errno));
    return -1;
  }
  if (private_dir_problem(out, why, sizeof why)) {
    fprintf(stderr, "bunkai mod: %s\n", why);
    return -1;
  }
  return 0;
}

EXPORT int bunkai_host_start(const char *path) {
  if (listen_fd >= 0)
    return 0;
  char def[108];
  if (!path)
    path = getenv("BUNKAI_HOST_SOCKET");
  if (!path || !*path) {
    if (default_dir(def, sizeof def))
      return -1;
    sweep_dead_sockets(def);
    size_t used_len = strlen(def), room = sizeof def - used_len;
    if ((size_t)snprintf(def + used_len, room, "/%d.sock", (int)getpid()) >=
        room) {
      fprintf(stderr, "bunkai mod: the socket path in %s is too long (set "
                      "BUNKAI_HOST_SOCKET to a shorter path)\n", def);
      return -1;
    }
    path = def;
  }
  if (strlen(path) >= sizeof sock_path) {
    fprintf(stderr, "bunkai mod: socket path %s is longer than %zu bytes "
                    "(choose a shorter one)\n", path, sizeof sock_path - 1);
    return -1;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    fprintf(stderr, "bunkai mod: cannot create the host's socket: %s (check "
                    "the process's descriptor limit)\n", strerror(errno));
    return -1;
  }
  /* Listening before the socket has its name: bind PATH.tmp, listen, then
   * rename (another host's sweep must never find PATH without a listener). */
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if ((size_t)snprintf(a.sun_path, sizeof a.sun_path, "%s.tmp", path) >= sizeof a.sun_path)
    strcpy(a.sun_path, path); /* no room for the suffix: the name at once */
  unlink(a.sun_path);
  if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 16) ||
      chmod(a.sun_path, 0600) ||
      (strcmp(a.sun_path, path) && rename(a.sun_path, path))) {
    fprintf(stderr, "bunkai mod: cannot listen on %s: %s (check the "
                    "directory exists and is writable)\n", path,
            strerror(errno));
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
    fprintf(stderr, "bunkai mod: cannot start the host's command thread: %s "
                    "(check the process's thread limit)\n", strerror(rc));
    close(fd);
    listen_fd = -1;
    unlink(path);
    sock_path[0] = 0;
    return -1;
  }
  pthread_detach(t);
  return 0;
}
