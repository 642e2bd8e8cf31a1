/* bunkai_share.h: what `bunkai share` (the CLI and node daemon, Rust, in
 * share/src/) and its runtime (share/runtime/share.c, preloaded into the
 * shared process on every host) agree on. Version BKS_VERSION; any change to
 * the layout below bumps it, and both sides refuse another version.
 *
 * Rules: plain C, fixed-width integers, little-endian, no padding surprises
 * (every struct is naturally aligned and its size is asserted below).
 *
 * ---------------------------------------------------------------------------
 * 1. Starting (who runs what)
 *
 *   home host   `bunkai share run --nodes A,B -- PROG ARGS` creates a TCP
 *               listener and a stats memfd, then runs PROG with
 *                 LD_PRELOAD=<libdir>/libbunkai-share.so (prepended)
 *                 GLIBC_TUNABLES=glibc.pthread.rseq=0   (appended: the kernel
 *                     must not write rseq areas of threads whose memory lives
 *                     on another host)
 *                 LD_BIND_NOW=1                          (no lazy PLT writes)
 *                 BUNKAI_SHARE=home <listen fd> <nodes> <stats fd> <place> <token>
 *               and personality(ADDR_NO_RANDOMIZE).
 *   each node   `bunkai share node --listen ADDR` receives the program's
 *               argv, environment and working directory from the CLI and
 *               starts a replica: the same program, the same environment
 *               (LD_PRELOAD etc. included), ASLR off, with
 *                 BUNKAI_SHARE=replica <host index> <home ip:port> <token>
 *               The replica's runtime constructor never returns to the
 *               program: the replica's main thread becomes its memory
 *               manager, and the replica runs only threads the home host
 *               places on it.
 *
 *   <place> is "rr" (round robin over home and the nodes, the first created
 *   thread on node 1), "remote" (round robin over the nodes only) or "home"
 *   (every thread on the home host: sharing set up, nothing moves).
 *   <token> is 32 hex digits; a replica's HELLO must carry it.
 *
 * 2. Wire protocol between the runtimes (TCP, little-endian)
 *
 *   Every message is a bks_msg header followed by `len` bytes of payload.
 *   Control connection: replica -> home listener, first message HELLO.
 *   Thread connection: the home executor of a thread -> the replica's own
 *   listener (port given in HELLO), first message START.
 *
 * 3. The stats page (memfd, BKS_STATS_SIZE bytes, mapped shared by the home
 *   runtime, read by the CLI after the program ends). All counters are
 *   written by the home runtime only.
 * ------------------------------------------------------------------------- */
#ifndef BUNKAI_SHARE_H
#define BUNKAI_SHARE_H

#include <stdint.h>

#define BKS_VERSION 2u
#define BKS_MAGIC 0x314b5342u /* "BSK1" */
#define BKS_MAX_HOSTS 16
#define BKS_MAX_THREADS 1024
#define BKS_PAGE 4096u

/* The runtime's private region: the same address on every host, reserved
 * PROT_NONE before the program runs so the program never maps there; each
 * host's runtime keeps its stacks, tables and buffers in it. Never shared. */
#define BKS_PRIVATE_BASE 0x100000000000ull
#define BKS_PRIVATE_SIZE (1ull << 34) /* 16 GiB of address space */

enum bks_msg_type {
  /* control connection, replica -> home */
  BKS_HELLO = 1,     /* payload bks_hello */
  BKS_PAGE_REQ = 2,  /* a = page address, b = 1 for write */
  BKS_DATA = 3,      /* a = page address, payload 4096 bytes: reply to FETCH/DOWNGRADE/TAKE */
  BKS_ACK = 4,       /* a = page address: reply to INVALIDATE, UNMAP, REMAP */
  BKS_ERROR = 5,     /* payload: one line of text; the run fails with it */
  /* control connection, home -> replica */
  BKS_GRANT = 16,    /* a = page, b = mode (1 read-only, 2 read-write), payload 4096 bytes or none (upgrade / you have it) */
  BKS_FETCH = 17,    /* a = page: send a copy, keep yours as it is */
  BKS_DOWNGRADE = 18,/* a = page: write-protect yours, send a copy */
  BKS_TAKE = 19,     /* a = page: send it and drop yours */
  BKS_INVALIDATE = 20,/* a = page: drop your read-only copy, ACK */
  BKS_UNMAP = 21,    /* a = start, b = end: the mapping is gone */
  BKS_REMAP = 22,    /* a = from, b = to, c = length: mremap moved it */
  BKS_QUIT = 23,     /* the program ended: exit with status a */
  BKS_PROTECT = 24,  /* a = start, b = length, c = prot: a thread changed protections (mprotect) */
  /* thread connection, home executor <-> remote thread */
  BKS_START = 32,    /* home -> replica: payload bks_start */
  BKS_SYSCALL = 33,  /* remote -> home: payload bks_syscall */
  BKS_RESULT = 34,   /* home -> remote: a = return value, b = flags (BKS_RES_*) */
  BKS_MAPINFO = 35,  /* remote -> home: a = faulting address, b = 1 for write */
  BKS_MAP = 36,      /* home -> remote: payload bks_map (count 0: not mapped) */
  BKS_CREATE = 37,   /* remote -> home: pthread_create: a = pthread_t *, b = attr, c = fn, payload u64 arg */
  BKS_EXIT = 38,     /* remote -> home: the thread's start routine returned a */
  BKS_CRASH = 39,    /* remote -> home: signal a at address b: kill the process with it */
};

