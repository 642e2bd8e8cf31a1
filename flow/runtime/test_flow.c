/* test_flow.c: unit tests of the flow-ID runtime (this directory), built once
 * against libbunkai-flow.so and once against libbunkai-flow.a, and run by
 * tests/e2e/flow_runtime.rs.
 *
 *   test_flow [NAME...]      run all tests, or the named ones
 *
 * Each passing test prints "ok NAME (...)"; the first failing check prints
 * "FAIL file:line: check: details" and exits 1. Files go to BUNKAI_FLOW_DIR
 * and the ID counter to BUNKAI_FLOW_IDS; when they are not set, the test
 * makes a directory under /tmp and removes it at the end.
 *
 * One file (about 1,700 lines) on purpose: it is one executable linked
 * twice (shared and static), and its tests share the checking macros and
 * the thread harness. */
#define _GNU_SOURCE
#include <cpuid.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bunkai_flow.h"

/* Test hooks exported by the runtime (the __bunkai_ prefix). */
uint64_t __bunkai_flow_table_stat(struct bkf_table *t, int what);
int __bunkai_flow_ids_mode(void);
int __bunkai_flow_guarded(uint64_t sled);
uint64_t __bunkai_flow_rmap_stat(int what);
enum { ST_LIVE, ST_USED, ST_CAP, ST_REBUILDS, ST_MAPPED, ST_LOCK };

static char dir[512];
static int own_dir;

static void fail(const char *file, int line, const char *what, const char *fmt, ...) {
  char b[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  fprintf(stderr, "FAIL %s:%d: %s: %s\n", file, line, what, b);
  if (own_dir) fprintf(stderr, "(files kept in %s)\n", dir);
  fflush(stderr);
  _exit(1);
}
#define CHECK(c, ...) do { if (!(c)) fail(__FILE__, __LINE__, #c, __VA_ARGS__); } while (0)

static uint64_t now_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static uint64_t ms_since(uint64_t t0) { return (now_ns(CLOCK_MONOTONIC) - t0) / 1000000; }
static int gettid_(void) { return (int)syscall(SYS_gettid); }

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
  uint64_t x = *s;
  x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
  *s = x;
  return x * 0x2545f4914f6cdd1dull;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}
/* Index of the first duplicate in v (sorted in place), or -1. */
static long first_dup(uint64_t *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_u64);
  for (size_t i = 1; i < n; i++)
    if (v[i] == v[i - 1]) return (long)i;
  return -1;
}

