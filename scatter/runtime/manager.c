/*
 * manager.c - the shared-library manager linked into every scatter launcher
 * (§3.4 of the paper; the lazy-binding slot patch goes beyond it).
 *
 * Rules for this file, which runs inside the scattered program:
 *   - Every exported symbol starts with __bunkai_; everything else is static.
 *   - One constructor only (__bunkai_init, placed first in .init_array by
 *     priority 0): it points every stub slot at the function's lazy entry
 *     (which calls __bunkai_resolve) before any other constructor of the
 *     program can call a stub.
 *   - Calls into libc are limited to dlopen/dlsym/dlerror, pthread mutexes,
 *     dladdr and realpath; messages and file reads use raw syscalls, so
 *     nothing here depends on stdio state or on functions the program may
 *     interpose. One exception: before a fatal error ends the program,
 *     fflush(NULL) writes out what it had printed (once: a failure inside
 *     the flush ends at once).
 *   - errno is preserved: a program must not see errno change because a
 *     function happened to be loaded on this call.
 *   - Resolution is serialised by one mutex: threads racing on the same
 *     function load it once; the winner publishes the slot with a release
 *     store and later calls never enter the manager (one indirect jump).
 *   - The manager must not be entered from a signal handler while another
 *     resolution holds the lock in the same thread (dlopen is not
 *     async-signal-safe either).
 *   - Grouped libraries (§5.2): when lib/NAME/groups.map exists, a miss goes
 *     function table -> group table -> handle table -> dlopen of g<hex>.so;
 *     a group library exports one table of its functions (no dlsym per
 *     function), and the handle table keeps that table's address.
 *     The map is checked field by field before it is used.
 *   - Calls between libraries (issue 23): a library calls another
 *     library's function through its own slot (__bunkai_gimp, zero in the
 *     file). When a library is opened its slots of functions already
 *     loaded get their bodies; the others get their stubs, are listed
 *     under the function they call, and get its body when it loads. Every
 *     slot is filled before dlopen's caller can run the library's code.
 *   - Network (§6.2): with BUNKAI_ORIGIN set, groups come from the fetch
 *     library (dlopen()ed only then, so a launcher never links libcurl);
 *     its preload thread starts in the constructor, and a miss waits for the
 *     group (or has it fetched at once) before dlopen. Nothing unverified is
 *     ever dlopen()ed: the fetch library checks each group's SHA-256.
 *   - Environment variables are read once, in the constructor.
 */
#define _GNU_SOURCE
#include "../include/bunkai_scatter.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Generated per launcher by the driver (stubs.S). */
extern void *__bunkai_got[];
extern const unsigned char __bunkai_stubs[]; /* stub `id` at +8 * id */
extern const unsigned char __bunkai_lazy[];  /* its lazy entry at +5 * id */
extern const uint32_t __bunkai_nfuncs;
extern const char __bunkai_libdir[];
extern const int __bunkai_is_lib;

void __bunkai_resolve(void);
void *__bunkai_lookup(uint32_t id);

/* What slot `id` holds until the function is loaded. */
static inline void *lazy_entry(uint32_t id) {
  return (void *)(__bunkai_lazy + 5 * (size_t)id);
}

/* Recursive: a library's loading may run code that calls another stub (for
 * instance constructors run again by dlopen during exit). */
static pthread_mutex_t lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static char dir[PATH_MAX]; /* absolute library directory, with a '/' */
static size_t dir_len;

/* Settings from the environment, read by the constructor. */
static const char *env_profile, *env_origin, *env_fetch, *env_fetch_log;
static int env_preload = 1, env_compress = 1;
static int profile_fd = -1;

/* §5.2: the group table (function id -> group id) comes from groups.map;
 * the handle table holds one dlopen() handle per group. */
static int grouped;
static uint32_t ngroups;
static const uint32_t *group_of, *slot_of;
static const struct bunkai_group *groups;
static const int32_t **handles; /* per group: its function table, once open */
/* Issue 23: slots of loaded libraries that still point at a stub, by the
 * function they call: pending[id] is the first node of a list. Nodes are
 * never freed (each slot gets one, once); the array grows with mremap. */
struct pend {
  void **slot;
  uint32_t next; /* node index + 1, 0 ends the list */
};
static uint32_t *pending;      /* per function id: node index + 1, or 0 */
static struct pend *pend_nodes;
static size_t pend_used, pend_cap;
static bunkai_fetch_wait_fn fetch_wait;

