/*
 * fetch.c - libbunkai-fetch.so: brings a scattered program's group libraries
 * from an HTTP origin while the program runs (seed 000, §6.2; the demand
 * fetch ahead of the queue goes beyond the paper).
 *
 * The launcher's manager dlopen()s this library (RTLD_DEEPBIND) only when
 * BUNKAI_ORIGIN is set, so launchers never depend on libcurl, zstd or
 * libcrypto. Two ways a group arrives, both ending in the same place:
 *   - the preload thread walks the groups in id order (the first-call order
 *     of the profile, so the order the program will want them);
 *   - a miss in the manager calls __bunkai_fetch_wait(g). If the preloader is
 *     already bringing g it waits for it; if the preloader has not reached g
 *     (a wrong prediction), the calling thread fetches g itself at once, and
 *     the preloader holds back its next group until that demand is served.
 * Every group is checked against the SHA-256 in groups.map after
 * decompression and written to the cache under a temporary name, then
 * renamed: a file named g<hex>.so in the cache has been verified, and code
 * that fails the check is never written under that name, never loaded.
 * Failures (origin down, 404, truncated or corrupted data) are retried with
 * exponential backoff, then reported as one line by the manager.
 *
 * Rules for this file, which runs inside the scattered program:
 *   - Exported symbols start with __bunkai_; everything else is static.
 *   - No constructors; all state is set up by __bunkai_fetch_start, which the
 *     manager calls once from its constructor.
 *   - errno is the manager's business (it saves and restores it).
 *   - After fork() the child has no preload thread: a pthread_atfork handler
 *     resets groups in flight and switches the child to demand fetching.
 *   - The preload thread never runs into the program's exit: OpenSSL is
 *     initialised without its exit-time cleanup (when we are first to use
 *     it), and an exit handler registered after every library's own stops
 *     the thread before it hashes again. The program exiting while the
 *     thread was in EVP_Digest had it crash on a freed lock, after the
 *     program's correct output.
 */
#define _GNU_SOURCE
#include "../include/bunkai_scatter.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#define EXPORT __attribute__((visibility("default")))

enum { ABSENT, CACHED, INFLIGHT, READY, FAILED };

static struct {
  char *origin;  /* ends with '/' */
  char *libdir;  /* ends with '/' */
  uint32_t n;
  const struct bunkai_group *groups;
  int preload, compress;
  int log_fd;
  struct timespec t0;
} F;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static unsigned char *state;   /* per group, guarded by mu */
static char (*errors)[256];    /* per group, the last failure */
static int demands_active;     /* demand fetches in progress */
static ZSTD_DDict *ddict;      /* groups.dict, when the groups use one */
static CURL *demand_curl;      /* used under the manager's lock only */

/* ---- small helpers ------------------------------------------------------ */

static double ms_since_start(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - F.t0.tv_sec) * 1e3 +
         (double)(t.tv_nsec - F.t0.tv_nsec) / 1e6;
}

static void log_line(uint32_t g, const char *how, size_t bytes) {
  if (F.log_fd < 0)
    return;
  char line[128];
  int n = snprintf(line, sizeof line, "%.1f\t%x\t%s\t%zu\n", ms_since_start(),
                   g, how, bytes);
  if (n > 0 && write(F.log_fd, line, (size_t)n) < 0) {
    /* the log is best effort */
  }
}

static void group_path(char *out, size_t cap, uint32_t g, const char *suffix) {
  snprintf(out, cap, "%s" BUNKAI_GROUP_PREFIX "%x" BUNKAI_LIB_SUFFIX "%s",
           F.libdir, g, suffix);
}

/* Exit: set (under crypto_mu) by the exit handler; the preload thread
 * then hashes no more and parks. */
static pthread_mutex_t crypto_mu = PTHREAD_MUTEX_INITIALIZER;
static int exiting;
static pthread_t preload_thread;
static int have_preload_thread;

static _Noreturn void park(void) {
  for (;;)
    pause(); /* every signal blocked: only the process's end ends it */
}

/* The preload thread, at a point where it may stop: parks if the program
 * is exiting. */
static void preload_checkpoint(void) {
  if (__atomic_load_n(&exiting, __ATOMIC_ACQUIRE))
    park();
}