static uint16_t expected_tag(void) {
  struct utsname u;
  uname(&u);
  uint32_t h = 2166136261u;
  for (const char *s = u.nodename; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
  return (uint16_t)((h ^ (h >> 16)) & 0xffff);
}

static void buf_path(char *out, size_t cap, int pid) { snprintf(out, cap, "%s/bunkai-flow.%d.buf", dir, pid); }

/* ------------------------------------------------------------------ */
/* Reading a record buffer back (what `bunkai flow dump` will do)      */

struct rec {
  uint32_t size, nvals, flags, tid, jp;
  uint64_t ns, pc;
  const uint64_t *vals;
  uint64_t chunk; /* the offset of the writer's chunk it is in, or ~0: a reservation of its own */
  uint32_t chunk_tid; /* the tid of that chunk's first record (its owner) */
};

struct bufview {
  void *map;
  size_t len;
  const struct bkf_buf_header *h;
  const char *data;
  uint64_t end; /* min(head, capacity) */
  uint64_t chunk, cend; /* the chunk being walked and its end (cend 0: none) */
  uint32_t chunk_tid;   /* the tid of its first record */
  uint64_t reserved, chunks; /* bytes of the reservations walked so far, and chunks among them */
};

static int buf_open(struct bufview *v, int pid) {
  char p[600];
  buf_path(p, sizeof p, pid);
  int fd = open(p, O_RDONLY);
  if (fd < 0) return 0;
  struct stat st;
  fstat(fd, &st);
  v->len = (size_t)st.st_size;
  v->map = mmap(0, v->len, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  CHECK(v->map != MAP_FAILED, "mmap %s", p);
  v->h = v->map;
  v->data = (const char *)v->map + BKF_BUF_HEADER_SIZE;
  v->cend = v->reserved = v->chunks = 0;
  v->end = v->h->head < v->h->capacity ? v->h->head : v->h->capacity;
  return 1;
}
static void buf_close(struct bufview *v) { munmap(v->map, v->len); }
/* After more stores into a live buffer. */
static void buf_refresh(struct bufview *v) { v->end = v->h->head < v->h->capacity ? v->h->head : v->h->capacity; }

/* A record's time as CLOCK_REALTIME ns, converted as a reader does
 * (bunkai_flow.h §3; flow/src/buffer.rs mirrors this). */
static uint64_t rec_ns(const struct bkf_buf_header *h, uint64_t t) {
  if (h->clock != BKF_CLOCK_TSC) return t;
  struct bkf_buf_time_pair c = h->cal[(h->cal_seq >> 1) & 1];
  __int128 d = (__int128)(int64_t)(t - h->tsc0) * (int64_t)(c.ns - h->mono0) / (int64_t)(c.tsc - h->tsc0);
  return h->ns0 + (uint64_t)(int64_t)d;
}

/* Next record at *off (start at 0); 0 at the end. Walks writers' chunks
 * (bunkai_flow.h §3: a zero word ends a chunk, or the walk at the top) and
 * checks the framing. */
static int buf_next(struct bufview *v, uint64_t *off, struct rec *r) {
  for (;;) {
    if (v->cend && *off + 8 > v->cend) {
      *off = v->cend, v->cend = 0;
      continue;
    }
    if (*off + 8 > v->end) return 0;
    const char *p = v->data + *off;
    uint32_t size = *(const uint32_t *)p;
    uint16_t flags = *(const uint16_t *)(p + 6);
    if (!size) {
      if (!v->cend) return 0;
      *off = v->cend, v->cend = 0;
      continue;
    }
    if (!v->cend && (flags & BKF_REC_CHUNK)) {
      CHECK(flags == BKF_REC_CHUNK && size % 8 == 0 && size >= 8 && *off + size <= v->end, "chunk at %llu: size %u flags %u",
            (unsigned long long)*off, size, flags);
      v->chunk = *off, v->cend = *off + size;
      v->reserved += size, v->chunks++;
      *off += 8;
      continue;
    }
    uint64_t lim = v->cend ? v->cend : v->end;
    CHECK(size % 8 == 0 && size >= BKF_REC_HEADER && *off + size <= lim, "record at %llu: size %u", (unsigned long long)*off, size);
    CHECK(!(flags & ~BKF_REC_DONE), "record at %llu: flags %u", (unsigned long long)*off, flags);
    r->size = size;
    r->nvals = *(const uint16_t *)(p + 4);
    r->flags = flags;
    r->ns = rec_ns(v->h, *(const uint64_t *)(p + 8));
    r->pc = *(const uint64_t *)(p + 16);
    r->tid = *(const uint32_t *)(p + 24);
    r->jp = *(const uint32_t *)(p + 28);
    r->vals = (const uint64_t *)(p + 32);
    if (v->cend && *off == v->chunk + 8) v->chunk_tid = r->tid;
    r->chunk = v->cend ? v->chunk : ~0ull;
    r->chunk_tid = v->cend ? v->chunk_tid : 0;
    if (!v->cend) v->reserved += size;
    CHECK(size == BKF_REC_HEADER + 8 * r->nvals, "record at %llu: size %u for %u values", (unsigned long long)*off, size, r->nvals);
    *off += size;
    return 1;
  }
}

/* ------------------------------------------------------------------ */
/* IDs                                                                 */

struct ids_arg {
  uint64_t *out;
  size_t n;
};
static void *ids_thread(void *p) {
  struct ids_arg *a = p;
  for (size_t i = 0; i < a->n; i++) a->out[i] = get_new_flowid();
  return 0;
}

static void test_ids_threads(char *note) {
  enum { T = 4, N = 50000 };
  uint64_t *all = malloc(sizeof(uint64_t) * T * N);
  pthread_t th[T];
  struct ids_arg a[T];
  for (int i = 0; i < T; i++) {
    a[i] = (struct ids_arg){all + (size_t)i * N, N};
    pthread_create(&th[i], 0, ids_thread, &a[i]);
  }
  for (int i = 0; i < T; i++) pthread_join(th[i], 0);
  CHECK(__bunkai_flow_ids_mode() == 1, "IDs do not come from the counter file (mode %d)", __bunkai_flow_ids_mode());
  uint16_t tag = expected_tag();
  for (size_t i = 0; i < (size_t)T * N; i++) {
    CHECK(all[i] != 0, "ID 0 at %zu", i);
    CHECK(all[i] >> 48 == tag, "host tag %llx, expected %x", (unsigned long long)(all[i] >> 48), tag);
  }
  long d = first_dup(all, (size_t)T * N);
  CHECK(d < 0, "ID %llx given twice", (unsigned long long)all[d]);
  sprintf(note, "%d threads x %d IDs, host tag %04x", T, N, tag);
  free(all);
}

/* Child of test_ids_processes: N IDs into FILE. */
static int ids_child(const char *file, long n) {
  uint64_t *v = malloc(sizeof(uint64_t) * (size_t)n);
  for (long i = 0; i < n; i++) v[i] = get_new_flowid();
  FILE *f = fopen(file, "wb");
  if (!f || fwrite(v, sizeof *v, (size_t)n, f) != (size_t)n || fclose(f)) return 2;
  return __bunkai_flow_ids_mode() == 1 ? 0 : 3;
}

static pid_t spawn_self(char *const argv[], char *const extra_env[]) {
  pid_t p = fork();
  if (p == 0) {
    for (int i = 0; extra_env && extra_env[i]; i++) putenv(extra_env[i]);
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  return p;
}
static int wait_ok(pid_t p) {
  int st;
  if (waitpid(p, &st, 0) != p) return 0;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}
static void wait_check(pid_t p, const char *who) {
  int st;
  CHECK(waitpid(p, &st, 0) == p, "waitpid %s", who);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: %s %d", who, WIFEXITED(st) ? "exit status" : "killed by signal",
        WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

static void test_ids_processes(char *note) {
  enum { N = 200000 };
  char f1[600], f2[600], n[16];
  snprintf(f1, sizeof f1, "%s/ids.1", dir);
  snprintf(f2, sizeof f2, "%s/ids.2", dir);
  snprintf(n, sizeof n, "%d", N);
  /* Two separately exec'd processes map the counter file on their own,
   * while this one takes IDs too. */
  char *a1[] = {"test_flow", "--ids-child", f1, n, 0}, *a2[] = {"test_flow", "--ids-child", f2, n, 0};
  pid_t p1 = spawn_self(a1, 0), p2 = spawn_self(a2, 0);
  uint64_t *all = malloc(sizeof(uint64_t) * 3 * N);
  for (int i = 0; i < N; i++) all[2 * N + i] = get_new_flowid();
  wait_check(p1, "ID child 1");
  wait_check(p2, "ID child 2");
  FILE *a = fopen(f1, "rb"), *b = fopen(f2, "rb");
  CHECK(a && b, "children's ID files");
  CHECK(fread(all, 8, N, a) == N && fread(all + N, 8, N, b) == N, "short ID file");
  fclose(a), fclose(b);
  unlink(f1), unlink(f2);
  for (int i = 0; i < 3 * N; i++) CHECK(all[i] != 0, "ID 0");
  long d = first_dup(all, 3 * N);
  CHECK(d < 0, "ID %llx given to two processes", (unsigned long long)all[d]);
  struct stat st;
  CHECK(stat(getenv("BUNKAI_FLOW_IDS"), &st) == 0 && st.st_size == 4096, "counter file");
  sprintf(note, "3 processes x %d IDs", N);
  free(all);
}

/* Child of test_ids_fallback: the counter file cannot be made. */
static int fallback_child(void) {
  enum { N = 20000 };
  static uint64_t v[2 * N];
  int fd[2];
  if (pipe(fd)) return 2;
  uint64_t first = get_new_flowid();
  if (__bunkai_flow_ids_mode() != 2) return 3;
  pid_t p = fork(); /* a fork child shares the process-local counter */
  if (p == 0) {
    for (int i = 0; i < N; i++) v[i] = get_new_flowid();
    _exit(write(fd[1], v, sizeof(uint64_t) * N) == (ssize_t)(sizeof(uint64_t) * N) ? 0 : 1);
  }
  for (int i = 0; i < N; i++) v[N + i] = get_new_flowid();
  size_t got = 0;
  while (got < sizeof(uint64_t) * N) {
    ssize_t r = read(fd[0], (char *)v + got, sizeof(uint64_t) * N - got);
    if (r <= 0) return 4;
    got += (size_t)r;
  }
  if (!wait_ok(p)) return 5;
  for (int i = 0; i < 2 * N; i++)
    if (!v[i] || v[i] == first) return 6;
  if (first_dup(v, 2 * N) >= 0) return 7;
  return 0;
}

static void test_ids_fallback(char *note) {
  char *a[] = {"test_flow", "--fallback-child", 0};
  char *e[] = {"BUNKAI_FLOW_IDS=/proc/nonexistent/bunkai-flow.ids", 0};
  wait_check(spawn_self(a, e), "fallback child (IDs unique across a fork with no counter file)");
  sprintf(note, "process-local counter shared with a fork child");
}

/* ------------------------------------------------------------------ */
/* Tables: semantics                                                   */

static void test_table_basics(char *note) {
  struct bkf_table *a = bkf_table("basics.a"), *b = bkf_table("basics.b");
  CHECK(a && b && a != b, "two tables");
  CHECK(bkf_table("basics.a") == a, "same name, same table");
  char name[64];
  strcpy(name, "basics.a");
  CHECK(bkf_table(name) == a, "same name in another string");
  CHECK(bkf_table(0) == 0, "NULL name");
  static char longname[5000];
  memset(longname, 'x', sizeof longname - 1);
  struct bkf_table *l = bkf_table(longname);
  CHECK(l && l != a && bkf_table(longname) == l, "long name");

  int obj[8];
  CHECK(get_flowid(a, &obj[0]) == 0, "empty table");
  CHECK(bkf_table_size(a) == 0, "empty size");
  register_flowid(a, &obj[0], 42);
  CHECK(get_flowid(a, &obj[0]) == 42, "registered");
  CHECK(get_flowid(b, &obj[0]) == 0, "tables are apart");
  CHECK(get_flowid(a, &obj[1]) == 0, "another address");
  register_flowid(a, &obj[0], 43);
  CHECK(get_flowid(a, &obj[0]) == 43 && bkf_table_size(a) == 1, "registered again: new ID, one entry");
  register_flowid(a, &obj[1], 43);
  CHECK(bkf_table_size(a) == 2, "two keys, one ID");
  remove_flowid(a, &obj[0]);
  CHECK(get_flowid(a, &obj[0]) == 0 && get_flowid(a, &obj[1]) == 43 && bkf_table_size(a) == 1, "removed one");
  remove_flowid(a, &obj[0]);
  remove_flowid(a, &obj[5]);
  CHECK(bkf_table_size(a) == 1, "removing an absent key changes nothing");
  register_flowid(a, &obj[0], 44);
  CHECK(get_flowid(a, &obj[0]) == 44 && bkf_table_size(a) == 2, "back after removal");
  register_flowid(a, &obj[0], 0);
  CHECK(get_flowid(a, &obj[0]) == 0 && bkf_table_size(a) == 1, "registering ID 0 removes");
  /* NULL table or key: ignored. */
  register_flowid(0, &obj[0], 1);
  remove_flowid(0, &obj[0]);
  CHECK(get_flowid(0, &obj[0]) == 0 && bkf_table_size(0) == 0, "NULL table");
  register_flowid(a, 0, 7);
  CHECK(get_flowid(a, 0) == 0 && bkf_table_size(a) == 1, "NULL key");
  /* Any 64-bit ID, and addresses that differ by one byte. */
  char bytes[4];
  for (int i = 0; i < 4; i++) register_flowid(b, &bytes[i], ~0ull - (uint64_t)i);
  for (int i = 0; i < 4; i++) CHECK(get_flowid(b, &bytes[i]) == ~0ull - (uint64_t)i, "byte address %d", i);
  sprintf(note, "%d tables", 3);
}

/* The paper's Figs. 5-8 (start, transit move/copy, xin_move/xout_move,
 * quit, an xflow-guarded advice), as generated advice will do them. */
static void test_paper_patterns(char *note) {
  struct bkf_table *netflow = bkf_table("netflow");
  struct sk_buff { char data[64]; } skb, n, n2, back;
  struct netif_tx_request { uint16_t flags, size; } tx = {0, 0};

  /* start (Fig. 5): a new flow for the allocated skb. */
  bkf_id id = get_new_flowid();
  register_flowid(netflow, &skb, id);
  CHECK(get_flowid(netflow, &skb) == id, "start");

  /* transit with copy: skb_clone, both keep the flow. */
  bkf_id i2 = get_flowid(netflow, &skb);
  if (i2 != 0) register_flowid(netflow, &n2, i2);
  CHECK(get_flowid(netflow, &skb) == id && get_flowid(netflow, &n2) == id, "copy keeps both");

  /* transit with move (Fig. 6): the flow goes from skb to n. */
  bkf_id i3 = get_flowid(netflow, &skb);
  if (i3 != 0) {
    register_flowid(netflow, &n, i3);
    remove_flowid(netflow, &skb);
  }
  CHECK(get_flowid(netflow, &skb) == 0 && get_flowid(netflow, &n) == id, "move");

  /* transit from an object not in the flow: nothing happens. */
  struct sk_buff stranger;
  bkf_id i4 = get_flowid(netflow, &stranger);
  if (i4 != 0) register_flowid(netflow, &skb, i4);
  CHECK(get_flowid(netflow, &skb) == 0, "transit outside the flow");

  /* xin_move (Fig. 7): 12 bits of the ID into tx.flags bits 4..15. */
  bkf_id i5 = get_flowid(netflow, &n);
  tx.flags |= (uint16_t)((i5 & 0xfff) << 4);
  remove_flowid(netflow, &n);
  CHECK(get_flowid(netflow, &n) == 0, "xin_move leaves the table");
  /* xout_move on the other side: back from the header field. The high
   * bits (host tag included) are lost, as the paper accepts. */
  bkf_id i6 = (tx.flags >> 4) & 0xfff;
  if (i6) register_flowid(netflow, &back, i6);
  CHECK(get_flowid(netflow, &back) == (id & 0xfff), "xout_move: %llx", (unsigned long long)get_flowid(netflow, &back));

  /* An xflow-guarded advice (Fig. 8) runs only for objects in the flow. */
  int ran = 0;
  struct sk_buff *candidates[] = {&back, &stranger, &n2, &skb};
  for (int i = 0; i < 4; i++)
    if (get_flowid(netflow, candidates[i]) != 0) ran++;
  CHECK(ran == 2, "xflow selects %d objects, expected 2", ran);

  /* quit: the flow ends. */
  remove_flowid(netflow, &back);
  remove_flowid(netflow, &n2);
  CHECK(bkf_table_size(netflow) == 0, "quit empties the table");
  sprintf(note, "start, copy, move, xin/xout_move, xflow, quit");
}

/* ------------------------------------------------------------------ */
/* Tables: growth, shrinking, memory                                    */

static void test_table_growth(char *note) {
  enum { N = 1000000 };
  struct bkf_table *t = bkf_table("growth");
  const uintptr_t base = 0x7f0000000000ull;
#define K(i) ((const void *)(base + 48 * (uintptr_t)(i)))
  for (int i = 0; i < N; i++) register_flowid(t, K(i), (uint64_t)i + 1);
  CHECK(bkf_table_size(t) == N, "size %llu", (unsigned long long)bkf_table_size(t));
  uint64_t cap = __bunkai_flow_table_stat(t, ST_CAP);
  CHECK(cap >= 2 * (uint64_t)N && cap <= 4 * (uint64_t)N, "capacity %llu for %d", (unsigned long long)cap, N);
  for (int i = 0; i < N; i++) CHECK(get_flowid(t, K(i)) == (uint64_t)i + 1, "key %d", i);
  CHECK(get_flowid(t, K(N)) == 0 && get_flowid(t, (const void *)(base + 1)) == 0, "absent keys");
  for (int i = 1; i < N; i += 2) remove_flowid(t, K(i));
  CHECK(bkf_table_size(t) == N / 2, "after removing half");
  for (int i = 0; i < N; i++) CHECK(get_flowid(t, K(i)) == (i % 2 ? 0 : (uint64_t)i + 1), "key %d after removals", i);
  for (int i = 1; i < N; i += 2) register_flowid(t, K(i), (uint64_t)i + 7);
  for (int i = 0; i < N; i++) CHECK(get_flowid(t, K(i)) == (uint64_t)i + (i % 2 ? 7 : 1), "key %d re-registered", i);
  uint64_t peak = __bunkai_flow_table_stat(t, ST_MAPPED);
  for (int i = 0; i < N; i++) remove_flowid(t, K(i));
  CHECK(bkf_table_size(t) == 0, "emptied");
  uint64_t small = __bunkai_flow_table_stat(t, ST_CAP);
  CHECK(small <= 65536, "an emptied table shrinks (capacity %llu)", (unsigned long long)small);
  for (int i = 0; i < N; i += 1000) CHECK(get_flowid(t, K(i)) == 0, "key %d after emptying", i);
  /* Never more than twice the arrays a size needs: below 4x the largest. */
  uint64_t largest = 64 + cap * 16;
  uint64_t mapped = __bunkai_flow_table_stat(t, ST_MAPPED);
  CHECK(mapped <= 4 * largest + (1u << 20), "arrays mapped: %llu bytes, largest array %llu", (unsigned long long)mapped,
        (unsigned long long)largest);
  sprintf(note, "%d entries, capacity %llu, %llu rebuilds, %.0f MiB mapped at most", N, (unsigned long long)cap,
          (unsigned long long)__bunkai_flow_table_stat(t, ST_REBUILDS), (double)(peak > mapped ? peak : mapped) / (1 << 20));
#undef K
}

/* New addresses all the time, few alive: dead slots are cleaned up and
 * the table stays small. */
static void test_table_churn(char *note) {
  struct bkf_table *t = bkf_table("churn");
  const uintptr_t base = 0x560000000000ull;
  enum { LIVE = 1000, ROUNDS = 300000 };
  for (uint64_t i = 0; i < ROUNDS; i++) {
    register_flowid(t, (const void *)(base + 64 * i), i + 1);
    if (i >= LIVE) remove_flowid(t, (const void *)(base + 64 * (i - LIVE)));
  }
  CHECK(bkf_table_size(t) == LIVE, "size %llu", (unsigned long long)bkf_table_size(t));
  for (uint64_t i = 0; i < ROUNDS; i++)
    CHECK(get_flowid(t, (const void *)(base + 64 * i)) == (i >= ROUNDS - LIVE ? i + 1 : 0), "key %llu", (unsigned long long)i);
  uint64_t cap = __bunkai_flow_table_stat(t, ST_CAP);
  CHECK(cap <= 4096, "capacity %llu for %d live", (unsigned long long)cap, LIVE);
  CHECK(__bunkai_flow_table_stat(t, ST_MAPPED) <= 4 * (64 + 16 * 4096) + 65536, "mapped %llu",
        (unsigned long long)__bunkai_flow_table_stat(t, ST_MAPPED));
  sprintf(note, "%d keys through %d live, capacity %llu, %llu rebuilds", ROUNDS, LIVE, (unsigned long long)cap,
          (unsigned long long)__bunkai_flow_table_stat(t, ST_REBUILDS));
}

/* ------------------------------------------------------------------ */
/* Tables: concurrent readers and writers through rebuilds             */

enum { SW = 2, SR = 2, SKEYS = 20000, SSTABLE = 1000 };
static struct bkf_table *st_t;
static volatile int st_stop;
static uint64_t st_mailbox[SW];
static uint64_t st_reads[SR], st_writes[SW];
static uint64_t *st_shadow[SW];

static uint64_t st_cycle[SW]; /* each writer's keys are new in every cycle */
static uintptr_t st_key_c(int w, uint64_t c, int j) {
  return 0x100000000000ull * (uintptr_t)(w + 1) + 64 * ((uintptr_t)c * SKEYS + (uintptr_t)j);
}
static uintptr_t st_key(int w, int j) { return st_key_c(w, __atomic_load_n(&st_cycle[w], __ATOMIC_RELAXED), j); }
static uintptr_t st_stable_key(int j) { return 0x500000000000ull + 80 * (uintptr_t)j; }
static uintptr_t st_mail_key(int w) { return 0x600000000000ull + 64 * (uintptr_t)w; }
static uint64_t st_hi(uintptr_t k) { return ((uint64_t)k * 0x9e3779b97f4a7c15ull) & 0xffffffff00000000ull; }
static uint64_t st_val(uintptr_t k, uint64_t ver) { return st_hi(k) | (ver & 0xffffffff); }

static void *st_writer(void *p) {
  int w = (int)(intptr_t)p;
  uint64_t s = 0x1234567 + (uint64_t)w, ver = 0, ops = 0;
  uint64_t *sh = st_shadow[w];
  while (!st_stop) {
    /* fill (grows), churn (dead slots, same-size rebuilds), drain (shrinks) */
    for (int j = 0; j < SKEYS; j++) {
      sh[j] = st_val(st_key(w, j), ++ver);
      register_flowid(st_t, (void *)st_key(w, j), sh[j]);
    }
    for (int i = 0; i < 4 * SKEYS && !st_stop; i++) {
      int j = (int)(rng_next(&s) % SKEYS);
      if (rng_next(&s) % 3 == 0) {
        remove_flowid(st_t, (void *)st_key(w, j));
        sh[j] = 0;
      } else {
        sh[j] = st_val(st_key(w, j), ++ver);
        register_flowid(st_t, (void *)st_key(w, j), sh[j]);
      }
      if (i % 64 == 0) {
        uint64_t v = ++ver;
        register_flowid(st_t, (void *)st_mail_key(w), st_val(st_mail_key(w), v));
        __atomic_store_n(&st_mailbox[w], v, __ATOMIC_RELEASE);
      }
    }
    if (st_stop) break;
    for (int j = 0; j < SKEYS; j++) {
      remove_flowid(st_t, (void *)st_key(w, j));
      sh[j] = 0;
    }
    ops += 6 * SKEYS;
    __atomic_store_n(&st_cycle[w], st_cycle[w] + 1, __ATOMIC_RELAXED);
  }
  st_writes[w] = ops;
  return 0;
}

static void *st_reader(void *p) {
  int r = (int)(intptr_t)p;
  uint64_t s = 0x9876 + (uint64_t)r, n = 0;
  while (!st_stop) {
    for (int i = 0; i < 256; i++, n += 4) {
      int w = (int)(rng_next(&s) % SW), j = (int)(rng_next(&s) % SKEYS);
      uint64_t c = __atomic_load_n(&st_cycle[w], __ATOMIC_RELAXED);
      uintptr_t k = st_key_c(w, c - (c && rng_next(&s) % 4 == 0), j); /* sometimes the last cycle's */
      uint64_t v1 = get_flowid(st_t, (void *)k), v2 = get_flowid(st_t, (void *)k);
      CHECK(!v1 || (v1 & 0xffffffff00000000ull) == st_hi(k), "key %lx read %llx: another key's value", (unsigned long)k,
            (unsigned long long)v1);
      CHECK(!v2 || (v2 & 0xffffffff00000000ull) == st_hi(k), "key %lx read %llx: another key's value", (unsigned long)k,
            (unsigned long long)v2);
      CHECK(!v1 || !v2 || (uint32_t)v2 >= (uint32_t)v1, "key %lx went back from version %u to %u", (unsigned long)k,
            (unsigned)v1, (unsigned)v2);
      int sj = (int)(rng_next(&s) % SSTABLE);
      uintptr_t sk = st_stable_key(sj);
      uint64_t sv = get_flowid(st_t, (void *)sk);
      CHECK(sv == st_val(sk, (uint64_t)sj + 1), "stable key %d read %llx", sj, (unsigned long long)sv);
      uint64_t m = __atomic_load_n(&st_mailbox[w], __ATOMIC_ACQUIRE);
      uint64_t mv = get_flowid(st_t, (void *)st_mail_key(w));
      CHECK(m == 0 || (mv && (uint32_t)mv >= (uint32_t)m), "writer %d published version %llu, read %llx", w,
            (unsigned long long)m, (unsigned long long)mv);
    }
  }
  st_reads[r] = n;
  return 0;
}

static void test_concurrent(char *note) {
  st_t = bkf_table("stress");
  for (int j = 0; j < SSTABLE; j++) register_flowid(st_t, (void *)st_stable_key(j), st_val(st_stable_key(j), (uint64_t)j + 1));
  for (int w = 0; w < SW; w++) st_shadow[w] = calloc(SKEYS, sizeof(uint64_t));
  uint64_t rb0 = __bunkai_flow_table_stat(st_t, ST_REBUILDS);
  const char *ms = getenv("BKF_STRESS_MS");
  int dur = ms ? atoi(ms) : 2000;
  pthread_t tw[SW], tr[SR];
  st_stop = 0;
  for (int w = 0; w < SW; w++) pthread_create(&tw[w], 0, st_writer, (void *)(intptr_t)w);
  for (int r = 0; r < SR; r++) pthread_create(&tr[r], 0, st_reader, (void *)(intptr_t)r);
  /* At least dur ms, and on until the table has been rebuilt 10 times under
   * the readers (a loaded machine gives the writers less time: the test
   * then runs longer instead of failing), for 30 s at most. */
  usleep((useconds_t)dur * 1000);
  for (int waited = 0; waited < 30000 && __bunkai_flow_table_stat(st_t, ST_REBUILDS) - rb0 < 10; waited += 10)
    usleep(10000);
  st_stop = 1;
  for (int w = 0; w < SW; w++) pthread_join(tw[w], 0);
  for (int r = 0; r < SR; r++) pthread_join(tr[r], 0);
  /* The table is what the writers last did. */
  uint64_t live = SSTABLE + SW;
  for (int w = 0; w < SW; w++)
    for (int j = 0; j < SKEYS; j++) {
      uint64_t v = get_flowid(st_t, (void *)st_key(w, j));
      CHECK(v == st_shadow[w][j], "writer %d key %d: %llx, expected %llx", w, j, (unsigned long long)v,
            (unsigned long long)st_shadow[w][j]);
      live += v != 0;
    }
  for (int w = 0; w < SW; w++)
    for (uint64_t c = 0; c < st_cycle[w]; c++)
      for (int j = 0; j < SKEYS; j += 7) CHECK(get_flowid(st_t, (void *)st_key_c(w, c, j)) == 0, "old key %d of cycle %llu", j, (unsigned long long)c);
  for (int j = 0; j < SSTABLE; j++) CHECK(get_flowid(st_t, (void *)st_stable_key(j)) == st_val(st_stable_key(j), (uint64_t)j + 1), "stable %d", j);
  CHECK(bkf_table_size(st_t) == live, "size %llu, expected %llu", (unsigned long long)bkf_table_size(st_t), (unsigned long long)live);
  uint64_t rebuilds = __bunkai_flow_table_stat(st_t, ST_REBUILDS) - rb0;
  CHECK(rebuilds >= 10, "only %llu rebuilds during the stress", (unsigned long long)rebuilds);
  sprintf(note, "%d writers, %d readers, %d ms: %.1fM reads, %.1fM writes, %llu cycles, %llu rebuilds", SW, SR, dur,
          (double)(st_reads[0] + st_reads[1]) / 1e6, (double)(st_writes[0] + st_writes[1]) / 1e6,
          (unsigned long long)(st_cycle[0] + st_cycle[1]), (unsigned long long)rebuilds);
  for (int w = 0; w < SW; w++) free(st_shadow[w]);
}

/* ------------------------------------------------------------------ */
/* The record buffer                                                   */

enum { BT = 3, BN = 20000, BIG_VALS = 400 };
static int bt_tid[BT];
static void *bt_thread(void *p) {
  int t = (int)(intptr_t)p;
  bt_tid[t] = gettid_();
  uint64_t v[5];
  for (uint64_t s = 0; s < BN; s++) {
    int n = 1 + (int)(s % 5);
    v[0] = (uint64_t)t << 32 | s, v[1] = s ^ 0xdead, v[2] = ~s, v[3] = s * 3, v[4] = s << 7;
    bkf_store(0x400000 + (uint64_t)t, (uint32_t)t + 10, n, v);
    if (s % 4000 == 0) {
      /* larger than a quarter chunk: in the thread's chunk if it fits
       * (one in five), else a reservation of its own */
      uint64_t big[BIG_VALS];
      for (int i = 0; i < BIG_VALS; i++) big[i] = (uint64_t)t << 32 | (s + (uint64_t)i);
      bkf_store(0xb16000 + (uint64_t)t, 9, BIG_VALS, big);
    }
  }
  return 0;
}

static void test_buffer(char *note) {
  uint64_t t0 = now_ns(CLOCK_REALTIME);
  pthread_t th[BT];
  for (int t = 0; t < BT; t++) pthread_create(&th[t], 0, bt_thread, (void *)(intptr_t)t);
  for (int t = 0; t < BT; t++) pthread_join(th[t], 0);
  /* The macros generated advice uses. */
  uint64_t bkf_pc__ = 0xabcdef;
  uint32_t bkf_jp__ = 77;
  uint64_t tsc;
  DO_RDTSC(tsc);
  STORE_DATA3(0x11, tsc, 0x33);
  STORE_DATA1(0x44);
  bkf_store(0x55, ~0u, 0, 0);
  uint64_t t1 = now_ns(CLOCK_REALTIME);

  struct bufview v;
  CHECK(buf_open(&v, getpid()), "no buffer file for this process");
  const struct bkf_buf_header *h = v.h;
  CHECK(h->magic == BKF_BUF_MAGIC && h->version == BKF_BUF_VERSION, "magic %x version %u", h->magic, h->version);
  CHECK(h->pid == (uint32_t)getpid(), "pid %u", h->pid);
  CHECK(h->host_tag == expected_tag(), "host tag %x", h->host_tag);
  CHECK(h->capacity == v.len - BKF_BUF_HEADER_SIZE && v.len == (32u << 20), "capacity %llu of a %zu-byte file",
        (unsigned long long)h->capacity, v.len);
  CHECK(h->dropped == 0, "dropped %llu", (unsigned long long)h->dropped);
  CHECK(h->started_ns <= t1 && h->started_ns + 60ull * 1000000000 > t0, "started_ns");
  struct utsname u;
  uname(&u);
  CHECK(strcmp(h->host, u.nodename) == 0, "host '%s'", h->host);
  char exe[192] = {0};
  CHECK(readlink("/proc/self/exe", exe, sizeof exe - 1) > 0 && strcmp(exe, h->exe) == 0, "exe '%s'", h->exe);

  /* Every record, once, complete and right. */
  static uint64_t last_ns[BT], seen[BT][BN / 64 + 1];
  uint64_t off = 0, bytes = 0, count = 0, bigs = 0, bigs_own = 0;
  int tail = 0;
  struct rec r;
  memset(last_ns, 0, sizeof last_ns);
  memset(seen, 0, sizeof seen);
  while (buf_next(&v, &off, &r)) {
    CHECK(r.flags == BKF_REC_DONE, "record %llu not complete", (unsigned long long)count);
    bytes += r.size, count++;
    /* a chunk is one thread's */
    CHECK(r.chunk == ~0ull || r.tid == r.chunk_tid, "chunk at %llu holds records of threads %u and %u", (unsigned long long)r.chunk,
          r.chunk_tid, r.tid);
    if (r.pc >= 0xb16000 && r.pc < 0xb16000 + BT) {
      int t = (int)(r.pc - 0xb16000);
      uint64_t s0 = r.vals[0] & 0xffffffff;
      CHECK(r.nvals == BIG_VALS && r.tid == (uint32_t)bt_tid[t] && s0 % 4000 == 0, "big record at %llu", (unsigned long long)(off - r.size));
      bigs_own += r.chunk == ~0ull;
      for (int i = 0; i < BIG_VALS; i++) CHECK(r.vals[i] == ((uint64_t)t << 32 | (s0 + (uint64_t)i)), "big record value %d", i);
      bigs++;
    } else if (r.pc >= 0x400000 && r.pc < 0x400000 + BT) {
      CHECK(r.chunk != ~0ull, "a thread's record outside its chunks");
      int t = (int)(r.pc - 0x400000);
      uint64_t s = r.vals[0] & 0xffffffff;
      CHECK(r.jp == (uint32_t)t + 10 && r.vals[0] >> 32 == (uint64_t)t && s < BN, "thread record at %llu: pc %llx jp %u v0 %llx",
            (unsigned long long)(off - r.size), (unsigned long long)r.pc, r.jp, (unsigned long long)r.vals[0]);
      CHECK(r.nvals == 1 + s % 5, "nvals %u for seq %llu", r.nvals, (unsigned long long)s);
      uint64_t want[5] = {(uint64_t)t << 32 | s, s ^ 0xdead, ~s, s * 3, s << 7};
      for (unsigned i = 0; i < r.nvals; i++) CHECK(r.vals[i] == want[i], "value %u of seq %llu", i, (unsigned long long)s);
      CHECK(r.tid == (uint32_t)bt_tid[t], "tid %u, expected %d", r.tid, bt_tid[t]);
      CHECK(!(seen[t][s / 64] >> (s % 64) & 1), "seq %llu twice", (unsigned long long)s);
      seen[t][s / 64] |= 1ull << (s % 64);
      /* with the TSC, a converted time may be off by the pairs' error (2 us allowed, as in time_stamps) */
      uint64_t slack = v.h->clock == BKF_CLOCK_TSC ? 2000 : 0;
      CHECK(r.ns >= last_ns[t] && r.ns + slack >= t0 && r.ns <= t1 + slack, "time %llu", (unsigned long long)r.ns);
      last_ns[t] = r.ns;
    } else if (r.pc == 0xabcdef && tail == 0) {
      CHECK(r.jp == 77 && r.nvals == 3 && r.vals[0] == 0x11 && r.vals[1] == tsc && r.vals[2] == 0x33, "STORE_DATA3");
      CHECK(r.tid == (uint32_t)gettid_(), "main thread tid");
      tail = 1;
    } else if (tail == 1) {
      CHECK(r.pc == 0xabcdef && r.jp == 77 && r.nvals == 1 && r.vals[0] == 0x44, "STORE_DATA1");
      tail = 2;
    } else {
      CHECK(tail == 2 && r.pc == 0x55 && r.jp == ~0u && r.nvals == 0 && r.size == BKF_REC_HEADER, "empty record");
      tail = 3;
    }
  }
  CHECK(tail == 3, "the macros' records are missing");
  CHECK(bigs == BT * (BN / 4000) && count == BT * BN + 3 + bigs, "%llu records, %llu big ones", (unsigned long long)count,
        (unsigned long long)bigs);
  CHECK(bigs_own > 0, "no big record had a reservation of its own");
  /* every reserved byte walked; what chunks leave unused: the chunk's
   * head and less than a small record in each (a big one that does not
   * fit goes elsewhere and the chunk stays), and each thread's last chunk */
  CHECK(v.reserved == h->head, "walked %llu bytes of reservations, head %llu", (unsigned long long)v.reserved,
        (unsigned long long)h->head);
  CHECK(h->head - bytes <= v.chunks * 80 + (BT + 1) * 4096ull, "%llu bytes of records in %llu bytes reserved, %llu chunks",
        (unsigned long long)bytes, (unsigned long long)h->head, (unsigned long long)v.chunks);
  for (int t = 0; t < BT; t++)
    for (int s = 0; s < BN; s++) CHECK(seen[t][s / 64] >> (s % 64) & 1, "thread %d seq %d missing", t, s);
  buf_close(&v);
  sprintf(note, "%llu records from %d threads, %llu bytes in %llu chunks and %llu records of their own", (unsigned long long)count,
          BT + 1, (unsigned long long)bytes, (unsigned long long)v.chunks, (unsigned long long)bigs_own);
}

/* Threads one after the other, each on its predecessor's stack and thread
 * pointer (glibc reuses them): each takes the dead one's entry over and
 * starts a chunk of its own, so no chunk holds two threads' records. */
enum { REUSE_THREADS = 40, REUSE_STORES = 10 };
static int reuse_tid[REUSE_THREADS];
static uint64_t reuse_tp[REUSE_THREADS];
static void *reuse_thread(void *p) {
  int k = (int)(intptr_t)p;
  reuse_tid[k] = gettid_();
  __asm__("mov %%fs:0, %0" : "=r"(reuse_tp[k]));
  for (uint64_t i = 0; i < REUSE_STORES; i++) {
    uint64_t v = (uint64_t)k << 32 | i;
    bkf_store(0x2e05e, 3, 1, &v);
  }
  return 0;
}

static void test_buffer_reuse(char *note) {
  for (int k = 0; k < REUSE_THREADS; k++) {
    pthread_t th;
    pthread_create(&th, 0, reuse_thread, (void *)(intptr_t)k);
    pthread_join(th, 0);
    /* glibc frees the stack (and thread pointer) when the kernel clears
     * the tid, before the kernel reaps the thread; until then tgkill still
     * finds it and the next thread could not take its entry over. Wait
     * for that (with a deadline), so every thread here takes over. */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (syscall(SYS_tgkill, getpid(), reuse_tid[k], 0) == 0) {
      clock_gettime(CLOCK_MONOTONIC, &t1);
      CHECK(t1.tv_sec - t0.tv_sec < 10, "thread %d not reaped after 10 s", reuse_tid[k]);
      sched_yield();
    }
  }
  int same_tp = 0;
  for (int k = 1; k < REUSE_THREADS; k++) same_tp += reuse_tp[k] == reuse_tp[0];
  /* more threads on one thread pointer than an entry's probes: without
   * takeover the ninth would find no entry */
  CHECK(same_tp >= 8, "only %d threads on the first one's thread pointer", same_tp + 1);
  struct bufview v;
  CHECK(buf_open(&v, getpid()), "no buffer");
  uint64_t off = 0, n = 0;
  int seen[REUSE_THREADS] = {0};
  struct rec r;
  while (buf_next(&v, &off, &r)) {
    if (r.pc != 0x2e05e) continue;
    int k = (int)(r.vals[0] >> 32);
    CHECK(k < REUSE_THREADS && r.tid == (uint32_t)reuse_tid[k] && (r.vals[0] & 0xffffffff) == (uint64_t)seen[k],
          "record of thread %d out of place", k);
    CHECK(r.chunk != ~0ull && r.tid == r.chunk_tid, "thread %d wrote into a chunk of thread %u", k, r.chunk_tid);
    seen[k]++, n++;
  }
  buf_close(&v);
  CHECK(n == REUSE_THREADS * REUSE_STORES, "%llu records", (unsigned long long)n);
  sprintf(note, "%d threads one after another (%d on the first one's thread pointer): a chunk each", REUSE_THREADS, same_tp + 1);
}

/* A full buffer counts drops, in a fork child with a small buffer. */
static void test_buffer_full(char *note) {
  pid_t p = fork();
  if (p == 0) {
    setenv("BUNKAI_FLOW_BUF", "8K", 1);
    uint64_t v = 7;
    for (int i = 0; i < 1000; i++) bkf_store(0x99, 1, 1, &v);
    struct bufview b;
    if (!buf_open(&b, getpid())) _exit(10);
    /* two chunks, the second cut short by the end of the area; then the
     * stores count drops without reserving more */
    uint64_t cap = 8192 - BKF_BUF_HEADER_SIZE, fit = (4096 - 8) / 40 + (cap - 4096 - 8) / 40;
    if (b.h->capacity != cap) _exit(11);
    if (b.h->head != 2 * 4096) _exit(12);
    if (b.h->dropped != 1000 - fit) _exit(13);
    uint64_t off = 0, n = 0;
    struct rec r;
    while (buf_next(&b, &off, &r)) {
      if (r.pc != 0x99 || r.vals[0] != 7 || r.flags != BKF_REC_DONE) _exit(14);
      n++;
    }
    if (n != fit || b.chunks != 2 || b.reserved != 4096 + cap - 4096) _exit(15);
    buf_close(&b);
    char path[600];
    buf_path(path, sizeof path, getpid());
    unlink(path);
    _exit(0);
  }
  wait_check(p, "child with an 8 KiB buffer");
  sprintf(note, "8 KiB: %d records kept in 2 chunks, the rest counted as dropped", (4096 - 8) / 40 + (8192 - BKF_BUF_HEADER_SIZE - 4096 - 8) / 40);
}

/* Threads whose first stores meet while the buffer is being created: each
 * waits for the creator (it is another thread), none drops its record. Many
 * fork children, each a fresh process with no buffer, four threads released
 * together by a barrier. */
enum { RACE_KIDS = 200, RACE_THREADS = 4 };
static pthread_barrier_t race_bar;
static void *race_thread(void *p) {
  uint64_t v = (uint64_t)(intptr_t)p;
  pthread_barrier_wait(&race_bar);
  bkf_store(0x7ace, 1, 1, &v);
  return 0;
}

static void test_buffer_race(char *note) {
  pid_t kids[RACE_KIDS];
  for (int k = 0; k < RACE_KIDS; k++) {
    pid_t p = fork();
    if (p == 0) {
      alarm(20); /* a hang is a failure, not a stuck test */
      pthread_t th[RACE_THREADS];
      pthread_barrier_init(&race_bar, 0, RACE_THREADS);
      for (int t = 0; t < RACE_THREADS; t++) pthread_create(&th[t], 0, race_thread, (void *)(intptr_t)(t + 1));
      for (int t = 0; t < RACE_THREADS; t++) pthread_join(th[t], 0);
      struct bufview b;
      int code = 0;
      if (!buf_open(&b, getpid())) _exit(30);
      if (b.h->dropped) code = 31;
      uint64_t off = 0, seen = 0;
      struct rec r;
      while (buf_next(&b, &off, &r))
        if (r.pc == 0x7ace && r.flags == BKF_REC_DONE && r.vals[0] >= 1 && r.vals[0] <= RACE_THREADS) seen |= 1ull << r.vals[0];
      if (!code && seen != ((1ull << (RACE_THREADS + 1)) - 2)) code = 32;
      buf_close(&b);
      char path[600];
      buf_path(path, sizeof path, getpid());
      unlink(path);
      _exit(code);
    }
    kids[k] = p;
  }
  int dropped = 0, missing = 0;
  for (int k = 0; k < RACE_KIDS; k++) {
    int st;
    CHECK(waitpid(kids[k], &st, 0) == kids[k], "waitpid");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 30, "child %d: no buffer, or killed (signal %d)", k, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    dropped += WEXITSTATUS(st) == 31, missing += WEXITSTATUS(st) == 32;
  }
  CHECK(!dropped && !missing, "%d of %d processes dropped a first store, %d lost one", dropped, RACE_KIDS, missing);
  sprintf(note, "%d processes, %d threads each making their first store together: none dropped", RACE_KIDS, RACE_THREADS);
}

/* Time stamps, both ways (BUNKAI_FLOW_CLOCK): 48 records 1 us to 25 ms
 * apart, each converted time between CLOCK_REALTIME read right before and
 * right after its store; with the TSC, within 2 us of them (the pairs'
 * error), after several recalibrations. */
static int cpu_tsc_invariant(void) {
  unsigned a, b, c, d;
  return __get_cpuid(0x80000007u, &a, &b, &c, &d) && (d >> 8 & 1);
}

static void test_time_stamps(char *note) {
  enum { N = 48, NMAX = 400 };
  const char *modes[] = {"ns", "tsc"};
  int tsc_ok = cpu_tsc_invariant();
  int64_t *worst_out = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(worst_out != MAP_FAILED, "mmap");
  for (int m = 0; m < 2; m++) {
    pid_t p = fork();
    if (p == 0) {
      setenv("BUNKAI_FLOW_CLOCK", modes[m], 1);
      /* N stores at growing gaps; with the TSC, on (up to NMAX) until the
       * runtime has recalibrated 4 times, however loaded the machine is */
      static uint64_t before[NMAX], after[NMAX];
      uint64_t gap = 1000, n = 0;
      int want = m == 1 && tsc_ok ? BKF_CLOCK_TSC : BKF_CLOCK_NS;
      struct bufview v;
      for (uint64_t i = 0; i < NMAX; i++) {
        before[i] = now_ns(CLOCK_REALTIME);
        bkf_store(0x700 + i, 1, 1, &i);
        after[i] = now_ns(CLOCK_REALTIME);
        n = i + 1;
        if (i == 0) CHECK(buf_open(&v, getpid()), "%s: no buffer", modes[m]);
        if (n >= N && (want != BKF_CLOCK_TSC || __atomic_load_n(&v.h->cal_seq, __ATOMIC_ACQUIRE) >= 8)) break;
        struct timespec ts = {0, (long)gap};
        nanosleep(&ts, 0);
        if (gap < 25000000) gap = gap * 5 / 4;
      }
      CHECK(v.h->clock == (uint32_t)want, "%s: clock %u, wanted %d", modes[m], v.h->clock, want);
      uint64_t slack = want == BKF_CLOCK_TSC ? 2000 : 0, off = 0, i = 0;
      int64_t worst = 0;
      struct rec r;
      while (buf_next(&v, &off, &r)) {
        int64_t e = r.ns < before[i] ? (int64_t)(before[i] - r.ns) : r.ns > after[i] ? (int64_t)(r.ns - after[i]) : 0;
        if (e > worst) worst = e;
        CHECK(i < n && r.pc == 0x700 + i && r.vals[0] == i, "%s: record %llu", modes[m], (unsigned long long)i);
        CHECK(r.ns + slack >= before[i] && r.ns <= after[i] + slack, "%s: record %llu at %lld ns from the read before it, %lld from the one after",
              modes[m], (unsigned long long)i, (long long)(r.ns - before[i]), (long long)(r.ns - after[i]));
        i++;
      }
      CHECK(i == n, "%s: %llu records of %llu", modes[m], (unsigned long long)i, (unsigned long long)n);
      if (want == BKF_CLOCK_TSC)
        CHECK(v.h->cal_seq >= 8 && !(v.h->cal_seq & 1), "recalibrated %u times", v.h->cal_seq / 2);
      char path[600];
      buf_path(path, sizeof path, getpid());
      unlink(path);
      worst_out[m] = worst;
      _exit(0);
    }
    wait_check(p, modes[m]);
  }
  sprintf(note, "CLOCK_REALTIME exactly; the TSC%s %lld ns outside the reads around its store at worst (2 us allowed), across recalibrations",
          tsc_ok ? "" : " (not invariant here: CLOCK_REALTIME instead)", (long long)worst_out[1]);
  munmap(worst_out, 4096);
}

/* bkf_store_tsc (generated advice's STORE_DATA after DO_RDTSC): with the
 * TSC the record's raw time is the TSC given, read 2 ms before the store;
 * with tsc 0, or one older than the buffer, and with CLOCK_REALTIME
 * records, the clock read in the store, as bkf_store. */
static void test_store_tsc(char *note) {
  const char *modes[] = {"ns", "tsc"};
  int tsc_ok = cpu_tsc_invariant();
  for (int m = 0; m < 2; m++) {
    pid_t p = fork();
    if (p == 0) {
      setenv("BUNKAI_FLOW_CLOCK", modes[m], 1);
      uint64_t early = __builtin_ia32_rdtsc(), v = 7, before[3], after[3], given[3];
      bkf_store(0x800, 1, 1, &v); /* the buffer, made after `early` */
      struct bufview b;
      CHECK(buf_open(&b, getpid()), "%s: no buffer", modes[m]);
      int tsc = b.h->clock == BKF_CLOCK_TSC;
      CHECK(tsc == (m == 1 && tsc_ok), "%s: clock %u", modes[m], b.h->clock);
      for (int i = 0; i < 3; i++) {
        given[i] = i == 0 ? __builtin_ia32_rdtsc() : i == 1 ? 0 : early;
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, 0);
        before[i] = now_ns(CLOCK_REALTIME);
        bkf_store_tsc(0x801 + i, 1, 1, &v, given[i]);
        after[i] = now_ns(CLOCK_REALTIME);
      }
      uint64_t off = 0, k = 0;
      struct rec r;
      while (buf_next(&b, &off, &r)) {
        if (r.pc == 0x800) continue;
        int i = (int)(r.pc - 0x801);
        CHECK(i >= 0 && i < 3 && r.nvals == 1 && r.vals[0] == 7, "%s: record %llx", modes[m], (unsigned long long)r.pc);
        uint64_t raw = *(const uint64_t *)((const char *)r.vals - 24);
        if (tsc && i == 0) {
          CHECK(raw == given[i], "%s: raw time %llu, given %llu", modes[m], (unsigned long long)raw, (unsigned long long)given[i]);
          CHECK(r.ns + 1000000 < before[i], "%s: the given TSC's time is %lld ns from the read before the store", modes[m],
                (long long)(r.ns - before[i]));
        } else {
          CHECK(r.ns + 2000 >= before[i] && r.ns <= after[i] + 2000, "%s: record %d at %lld ns from the read before it", modes[m], i,
                (long long)(r.ns - before[i]));
        }
        k++;
      }
      CHECK(k == 3, "%s: %llu records of 3", modes[m], (unsigned long long)k);
      char path[600];
      buf_path(path, sizeof path, getpid());
      unlink(path);
      _exit(0);
    }
    wait_check(p, modes[m]);
  }
  sprintf(note, "the TSC given is the record's time%s; 0, or older than the buffer: the clock", tsc_ok ? "" : " (not checked: TSC not invariant)");
}

/* Buffers that cannot exist: stores are no-ops, nothing breaks. */
static void test_buffer_unavailable(char *note) {
  const char *envs[][2] = {{"BUNKAI_FLOW_BUF", "0"}, {"BUNKAI_FLOW_DIR", "/proc/nonexistent"}, {"BUNKAI_FLOW_BUF", "12Q"}};
  for (int i = 0; i < 3; i++) {
    pid_t p = fork();
    if (p == 0) {
      setenv(envs[i][0], envs[i][1], 1);
      uint64_t v = 1;
      for (int j = 0; j < 100; j++) bkf_store(1, 1, 1, &v);
      struct bufview b;
      int have = buf_open(&b, getpid());
      if (i < 2 && have) _exit(20); /* disabled or impossible: no file */
      if (i == 2) { /* a bad size means the default */
        if (!have || b.len != (64u << 20)) _exit(21);
        char path[600];
        buf_path(path, sizeof path, getpid());
        unlink(path);
      }
      _exit(0);
    }
    wait_check(p, envs[i][1]);
  }
  sprintf(note, "BUNKAI_FLOW_BUF=0, an unusable directory, a bad size");
}

/* Time stamps in a process that dropped its privileges, as httpd does
 * (User nobody): such a process is not dumpable, its /proc files are root's,
 * and /proc/self/auxv cannot be opened, yet the runtime must still find the
 * vDSO's clock. The child is a fresh exec of this program (a fork would
 * inherit the clock the parent already found); it drops to nobody (as root)
 * or makes itself non-dumpable, then runs under a seccomp filter that kills
 * it on a clock_gettime system call, and stores 1,000 records. */
enum { CLOCK_RECS = 1000 };

/* Kills the process on a clock_gettime system call; with old_kernel, also
 * answers prctl(PR_GET_AUXV) with EINVAL, as Linux before 6.4 does. */
static void kill_on_clock_syscall(int old_kernel) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clock_gettime, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_prctl, 0, 3),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, old_kernel ? 0x41555856 : 0xffffffff, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {sizeof f / sizeof f[0], f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) _exit(50);
}

static int clock_child(const char *mode) {
  if (!strcmp(mode, "probe")) { /* can libc read the clock here without the system call? */
    kill_on_clock_syscall(0);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return 0;
  }
  if (geteuid() == 0) {
    if (setgid(65534) || setuid(65534)) return 51;
  } else if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) {
    return 52;
  }
  int fd = open("/proc/self/auxv", O_RDONLY);
  if (fd >= 0) return 53; /* the case this test is about did not arise */
  char fake[600] = "";
  if (!strcmp(mode, "old-kernel")) {
    /* a file whose name ends in [vdso], mapped below the real one (and not
     * unlinked yet, or its line would end in "(deleted)"): the maps reader
     * must want the whole name */
    snprintf(fake, sizeof fake, "%s/fake[vdso]", getenv("BUNKAI_FLOW_DIR"));
    int ff = open(fake, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (ff < 0 || ftruncate(ff, 4096) || mmap(0, 4096, PROT_READ, MAP_PRIVATE, ff, 0) == MAP_FAILED) return 59;
    close(ff);
  }
  snprintf(dir, sizeof dir, "%s", getenv("BUNKAI_FLOW_DIR")); /* for buf_open */
  /* every record reads the clock (with the TSC, only the buffer's creation
   * would) */
  setenv("BUNKAI_FLOW_CLOCK", "ns", 1);
  kill_on_clock_syscall(!strcmp(mode, "old-kernel"));
  uint64_t t0 = now_ns(CLOCK_REALTIME);
  for (uint64_t i = 0; i < CLOCK_RECS; i++) bkf_store(0xc10c, 1, 1, &i);
  uint64_t t1 = now_ns(CLOCK_REALTIME);
  struct bufview b;
  if (!buf_open(&b, getpid())) return 54;
  uint64_t off = 0, n = 0, last = 0;
  struct rec r;
  while (buf_next(&b, &off, &r)) {
    if (r.pc != 0xc10c || r.vals[0] != n || r.ns < t0 || r.ns > t1 || r.ns < last) return 55;
    last = r.ns, n++;
  }
  buf_close(&b);
  char path[600];
  buf_path(path, sizeof path, getpid());
  unlink(path);
  if (fake[0]) unlink(fake);
  return n == CLOCK_RECS ? 0 : 56;
}

static int run_clock_child(const char *mode, const char *bufdir) {
  pid_t p = fork();
  if (p == 0) {
    setenv("BUNKAI_FLOW_DIR", bufdir, 1);
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) _exit(57);
    exe[n] = 0;
    execl(exe, exe, "--clock-child", mode, (char *)0);
    _exit(58);
  }
  int st;
  CHECK(waitpid(p, &st, 0) == p, "waitpid");
  return WIFSIGNALED(st) ? -WTERMSIG(st) : WEXITSTATUS(st);
}

