/* bunkai_share.h: what `bunkai share` (the CLI and node daemon, Rust, in
 * share/src/) and its runtime (share/runtime/, preloaded into the shared
 * process on every host) agree on. Version BKS_VERSION; any change to the
 * layout below bumps it, and both sides refuse another version. The Rust
 * mirror is share/src/wire.rs; a test compiles this header and compares.
 *
 * Rules: plain C, fixed-width integers, little-endian, no padding surprises
 * (every struct is naturally aligned and its size is asserted below).
 *
 * ---------------------------------------------------------------------------
 * 1. Starting (who runs what)
 *
 *   home host   `bunkai share run --nodes A,B -- PROG ARGS` reads the
 *               cluster key (~/.config/bunkai/share.key), makes a run id
 *               (16 random bytes) and the run key
 *                 R = HMAC-SHA256(K, "bunkai-share run" || run id)
 *               creates a TCP listener and a stats memfd, writes R into a
 *               pipe, then runs PROG with
 *                 LD_PRELOAD=<libdir>/libbunkai-share.so (prepended)
 *                 GLIBC_TUNABLES=glibc.pthread.rseq=0   (appended: the kernel
 *                     must not write rseq areas of threads whose memory lives
 *                     on another host)
 *                 LD_BIND_NOW=1                          (no lazy PLT writes)
 *                 BUNKAI_SHARE=home <listen fd> <nodes> <stats fd> <place> <key fd>
 *               and personality(ADDR_NO_RANDOMIZE).
 *   each node   `bunkai share node` authenticates the CLI (share/src/auth.rs),
 *               receives the run id, the program's argv, environment and
 *               working directory, computes R itself (R never travels) and
 *               starts a replica: the same program, the same environment,
 *               ASLR off, R in a pipe, and
 *                 BUNKAI_SHARE=replica <host index> <home ip:port> <key fd>
 *               The replica's runtime constructor never returns to the
 *               program: the replica's main thread becomes its memory
 *               manager, and the replica runs only threads the home host
 *               places on it.
 *
 *   <place> is "rr" (round robin over home and the nodes, the first created
 *   thread on node 1), "remote" (round robin over the nodes only) or "home"
 *   (every thread on the home host: sharing set up, nothing moves).
 *   The runtime reads the 32 bytes of R from <key fd> and closes it.
 *
 * 2. Authentication (every runtime connection, before any message)
 *
 *   client -> server  struct bks_auth_hello (magic, version, role, from,
 *                     to, seq, mac_c), then at once its first message
 *                     (HELLO or START), without waiting
 *   server -> client  struct bks_auth_reply (mac_s), before anything else
 *     mac_c = HMAC-SHA256(R, "bunkai-share client" || the hello's first 48 bytes)
 *     mac_s = HMAC-SHA256(R, "bunkai-share server" || the hello's first 48 bytes)
 *   `from` and `to` are the two hosts' indices (home 0), `seq` a number
 *   the client never uses twice for that role and host (from 1), and the
 *   hello names the connection's two ends (address and port) as the client
 *   sees them. The server reads the first message only once mac_c checks,
 *   `to` is itself, the ends are this connection's as it sees them, and it
 *   has not seen (role, from, seq) before (a window of BKS_AUTH_WINDOW
 *   numbers below the highest seen; older ones are refused); the client
 *   reads nothing else until mac_s checks. R is new in every run, the MAC
 *   names both hosts and the connection's ends: a recorded hello is good
 *   on no other connection (not even one the server never read, or a
 *   faster one racing the original) and never twice on its own. No round
 *   trip is added: the first message travels with the hello (the CLI's
 *   handshake with a node daemon, under the cluster key, seals its request
 *   in its hello too: share/src/auth.rs). Address translation between hosts is not
 *   supported (the ends would differ). Anything else, or nothing within
 *   BKS_AUTH_MS, closes the connection.
 *
 * 3. Wire protocol between the runtimes (TCP, little-endian)
 *
 *   Every message is a bks_msg header followed by `len` bytes of payload.
 *   Control connection (role BKS_ROLE_CONTROL): replica -> home listener,
 *   first message HELLO. Home's memory manager is the only sender on it,
 *   and the node's memory manager the only reader, so everything it says
 *   (pages, mappings) happens on the node in the order it was decided.
 *   Thread connection (role BKS_ROLE_THREAD): the home executor of a thread
 *   -> the replica's own listener (port given in HELLO), first message START.
 *
 * 4. The stats page (memfd, BKS_STATS_SIZE bytes, mapped shared by the home
 *   runtime, read by the CLI after the program ends). All counters are
 *   written by the home runtime only.
 * ------------------------------------------------------------------------- */
