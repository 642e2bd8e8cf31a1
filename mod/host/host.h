/*
 * host.h - what the files of libbunkai-host share: the host side of
 * `bunkai mod` (DKM, seed 004).
 *
 * A host program links this library (or gets it through LD_PRELOAD with
 * BUNKAI_HOST=1) and plays the part of DKM's kernel: it owns the memory
 * modules live in, the registry through which it calls them, and the table
 * of loaded modules. The module server (`bunkai mod`, Rust) does the checks,
 * the dependency walk and the linking, and drives this library over a Unix
 * socket with the protocol in mod/include/bunkai_mod.h.
 *
 * Rules for every file of this library, which runs inside the host program:
 *   - Exported symbols start with bunkai_ (the public host API in
 *     bunkai_mod.h) or __bunkai_; everything else is static, or, when
 *     another file needs it, declared here: hidden (-fvisibility=hidden and
 *     the pragma below) and renamed __bunkai_host_NAME (the #defines
 *     below), because the static archive libbunkai-host.a is linked into
 *     arbitrary programs, whose own symbols a short name could clash with.
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
 *
 * Files (one concept each): registry.c (interfaces, function tables, grace
 * periods: what the program's threads call), modules.c (the table of loaded
 * modules, the memory budget, unloading), memory.c (a load's staged memory:
 * ALLOC, WRITE, PROTECT, MAP with its sealed memfd), wire.c (a connection:
 * SO_PEERCRED, timeouts, reads and writes, message framing), json.c (the
 * module's record is JSON), transaction.c (a connection's session: COMMIT
 * and its checks, EVICT, the undo), commands.c (HELLO, RESOLVE, UNLOAD,
 * UNLOAD_NAME), socket.c (where the socket lives: the private directory,
 * dead hosts' sockets), server.c (the command thread, bunkai_host_start),
 * fork.c (a host of its own in every fork child), preload.c (the one
 * constructor, shared library only).
 */
#ifndef BUNKAI_MOD_HOST_H
#define BUNKAI_MOD_HOST_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
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

/* The names the files share, as the linker sees them. */
#define reg_lock __bunkai_host_reg_lock
#define ifaces __bunkai_host_ifaces
#define expects __bunkai_host_expects
#define grace_period __bunkai_host_grace_period
#define drop_providers __bunkai_host_drop_providers
#define publish_tables __bunkai_host_publish_tables
#define unregister __bunkai_host_unregister
#define iface_length __bunkai_host_iface_length
#define modules __bunkai_host_modules
#define mod_lock __bunkai_host_mod_lock
#define next_id __bunkai_host_next_id
#define budget __bunkai_host_budget
#define used __bunkai_host_used
#define free_strv __bunkai_host_free_strv
#define free_reg __bunkai_host_free_reg
#define find_module __bunkai_host_find_module
#define retire __bunkai_host_retire
#define remove_module __bunkai_host_remove_module
#define module_named __bunkai_host_module_named
#define needs __bunkai_host_needs
#define dependents __bunkai_host_dependents
#define find_staged __bunkai_host_find_staged
#define drop_staged __bunkai_host_drop_staged
#define do_alloc __bunkai_host_do_alloc
#define do_write __bunkai_host_do_write
#define do_protect __bunkai_host_do_protect
#define do_map __bunkai_host_do_map
#define now_ns __bunkai_host_now_ns
#define txn_deadline __bunkai_host_txn_deadline
#define read_full __bunkai_host_read_full
#define get32 __bunkai_host_get32
#define get64 __bunkai_host_get64
#define getbytes __bunkai_host_getbytes
#define getstr __bunkai_host_getstr
#define getname __bunkai_host_getname
#define put32 __bunkai_host_put32
#define put64 __bunkai_host_put64
#define putstr __bunkai_host_putstr
#define send_msg __bunkai_host_send_msg
#define send_err __bunkai_host_send_err
#define send_ok_since __bunkai_host_send_ok_since
#define admit __bunkai_host_admit
#define json_object_error __bunkai_host_json_object_error
#define rollback __bunkai_host_rollback
#define do_commit __bunkai_host_do_commit
#define do_evict __bunkai_host_do_evict
#define do_hello __bunkai_host_do_hello
#define do_resolve __bunkai_host_do_resolve
#define do_unload __bunkai_host_do_unload
#define do_unload_name __bunkai_host_do_unload_name
#define sock_path __bunkai_host_sock_path
#define remove_socket __bunkai_host_remove_socket
#define sweep_dead_sockets __bunkai_host_sweep_dead_sockets
#define default_dir __bunkai_host_default_dir
#define listen_fd __bunkai_host_listen_fd
#define txn_lock __bunkai_host_txn_lock
#define pending __bunkai_host_pending
#define npending __bunkai_host_npending
#define listen_on __bunkai_host_listen_on
#define start_thread __bunkai_host_start_thread
#define command_thread __bunkai_host_command_thread
#define fork_watch __bunkai_host_fork_watch
#define readers_after_fork __bunkai_host_readers_after_fork
#define serving_after_fork __bunkai_host_serving_after_fork
#define same_socket __bunkai_host_same_socket