static void test_clock_unprivileged(char *note) {
  char sub[] = "/tmp/bunkai-flow-nobody.XXXXXX"; /* the test's directory may be closed to nobody */
  CHECK(mkdtemp(sub) && chmod(sub, 0777) == 0, "mkdtemp %s: %s", sub, strerror(errno));
  int probe = run_clock_child("probe", sub);
  if (probe != 0) {
    rmdir(sub);
    CHECK(probe == -SIGSYS, "probe child: %d", probe);
    sprintf(note, "skipped: this machine's clock is not in the vDSO (libc makes the system call)");
    return;
  }
  /* prctl(PR_GET_AUXV) first; without it (before Linux 6.4), /proc/self/maps. */
  const char *modes[] = {"store", "old-kernel"};
  for (int m = 0; m < 2; m++) {
    int r = run_clock_child(modes[m], sub);
    CHECK(r != -SIGSYS, "%s: a record's time stamp was a clock_gettime system call (the vDSO was not found)", modes[m]);
    CHECK(r == 0, "%s child: %s %d", modes[m], r < 0 ? "killed by signal" : "exit status", r < 0 ? -r : r);
  }
  rmdir(sub);
  sprintf(note, "%s, /proc/self/auxv closed to it, with and without PR_GET_AUXV: %d records each stamped through the vDSO",
          geteuid() == 0 ? "as nobody" : "not dumpable", CLOCK_RECS);
}