static long raw3(long n, long a, long b, long c) {
  long ret;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c)
                   : "rcx", "r11", "memory");
  return ret;
}

static long raw6(long n, long a, long b, long c, long d, long e, long f) {
  long ret;
  register long r10 __asm__("r10") = d;
  register long r8 __asm__("r8") = e;
  register long r9 __asm__("r9") = f;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                   : "rcx", "r11", "memory");
  return ret;
}

static size_t slen(const char *s) {
  size_t n = 0;
  while (s[n])
    n++;
  return n;
}

static void put(const char *s) { raw3(SYS_write, 2, (long)s, (long)slen(s)); }

static char *append(char *p, char *end, const char *s) {
  while (*s && p < end)
    *p++ = *s++;
  return p;
}

static char *append_hex(char *p, char *end, uint32_t v) {
  char tmp[9];
  int n = 0;
  do {
    tmp[n++] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v);
  while (n && p < end)
    *p++ = tmp[--n];
  return p;
}

/* Find the original name of function `id` in functions.tsv, for messages. */
static void name_of(uint32_t id, char *out, size_t cap) {
  char path[PATH_MAX + 32], buf[8192], want[16];
  char *w = append_hex(want, want + sizeof want - 2, id);
  *w++ = '\t';
  *w = 0;
  char *p = append(path, path + sizeof path - 1, dir);
  p = append(p, path + sizeof path - 1, BUNKAI_NAMES_FILE);
  *p = 0;
  out[0] = 0;
  long fd = raw3(SYS_open, (long)path, O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0)
    return;
  size_t have = 0, wl = slen(want);
  int at_line_start = 1;
  for (;;) {
    long n = raw3(SYS_read, fd, (long)(buf + have), (long)(sizeof buf - 1 - have));
    if (n <= 0)
      break;
    have += (size_t)n;
    buf[have] = 0;
    size_t i = 0, keep = 0;
    while (i < have) {
      char *nl = 0;
      for (size_t j = i; j < have; j++)
        if (buf[j] == '\n') {
          nl = buf + j;
          break;
        }
      if (!nl) {
        keep = i;
        break;
      }
      if (at_line_start && (size_t)(nl - (buf + i)) > wl) {
        size_t k = 0;
        while (k < wl && buf[i + k] == want[k])
          k++;
        if (k == wl) {
          size_t o = 0;
          for (char *c = buf + i + wl; c < nl && *c != '\t' && o + 1 < cap; c++)
            out[o++] = *c;
          out[o] = 0;
          raw3(SYS_close, fd, 0, 0);
          return;
        }
      }
      i = (size_t)(nl - buf) + 1;
      keep = i;
    }
    /* Shift the unfinished line to the front. */
    size_t rest = have - keep;
    for (size_t k = 0; k < rest; k++)
      buf[k] = buf[keep + k];
    have = rest;
    if (have == sizeof buf - 1)
      have = 0; /* absurdly long line: drop it */
  }
  raw3(SYS_close, fd, 0, 0);
}

#define NO_FUNCTION UINT32_MAX

/* Why a function's library did not load, for the hint after the message. */
enum cause {
  CAUSE_OTHER,    /* no hint of ours */
  CAUSE_MISSING,  /* the library file is not there */
  CAUSE_MISMATCH, /* it is there, but does not fit the launcher */
};

/* The hint for a library that would not load. bunkai scatter checks each
 * library against its launcher before it installs them, so a library that
 * is there but does not fit comes from another build or was changed since:
 * copying the output again, or scattering again, would not help. */
static const char *hint(enum cause c) {
  if (fetch_wait)
    return " (check that the origin is up and serves this build; rerun bunkai "
           "scatter run)";
  if (c == CAUSE_MISSING)
    return " (the scattered output is incomplete: copy the launcher's library "
           "directory with it)";
  if (c == CAUSE_MISMATCH)
    return " (the launcher and this library come from different scatter "
           "outputs, or one was changed: install both from the same one)";
  return "";
}

/* One line on stderr and exit 127, like the dynamic loader's own errors.
 * `id` is the function being loaded, or NO_FUNCTION. */