struct bks_msg {
  uint32_t type;
  uint32_t len;      /* payload bytes after this header */
  uint64_t a, b, c;
};

struct bks_hello {
  uint32_t magic;    /* BKS_MAGIC */
  uint32_t version;  /* BKS_VERSION */
  uint32_t host;     /* 1..nodes */
  uint16_t port;     /* the replica's thread listener, network order not used: host order */
  uint16_t pad;
  uint32_t pid;      /* the replica's pid on its host */
  char token[32];
};

struct bks_start {
  uint64_t fn, arg;  /* the thread's start routine and its argument */
  uint64_t sp;       /* where the remote thread's stack starts (16-aligned) */
  uint64_t fs;       /* its thread pointer (glibc's struct pthread) */
  uint32_t thread;   /* thread number (the thread management table's key) */
  uint32_t tid;      /* its executor's TID on the home host (what gettid returns) */
  uint32_t pid;      /* the process's PID on the home host (what getpid returns) */
  uint32_t pad;
};

struct bks_syscall {
  uint64_t nr;
  uint64_t arg[6];
};

#define BKS_RES_MAPS_CHANGED 1u /* the call changed mappings: wait until the control connection's message c is handled */
#define BKS_RES_FRESH 2u        /* mmap made a private anonymous mapping at a: its pages are the caller's host's,
                                   zeros: map it and fill its first touches locally (first-touch ownership) */

/* One mapping as the home host sees it (from /proc/self/maps). */
struct bks_map {
  uint64_t start, end, offset;
  uint32_t prot;       /* PROT_* */
  uint32_t kind;       /* BKS_MAP_* */
  char path[256];      /* for BKS_MAP_FILE */
};
enum { BKS_MAP_NONE = 0, BKS_MAP_SHARED_MEM = 1 /* anonymous or private, kept coherent page by page */,
       BKS_MAP_FILE = 2 /* read-only file mapping: map the same file locally */ };

/* The stats page. */
#define BKS_STATS_SIZE 65536u
struct bks_host_stats {
  uint64_t read_faults;     /* page requests for reading served for this host */
  uint64_t write_faults;    /* for writing (incl. upgrades) */
  uint64_t pages_in;        /* pages sent to this host */
  uint64_t pages_out;       /* pages fetched from this host */
  uint64_t invalidations;   /* copies this host dropped on request */
  uint64_t syscalls;        /* syscalls forwarded from this host's threads */
  uint64_t threads;         /* threads placed on this host */
  uint64_t fault_ns;        /* total time the home manager spent serving this host's requests */
  uint64_t fresh_pages;     /* pages of new mappings given to this host's threads without a transfer */
};
struct bks_thread_stats {
  uint32_t thread, host, tid, done;
  uint64_t syscalls;
};
struct bks_stats {
  uint32_t magic, version;  /* BKS_MAGIC, BKS_VERSION: set when the runtime started */
  uint32_t hosts;           /* 1 + nodes */
  uint32_t nthreads;        /* entries used in thread[] */
  uint64_t started_ns;      /* CLOCK_MONOTONIC when sharing began */
  uint64_t mappings;        /* mappings registered for sharing on the home host */
  uint32_t failed_host;     /* the node whose loss ended the run (0: none) */
  int32_t failed_err;       /* why: -ETIMEDOUT, -ECONNRESET, or another negative errno (closed) */
  char error[256];          /* the runtime's last fatal error, if any */
  struct bks_host_stats host[BKS_MAX_HOSTS];
  struct bks_thread_stats thread[BKS_MAX_THREADS];
};

#ifdef __cplusplus
static_assert(sizeof(struct bks_msg) == 32, "bks_msg");
#else
_Static_assert(sizeof(struct bks_msg) == 32, "bks_msg");
_Static_assert(sizeof(struct bks_hello) == 52, "bks_hello");
_Static_assert(sizeof(struct bks_start) == 48, "bks_start");
_Static_assert(sizeof(struct bks_map) == 288, "bks_map");
_Static_assert(sizeof(struct bks_stats) <= BKS_STATS_SIZE, "bks_stats");
#endif

#endif