/* ------------------------------------------------------------------ */
/* Fork                                                                */

static void test_fork(char *note) {
  struct bkf_table *t = bkf_table("forked");
  static int objs[4];
  register_flowid(t, &objs[0], 100);
  uint64_t v = 1;
  bkf_store(1, 1, 1, &v); /* the parent has its buffer */
  struct bufview b;
  CHECK(buf_open(&b, getpid()), "parent buffer");
  uint64_t head = b.h->head;
  pid_t p = fork();
  if (p == 0) {
    /* Inherited flows; the child's own changes; the child's own buffer. */
    if (get_flowid(t, &objs[0]) != 100) _exit(30);
    register_flowid(t, &objs[1], 101);
    remove_flowid(t, &objs[0]);
    if (get_flowid(t, &objs[1]) != 101 || get_flowid(t, &objs[0]) != 0) _exit(31);
    uint64_t s = 0xc41d;
    for (int i = 0; i < 100; i++) bkf_store(0xc41d, 2, 1, &s);
    struct bufview c;
    if (!buf_open(&c, getpid())) _exit(32);
    if (c.h->pid != (uint32_t)getpid() || c.h->head != 4096) _exit(33); /* one chunk of its own */
    uint64_t off = 0;
    struct rec r;
    int n = 0;
    while (buf_next(&c, &off, &r)) {
      if (r.pc != 0xc41d || r.tid != (uint32_t)gettid_()) _exit(34);
      n++;
    }
    if (n != 100) _exit(35);
    _exit(0);
  }
  wait_check(p, "fork child");
  CHECK(b.h->head == head, "the child reserved in the parent's buffer");
  uint64_t off = 0, n = 0;
  struct rec r;
  buf_refresh(&b);
  while (buf_next(&b, &off, &r)) n += r.pc == 0xc41d;
  CHECK(n == 0, "the child wrote %llu records into the parent's chunk", (unsigned long long)n);
  CHECK(get_flowid(t, &objs[0]) == 100 && get_flowid(t, &objs[1]) == 0, "the child's changes leaked into the parent");
  char path[600];
  buf_path(path, sizeof path, p);
  CHECK(unlink(path) == 0, "the child's buffer %s", path);
  buf_close(&b);
  sprintf(note, "inherited tables, separate buffers");
}