static void on_exit_stop_preloader(void) {
  pthread_mutex_lock(&crypto_mu); /* waits for a hash in progress */
  __atomic_store_n(&exiting, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&crypto_mu);
}

static int sha_matches(const unsigned char *data, size_t len,
                       const uint8_t want[32]) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  pthread_mutex_lock(&crypto_mu);
  int preloading = have_preload_thread && pthread_equal(pthread_self(), preload_thread);
  if (preloading && exiting) {
    pthread_mutex_unlock(&crypto_mu);
    park();
  }
  int ok = EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL) && mdlen == 32;
  pthread_mutex_unlock(&crypto_mu);
  return ok && memcmp(md, want, 32) == 0;
}

/* ---- one download ------------------------------------------------------- */

struct buf {
  unsigned char *p;
  size_t len, cap, limit;
};

static size_t on_data(char *data, size_t size, size_t nmemb, void *arg) {
  struct buf *b = arg;
  size_t n = size * nmemb;
  if (b->len + n > b->limit)
    return 0; /* more than the map says: abort, it is not our file */
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 65536;
    while (cap < b->len + n)
      cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p)
      return 0;
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, data, n);
  b->len += n;
  return n;
}

static CURL *new_handle(void) {
  CURL *c = curl_easy_init();
  if (!c)
    return NULL;
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
  /* A stalled transfer (peer gone) fails instead of hanging: less than one
   * byte per second for 20 s. Narrow links are slow, never that slow. */
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 20L);
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
  return c;
}

/* Fetches, checks and installs group g once. 0 on success, else -1 with a
 * message in err. */
static int fetch_once(CURL *c, uint32_t g, char *err, size_t errlen,
                      size_t *wire_bytes) {
  const struct bunkai_group *gr = &F.groups[g];
  char url[4096];
  snprintf(url, sizeof url, "%s" BUNKAI_GROUP_PREFIX "%x" BUNKAI_LIB_SUFFIX "%s",
           F.origin, g, F.compress ? BUNKAI_ZST_SUFFIX : "");
  struct buf b = {0};
  b.limit = F.compress ? gr->zst_bytes : gr->raw_bytes;
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
  CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  int ok = -1;
  unsigned char *raw = NULL;
  if (rc == CURLE_WRITE_ERROR && b.len + 1 > b.limit) {
    snprintf(err, errlen, "%s is larger than the group map says (corrupted or "
             "from another build)", url);
  } else if (rc != CURLE_OK) {
    snprintf(err, errlen, "cannot fetch %s: %s", url, curl_easy_strerror(rc));
  } else if (status != 200) {
    snprintf(err, errlen, "cannot fetch %s: HTTP %ld", url, status);
  } else if (b.len != b.limit) {
    snprintf(err, errlen, "%s is truncated: %zu of %zu bytes", url, b.len,
             (size_t)b.limit);
  } else {
    size_t rawlen = gr->raw_bytes;
    if (F.compress) {
      raw = malloc(rawlen ? rawlen : 1);
      size_t got = 0;
      if (raw && ddict) {
        ZSTD_DCtx *dc = ZSTD_createDCtx();
        got = dc ? ZSTD_decompress_usingDDict(dc, raw, rawlen, b.p, b.len, ddict)
                 : (size_t)-1;
        ZSTD_freeDCtx(dc);
      } else if (raw) {
        got = ZSTD_decompress(raw, rawlen, b.p, b.len);
      }
      if (!raw || ZSTD_isError(got) || got != rawlen) {
        snprintf(err, errlen, "%s does not decompress to %zu bytes (%s)", url,
                 rawlen, raw && ZSTD_isError(got) ? ZSTD_getErrorName(got)
                                                  : "wrong size");
        goto out;
      }
    } else {
      raw = b.p;
      b.p = NULL;
    }
    if (!sha_matches(raw, rawlen, gr->raw_sha256)) {
      snprintf(err, errlen, "%s fails its SHA-256 check (corrupted)", url);
      goto out;
    }
    char final[4096], tmp[4200];
    group_path(final, sizeof final, g, "");
    snprintf(tmp, sizeof tmp, "%s.tmp.%d.%lx", final, (int)getpid(),
             (unsigned long)pthread_self());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
    if (fd < 0) {
      snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
      goto out;
    }
    size_t off = 0;
    while (off < rawlen) {
      ssize_t w = write(fd, raw + off, rawlen - off);
      if (w <= 0)
        break;
      off += (size_t)w;
    }
    if (close(fd) != 0 || off != rawlen || rename(tmp, final) != 0) {
      snprintf(err, errlen, "cannot write %s: %s", final, strerror(errno));
      unlink(tmp);
      goto out;
    }
    *wire_bytes = b.len;
    ok = 0;
  }
out:
  free(b.p);
  free(raw);
  return ok;
}

