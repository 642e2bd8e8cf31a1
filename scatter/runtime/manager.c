/*
 * manager.c - the shared-library manager linked into every scatter launcher
 * (§3.4 of the paper; the lazy-binding slot patch goes beyond it).
 *
 * Rules for this file, which runs inside the scattered program:
 *   - Every exported symbol starts with __bunkai_; everything else is static.
 *   - One constructor only (__bunkai_init, placed first in .init_array by
 *     priority 0): it points every stub slot at __bunkai_resolve before any
 *     other constructor of the program can call a stub.
 *   - Calls into libc are limited to dlopen/dlsym/dlerror, pthread mutexes,
 *     dladdr and realpath; messages and file reads use raw syscalls, so
 *     nothing here depends on stdio state or on functions the program may
 *     interpose.
 *   - errno is preserved: a program must not see errno change because a
 *     function happened to be loaded on this call.
 *   - Resolution is serialised by one mutex: threads racing on the same
 *     function load it once; the winner publishes the slot with a release
 *     store and later calls never enter the manager (one indirect jump).
 *   - The manager must not be entered from a signal handler while another
 *     resolution holds the lock in the same thread (dlopen is not
 *     async-signal-safe either).
 */
#define _GNU_SOURCE
#include "../include/bunkai_scatter.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Generated per launcher by the driver (stubs.S). */
extern void *__bunkai_got[];
extern const uint32_t __bunkai_nfuncs;
extern const char __bunkai_libdir[];
extern const int __bunkai_is_lib;

void __bunkai_resolve(void);
void *__bunkai_lookup(uint32_t id);

/* Recursive: a library's loading may run code that calls another stub (for
 * instance constructors run again by dlopen during exit). */
static pthread_mutex_t lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static char dir[PATH_MAX]; /* absolute library directory, with a '/' */
static size_t dir_len;

static long raw3(long n, long a, long b, long c) {
  long ret;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c)
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

__attribute__((noreturn)) static void fail(uint32_t id, const char *path,
                                           const char *why) {
  char name[256], msg[PATH_MAX + 1024];
  name_of(id, name, sizeof name);
  char *e = msg + sizeof msg - 2;
  char *p = append(msg, e, "bunkai: cannot load function ");
  p = append(p, e, name[0] ? name : "?");
  p = append(p, e, " (id 0x");
  p = append_hex(p, e, id);
  p = append(p, e, ") from ");
  p = append(p, e, path);
  p = append(p, e, ": ");
  p = append(p, e, why ? why : "unknown error");
  p = append(p, e, " (the scattered output is incomplete: copy it again or "
                   "rerun bunkai scatter)\n");
  *p = 0;
  put(msg);
  raw3(SYS_exit_group, 127, 0, 0);
  __builtin_unreachable();
}

/* The directory the launcher lives in, plus __bunkai_libdir. */
static void find_dir(void) {
  char self[PATH_MAX];
  if (__bunkai_is_lib) {
    Dl_info info;
    if (!dladdr((void *)&__bunkai_lookup, &info) || !info.dli_fname ||
        !realpath(info.dli_fname, self))
      fail(0, "(launcher library)", "cannot find where the launcher is");
    /* The libraries resolve the launcher's symbols in the global scope. A
     * program that dlopen()ed the launcher RTLD_LOCAL kept it out of there:
     * promote it (it is already loaded, so this only changes its scope).
     * The libraries do not list the launcher as DT_NEEDED on purpose: a
     * library loaded during exit would make glibc run the launcher's
     * constructors a second time. */
    if (!dlopen(self, RTLD_LAZY | RTLD_NOLOAD | RTLD_GLOBAL))
      fail(0, self, dlerror());
  } else {
    long n = raw3(SYS_readlink, (long)"/proc/self/exe", (long)self,
                  sizeof self - 1);
    if (n <= 0)
      fail(0, "/proc/self/exe", "cannot find where the launcher is");
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
}

void *__bunkai_lookup(uint32_t id) {
  int saved_errno = errno;
  void *fn;
  pthread_mutex_lock(&lock);
  fn = __atomic_load_n(&__bunkai_got[id], __ATOMIC_ACQUIRE);
  if (fn == (void *)&__bunkai_resolve) {
    if (!dir_len)
      find_dir();
    char path[PATH_MAX + 32], sym[32];
    char *p = append(path, path + sizeof path - 1, dir);
    p = append(p, path + sizeof path - 1, BUNKAI_LIB_PREFIX);
    p = append_hex(p, path + sizeof path - 1, id);
    p = append(p, path + sizeof path - 1, BUNKAI_LIB_SUFFIX);
    *p = 0;
    void *h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
    if (!h)
      fail(id, path, dlerror());
    p = append(sym, sym + sizeof sym - 1, BUNKAI_BODY_PREFIX);
    p = append_hex(p, sym + sizeof sym - 1, id);
    *p = 0;
    fn = dlsym(h, sym);
    if (!fn)
      fail(id, path, dlerror());
    __atomic_store_n(&__bunkai_got[id], fn, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&lock);
  errno = saved_errno;
  return fn;
}

static void __bunkai_init(void) {
  /* Only empty slots: never forget a function that is already loaded. */
  for (uint32_t i = 0; i < __bunkai_nfuncs; i++)
    if (!__bunkai_got[i])
      __bunkai_got[i] = (void *)&__bunkai_resolve;
}

/* Priority 0: before every constructor of the program, which may call stubs. */
typedef void (*init_fn)(void);
__attribute__((section(".init_array.00000"), used)) static init_fn init_entry =
    __bunkai_init;