/* Forks while another thread writes tables and records: a lock held by a
 * parent thread at fork must not hang the child. */
static volatile int fl_stop;
static void *fl_thread(void *p) {
  struct bkf_table *t = p;
  uint64_t i = 0, v = 0;
  while (!fl_stop) {
    for (int j = 0; j < 4096; j++, i++) {
      register_flowid(t, (void *)(0x330000000000ull + 64 * i), i + 1);
      if (i >= 2000) remove_flowid(t, (void *)(0x330000000000ull + 64 * (i - 2000)));
    }
    bkf_store(2, 2, 1, &v);
  }
  return 0;
}

static void test_fork_under_load(char *note) {
  enum { FORKS = 40 };
  struct bkf_table *t = bkf_table("fork-load");
  pthread_t th;
  fl_stop = 0;
  pthread_create(&th, 0, fl_thread, t);
  pid_t kids[FORKS];
  for (int k = 0; k < FORKS; k++) {
    usleep(2000);
    pid_t p = fork();
    if (p == 0) {
      alarm(20); /* a hang is a failure, not a stuck test */
      int held = __bunkai_flow_table_stat(t, ST_LOCK) != 0; /* the writer held it at fork */
      for (uint64_t i = 0; i < 20000; i++) {
        register_flowid(t, (void *)(0x440000000000ull + 64 * i), i + 1);
        if (get_flowid(t, (void *)(0x440000000000ull + 64 * i)) != i + 1) _exit(40);
        if (i >= 100) remove_flowid(t, (void *)(0x440000000000ull + 64 * (i - 100)));
      }
      if (!bkf_table("made-in-a-child")) _exit(41);
      uint64_t v = 3;
      bkf_store(3, 3, 1, &v);
      _exit(held ? 0 : 99);
    }
    kids[k] = p;
  }
  fl_stop = 1;
  pthread_join(th, 0);
  int held = 0;
  for (int k = 0; k < FORKS; k++) {
    int st;
    CHECK(waitpid(kids[k], &st, 0) == kids[k], "waitpid");
    CHECK(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 99), "child forked under load: %s %d",
          WIFEXITED(st) ? "exit status" : "killed by signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    held += WEXITSTATUS(st) == 0;
    char path[600];
    buf_path(path, sizeof path, kids[k]);
    unlink(path);
  }
  sprintf(note, "%d forks beside a writing thread, %d with the table locked", FORKS, held);
}