/* Up to five attempts, 100 ms apart and doubling (1.5 s in all). */
static int fetch_with_retries(CURL *c, uint32_t g, char *err, size_t errlen,
                              size_t *wire_bytes) {
  long delay_ms = 100;
  for (int attempt = 0;; attempt++) {
    if (fetch_once(c, g, err, errlen, wire_bytes) == 0)
      return 0;
    if (attempt == 4)
      break;
    struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    delay_ms *= 2;
  }
  size_t l = strlen(err);
  snprintf(err + l, errlen - l, ", after 5 attempts");
  return -1;
}

/* A group found in the cache from an earlier run is used only if it still
 * matches its checksum. */
static int cached_ok(uint32_t g) {
  char path[4096];
  group_path(path, sizeof path, g, "");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  size_t len = F.groups[g].raw_bytes;
  unsigned char *p = malloc(len ? len : 1);
  size_t off = 0;
  while (p && off < len) {
    ssize_t r = read(fd, p + off, len - off);
    if (r <= 0)
      break;
    off += (size_t)r;
  }
  char extra;
  int ok = p && off == len && read(fd, &extra, 1) == 0 &&
           sha_matches(p, len, F.groups[g].raw_sha256);
  close(fd);
  free(p);
  if (!ok)
    unlink(path);
  return ok;
}

/* ---- the preload thread (§6.2) ------------------------------------------ */

static void *preloader(void *arg) {
  (void)arg;
  CURL *c = new_handle();
  if (!c)
    return NULL;
  for (uint32_t g = 0; g < F.n; g++) {
    preload_checkpoint();
    pthread_mutex_lock(&mu);
    /* A demand fetch is a wrong prediction being repaired: let it have the
     * link before we start another group. */
    while (demands_active)
      pthread_cond_wait(&cv, &mu);
    if (state[g] != ABSENT) {
      pthread_mutex_unlock(&mu);
      continue;
    }
    state[g] = INFLIGHT;
    pthread_mutex_unlock(&mu);
    char err[256];
    size_t bytes = 0;
    int rc = fetch_with_retries(c, g, err, sizeof err, &bytes);
    pthread_mutex_lock(&mu);
    if (rc == 0) {
      state[g] = READY;
      log_line(g, "preload", bytes);
    } else {
      state[g] = FAILED;
      memcpy(errors[g], err, sizeof err);
    }
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
  }
  curl_easy_cleanup(c);
  return NULL;
}

static void after_fork_child(void) {
  /* The preload thread did not survive the fork. */
  pthread_mutex_init(&mu, NULL);
  pthread_mutex_init(&crypto_mu, NULL);
  have_preload_thread = 0;
  pthread_cond_init(&cv, NULL);
  for (uint32_t g = 0; g < F.n; g++)
    if (state[g] == INFLIGHT)
      state[g] = ABSENT;
  demands_active = 0;
  demand_curl = NULL; /* never share a connection with the parent */
}