#pragma GCC visibility push(hidden)

/* ---- registry.c: the registry ------------------------------------------------ */

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

extern pthread_mutex_t reg_lock;
extern struct bunkai_iface *ifaces;
extern struct expect *expects;

struct module;
void grace_period(void);
void readers_after_fork(void); /* a fork child keeps the forking thread's calls in flight only */
void drop_providers(const struct module *m);
void publish_tables(void);
void unregister(struct module *m);
int64_t iface_length(const char *name, uint32_t skip);

/* ---- modules.c: the loaded modules ------------------------------------------- */

struct reg {
  struct bunkai_iface *iface;
  const void **table;
  char **names;
  uint32_t nfn;
};

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

extern struct module *modules; /* guarded by the command thread (only writer)
                                  and mod_lock for provider names */
extern pthread_mutex_t mod_lock;
extern uint32_t next_id;
extern uint64_t budget, used;

void free_strv(char **v, uint32_t n);
void free_reg(struct reg *r);
struct module *find_module(uint32_t id);
void retire(struct module *m);
void remove_module(struct module *m);
struct module *module_named(const char *name, uint32_t skip);
int needs(const struct module *x, const char *name);
int dependents(uint32_t id, char *buf, size_t len);

/* ---- wire.c: a connection ---------------------------------------------------- */

struct msg {
  unsigned char *p;
  size_t len, off;
  int bad;
};

struct out {
  unsigned char *p;
  size_t len, cap;
};

uint64_t now_ns(void);
extern uint64_t txn_deadline; /* now_ns() after which a read gives up */
int read_full(int fd, void *buf, size_t len, int *passed);
uint32_t get32(struct msg *m);
uint64_t get64(struct msg *m);
const unsigned char *getbytes(struct msg *m, uint32_t *len);
char *getstr(struct msg *m);
char *getname(struct msg *m, const char *what, char *why, size_t wl);
void put32(struct out *o, uint32_t v);
void put64(struct out *o, uint64_t v);
void putstr(struct out *o, const char *s, size_t n);
int send_msg(int fd, uint32_t type, struct out *body);
int send_err(int fd, const char *fmt, ...);
int send_ok_since(int fd, uint64_t t0);
int admit(int fd);

/* ---- json.c ------------------------------------------------------------------ */

const char *json_object_error(const unsigned char *p, size_t n, size_t *at);

/* ---- transaction.c: one connection's session --------------------------------- */

struct staged {
  void *mem;
  size_t rx_len, mem_len;
  int sealed; /* the RX part is final (PROTECT or MAP): no more WRITEs to it */
  struct staged *next;
};

struct session {
  struct staged *staged;
  int passed_fd; /* a descriptor received with SCM_RIGHTS, not yet used */
  uint32_t evict[64]; /* modules to unload when the first COMMIT lands */
  uint32_t nevict;
  uint64_t evict_bytes;
};

void rollback(struct session *s);
int do_commit(int fd, struct session *s, struct msg *m);
int do_evict(int fd, struct session *s, struct msg *m);

/* ---- memory.c: a load's staged memory ---------------------------------------- */

struct staged *find_staged(struct session *s, uint64_t addr);
void drop_staged(struct session *s, struct staged *st);
int do_alloc(int fd, struct session *s, struct msg *m);
int do_write(int fd, struct session *s, struct msg *m);
int do_protect(int fd, struct session *s, struct msg *m);
int do_map(int fd, struct session *s, struct msg *m);

/* ---- commands.c: the commands outside a load --------------------------------- */

int do_hello(int fd);
int do_resolve(int fd, struct msg *m);
int do_unload(int fd, struct msg *m);
int do_unload_name(int fd, struct msg *m);

/* ---- socket.c: where the socket lives ---------------------------------------- */

extern char sock_path[108];
void remove_socket(void);
void sweep_dead_sockets(const char *dir);
int default_dir(char *out, size_t len);

/* ---- server.c: the command thread ------------------------------------------- */

struct pending {
  int fd;
  uint64_t since;
  uint64_t ino; /* the socket's inode: the program may close the number and reuse it */
};
extern int listen_fd;            /* -1: no host in this process */
extern pthread_mutex_t txn_lock; /* held while a message is carried out */
extern struct pending pending[MAX_PENDING];
extern int npending;
int listen_on(const char *path);
int same_socket(int fd, uint64_t ino); /* fd still names the socket of inode ino */
int start_thread(void);
void *command_thread(void *fd); /* serves the listening socket fd (an intptr_t) */
void serving_after_fork(int consistent); /* a fork child: the parent's connection in service is not its own */

/* ---- fork.c: a host in every fork child ---------------------------------- */

void fork_watch(int in_default);

#pragma GCC visibility pop

#endif