/* ------------------------------------------------------------------ */
/* Signals: bkf_store and get_flowid from a handler that interrupts them */

static volatile uint64_t sig_count;
static volatile int sig_stop;
static struct bkf_table *sig_table;
static void on_signal(int s) {
  (void)s;
  uint64_t v[2] = {0x5167, get_flowid(sig_table, &sig_table)};
  bkf_store(0x5160, 5, 2, v);
  sig_count++;
}
/* A fault on the values' page, inside bkf_store: a record of the
 * handler's own, then the page made readable so the store goes on. */
static char *segv_page;
static int segv_hits;
static void on_segv(int s, siginfo_t *si, void *uc) {
  (void)uc;
  if (!segv_page || (char *)si->si_addr < segv_page || (char *)si->si_addr >= segv_page + 4096) {
    signal(s, SIG_DFL); /* another fault: let it crash */
    return;
  }
  uint64_t v[2] = {0x5e6f, (uint64_t)segv_hits};
  bkf_store(0x5e60, 5, 2, v);
  segv_hits++;
  mprotect(segv_page, 4096, PROT_READ | PROT_WRITE);
}

static void *signaler(void *p) {
  pthread_t main_thread = *(pthread_t *)p;
  while (!sig_stop) {
    pthread_kill(main_thread, SIGUSR1);
    for (volatile int i = 0; i < 2000; i++) {
    }
    sched_yield();
  }
  return 0;
}

static void test_signal(char *note) {
  enum { MAX_STORES = 400000, CHUNK = 1000 }; /* 16 MB of records at most */
  sig_table = bkf_table("signal");
  register_flowid(sig_table, &sig_table, 9);
  bkf_store(0, 0, 0, 0); /* the buffer exists */
  struct bufview b;
  CHECK(buf_open(&b, getpid()), "buffer");
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, 0);
  pthread_t self = pthread_self(), th;
  sig_stop = 0;
  pthread_create(&th, 0, signaler, &self);
  uint64_t v = 0x3a1, stores = 0, t0 = now_ns(CLOCK_MONOTONIC);
  /* Until enough signals landed (the machine may be busy, and the signaling
   * thread must run): a store, then gets, so as not to fill the buffer. */
  while ((sig_count < 300 || ms_since(t0) < 50) && ms_since(t0) < 5000) {
    for (int i = 0; i < CHUNK; i++) {
      if (stores < MAX_STORES) bkf_store(0x3a1, 6, 1, &v), stores++;
      for (int j = 0; j < 20; j++) CHECK(get_flowid(sig_table, &sig_table) == 9, "get while signals arrive");
    }
  }
  sig_stop = 1;
  pthread_join(th, 0);
  signal(SIGUSR1, SIG_IGN);
  buf_refresh(&b);
  uint64_t o = 0, handler = 0, main_ = 0, own = 0;
  struct rec r;
  while (buf_next(&b, &o, &r)) {
    CHECK(r.flags == BKF_REC_DONE, "incomplete record");
    if (r.pc == 0x5160) {
      CHECK(r.vals[0] == 0x5167 && r.vals[1] == 9, "handler record");
      handler++;
      own += r.chunk == ~0ull; /* it interrupted a store: a reservation of its own */
    } else if (r.pc == 0x3a1) {
      CHECK(r.vals[0] == 0x3a1 && r.chunk != ~0ull, "main record");
      main_++;
    }
  }
  CHECK(handler == sig_count && main_ == stores, "handler %llu of %llu, main %llu of %llu", (unsigned long long)handler,
        (unsigned long long)sig_count, (unsigned long long)main_, (unsigned long long)stores);
  CHECK(handler >= 50, "only %llu signals arrived", (unsigned long long)handler);
  CHECK(b.h->dropped == 0, "dropped");

  /* Where the signals land is up to the scheduler (none inside a store
   * once the stores stop at MAX_STORES, on a busy machine): a signal made
   * inside a store for certain, a SIGSEGV on the page of its values,
   * must record into a reservation of its own, and both records be whole. */
  segv_page = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(segv_page != MAP_FAILED, "mmap");
  uint64_t *sv = (uint64_t *)segv_page;
  sv[0] = 0x5e70, sv[1] = 0x5e71;
  mprotect(segv_page, 4096, PROT_NONE);
  struct sigaction ss, old;
  memset(&ss, 0, sizeof ss);
  ss.sa_sigaction = on_segv;
  ss.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &ss, &old);
  segv_hits = 0;
  bkf_store(0x5e7, 6, 2, sv);
  sigaction(SIGSEGV, &old, 0);
  munmap(segv_page, 4096);
  segv_page = 0;
  CHECK(segv_hits == 1, "%d faults on the values' page", segv_hits);
  buf_refresh(&b);
  o = 0;
  int inner = 0, outer = 0;
  while (buf_next(&b, &o, &r)) {
    if (r.pc == 0x5e60) {
      CHECK(r.flags == BKF_REC_DONE && r.nvals == 2 && r.vals[0] == 0x5e6f && r.chunk == ~0ull,
            "the handler's record inside a store: not complete, or in a chunk (%llx)", (unsigned long long)r.chunk);
      inner++;
    } else if (r.pc == 0x5e7) {
      CHECK(r.flags == BKF_REC_DONE && r.nvals == 2 && r.vals[0] == 0x5e70 && r.vals[1] == 0x5e71 && r.chunk != ~0ull,
            "the interrupted record");
      outer++;
    }
  }
  CHECK(inner == 1 && outer == 1, "%d handler records, %d interrupted ones", inner, outer);
  buf_close(&b);
  sprintf(note, "%llu stores from a signal handler among %llu (%llu interrupted a store: their own reservations); a fault inside a store recorded on its own",
          (unsigned long long)handler, (unsigned long long)stores, (unsigned long long)own);
}

/* ------------------------------------------------------------------ */

/* A sled of our own: probe_flags(f) loads the flags from f (popfq), runs
 * the sled, and returns the flags after it (pushfq). The sled sits at an
 * even address, as bkf_weave wants. */
uint64_t probe_flags(uint64_t flags);
extern char probe_sled[];
__asm__(".text\n"
        ".p2align 4\n"
        ".globl probe_flags\n"
        ".type probe_flags,@function\n"
        "probe_flags:\n"
        "  push %rdi\n"
        "  popfq\n"
        ".globl probe_sled\n"
        "probe_sled:\n"
        "  .byte 0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0\n"
        "  pushfq\n"
        "  pop %rax\n"
        "  ret\n"
        ".size probe_flags, .-probe_flags\n");

static uint64_t flag_calls;
static volatile uint64_t flag_sink;

/* Leaves the flags different from how it found them (integers only). */
static void flag_clobber(struct bkf_frame *f, void *xsave, uint32_t jp, void *arg) {
  (void)xsave, (void)jp, (void)arg;
  flag_calls++;
  uint64_t x = f->flags;
  __asm__ volatile("xor %0, %0\n cmp $1, %0" : "+r"(x) : : "cc");
  flag_sink = x;
}

/* Both trampolines (full state, and vector-free with its sahf path) give
 * the program back every arithmetic flag as it was at the sled. */
static void test_weave_flags(char *note) {
  const uint64_t arith = 0x1 | 0x4 | 0x10 | 0x40 | 0x80 | 0x800; /* CF PF AF ZF SF OF */
  uint64_t sled = (uint64_t)(uintptr_t)probe_sled;
  uint32_t jp = 0;
  CHECK(sled % 2 == 0, "probe sled at an odd address");
  for (int mode = 0; mode < 2; mode++) {
    int r = bkf_weave_ex(1, &sled, &jp, flag_clobber, 0, mode ? BKF_WEAVE_NO_VECTOR : 0);
    CHECK(r == 0, "bkf_weave_ex(mode %d): %d", mode, r);
    uint64_t before = flag_calls;
    for (int bits = 0; bits < 64; bits++) {
      uint64_t in = 0x2;
      for (int k = 0; k < 6; k++)
        if (bits & (1 << k)) in |= (uint64_t[]){0x1, 0x4, 0x10, 0x40, 0x80, 0x800}[k];
      uint64_t out = probe_flags(in);
      CHECK((out & arith) == (in & arith), "mode %d: flags %#llx came back %#llx", mode,
            (unsigned long long)in, (unsigned long long)out);
      CHECK(!(out & 0x400), "mode %d: DF set after the sled", mode);
    }
    CHECK(flag_calls - before == 64, "mode %d: %llu calls for 64 sled runs", mode,
          (unsigned long long)(flag_calls - before));
    CHECK(bkf_unweave(1, &sled) == 0, "unweave");
  }
  CHECK(bkf_weave_ex(1, &sled, &jp, flag_clobber, 0, 4) == -EINVAL, "an unknown flag is refused");
  probe_flags(0x2); /* unwoven: no call */
  CHECK(flag_calls == 128, "%llu calls after unweave", (unsigned long long)flag_calls);
  snprintf(note, 256, "64 flag patterns through both trampolines");
}

/* A fork while another thread is inside advice: that thread does not
 * exist in the child, so its count of calls in progress must not either
 * (wipe-on-fork), or the child's unweave would wait for ever. The child
 * unweaves (under an alarm), and its sled then calls nothing; its
 * bkf_buffer_size sets the capacity of the buffer it creates. */
static volatile int fa_inside, fa_hold;
static uint64_t fa_calls;
static void fa_handler(struct bkf_frame *f, void *xsave, uint32_t jp, void *arg) {
  (void)f, (void)xsave, (void)jp, (void)arg;
  __atomic_add_fetch(&fa_calls, 1, __ATOMIC_SEQ_CST);
  if (!fa_hold) return;
  fa_inside = 1;
  while (fa_hold) sched_yield();
}
static void *fa_thread(void *p) {
  (void)p;
  probe_flags(0x2);
  return 0;
}