EXPORT int __bunkai_fetch_start(const struct bunkai_fetch_config *cfg,
                                char *err, unsigned long errlen) {
  if (cfg->abi != BUNKAI_SCATTER_VERSION) {
    snprintf(err, errlen, "the fetch library is ABI %d, the launcher ABI %u "
             "(use the bunkai that built it)", BUNKAI_SCATTER_VERSION, cfg->abi);
    return -1;
  }
  clock_gettime(CLOCK_MONOTONIC, &F.t0);
  size_t ol = strlen(cfg->origin);
  F.origin = malloc(ol + 2);
  F.libdir = strdup(cfg->libdir);
  if (!F.origin || !F.libdir) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  memcpy(F.origin, cfg->origin, ol + 1);
  if (ol == 0 || F.origin[ol - 1] != '/')
    strcpy(F.origin + ol, "/");
  F.n = cfg->ngroups;
  F.groups = cfg->groups;
  F.preload = cfg->preload;
  F.compress = cfg->compress;
  F.log_fd = -1;
  if (cfg->log_path)
    F.log_fd = open(cfg->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
                    0644);
  if (F.compress) {
    /* The dictionary the groups were compressed with, fetched (and
     * checked) by bunkai scatter run before the program started. */
    char path[4096];
    snprintf(path, sizeof path, "%sgroups.dict", F.libdir);
    FILE *f = fopen(path, "rbe");
    if (f) {
      static unsigned char dict[1 << 20];
      size_t n = fread(dict, 1, sizeof dict, f);
      fclose(f);
      ddict = n ? ZSTD_createDDict(dict, n) : NULL;
      if (!ddict) {
        snprintf(err, errlen, "%s is not a zstd dictionary (rerun bunkai scatter run)", path);
        return -1;
      }
    }
  }
  state = calloc(F.n, 1);
  errors = calloc(F.n, sizeof *errors);
  if (!state || !errors) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  /* OpenSSL without its atexit cleanup (a no-op if the program has
   * initialised it already), then libcurl, which initialises it too */
  OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
    snprintf(err, errlen, "cannot initialise libcurl");
    return -1;
  }
  /* registered after every library's own handler, so it runs first */
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen;
  EVP_Digest("", 0, md, &mdlen, EVP_sha256(), NULL); /* any lazy set-up now */
  atexit(on_exit_stop_preloader);
  for (uint32_t g = 0; g < F.n; g++) {
    char path[4096];
    struct stat st;
    group_path(path, sizeof path, g, "");
    if (stat(path, &st) == 0)
      state[g] = CACHED;
  }
  pthread_atfork(NULL, NULL, after_fork_child);
  if (F.preload) {
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    /* The program must not notice the thread: block every signal in it, so
     * signals meant for the program go to the program's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_mutex_lock(&crypto_mu); /* preload_thread set before it hashes */
    int rc = pthread_create(&t, &a, preloader, NULL);
    if (rc == 0)
      preload_thread = t, have_preload_thread = 1;
    pthread_mutex_unlock(&crypto_mu);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&a);
    if (rc != 0) {
      snprintf(err, errlen, "cannot start the preload thread: %s",
               strerror(rc));
      return -1;
    }
  }
  return 0;
}

EXPORT int __bunkai_fetch_wait(uint32_t g, char *err, unsigned long errlen) {
  if (g >= F.n) {
    snprintf(err, errlen, "group %x does not exist", g);
    return -1;
  }
  pthread_mutex_lock(&mu);
  for (;;) {
    if (state[g] == READY) {
      pthread_mutex_unlock(&mu);
      return 0;
    }
    if (state[g] == FAILED) {
      snprintf(err, errlen, "%s", errors[g]);
      pthread_mutex_unlock(&mu);
      return -1;
    }
    if (state[g] == INFLIGHT) {
      pthread_cond_wait(&cv, &mu);
      continue;
    }
    break; /* ABSENT or CACHED: this thread does it, now */
  }
  int was_cached = state[g] == CACHED;
  state[g] = INFLIGHT;
  demands_active++;
  pthread_mutex_unlock(&mu);

  int rc = 0;
  size_t bytes = 0;
  if (!(was_cached && cached_ok(g))) {
    if (!demand_curl)
      demand_curl = new_handle();
    rc = demand_curl ? fetch_with_retries(demand_curl, g, err, errlen, &bytes)
                     : (snprintf(err, errlen, "cannot initialise libcurl"), -1);
  }

  pthread_mutex_lock(&mu);
  demands_active--;
  if (rc == 0) {
    state[g] = READY;
    log_line(g, was_cached && bytes == 0 ? "cache" : "demand", bytes);
  } else {
    state[g] = FAILED;
    snprintf(errors[g], sizeof errors[g], "%s", err);
  }
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  return rc;
}
