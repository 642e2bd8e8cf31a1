/* runtime.h: what the files of libbunkai-share.so share. The runtime of
 * `bunkai share` lives inside the shared process on every host (seed 002:
 * the memory control part (§3) and the system-call control part (§4-5)).
 *
 * Rules for every file of this runtime (it lives inside someone else's
 * process, and on the nodes inside a process whose libc data belongs to the
 * home host):
 *   - No libc calls after the constructor, except dlsym at start-up and the
 *     real pthread_create/pthread_exit/dlopen the interposers hand over to.
 *     Every system call is the raw `syscall` instruction inlined into
 *     this library's text (common/runtime/bunkai_syscall_x86_64.h): on the
 *     nodes that range is the only one Syscall User Dispatch lets through,
 *     and libc's own data (errno, locks, tunables that memcpy reads) is
 *     shared memory that only the program may touch. For the same reason
 *     the runtime carries its own SHA-256 (sha256.c): no library can run
 *     here, and these kernels have no AF_ALG.
 *   - No TLS, no stack protector (fs points into the program's memory).
 *   - Our memory is ours: this library's data and bss and the private
 *     region at BKS_PRIVATE_BASE (same address on every host, never
 *     shared). Nothing of ours goes on the program's heap or stacks.
 *   - Never read or write the program's shared memory from a manager
 *     thread with a plain load or store: a page that is not here would
 *     fault into the manager's own userfaultfd and wait for ever. Use
 *     mem_read (/proc/self/mem, which fails instead of waiting).
 *   - Exported symbols: pthread_create (the thread placement point),
 *     pthread_exit, dlopen and dlmopen (see start.c), and the __bunkai_
 *     prefix; everything else is static or hidden (-fvisibility=hidden).
 *   - No global constructors besides the one that starts sharing.
 *
 * Files: start.c (the constructor, the interposed calls), home_manager.c
 * (the page directory's owner: the page-state protocol is written down at
 * its top), directory.c (its tables), executor.c (§5.1), node_manager.c,
 * remote_thread.c, convert.c (file mappings made shared memory), auth.c and
 * sha256.c (the handshake), wire.c (sockets), uffd.c, maps.c, util.c, and
 * thread_x86_64.S (clone and stack switches).
 */
#ifndef BUNKAI_SHARE_RUNTIME_H
#define BUNKAI_SHARE_RUNTIME_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <poll.h>

#include "bunkai_share.h"
#include "bunkai_syscall_x86_64.h"

/* Everything declared below is internal to the library (hidden): calls
 * between the files bind locally, never through the PLT. */
#pragma GCC visibility push(hidden)

#define HIDDEN __attribute__((visibility("hidden")))
#define NORETURN __attribute__((noreturn))
#define PAGE 4096ul
#define PAGE_DOWN(x) ((uint64_t)(x) & ~(PAGE - 1))
#define PAGE_UP(x) (((uint64_t)(x) + PAGE - 1) & ~(PAGE - 1))

/* ------------------------------------------------------------------ */
/* util.c (slen and sequal: those of common/runtime/bunkai_rt_util.h,  */
/* shared with flow's runtime, out of line)                            */

void *memcpy(void *d, const void *s, size_t n);
void *memset(void *d, int c, size_t n);
size_t slen(const char *s);
int sprefix(const char *s, const char *p);
int sequal(const char *a, const char *b);
uint64_t parse_u(const char **p, int base);
size_t fmt(char *out, size_t cap, const char *f, const long *args);
void say(const char *f, long a0, long a1, long a2, long a3);
NORETURN void die(const char *f, long a0, long a1, long a2, long a3);
NORETURN void home_ended(int err, const char *what);
void *priv_alloc(uint64_t size);
void lock(volatile int *l);
void unlock(volatile int *l);
uint64_t now_ns(void);
long spin_poll(struct pollfd *pf, int n, uint64_t *last);
int hide_fd(int fd);
void sleep_ms(long ms);
int random_bytes(void *b, size_t n);

/* ------------------------------------------------------------------ */
/* maps.c                                                              */

struct vma {
  uint64_t start, end, offset, inode;
  int prot, shared;
  char path[256];
};
long read_maps(char *buf, long cap);
int next_vma(const char **p, struct vma *v);
int find_vma(char *buf, long cap, uint64_t addr, struct vma *v);
int mapped_at(uint64_t addr);
void block_signals(void);
int ours(const struct vma *v);
int is_shared_mem(const struct vma *v);
int mem_read(uint64_t addr, void *buf, uint64_t len);
int page_here(uint64_t page);