__attribute__((noreturn)) static void fail_because(uint32_t id, const char *path,
                                                   const char *why, enum cause c) {
  char name[256], msg[PATH_MAX + 1024];
  char *e = msg + sizeof msg - 2;
  char *p = append(msg, e, "bunkai: ");
  if (id != NO_FUNCTION) {
    name_of(id, name, sizeof name);
    p = append(p, e, "cannot load function ");
    if (name[0]) {
      p = append(p, e, name);
      p = append(p, e, " (id 0x");
      p = append_hex(p, e, id);
      p = append(p, e, ")");
    } else {
      p = append(p, e, "id 0x");
      p = append_hex(p, e, id);
    }
    p = append(p, e, " from ");
  }
  p = append(p, e, path);
  p = append(p, e, ": ");
  p = append(p, e, why ? why : "unknown error");
  if (id != NO_FUNCTION)
    p = append(p, e, hint(c));
  p = append(p, e, "\n");
  *p = 0;
  /* What the program printed before this call is its output, as it would
   * be had the function been there: written out before our line. */
  static int failing;
  if (!__atomic_exchange_n(&failing, 1, __ATOMIC_ACQ_REL))
    fflush(NULL);
  put(msg);
  raw3(SYS_exit_group, 127, 0, 0);
  __builtin_unreachable();
}

__attribute__((noreturn)) static void fail(uint32_t id, const char *path,
                                           const char *why) {
  fail_because(id, path, why, CAUSE_OTHER);
}

/* A library dlopen() refused: missing, or there and not fitting. */
__attribute__((noreturn)) static void fail_open(uint32_t id, const char *path) {
  const char *why = dlerror();
  int missing = raw3(SYS_access, (long)path, F_OK, 0) < 0;
  fail_because(id, path, why, missing ? CAUSE_MISSING : CAUSE_MISMATCH);
}

static int env_flag(const char *name, int dflt) {
  const char *v = getenv(name);
  if (!v || !*v)
    return dflt;
  return !(v[0] == '0' && v[1] == 0);
}

/* Reads groups.map into private memory and checks it. Returns 0 when there
 * is no map (per-function libraries); fails loudly when it is damaged. */
static int load_group_map(void) {
  char path[PATH_MAX + 32];
  char *p = append(path, path + sizeof path - 1, dir);
  p = append(p, path + sizeof path - 1, BUNKAI_GROUP_MAP);
  *p = 0;
  long fd = raw3(SYS_open, (long)path, O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0)
    return 0;
  struct stat st;
  if (raw3(SYS_fstat, fd, (long)&st, 0) < 0 || st.st_size < 16)
    fail(NO_FUNCTION, path, "the group map is truncated (rerun bunkai scatter group)");
  size_t size = (size_t)st.st_size;
  long m = raw6(SYS_mmap, 0, (long)size, PROT_READ, MAP_PRIVATE, fd, 0);
  raw3(SYS_close, fd, 0, 0);
  if (m < 0 && m > -4096)
    fail(NO_FUNCTION, path, "cannot map the group map");
  const unsigned char *b = (const unsigned char *)m;
  const char *magic = BUNKAI_GROUP_MAGIC;
  for (int i = 0; i < 8; i++)
    if (b[i] != (unsigned char)magic[i])
      fail(NO_FUNCTION, path, "not a bunkai group map, or from another version (rerun "
                    "bunkai scatter group)");
  uint32_t nf, ng;
  __builtin_memcpy(&nf, b + 8, 4);
  __builtin_memcpy(&ng, b + 12, 4);
  if (nf != __bunkai_nfuncs)
    fail(NO_FUNCTION, path, "the group map belongs to another build (rerun bunkai "
                  "scatter profile and bunkai scatter group)");
  if (ng == 0 || ng > nf ||
      size != 16 + 8 * (uint64_t)nf + sizeof(struct bunkai_group) * (uint64_t)ng + 8)
    fail(NO_FUNCTION, path, "the group map is damaged (rerun bunkai scatter group)");
  /* The check word (FNV-1a over the rest): fields that are each plausible
   * can still be wrong, and a wrong slot calls the wrong function. */
  uint64_t want, check = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size - 8; i++)
    check = (check ^ b[i]) * 0x100000001b3ull;
  __builtin_memcpy(&want, b + size - 8, 8);
  if (check != want)
    fail(NO_FUNCTION, path, "the group map is damaged: its check word does not match "
                  "(rerun bunkai scatter group)");
  group_of = (const uint32_t *)(b + 16);
  for (uint32_t i = 0; i < nf; i++)
    if (group_of[i] >= ng)
      fail(NO_FUNCTION, path, "the group map names a group that does not exist (rerun "
                    "bunkai scatter group)");
  slot_of = (const uint32_t *)(b + 16 + 4 * (size_t)nf);
  /* Slots are checked against the table size when a group is opened (its
   * raw size bounds it); here only that no slot is absurd. */
  for (uint32_t i = 0; i < nf; i++)
    if (slot_of[i] >= nf)
      fail(NO_FUNCTION, path, "the group map is damaged (rerun bunkai scatter group)");
  groups = (const struct bunkai_group *)(b + 16 + 8 * (size_t)nf);
  long h = raw6(SYS_mmap, 0, (long)(sizeof(void *) * ng), PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (h < 0 && h > -4096)
    fail(NO_FUNCTION, path, "out of memory for the handle table");
  handles = (const int32_t **)h;
  ngroups = ng;
  grouped = 1;
  return 1;
}