static void test_fork_in_advice(char *note) {
  uint64_t sled = (uint64_t)(uintptr_t)probe_sled;
  uint32_t jp = 0;
  CHECK(bkf_weave_ex(1, &sled, &jp, fa_handler, 0, 0) == 0, "weave");
  fa_hold = 1;
  pthread_t th;
  CHECK(pthread_create(&th, 0, fa_thread, 0) == 0, "thread");
  uint64_t t0 = now_ns(CLOCK_MONOTONIC);
  while (!fa_inside) {
    CHECK(ms_since(t0) < 10000, "the thread never reached the advice");
    sched_yield();
  }
  pid_t p = fork();
  if (p == 0) {
    alarm(10); /* a child waiting for the parent's thread dies of SIGALRM */
    fa_hold = 0;
    if (bkf_unweave(1, &sled) != 0) _exit(40);
    uint64_t before = fa_calls;
    probe_flags(0x2);
    if (fa_calls != before) _exit(41); /* unwoven in the child */
    if (bkf_buffer_size(64 << 10) != 0) _exit(42); /* no buffer in this process yet */
    uint64_t v = 7;
    bkf_store(0xfa, 1, 1, &v);
    struct bufview c;
    if (!buf_open(&c, getpid())) _exit(43);
    if (c.h->capacity + sizeof *c.h != (64 << 10)) _exit(44); /* the file, header included */
    if (bkf_buffer_size(1 << 20) != 1) _exit(45); /* it has one now: kept */
    _exit(0);
  }
  wait_check(p, "fork child unweaving while a parent thread was in advice");
  char path[600];
  buf_path(path, sizeof path, p);
  unlink(path);
  fa_hold = 0;
  pthread_join(th, 0);
  CHECK(bkf_unweave(1, &sled) == 0, "the parent's unweave");
  uint64_t before = fa_calls;
  probe_flags(0x2);
  CHECK(fa_calls == before, "the parent's sled still calls its handler");
  snprintf(note, 256, "the child of a fork during advice unwove at once; its buffer took bkf_buffer_size's 64 KiB");
}

/* A guarded sled: probe_guard(key, flags, &regs) puts key in %rax %rcx
 * %rdx %rbx %rdi %r12 %r15, loads the flags, runs the sled, and returns the
 * flags after it; regs gets the OR of each of those registers XOR key (0:
 * all came back). */
uint64_t probe_guard(uint64_t key, uint64_t flags, uint64_t *regs);
uint64_t probe_guard_split(uint64_t key, uint64_t flags, uint64_t *regs);
extern char probe_gsled[], probe_gsled_split[];
/* ALIGN places the sled: anywhere even, or 58 bytes into a cache line, so
 * that the call's rel32 (bytes 3..6) straddles two lines. */
#define PROBE_GUARD(NAME, SLED, ALIGN)                                                                  \
  __asm__(".text\n"                                                                                     \
          ".p2align 4\n"                                                                                \
          ".globl " NAME "\n"                                                                           \
          ".type " NAME ",@function\n" NAME ":\n"                                                       \
          "  push %rbx\n push %r12\n push %r15\n"                                                       \
          "  mov %rdx, %r8\n"                                                                           \
          "  mov %rdi, %rax\n mov %rdi, %rcx\n mov %rdi, %rdx\n mov %rdi, %rbx\n mov %rdi, %r12\n mov %rdi, %r15\n" \
          "  push %rsi\n"                                                                               \
          "  popfq\n" ALIGN ".globl " SLED "\n" SLED ":\n"                                              \
          "  .byte 0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0\n"                                  \
          "  pushfq\n"                                                                                  \
          "  xor %rdi, %rax\n xor %rdi, %rcx\n or %rcx, %rax\n xor %rdi, %rdx\n or %rdx, %rax\n"          \
          "  xor %rdi, %rbx\n or %rbx, %rax\n xor %rdi, %r12\n or %r12, %rax\n xor %rdi, %r15\n or %r15, %rax\n" \
          "  mov %rax, (%r8)\n"                                                                         \
          "  pop %rax\n"                                                                                \
          "  pop %r15\n pop %r12\n pop %rbx\n"                                                          \
          "  ret\n"                                                                                     \
          ".size " NAME ", .-" NAME "\n");
PROBE_GUARD("probe_guard", "probe_gsled", "  .p2align 1\n")
PROBE_GUARD("probe_guard_split", "probe_gsled_split", "  .p2align 6, 0x90\n  .fill 58, 1, 0x90\n")

/* The probe the test runs: the plain sled or the one whose rel32 straddles
 * a line (it calls its stub, and its stub jumps to the guard). */
static uint64_t (*gprobe)(uint64_t, uint64_t, uint64_t *) = probe_guard;
static char *gprobe_sled = probe_gsled;

static uint64_t guard_calls, guard_bad_frames, guard_xsaves;
static void guard_count(struct bkf_frame *f, void *xsave, uint32_t jp, void *arg) {
  (void)jp, (void)arg;
  /* a guard calls the trampoline with -1 or -2 for the slot: the handler
   * must see the sled's own slot and return address all the same */
  if ((int64_t)f->slot < 0 || f->slot >= 65536 || f->ret != (uint64_t)(uintptr_t)gprobe_sled + 7) guard_bad_frames++;
  guard_xsaves += xsave != 0;
  guard_calls++;
}

static uint64_t filter_index(uint64_t k) { return (k * 0x9e3779b97f4a7c15ull) >> 48; }

/* Runs the guarded sled with key under two flag patterns, checks that the
 * registers and flags came back, and returns how many times the handler ran. */
static uint64_t guard_runs(uint64_t key) {
  uint64_t before = guard_calls;
  const uint64_t arith = 0x1 | 0x4 | 0x10 | 0x40 | 0x80 | 0x800;
  for (int k = 0; k < 2; k++) {
    uint64_t in = k ? 0x2 | arith : 0x2, regs = ~0ull;
    uint64_t out = gprobe(key, in, &regs);
    CHECK((out & arith) == (in & arith), "flags %#llx came back %#llx", (unsigned long long)in, (unsigned long long)out);
    CHECK(regs == 0, "a register changed across the guarded sled (%#llx)", (unsigned long long)regs);
  }
  return guard_calls - before;
}

/* Guards (bkf_weave_guarded): the handler runs only when a guard register
 * holds a live key of its table, for each register a guard can name,
 * for two guards at one sled, after remove and register again; a filter
 * collision lets the handler run (it decides); bad guards are refused. */
static void weave_guard_at(char *note) {
  uint64_t sled = (uint64_t)(uintptr_t)gprobe_sled;
  uint32_t jp = 0;
  CHECK(sled % 2 == 0, "guard sled at an odd address");
  struct bkf_table *t = bkf_table("guard-a"), *u = bkf_table("guard-b");
  uint64_t in = 0x7f0000001040ull, out = 0x7f0000002080ull, other = 0x7f00000030c0ull;
  CHECK(filter_index(in) != filter_index(out) && filter_index(other) != filter_index(in) &&
            filter_index(other) != filter_index(out), "test keys collide in the filter");
  register_flowid(t, (void *)in, get_new_flowid());
  register_flowid(u, (void *)other, get_new_flowid());
  const uint8_t regs[] = {0, 1, 2, 3, 7, 12, 15};
  int guarded = 0;
  for (unsigned i = 0; i < sizeof regs; i++) {
    struct bkf_guard g = {.n = 1, .reg = {regs[i]}, .table = {t}};
    int r = bkf_weave_guarded(1, &sled, &jp, guard_count, 0, BKF_WEAVE_NO_VECTOR, &g);
    CHECK(r == 0, "bkf_weave_guarded(reg %u): %d", regs[i], r);
    guarded = __bunkai_flow_guarded(sled);
    CHECK(guarded >= 0, "the sled is not known after weaving");
    CHECK(guard_runs(in) == 2, "reg %u: a key in the flow did not reach the handler", regs[i]);
    uint64_t skipped = guard_runs(out);
    CHECK(skipped == (guarded ? 0 : 2), "reg %u: %llu handler runs for a key not in the flow (guarded %d)", regs[i],
          (unsigned long long)skipped, guarded);
    CHECK(bkf_unweave(1, &sled) == 0, "unweave");
  }
  CHECK(guard_bad_frames == 0 && guard_xsaves == 0, "%llu frames with a wrong slot or return address, %llu vector-free calls with an XSAVE area",
        (unsigned long long)guard_bad_frames, (unsigned long long)guard_xsaves);
  /* a guard of a full-state weave: the handler gets the vector state */
  struct bkf_guard full = {.n = 1, .reg = {7}, .table = {t}};
  CHECK(bkf_weave_guarded(1, &sled, &jp, guard_count, 0, 0, &full) == 0, "full-state guard");
  CHECK(guard_runs(in) == 2 && guard_xsaves == 2, "full-state guard: %llu XSAVE areas", (unsigned long long)guard_xsaves);
  CHECK(guard_runs(out) == (guarded ? 0 : 2), "full-state guard: a key not in the flow");
  CHECK(bkf_unweave(1, &sled) == 0, "unweave");
  guard_xsaves = 0;
  /* two guards: either table's key lets the handler run */
  struct bkf_guard two = {.n = 2, .reg = {3, 12}, .table = {t, u}};
  CHECK(bkf_weave_guarded(1, &sled, &jp, guard_count, 0, BKF_WEAVE_NO_VECTOR, &two) == 0, "two guards");
  CHECK(guard_runs(in) == 2 && guard_runs(other) == 2, "a key of either table runs the handler");
  CHECK(guard_runs(out) == (guarded ? 0 : 2), "a key of neither table");
  /* leaving the flow and coming back */
  remove_flowid(t, (void *)in);
  CHECK(guard_runs(in) == (guarded ? 0 : 2), "a removed key still runs the handler");
  register_flowid(t, (void *)in, get_new_flowid());
  CHECK(guard_runs(in) == 2, "a key registered again does not run the handler");
  /* a filter collision: not in the table, same filter counter as in */
  uint64_t twin = 0;
  for (uint64_t k = in + 64; !twin; k += 64)
    if (filter_index(k) == filter_index(in)) twin = k;
  CHECK(get_flowid(t, (void *)twin) == 0, "the twin is in the table");
  CHECK(guard_runs(twin) == 2, "a filter collision must reach the handler");
  CHECK(bkf_unweave(1, &sled) == 0, "unweave");
  CHECK(guard_runs(in) == 0, "unwoven: no call");
  /* woven again unguarded: every pass calls */
  CHECK(bkf_weave_ex(1, &sled, &jp, guard_count, 0, BKF_WEAVE_NO_VECTOR) == 0, "unguarded");
  CHECK(__bunkai_flow_guarded(sled) == 0, "an unguarded weave left the guard in place");
  CHECK(guard_runs(out) == 2, "unguarded: the handler runs for any key");
  CHECK(bkf_unweave(1, &sled) == 0, "unweave");
  CHECK(guard_bad_frames == 0 && guard_xsaves == 0, "%llu frames with a wrong slot or return address, %llu vector-free calls with an XSAVE area",
        (unsigned long long)guard_bad_frames, (unsigned long long)guard_xsaves);
  /* refused: %rsp, a register past 15, a missing table, too many */
  struct bkf_guard bad[] = {{.n = 1, .reg = {4}, .table = {t}}, {.n = 1, .reg = {16}, .table = {t}},
                            {.n = 1, .reg = {3}, .table = {0}}, {.n = BKF_GUARD_MAX + 1}};
  for (unsigned i = 0; i < sizeof bad / sizeof bad[0]; i++)
    CHECK(bkf_weave_guarded(1, &sled, &jp, guard_count, 0, 0, &bad[i]) == -EINVAL, "bad guard %u accepted", i);
  CHECK(guard_runs(in) == 0, "a refused weave patched the sled");

  /* field tests (xout): a header whose member holds a flow ID's bits */
  static struct {
    uint8_t b;
    uint8_t pad;
    uint16_t flags;
    uint32_t word;
    uint64_t quad;
  } hdr;
  uint64_t h = (uint64_t)(uintptr_t)&hdr;
  const struct {
    uint8_t width;
    uint32_t off;
    uint64_t mask;
  } fields[] = {{2, 2, 0xfff0}, {1, 0, 0x80}, {4, 4, 0xffff0000u}, {8, 8, 0xff00000000000000ull}};
  for (unsigned i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    for (unsigned j = 0; j < sizeof regs; j++) {
      struct bkf_guard g = {.n = 1, .kind = {BKF_GUARD_FIELD}, .reg = {regs[j]}, .width = {fields[i].width},
                            .off = {fields[i].off}, .mask = {fields[i].mask}};
      CHECK(bkf_weave_guarded(1, &sled, &jp, guard_count, 0, BKF_WEAVE_NO_VECTOR, &g) == 0, "field guard %u", i);
      memset(&hdr, 0, sizeof hdr);
      uint64_t v = ~fields[i].mask & (fields[i].width == 8 ? ~0ull : (1ull << (8 * fields[i].width)) - 1);
      memcpy((char *)&hdr + fields[i].off, &v, fields[i].width); /* every bit but the mask's */
      CHECK(guard_runs(h) == (guarded ? 0 : 2), "field %u reg %u: no bit of the mask set, the handler ran", i, regs[j]);
      CHECK(guard_runs(0) == (guarded ? 0 : 2), "field %u reg %u: a NULL header ran the handler", i, regs[j]);
      v |= fields[i].mask & -fields[i].mask; /* the mask's lowest bit */
      memcpy((char *)&hdr + fields[i].off, &v, fields[i].width);
      CHECK(guard_runs(h) == 2, "field %u reg %u: a flow ID in the header did not reach the handler", i, regs[j]);
      CHECK(bkf_unweave(1, &sled) == 0, "unweave");
    }
  }
  /* a field test and a key test at one sled: either lets the handler run */
  memset(&hdr, 0, sizeof hdr);
  struct bkf_guard mixed = {.n = 2, .kind = {BKF_GUARD_FIELD, BKF_GUARD_KEY}, .reg = {3, 12}, .width = {2},
                            .off = {2}, .mask = {0xfff0}, .table = {0, t}};
  CHECK(bkf_weave_guarded(1, &sled, &jp, guard_count, 0, BKF_WEAVE_NO_VECTOR, &mixed) == 0, "mixed guard");
  CHECK(guard_runs(h) == (guarded ? 0 : 2), "mixed: neither test holds");
  hdr.flags = 0x10;
  CHECK(guard_runs(h) == 2, "mixed: the field test holds");
  hdr.flags = 0;
  register_flowid(t, (void *)h, get_new_flowid()); /* the header is a key too */
  CHECK(guard_runs(h) == 2, "mixed: the key test holds");
  remove_flowid(t, (void *)h);
  CHECK(guard_runs(h) == (guarded ? 0 : 2), "mixed: the key left the flow");
  CHECK(bkf_unweave(1, &sled) == 0, "unweave");
  struct bkf_guard badf[] = {{.n = 1, .kind = {BKF_GUARD_FIELD}, .reg = {3}, .width = {3}, .mask = {1}},
                             {.n = 1, .kind = {BKF_GUARD_FIELD}, .reg = {3}, .width = {2}, .mask = {0}},
                             {.n = 1, .kind = {BKF_GUARD_FIELD}, .reg = {3}, .width = {2}, .mask = {0x10000}},
                             {.n = 1, .kind = {2}, .reg = {3}, .table = {t}}};
  for (unsigned i = 0; i < sizeof badf / sizeof badf[0]; i++)
    CHECK(bkf_weave_guarded(1, &sled, &jp, guard_count, 0, 0, &badf[i]) == -EINVAL, "bad field guard %u accepted", i);
  snprintf(note, 256, "%s; %llu handler runs",
           !guarded ? "no BMI2: unguarded" : gprobe_sled == probe_gsled_split ? "guards reached through the stub" : "guards called from the sled",
           (unsigned long long)guard_calls);
}