/* ------------------------------------------------------------------ */
/* uffd.c: every call returns 0 or -errno; callers decide what a
 * failure means (at home, -EAGAIN: a mapping change is in flight).     */

void uffd_open(int events);
long uffd_register(uint64_t start, uint64_t end);
long uffd_wp(uint64_t page, uint64_t len, int on);
long uffd_changing(void);
long uffd_copy(uint64_t page, const void *data, int ro);
long uffd_zero(uint64_t page);
long uffd_wake(uint64_t start, uint64_t len);
extern const uint8_t zero_page[PAGE];

/* ------------------------------------------------------------------ */
/* wire.c                                                              */

int wr_all(int fd, const void *b, size_t n);
int rd_all(int fd, void *b, size_t n);
int rd_deadline(int fd, void *b, size_t n, uint64_t deadline_ns);
void send_msg(int fd, uint32_t type, uint64_t a, uint64_t b, uint64_t c, const void *pl, uint32_t len);
int recv_msg(int fd, struct bks_msg *m, void *pl, uint32_t cap);
struct msgbuf {
  uint8_t *b;
  uint32_t off, len, cap;
};
int mb_ready(const struct msgbuf *r);
int mb_recv(int fd, struct msgbuf *r, struct bks_msg *m, char **pl, uint32_t cap);
void tune_socket(int fd);
int tcp_connect(uint32_t ip, uint16_t port);

/* ------------------------------------------------------------------ */
/* sha256.c, auth.c                                                    */

void hmac_sha256(const uint8_t *key, size_t klen, const void *msg, size_t mlen, uint8_t out[32]);
enum { AUTH_OK = 0, AUTH_IO = -1, AUTH_PROTO = -2, AUTH_KEY = -3, AUTH_TIME = -4, AUTH_REPLAY = -5, AUTH_PEER = -6 };
/* client: auth_hello, then the first message, then auth_check before
 * reading anything; server: auth_server, which checks that the caller may
 * call with that role (threads: home; control: a node of the run) before
 * it answers, and says who called (the client's host index) */
int auth_hello(int fd, uint32_t role, int to, struct bks_auth_hello *h);
int auth_check(int fd, const struct bks_auth_hello *h);
int auth_server(int fd, uint32_t role, int *from);
const char *auth_error(int e);

/* ------------------------------------------------------------------ */
/* thread_x86_64.S                                                     */

long __bunkai_clone(unsigned long flags, void *stack, uint64_t tls, void (*fn)(void *), void *arg, volatile int *child_tid);
#define THREAD_FLAGS (CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM)
uint64_t __bunkai_call_on(void *stack, uint64_t (*fn)(void *), void *arg);
NORETURN void __bunkai_run_on(uint64_t sp, uint64_t fn, uint64_t arg, uint64_t exit_sp);
NORETURN void __bunkai_remote_exit(uint64_t ret);
void __bunkai_restorer(void);

/* ------------------------------------------------------------------ */
/* Global state (this library's bss: private to each host)             */

enum { ROLE_NONE, ROLE_HOME, ROLE_REPLICA };

struct host {
  int fd;              /* control connection (home: to the node; node: to home) */
  uint32_t ip;         /* network order */
  uint16_t port;       /* the node's thread listener */
  uint32_t pid;
  volatile uint64_t sent; /* control messages sent to it (home; manager only) */
};

/* A remote thread on a node. */
struct rthread {
  int fd;                  /* thread connection to its executor */
  int ktid;                /* its kernel TID on this node */
  uint32_t thread, tid, pid;
  uint64_t fn, arg, sp, fs;
  uint64_t last_fault;     /* the same fault over and over, nothing mapped */
  uint32_t last_layout;    /* in between, is a real one (remote_thread.c) */
  int repeats;
  volatile uint8_t selector;
};