/* The directory the launcher lives in, plus __bunkai_libdir; then the group
 * map, unless profiling (a profile needs per-function first calls). */
static void find_dir(void) {
  char self[PATH_MAX];
  if (__bunkai_is_lib) {
    Dl_info info;
    if (!dladdr((void *)&__bunkai_lookup, &info) || !info.dli_fname ||
        !realpath(info.dli_fname, self))
      fail(NO_FUNCTION, "(launcher library)", "cannot find where the launcher is");
    /* The libraries resolve the launcher's symbols in the global scope. A
     * program that dlopen()ed the launcher RTLD_LOCAL kept it out of there:
     * promote it (it is already loaded, so this only changes its scope).
     * The libraries do not list the launcher as DT_NEEDED on purpose: a
     * library loaded during exit would make glibc run the launcher's
     * constructors a second time. */
    if (!dlopen(self, RTLD_LAZY | RTLD_NOLOAD | RTLD_GLOBAL))
      fail(NO_FUNCTION, self, dlerror());
  } else {
    long n = raw3(SYS_readlink, (long)"/proc/self/exe", (long)self,
                  sizeof self - 1);
    if (n <= 0)
      fail(NO_FUNCTION, "/proc/self/exe", "cannot find where the launcher is");
    self[n] = 0;
  }
  size_t cut = slen(self);
  while (cut && self[cut - 1] != '/')
    cut--;
  self[cut] = 0;
  char *e = dir + sizeof dir - 2;
  char *p = append(dir, e, self);
  p = append(p, e, __bunkai_libdir);
  *p++ = '/';
  *p = 0;
  dir_len = (size_t)(p - dir);
  if (!env_profile)
    load_group_map();
}