#ifndef BUNKAI_SHARE_H
#define BUNKAI_SHARE_H

#include <stdint.h>

#define BKS_VERSION 4u
#define BKS_MAGIC 0x314b5342u /* "BSK1" */
#define BKS_MAX_HOSTS 16
#define BKS_MAX_THREADS 1024
#define BKS_PAGE 4096u
#define BKS_KEY_BYTES 32u
#define BKS_AUTH_MS 5000 /* a peer has this long to finish the handshake */
#define BKS_AUTH_WINDOW 1024 /* how far below the highest seq a hello may come */

/* The runtime's private region: the same address on every host, reserved
 * PROT_NONE before the program runs so the program never maps there; each
 * host's runtime keeps its stacks, tables and buffers in it. Never shared. */
#define BKS_PRIVATE_BASE 0x100000000000ull
#define BKS_PRIVATE_SIZE (1ull << 34) /* 16 GiB of address space */

enum bks_role { BKS_ROLE_CONTROL = 1, BKS_ROLE_THREAD = 2 };

struct bks_auth_hello {
  uint32_t magic;      /* BKS_MAGIC */
  uint32_t version;    /* BKS_VERSION */
  uint32_t role;       /* enum bks_role */
  uint32_t from;       /* the client's host index (home 0) */
  uint32_t to;         /* the server's host index */
  uint32_t pad;
  uint64_t seq;        /* the client's connection attempts of this role to `to`, from 1 */
  uint32_t client_ip;  /* this connection's two ends, as the client sees them */
  uint32_t server_ip;  /* (network order): the server compares them with its own */
  uint16_t client_port;/* view, so a hello is good on its own connection only */
  uint16_t server_port;
  uint32_t pad2;
  uint8_t mac[32];     /* mac_c */
};
struct bks_auth_reply {
  uint8_t mac[32];     /* mac_s */
};