struct runtime {
  int role;
  int uffd;
  int nhosts;              /* 1 + nodes */
  int self;                /* 0 on home, the host index on a node */
  int place;               /* 0 rr, 1 remote, 2 home */
  uint8_t key[BKS_KEY_BYTES]; /* the run key R */
  struct host hosts[BKS_MAX_HOSTS];
  struct bks_stats *stats;
  uint64_t lib_lo, lib_hi;        /* this library's mappings */
  uint64_t text_lo, text_hi;      /* its text (the SUD-allowed range) */
  volatile uint64_t priv_next;    /* bump pointer in the private region */
  uint32_t home_pid;
  volatile uint32_t next_thread;
  int mem_fd, pagemap_fd;         /* /proc/self/mem, /proc/self/pagemap */
  int memw_fd;                    /* /proc/self/mem for writing (home manager: TID words) */
  int (*real_create)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
  void (*real_exit)(void *) __attribute__((noreturn));
  void *(*real_dlopen)(const char *, int);
  void *(*real_dlmopen)(long, const char *, int);
  /* node: remote threads and the manager's progress */
  int listen_fd;
  uint32_t home_ip;               /* the home host's address (network order) */
  struct rthread *threads[BKS_MAX_THREADS];
  volatile uint32_t processed;    /* control messages handled by the node manager */
  volatile uint32_t processed_waiters;
  volatile uint32_t layout;       /* changes the node manager made to this node's mappings */
  volatile int ctrl_lock;         /* node: writes on the control connection (manager, and die from any thread) */
};
extern struct runtime g;

/* ------------------------------------------------------------------ */
/* Between the files                                                   */

struct range { uint64_t start, end; };

/* home_manager.c: what executors and home threads ask of the manager. */
enum item_kind {
  ITEM_TID = 1,      /* page is a thread's TID word: clear it and wake its joiners once pidfd says the thread exited;
                        the manager owns the item from then on */
  ITEM_BARRIER,      /* result: the control sequence of host */
  ITEM_PROTECT,      /* tell every node, then barrier */
  ITEM_FRESH,        /* [page, page + len) is a new mapping of host's thread: register, give it, result sequence;
                        result_status 0 when it was not possible (then an ordinary barrier) */
  ITEM_MAPINFO,      /* host's thread faulted at page (write: len = 1): make it mapped there */
  ITEM_ZAP,          /* [page, page + len): madvise(MADV_DONTNEED) for host's thread */
  ITEM_PREPARE,      /* a home thread converted these ranges (new objects' writable mappings): register them */
};
#define ITEM_BASES 32
struct item {
  int kind;
  int host;
  uint64_t page, len, prot;
  int pidfd;
  volatile uint32_t done;
  volatile uint32_t tid_sink;  /* ITEM_TID: where the kernel clears the TID instead */
  uint64_t result;         /* the control sequence the caller's node must reach */
  uint64_t result_status;  /* ITEM_MAPINFO: BKS_MAPPED_*; ITEM_FRESH: 1 done */
  int nbases;              /* ITEM_PREPARE: ranges the caller converted, to register */
  struct range bases[ITEM_BASES];
  struct item *next;       /* the free list */
};
/* Items live in our memory: the manager must never touch a program
 * thread's stack (a node may hold the page). */
struct item *item_get(void);
void item_put(struct item *it);
uint64_t ask_manager(struct item *it);
void home_manager_start(void);
NORETURN void node_gone(int h, int err);

/* directory.c (home manager only) */
#define SHARED_OWNER 0xff
struct dent {
  uint64_t page;     /* 0 = empty slot */
  uint16_t copyset;  /* hosts with a read-only copy, when owner == SHARED_OWNER */
  uint8_t owner;     /* the host with the only, writable copy */
};
struct dent *dir_find(uint64_t page, int create);
void dir_forget(uint64_t s, uint64_t e);
void dir_move(uint64_t from, uint64_t to, uint64_t len);
void dir_set_owner(uint64_t s, uint64_t e, int host);
struct rangeset {
  struct range *r;
  int n, cap;
  volatile int lock;
};
int rs_find(const struct rangeset *s, uint64_t a);
int rs_overlaps(const struct rangeset *s, uint64_t a, uint64_t b);
void rs_add(struct rangeset *s, uint64_t a, uint64_t b);
int rs_cut(struct rangeset *s, uint64_t a, uint64_t b, int keep);
extern struct rangeset regs;

/* convert.c (never in the home manager) */
int make_anonymous(const struct vma *v);
void convert_at(uint64_t addr);
int convert_loaded(const uint64_t *bases, int n, struct range *out, int cap);

/* executor.c */
int home_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg);
void hand_over_tid_word(void);

/* node_manager.c, remote_thread.c */
NORETURN void node_manager(void);
void start_acceptor(void);
struct rthread *me(void);
void wait_processed(uint32_t seq);
void sigsys(int sig, siginfo_t *si, void *ctx);
void sigsegv(int sig, siginfo_t *si, void *ctx);
/* 0, or -EEXIST for a START of a thread this node runs already (an
 * executor's retry after an answer that was lost): nothing is started. */
int remote_thread_spawn(int fd, const struct bks_start *st);

#pragma GCC visibility pop

#endif
