#define _GNU_SOURCE
/* bunkai share test: libraries loaded with dlopen, called from threads on
 * other hosts. Usage: dlopen THREADS
 *
 * Before any thread starts, main loads libz and libcrypto; each thread
 * then compresses a buffer of its own with zlib (compress2, crc32) and
 * hashes it with SHA-256 through libcrypto's EVP interface. After the
 * threads have started, each loads libsqlite3 and liblzma itself and runs
 * an in-memory database query and lzma_version_string. Every result is
 * printed by main in thread order: the transcript is the native one. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*compress2_t)(unsigned char *, unsigned long *, const unsigned char *, unsigned long, int);
typedef unsigned long (*crc32_t)(unsigned long, const unsigned char *, unsigned int);
typedef const char *(*zver_t)(void);
typedef void *(*evp_md_t)(void);
typedef int (*evp_digest_t)(const void *, size_t, unsigned char *, unsigned int *, const void *, void *);

static compress2_t z_compress2;
static crc32_t z_crc32;
static zver_t z_version;
static evp_md_t evp_sha256;
static evp_digest_t evp_digest;

#define MAXT 16
static char report[MAXT][512];

static void *must(void *lib, const char *name) {
  void *f = dlsym(lib, name);
  if (!f) {
    fprintf(stderr, "dlopen: no %s: %s\n", name, dlerror());
    exit(1);
  }
  return f;
}

static int first_column(void *p, int n, char **v, char **names) {
  (void)n, (void)names;
  *(int *)p = v[0] ? atoi(v[0]) : 0;
  return 0;
}

static int sqlite_count(int t) {
  void *lib = dlopen("libsqlite3.so.0", RTLD_NOW);
  if (!lib) return -1;
  int (*open_)(const char *, void **) = must(lib, "sqlite3_open");
  int (*exec_)(void *, const char *, int (*)(void *, int, char **, char **), void *, char **) = must(lib, "sqlite3_exec");
  int (*close_)(void *) = must(lib, "sqlite3_close");
  void *db;
  if (open_(":memory:", &db)) return -2;
  char sql[512];
  snprintf(sql, sizeof sql,
           "create table t(a integer, b text);"
           "with recursive c(x) as (select 1 union all select x + 1 from c where x < %d) "
           "insert into t select x, printf('row %%d', x * x) from c;",
           1000 + 100 * t);
  if (exec_(db, sql, 0, 0, 0)) return -3;
  int sum = 0;
  exec_(db, "select sum(length(b)) from t where a % 7 = 3", first_column, &sum, 0);
  close_(db);
  return sum;
}

static void *worker(void *p) {
  int t = (int)(long)p;
  /* libraries loaded before the thread started */
  size_t n = 200000 + 1000 * (size_t)t;
  unsigned char *in = malloc(n), *out = malloc(n + n / 100 + 600);
  for (size_t i = 0; i < n; i++) in[i] = (unsigned char)("the quick brown fox "[i % 20] + (i / 997) % 3);
  unsigned long outn = n + n / 100 + 600;
  int zr = z_compress2(out, &outn, in, n, 6);
  unsigned long crc = z_crc32(0, out, (unsigned)outn);
  unsigned char md[32];
  unsigned int mdn = 0;
  int er = evp_digest(in, n, md, &mdn, evp_sha256(), 0);
  char hex[65];
  for (unsigned i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
  /* libraries this thread loads itself */
  int sq = sqlite_count(t);
  const char *lz = "-";
  void *lzma = dlopen("liblzma.so.5", RTLD_NOW);
  if (lzma) lz = ((const char *(*)(void))must(lzma, "lzma_version_string"))();
  snprintf(report[t], sizeof report[t], "thread %d: zlib %s rc %d %lu bytes crc %08lx, sha256 %s (%d), sqlite %d, lzma %s", t,
           z_version(), zr, outn, crc, er == 1 ? hex : "failed", mdn, sq, lz);
  free(in), free(out);
  return 0;
}

int main(int argc, char **argv) {
  int nt = argc > 1 ? atoi(argv[1]) : 4;
  if (nt < 1 || nt > MAXT) return 2;
  void *z = dlopen("libz.so.1", RTLD_NOW);
  void *c = dlopen("libcrypto.so.3", RTLD_NOW);
  if (!z || !c) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  z_compress2 = must(z, "compress2");
  z_crc32 = must(z, "crc32");
  z_version = must(z, "zlibVersion");
  evp_sha256 = must(c, "EVP_sha256");
  evp_digest = must(c, "EVP_Digest");
  pthread_t th[MAXT];
  for (int t = 0; t < nt; t++) pthread_create(&th[t], 0, worker, (void *)(long)t);
  for (int t = 0; t < nt; t++) pthread_join(th[t], 0);
  for (int t = 0; t < nt; t++) puts(report[t]);
  return 0;
}