enum bks_msg_type {
  /* control connection, replica -> home */
  BKS_HELLO = 1,     /* payload bks_hello */
  BKS_PAGE_REQ = 2,  /* a = page address, b = BKS_REQ_* flags */
  BKS_DATA = 3,      /* a = page address; payload 4096 bytes, or none: the page is zeros. Reply to FETCH/DOWNGRADE/TAKE */
  BKS_ACK = 4,       /* a = page (INVALIDATE) or start (ZAP) */
  BKS_ERROR = 5,     /* payload: one line of text; the run fails with it */
  /* control connection, home -> replica (all of them, in the order the
   * home manager decided them) */
  BKS_GRANT = 16,    /* a = page, b = mode (1 read-only, 2 read-write); payload 4096 bytes (the page),
                        none (you hold it: set the mode and wake), or none with c = BKS_GRANT_ZERO (zeros) */
  BKS_FETCH = 17,    /* a = page: send a copy, keep yours as it is */
  BKS_DOWNGRADE = 18,/* a = page: write-protect yours, send a copy */
  BKS_TAKE = 19,     /* a = page: send it and drop yours */
  BKS_INVALIDATE = 20,/* a = page: drop your read-only copy, ACK */
  BKS_UNMAP = 21,    /* a = start, b = end: the mapping is gone */
  BKS_REMAP = 22,    /* a = from, b = to, c = length: mremap moved it (what you hold there moves too) */
  BKS_QUIT = 23,     /* the program ended: exit with status a */
  BKS_PROTECT = 24,  /* a = start, b = length, c = prot: a thread changed protections (mprotect) */
  BKS_MAP = 25,      /* a = start, b = end, c = prot: shared memory; map what of it you have not mapped */
  BKS_FRESH = 26,    /* a = start, b = end, c = prot: a new mapping whose pages are yours, zeros (first touch) */
  BKS_ZAP = 27,      /* a = start, b = end: drop every page you hold there (madvise(MADV_DONTNEED)), ACK */
  BKS_GONE = 28,     /* a = page: your request for it cannot be served (the memory was unmapped or moved): wake */
  /* thread connection, home executor <-> remote thread */
  BKS_START = 32,    /* home -> replica: payload bks_start */
  BKS_SYSCALL = 33,  /* remote -> home: payload bks_syscall */
  BKS_RESULT = 34,   /* home -> remote: a = return value, b = flags (BKS_RES_*), c = control sequence */
  BKS_MAPINFO = 35,  /* remote -> home: a = faulting address, b = 1 for write */
  BKS_MAPPED = 36,   /* home -> remote: a = BKS_MAPPED_*, b = prot, c = control sequence to wait for */
  BKS_CREATE = 37,   /* remote -> home: pthread_create: a = pthread_t *, b = attr, c = fn, payload u64 arg */
  BKS_EXIT = 38,     /* remote -> home: the thread's start routine returned a */
  BKS_CRASH = 39,    /* remote -> home: signal a at address b: kill the process with it */
};

#define BKS_REQ_WRITE 1u   /* PAGE_REQ: the thread wants to write */
#define BKS_REQ_HAVE 2u    /* PAGE_REQ: the node holds a read-only copy (an upgrade) */
#define BKS_GRANT_ZERO 1u  /* GRANT without payload, c: the page is zeros */

enum {
  BKS_MAPPED_OK = 0,     /* mapped on your host once the control sequence is reached: retry the access */
  BKS_MAPPED_NONE = 1,   /* nothing is mapped there at home, or not with that access: a real fault */
  BKS_MAPPED_SHARED = 2, /* a MAP_SHARED mapping: not kept coherent across hosts */
  BKS_MAPPED_CONVERT = 3,/* (home internal) a file mapping: the executor converts it, then asks again */
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
  uint16_t port;     /* the replica's thread listener, host order */
  uint16_t pad;
  uint32_t pid;      /* the replica's pid on its host */
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

#define BKS_RES_MAPS_CHANGED 1u /* wait until the control connection's message c is handled before going on */

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
  uint64_t retries;         /* home-side userfaultfd calls retried after a mapping change (EAGAIN) */
  uint64_t converted;       /* file mappings made shared memory after start-up (dlopen, touched by a node) */
  uint64_t refused;         /* connections refused (no handshake, wrong key, wrong peer) */
  uint64_t zapped_pages;    /* pages dropped everywhere for madvise(MADV_DONTNEED) and alike */
  struct bks_host_stats host[BKS_MAX_HOSTS];
  struct bks_thread_stats thread[BKS_MAX_THREADS];
};

#ifdef __cplusplus
static_assert(sizeof(struct bks_msg) == 32, "bks_msg");
#else
_Static_assert(sizeof(struct bks_msg) == 32, "bks_msg");
_Static_assert(sizeof(struct bks_hello) == 20, "bks_hello");
_Static_assert(sizeof(struct bks_start) == 48, "bks_start");
_Static_assert(sizeof(struct bks_auth_hello) == 80, "bks_auth_hello");
_Static_assert(sizeof(struct bks_auth_reply) == 32, "bks_auth_reply");
_Static_assert(sizeof(struct bks_stats) <= BKS_STATS_SIZE, "bks_stats");
#endif

#endif