/* Network mode: load the fetch library and start the preloader. */
static void start_fetch(void) {
  char err[512];
  if (!grouped)
    fail(NO_FUNCTION, dir, "BUNKAI_ORIGIN is set but there is no group map (use "
                 "bunkai scatter run on a grouped output)");
  if (!env_fetch)
    fail(NO_FUNCTION, "(BUNKAI_FETCH)", "BUNKAI_ORIGIN is set without BUNKAI_FETCH (start "
                              "the program with bunkai scatter run)");
  void *h = dlopen(env_fetch, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (!h)
    fail(NO_FUNCTION, env_fetch, dlerror());
  bunkai_fetch_start_fn start =
      (bunkai_fetch_start_fn)dlsym(h, BUNKAI_FETCH_START);
  fetch_wait = (bunkai_fetch_wait_fn)dlsym(h, BUNKAI_FETCH_WAIT);
  if (!start || !fetch_wait)
    fail(NO_FUNCTION, env_fetch, "not a bunkai fetch library");
  struct bunkai_fetch_config cfg = {
      .abi = BUNKAI_SCATTER_VERSION,
      .libdir = dir,
      .origin = env_origin,
      .ngroups = ngroups,
      .groups = groups,
      .preload = env_preload,
      .compress = env_compress,
      .log_path = env_fetch_log,
  };
  if (start(&cfg, err, sizeof err))
    fail(NO_FUNCTION, env_origin, err);
}

static void record_first_call(uint32_t id) {
  char line[16];
  char *p = append_hex(line, line + sizeof line - 1, id);
  *p++ = '\n';
  raw3(SYS_write, profile_fd, (long)line, (long)(p - line));
}

/* dir + prefix + hex(n) + ".so": f<id>.so or g<group>.so. */
static void library_path(char *path, size_t cap, const char *prefix,
                         uint32_t n) {
  char *end = path + cap - 1;
  char *p = append(path, end, dir);
  p = append(p, end, prefix);
  p = append_hex(p, end, n);
  p = append(p, end, BUNKAI_LIB_SUFFIX);
  *p = 0;
}

/* Issue 23: a library's slots for the functions of other libraries it
 * calls (none in a library that calls no other, or one built by an older
 * bunkai): each slot of a function already loaded gets its body now, the
 * others wait in pending[] until their function loads. `bytes` bounds the
 * tables (they lie inside the library); `id` names the function being
 * loaded in errors. */
static void open_imports(uint32_t id, void *h, const char *path, uint64_t bytes) {
  void **slots = (void **)dlsym(h, BUNKAI_LIB_IMPORTS);
  const uint32_t *ids = (const uint32_t *)dlsym(h, BUNKAI_LIB_IMPORT_IDS);
  if (!slots && !ids)
    return;
  if (!slots || !ids)
    fail_because(id, path, "it has half of its call slots", CAUSE_MISMATCH);
  uint32_t n = ids[0];
  if (n == 0 || (uint64_t)n * 12 >= bytes)
    fail_because(id, path, "its call slots are damaged", CAUSE_MISMATCH);
  ids++;
  if (!pending) {
    long m = raw6(SYS_mmap, 0, (long)(sizeof(uint32_t) * __bunkai_nfuncs),
                  PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m < 0 && m > -4096)
      fail(id, path, "out of memory for the call slots");
    pending = (uint32_t *)m;
  }
  if (pend_used + n > pend_cap) {
    size_t cap = pend_cap ? pend_cap : 4096;
    while (cap < pend_used + n)
      cap *= 2;
    long m = pend_cap
                 ? raw6(SYS_mremap, (long)pend_nodes, (long)(sizeof *pend_nodes * pend_cap),
                        (long)(sizeof *pend_nodes * cap), MREMAP_MAYMOVE, 0, 0)
                 : raw6(SYS_mmap, 0, (long)(sizeof *pend_nodes * cap), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m < 0 && m > -4096)
      fail(id, path, "out of memory for the call slots");
    pend_nodes = (struct pend *)m;
    pend_cap = cap;
  }
  for (uint32_t k = 0; k < n; k++) {
    uint32_t callee = ids[k];
    if (callee >= __bunkai_nfuncs || (k && callee <= ids[k - 1]))
      fail_because(id, path, "its call slots name functions the launcher does not have",
                   CAUSE_MISMATCH);
    void *fn = __atomic_load_n(&__bunkai_got[callee], __ATOMIC_ACQUIRE);
    if (fn != lazy_entry(callee)) {
      __atomic_store_n(&slots[k], fn, __ATOMIC_RELEASE);
      continue;
    }
    /* Not loaded yet: the stub, `jmpq *__bunkai_got+8*callee(%rip)`
     * (ff 25 rel32). */
    const unsigned char *stub = __bunkai_stubs + 8 * (size_t)callee;
    int32_t rel;
    __builtin_memcpy(&rel, stub + 2, 4);
    if (stub[0] != 0xff || stub[1] != 0x25 ||
        stub + 6 + rel != (const unsigned char *)&__bunkai_got[callee])
      fail(id, "(launcher)", "its stubs are not where the manager expects them "
                             "(install the launcher and its libraries from the same "
                             "scatter output)");
    __atomic_store_n(&slots[k], (void *)stub, __ATOMIC_RELEASE);
    pend_nodes[pend_used] = (struct pend){&slots[k], pending[callee]};
    pending[callee] = (uint32_t)++pend_used;
  }
}

/* Issue 23: function id now has its body fn: every loaded library's slot
 * for it calls the body from now on. */
static void bind_imports(uint32_t id, void *fn) {
  if (!pending)
    return;
  for (uint32_t i = pending[id]; i; i = pend_nodes[i - 1].next)
    __atomic_store_n(pend_nodes[i - 1].slot, fn, __ATOMIC_RELEASE);
  pending[id] = 0;
}

/* §5.2: the table of group g, loading (and in network mode fetching) the
 * group's library first. The handle table holds the table's address: the
 * dlopen() handle itself is never needed again. */
static const int32_t *group_table(uint32_t id, uint32_t g) {
  const int32_t *t = handles[g];
  if (t)
    return t;
  char path[PATH_MAX + 32];
  library_path(path, sizeof path, BUNKAI_GROUP_PREFIX, g);
  if (fetch_wait) {
    char err[512];
    if (fetch_wait(g, err, sizeof err))
      fail(id, path, err);
  }
  void *h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
  if (!h)
    fail_open(id, path);
  t = (const int32_t *)dlsym(h, BUNKAI_GROUP_TABLE);
  if (!t)
    fail_because(id, path, "not a group library (no " BUNKAI_GROUP_TABLE ")",
                 CAUSE_MISMATCH);
  open_imports(id, h, path, groups[g].raw_bytes);
  handles[g] = t;
  return t;
}

/* §3.4, one library per function: dlopen f<id>.so, dlsym its body. */
static void *function_body(uint32_t id) {
  char path[PATH_MAX + 32], sym[32];
  library_path(path, sizeof path, BUNKAI_LIB_PREFIX, id);
  void *h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
  if (!h)
    fail_open(id, path);
  char *p = append(sym, sym + sizeof sym - 1, BUNKAI_BODY_PREFIX);
  p = append_hex(p, sym + sizeof sym - 1, id);
  *p = 0;
  void *fn = dlsym(h, sym);
  if (!fn)
    fail_because(id, path, dlerror(), CAUSE_MISMATCH);
  struct stat st;
  long fd = raw3(SYS_open, (long)path, O_RDONLY | O_CLOEXEC, 0);
  int ok = fd >= 0 && raw3(SYS_fstat, fd, (long)&st, 0) == 0;
  if (fd >= 0)
    raw3(SYS_close, fd, 0, 0);
  open_imports(id, h, path, ok ? (uint64_t)st.st_size : 0);
  return fn;
}

/* §5.2, grouped: function table -> group table -> handle table. */
static void *grouped_body(uint32_t id) {
  uint32_t g = group_of[id], slot = slot_of[id];
  const int32_t *t = group_table(id, g);
  /* The table lies inside the library, whose size bounds its slots. */
  if ((uint64_t)slot * 4 >= groups[g].raw_bytes)
    fail(id, "its group library", "the group map is damaged (rerun bunkai scatter group)");
  return (void *)((const char *)t + t[slot]);
}

void *__bunkai_lookup(uint32_t id) {
  int saved_errno = errno;
  void *fn;
  pthread_mutex_lock(&lock);
  fn = __atomic_load_n(&__bunkai_got[id], __ATOMIC_ACQUIRE);
  if (fn == lazy_entry(id)) {
    if (!dir_len)
      find_dir();
    fn = grouped ? grouped_body(id) : function_body(id);
    if (profile_fd >= 0)
      record_first_call(id);
    __atomic_store_n(&__bunkai_got[id], fn, __ATOMIC_RELEASE);
    bind_imports(id, fn);
  }
  pthread_mutex_unlock(&lock);
  errno = saved_errno;
  return fn;
}

static void __bunkai_init(void) {
  /* Only empty slots: never forget a function that is already loaded. */
  for (uint32_t i = 0; i < __bunkai_nfuncs; i++)
    if (!__bunkai_got[i])
      __bunkai_got[i] = lazy_entry(i);
  env_profile = getenv("BUNKAI_PROFILE");
  if (env_profile && !*env_profile)
    env_profile = 0;
  if (env_profile) {
    profile_fd = (int)raw3(SYS_open, (long)env_profile,
                           O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (profile_fd < 0)
      fail(NO_FUNCTION, env_profile, "cannot write the profile (check BUNKAI_PROFILE)");
  }
  env_origin = getenv("BUNKAI_ORIGIN");
  if (env_origin && *env_origin && !env_profile) {
    env_fetch = getenv("BUNKAI_FETCH");
    env_fetch_log = getenv("BUNKAI_FETCH_LOG");
    env_preload = env_flag("BUNKAI_PRELOAD", 1);
    env_compress = env_flag("BUNKAI_COMPRESS", 1);
    pthread_mutex_lock(&lock);
    find_dir();
    start_fetch();
    pthread_mutex_unlock(&lock);
  }
}
/* Priority 0: before every constructor of the program, which may call stubs. */
typedef void (*init_fn)(void);
__attribute__((section(".init_array.00000"), used)) static init_fn init_entry =
    __bunkai_init;