/* Guards on a sled anywhere (called directly), then on one whose call's
 * rel32 straddles a cache line (called through its stub, whose target is
 * the one thing a weave changes there). */
static void test_weave_guard(char *note) {
  char a[256], b[256];
  weave_guard_at(a);
  gprobe = probe_guard_split, gprobe_sled = probe_gsled_split;
  CHECK((((uint64_t)(uintptr_t)gprobe_sled + 3) & 63) > 60, "the split probe's rel32 does not straddle a line");
  weave_guard_at(b);
  gprobe = probe_guard, gprobe_sled = probe_gsled;
  snprintf(note, 256, "%s; rel32 across a line: %s", a, b);
}

/* Many guarded sleds: MANY functions of one sled and a `ret` each, 12
 * bytes apart (even addresses), the key in %rdi. Weaving them grows the
 * return map twice (1,024 entries at first, twice the slots in use at
 * least), whose entries carry the handler, argument, join point and mode
 * that a call from a guard runs: after the growth, after unweave (also
 * for a call made late, see many_run), and after weaving them again with another handler, argument, join points
 * and mode, every sled must reach what it was woven with, or nothing. */
enum { MANY = 1200 };
extern char many_sleds[];
__asm__(".text\n"
        ".p2align 4\n"
        "many_sleds:\n"
        ".rept 1200\n"
        "  .byte 0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00\n"
        "  ret\n"
        ".endr\n");
static uint32_t many_jp[MANY];
static uint64_t many_calls, many_wrong;
static void many_a(struct bkf_frame *f, void *xsave, uint32_t jp, void *arg) {
  uint64_t i = (f->ret - 7 - (uint64_t)(uintptr_t)many_sleds) / 12;
  if (i >= MANY || arg != (void *)0xa || jp != 1000 + i || !xsave) many_wrong++;
  else many_jp[i] = jp;
  many_calls++;
}
static void many_b(struct bkf_frame *f, void *xsave, uint32_t jp, void *arg) {
  uint64_t i = (f->ret - 7 - (uint64_t)(uintptr_t)many_sleds) / 12;
  if (i >= MANY || arg != (void *)0xb || jp != 5000 + i || xsave) many_wrong++;
  else many_jp[i] = jp;
  many_calls++;
}
/* from the sleds' first byte; with late = 2, from the call in bytes 2..10
 * (which unweave leaves in place): as a thread that had passed the `66 90`
 * when unweave ran and makes its call only now */
static void many_run(uint64_t key, int late) {
  for (int i = 0; i < MANY; i++) ((void (*)(uint64_t))(uintptr_t)(many_sleds + 12 * i + late))(key);
}

static void test_weave_many(char *note) {
  struct bkf_table *t = bkf_table("many");
  static int key;
  register_flowid(t, &key, 42);
  static uint64_t sleds[MANY];
  static uint32_t jps[MANY];
  struct bkf_guard g = {.n = 1, .kind = {BKF_GUARD_KEY}, .reg = {7}, .table = {t}};
  static struct bkf_guard gs[MANY];
  for (int i = 0; i < MANY; i++) sleds[i] = (uint64_t)(uintptr_t)(many_sleds + 12 * i), jps[i] = 1000 + (uint32_t)i, gs[i] = g;
  uint64_t maps0 = __bunkai_flow_rmap_stat(1);
  CHECK(bkf_weave_guarded(MANY, sleds, jps, many_a, (void *)0xa, 0, gs) == 0, "weave %d sleds", MANY);
  int guarded = __bunkai_flow_guarded(sleds[MANY - 1]);
  /* every map, replaced ones too (a reader may still probe one), holds
   * what the slots hold */
  uint64_t maps = __bunkai_flow_rmap_stat(1);
  CHECK(maps >= maps0 + 2, "the return map did not grow twice (%llu maps, %llu before)", (unsigned long long)maps,
        (unsigned long long)maps0);
  CHECK(__bunkai_flow_rmap_stat(0) == 0, "woven: %llu stale entries", (unsigned long long)__bunkai_flow_rmap_stat(0));
  memset(many_jp, 0, sizeof many_jp);
  many_calls = many_wrong = 0;
  many_run((uint64_t)(uintptr_t)&key, 0);
  CHECK(many_calls == MANY && !many_wrong, "woven: %llu calls, %llu wrong", (unsigned long long)many_calls, (unsigned long long)many_wrong);
  for (int i = 0; i < MANY; i++) CHECK(many_jp[i] == 1000 + (uint32_t)i, "sled %d: join point %u", i, many_jp[i]);
  CHECK(bkf_unweave(MANY, sleds) == 0, "unweave");
  CHECK(__bunkai_flow_rmap_stat(0) == 0, "unwoven: %llu stale entries", (unsigned long long)__bunkai_flow_rmap_stat(0));
  many_run((uint64_t)(uintptr_t)&key, 0);
  many_run((uint64_t)(uintptr_t)&key, 2);
  CHECK(many_calls == MANY, "%llu calls after unweave", (unsigned long long)(many_calls - MANY));
  for (int i = 0; i < MANY; i++) jps[i] = 5000 + (uint32_t)i;
  CHECK(bkf_weave_guarded(MANY, sleds, jps, many_b, (void *)0xb, BKF_WEAVE_NO_VECTOR, gs) == 0, "weave again");
  CHECK(__bunkai_flow_rmap_stat(0) == 0, "woven again: %llu stale entries", (unsigned long long)__bunkai_flow_rmap_stat(0));
  many_calls = 0;
  many_run((uint64_t)(uintptr_t)&key, 0);
  CHECK(many_calls == MANY && !many_wrong, "woven again: %llu calls, %llu wrong", (unsigned long long)many_calls,
        (unsigned long long)many_wrong);
  for (int i = 0; i < MANY; i++) CHECK(many_jp[i] == 5000 + (uint32_t)i, "sled %d: join point %u", i, many_jp[i]);
  CHECK(bkf_unweave(MANY, sleds) == 0, "unweave");
  many_run((uint64_t)(uintptr_t)&key, 0);
  many_run((uint64_t)(uintptr_t)&key, 2);
  CHECK(many_calls == MANY, "%llu calls after the second unweave", (unsigned long long)(many_calls - MANY));
  remove_flowid(t, &key);
  sprintf(note, "%d sleds %s, woven (the return map grew to %llu maps), unwoven, woven again with another handler and mode: each ran what it was woven with, every map in step", MANY,
          guarded > 0 ? "guarded" : "unguarded (no BMI2)", (unsigned long long)maps);
}

static const struct {
  const char *name;
  void (*fn)(char *note);
} tests[] = {
    {"ids_threads", test_ids_threads},
    {"ids_processes", test_ids_processes},
    {"ids_fallback", test_ids_fallback},
    {"table_basics", test_table_basics},
    {"paper_patterns", test_paper_patterns},
    {"table_growth", test_table_growth},
    {"table_churn", test_table_churn},
    {"concurrent", test_concurrent},
    {"buffer", test_buffer},
    {"buffer_reuse", test_buffer_reuse},
    {"buffer_full", test_buffer_full},
    {"buffer_race", test_buffer_race},
    {"buffer_unavailable", test_buffer_unavailable},
    {"time_stamps", test_time_stamps},
    {"store_tsc", test_store_tsc},
    {"clock_unprivileged", test_clock_unprivileged},
    {"fork", test_fork},
    {"fork_under_load", test_fork_under_load},
    {"signal", test_signal},
    {"weave_flags", test_weave_flags},
    {"fork_in_advice", test_fork_in_advice},
    {"weave_guard", test_weave_guard},
    {"weave_many", test_weave_many},
};
enum { NTESTS = sizeof tests / sizeof tests[0] };

static void cleanup(void) {
  char p[600];
  buf_path(p, sizeof p, getpid());
  unlink(p);
  if (!own_dir) return;
  snprintf(p, sizeof p, "%s/ids", dir);
  unlink(p);
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  if (d) closedir(d);
  rmdir(dir);
}

int main(int argc, char **argv) {
  if (argc == 4 && !strcmp(argv[1], "--ids-child")) return ids_child(argv[2], atol(argv[3]));
  if (argc == 2 && !strcmp(argv[1], "--fallback-child")) return fallback_child();
  if (argc == 3 && !strcmp(argv[1], "--clock-child")) return clock_child(argv[2]);

  const char *d = getenv("BUNKAI_FLOW_DIR");
  if (d && *d) {
    snprintf(dir, sizeof dir, "%s", d);
  } else {
    strcpy(dir, "/tmp/bunkai-flow-test.XXXXXX");
    CHECK(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    own_dir = 1;
    setenv("BUNKAI_FLOW_DIR", dir, 1);
  }
  if (!getenv("BUNKAI_FLOW_IDS")) {
    char p[600];
    snprintf(p, sizeof p, "%s/ids", dir);
    setenv("BUNKAI_FLOW_IDS", p, 1);
  }
  setenv("BUNKAI_FLOW_BUF", "32M", 1);
  atexit(cleanup);

  int ran = 0;
  uint64_t t_all = now_ns(CLOCK_MONOTONIC);
  for (int i = 0; i < NTESTS; i++) {
    int want = argc == 1;
    for (int a = 1; a < argc; a++) want |= !strcmp(argv[a], tests[i].name);
    if (!want) continue;
    char note[256] = "";
    uint64_t t0 = now_ns(CLOCK_MONOTONIC);
    tests[i].fn(note);
    printf("ok %s (%s; %llu ms)\n", tests[i].name, note, (unsigned long long)ms_since(t0));
    fflush(stdout);
    ran++;
  }
  for (int a = 1; a < argc; a++) {
    int known = 0;
    for (int i = 0; i < NTESTS; i++) known |= !strcmp(argv[a], tests[i].name);
    CHECK(known, "no test called %s", argv[a]);
  }
  printf("test_flow: %d passed in %llu ms\n", ran, (unsigned long long)ms_since(t_all));
  return 0;
}
