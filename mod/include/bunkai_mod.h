/*
 * bunkai_mod.h - the one interface shared by `bunkai mod` (the module server,
 * Rust), libbunkai-host (the C library inside a host program) and modules
 * (relocatable objects built with clang or gcc -c). DKM, seed 004.
 *
 * Bump BUNKAI_MOD_VERSION whenever the metadata format or the wire protocol
 * below changes; the server and the host refuse to talk across versions, and
 * a Rust test compiles this header so the two sides cannot drift apart.
 * (BUNKAI_MOD_ABI is its old name, kept for hosts that use it: deprecated.)
 *
 * ---- Interfaces -----------------------------------------------------------
 * An interface is a named, ordered list of C prototypes, written once in a
 * header as an X-macro and used by both the host and the modules:
 *
 *     #define SCHED_POLICY(X)                                          \
 *       X(int, pick, (const struct job *ready, int n, long now))       \
 *       X(const char *, name, (void))
 *     BUNKAI_INTERFACE(sched_policy, SCHED_POLICY)
 *
 * That declares `struct sched_policy_ops` (one function pointer per
 * prototype, in order), an enum of indexes, and the interface's text: the
 * prototypes as written, which the server normalises (whitespace) and
 * hashes, like modversions CRCs. A module and a host that disagree on one
 * prototype are refused, naming that function.
 *
 * ---- Modules --------------------------------------------------------------
 *     BUNKAI_MODULE("fifo", "1.0");
 *     BUNKAI_IMPLEMENTS(sched_policy, SCHED_POLICY, fifo_pick, fifo_name);
 *     BUNKAI_REQUIRES(job_queue, JOB_QUEUE);       (optional, any number)
 *     BUNKAI_MODULE_INIT(fifo_init);                (optional: int fn(void))
 *     BUNKAI_MODULE_EXIT(fifo_exit);                (optional: void fn(void))
 * Each macro emits one record into the ELF section ".bunkai_mod": a record
 * is the text "<kind>\x1f<field>\x1f<field>...\x1e" with the kinds
 *     module  NAME VERSION
 *     implements IFACE TEXT SYM...    (SYM: the functions, in prototype order)
 *     requires IFACE TEXT
 *     init SYM / exit SYM
 * Symbols are written by name (stringified), so the server resolves them in
 * the module's own symbol table; nothing in the section needs relocating.
 *
 * ---- Host -----------------------------------------------------------------
 * A host links libbunkai-host (or gets it through LD_PRELOAD with
 * BUNKAI_HOST=1), calls bunkai_host_start() and bunkai_host_expect() for the
 * interfaces it calls, and calls modules through the registry:
 *
 *     struct bunkai_guard g;
 *     const struct sched_policy_ops *p = BUNKAI_ACQUIRE(sched_policy, &g);
 *     if (p) next = p->pick(ready, n, now);
 *     bunkai_release(&g);
 *
 * Between acquire and release the module providing the interface cannot be
 * unloaded or swapped out, and all its functions come from one module: a
 * swap replaces the whole table in one atomic store (no half-swapped call).
 */
#ifndef BUNKAI_MOD_H
#define BUNKAI_MOD_H

#include <stdint.h>

#define BUNKAI_MOD_VERSION 2
/* Deprecated: the old name of BUNKAI_MOD_VERSION (clang 14 and later warn
 * where it is used). */
#define BUNKAI_MOD_ABI BUNKAI_MOD_VERSION
#if defined(__clang__) && __clang_major__ >= 14
#pragma clang deprecated(BUNKAI_MOD_ABI, "use BUNKAI_MOD_VERSION")
#endif
#define BUNKAI_MOD_SECTION ".bunkai_mod"
#define BUNKAI_MOD_FS "\x1f" /* field separator */
#define BUNKAI_MOD_RS "\x1e" /* record separator */

#define BUNKAI__STR(x) #x
#define BUNKAI__XSTR(x) BUNKAI__STR(x)
#define BUNKAI__CAT2(a, b) a##b
#define BUNKAI__CAT(a, b) BUNKAI__CAT2(a, b)
#define BUNKAI__RECORD(text)                                                   \
  __attribute__((section(BUNKAI_MOD_SECTION), used, aligned(1)))               \
  static const char BUNKAI__CAT(__bunkai_mod_rec_, __COUNTER__)[] = text       \
      BUNKAI_MOD_RS

/* ---- interfaces ---------------------------------------------------------- */
#define BUNKAI__OPS_FIELD(ret, name, args) ret(*name) args;
#define BUNKAI__IDX(ret, name, args) name##_idx_,
#define BUNKAI__PROTO_TEXT(ret, name, args) #ret " " #name #args ";"

#define BUNKAI_INTERFACE(iface, LIST)                                          \
  struct iface##_ops {                                                         \
    LIST(BUNKAI__OPS_FIELD)                                                    \
  };                                                                           \
  enum { LIST(BUNKAI__IDX) iface##_nfuncs_ };                                  \
  static const char iface##_iface_text[] __attribute__((unused)) =            \
      LIST(BUNKAI__PROTO_TEXT);

/* ---- modules ------------------------------------------------------------- */
#define BUNKAI_MODULE(name, version)                                           \
  BUNKAI__RECORD("module" BUNKAI_MOD_FS name BUNKAI_MOD_FS version)

#define BUNKAI__SYMS1(a) BUNKAI_MOD_FS #a
#define BUNKAI__SYMS(...) BUNKAI__SYMS_N(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1)(__VA_ARGS__)
#define BUNKAI__SYMS_N(_1, _2, _3, _4, _5, _6, _7, _8, N, ...) BUNKAI__SYMS_##N
#define BUNKAI__SYMS_1(a) BUNKAI__SYMS1(a)
#define BUNKAI__SYMS_2(a, ...) BUNKAI__SYMS1(a) BUNKAI__SYMS_1(__VA_ARGS__)
#define BUNKAI__SYMS_3(a, ...) BUNKAI__SYMS1(a) BUNKAI__SYMS_2(__VA_ARGS__)
#define BUNKAI__SYMS_4(a, ...) BUNKAI__SYMS1(a) BUNKAI__SYMS_3(__VA_ARGS__)
#define BUNKAI__SYMS_5(a, ...) BUNKAI__SYMS1(a) BUNKAI__SYMS_4(__VA_ARGS__)
#define BUNKAI__SYMS_6(a, ...) BUNKAI__SYMS1(a) BUNKAI__SYMS_5(__VA_ARGS__)
#define BUNKAI__SYMS_7(a, ...) BUNKAI__SYMS1(a) BUNKAI__SYMS_6(__VA_ARGS__)
#define BUNKAI__SYMS_8(a, ...) BUNKAI__SYMS1(a) BUNKAI__SYMS_7(__VA_ARGS__)

/* Up to 8 functions per interface; they are type-checked against the
 * interface's prototypes by assigning them into a `struct iface_ops`. */
#define BUNKAI_IMPLEMENTS(iface, LIST, ...)                                    \
  __attribute__((used)) static const struct iface##_ops                        \
      BUNKAI__CAT(__bunkai_mod_check_, __COUNTER__) = {__VA_ARGS__};           \
  BUNKAI__RECORD("implements" BUNKAI_MOD_FS #iface BUNKAI_MOD_FS                \
                 LIST(BUNKAI__PROTO_TEXT) BUNKAI__SYMS(__VA_ARGS__))

#define BUNKAI_REQUIRES(iface, LIST)                                           \
  BUNKAI__RECORD("requires" BUNKAI_MOD_FS #iface BUNKAI_MOD_FS                  \
                 LIST(BUNKAI__PROTO_TEXT))

#define BUNKAI_MODULE_INIT(fn)                                                 \
  static int (*BUNKAI__CAT(__bunkai_mod_init_check_, __COUNTER__))(void)       \
      __attribute__((used)) = fn;                                              \
  BUNKAI__RECORD("init" BUNKAI_MOD_FS #fn)
#define BUNKAI_MODULE_EXIT(fn)                                                 \
  static void (*BUNKAI__CAT(__bunkai_mod_exit_check_, __COUNTER__))(void)      \
      __attribute__((used)) = fn;                                              \
  BUNKAI__RECORD("exit" BUNKAI_MOD_FS #fn)

/* ---- host API (libbunkai-host) ------------------------------------------ */
#ifdef __cplusplus
extern "C" {
#endif

struct bunkai_guard {
  uint32_t gen;
};
typedef struct bunkai_iface bunkai_iface_t;

/* Starts the command thread on `socket_path` (NULL: the default,
 * $BUNKAI_HOST_SOCKET, else <pid>.sock in $XDG_RUNTIME_DIR/bunkai-mod when
 * XDG_RUNTIME_DIR is a private directory of ours, else in
 * /tmp/bunkai-mod-<uid>; a default directory must be a real directory of
 * ours with mode 0700, or the host refuses to start). 0 on success; on
 * failure one line `bunkai mod: ...` on stderr. */
int bunkai_host_start(const char *socket_path);
/* The socket path the host listens on (after bunkai_host_start). */
const char *bunkai_host_socket(void);
/* Declares an interface the host calls, with its prototypes' text: modules
 * implementing it must match. */
int bunkai_host_expect(const char *iface, const char *text);
/* Limits the memory modules may use (bytes; 0 = no limit). */
void bunkai_host_set_budget(uint64_t bytes);

/* A stable handle for an interface (created on first use, never freed). */
bunkai_iface_t *bunkai_iface(const char *iface);
/* The current provider's function table, or NULL; valid until release. */
const void *bunkai_acquire(bunkai_iface_t *h, struct bunkai_guard *g);
void bunkai_release(struct bunkai_guard *g);
/* One function by interface and name, outside any guard (for tools). */
void *bunkai_lookup(const char *iface, const char *name);
/* Name of the module providing `iface`, or NULL (for logs). Copies into
 * buf; safe against a concurrent unload. */
const char *bunkai_provider(const char *iface, char *buf, unsigned long len);

#define BUNKAI_EXPECT(iface) bunkai_host_expect(#iface, iface##_iface_text)
/* The handle of `iface`, looked up once per call site: bunkai_iface takes
 * the registry's lock and compares names, so a call site keeps what it
 * returned (handles are never freed; a NULL from a failed allocation is
 * not kept). After the first call, BUNKAI_ACQUIRE is one load and
 * bunkai_acquire's two atomic adds (bench/mod/acquire.sh measures it). */
#define BUNKAI__HANDLE(iface)                                                  \
  __extension__({                                                              \
    static bunkai_iface_t *bunkai__h_;                                         \
    bunkai_iface_t *bunkai__x_ = __atomic_load_n(&bunkai__h_, __ATOMIC_ACQUIRE); \
    if (!bunkai__x_) {                                                         \
      bunkai__x_ = bunkai_iface(#iface);                                       \
      __atomic_store_n(&bunkai__h_, bunkai__x_, __ATOMIC_RELEASE);             \
    }                                                                          \
    bunkai__x_;                                                                \
  })
#define BUNKAI_ACQUIRE(iface, guard)                                           \
  ((const struct iface##_ops *)bunkai_acquire(BUNKAI__HANDLE(iface), (guard)))

#ifdef __cplusplus
}
#endif

/* ---- wire protocol (server <-> host, Unix stream socket) -----------------
 * Every message: uint32 length of what follows, uint32 type, payload. All
 * integers little-endian. Strings: uint32 length + bytes. The host serves
 * one connection at a time: a connection is a transaction. Everything it
 * allocated is freed and nothing it staged is published unless the
 * connection sends COMMIT; a dropped connection rolls back.
 *   HELLO    -> OK u32 abi u32 pid u64 budget u64 used
 *               u32 nexpect {name text}* u32 nmod {u32 id u64 addr u64 len blob}*
 *   RESOLVE  n {name}*              -> OK {u64 addr (0: missing)}*
 *   ALLOC    u64 rx u64 rw          -> OK u64 rx_addr u64 rw_addr u64 ns
 *   WRITE    u64 addr bytes          -> OK u64 ns   (into staged memory only)
 *   PROTECT  u64 rx_addr            -> OK u64 ns   (RX pages become r-x)
 *   MAP      u64 rx_addr u64 len    -> OK u64 ns   (zero-copy load: the
 *            message carries one memfd (SCM_RIGHTS, MFD_ALLOW_SEALING) holding
 *            the linked image laid out like the staged memory, sealed with
 *            F_SEAL_WRITE|GROW|SHRINK|SEAL by its sender after unmapping it
 *            (the host adds missing seals, and refuses a memfd it cannot seal:
 *            one still mapped writable elsewhere); the host
 *            maps [0, len) over the staged memory: the RX part r-x,
 *            the rest rw- copy-on-write; both private. WRITE and PROTECT are
 *            then not needed; on ERR the staged memory is as ALLOC left it)
 *   COMMIT   u32 replace_id blob u64 rx u64 rw u64 init u64 exit
 *            n {iface nfn {name u64 fn}*} name ndeps {dep}*
 *            (name: the module's; deps: the modules it needs)
 *                                   -> OK u32 id u64 ns_init u64 ns_publish
 *            (replace_id != 0: the swap, one atomic publication)
 *            Refused (ERR, the staged memory unmapped, nothing run) unless:
 *            init, exit and every fn lie in the RX part staged at rx; names
 *            are 1-255 bytes without NUL; each table has its interface's
 *            length (the host's expected text, else the current providers');
 *            blob is a JSON object; the name is not loaded already; every
 *            dep is loaded and not being evicted.
 *   UNLOAD   u32 id                 -> OK u64 ns   (refused while other
 *            modules need it, naming them; EVICT likewise)
 *   UNLOAD_NAME name                -> OK u32 status, then for status
 *            0 (unloaded): u32 id u64 ns; 1: no module of that name;
 *            2 (refused: other modules need it): n {name}* of those
 *   EVICT    u32 id                 -> OK   (memory pressure: the module is
 *            unloaded when this transaction's first COMMIT lands, and its
 *            memory counts as free for ALLOC; forgotten on rollback)
 * Errors: ERR string, one line. `blob` is the server's record of the module
 * (JSON), kept by the host so any later server sees the same state.
 * A connection is served once it has sent something (a silent one is closed
 * after 10 s and holds up nobody); reads and writes time out after 10 s; a
 * transaction ends after 120 s. */
#define BUNKAI_MSG_HELLO 1
#define BUNKAI_MSG_RESOLVE 2
#define BUNKAI_MSG_ALLOC 3
#define BUNKAI_MSG_WRITE 4
#define BUNKAI_MSG_PROTECT 5
#define BUNKAI_MSG_COMMIT 6
#define BUNKAI_MSG_UNLOAD 7
#define BUNKAI_MSG_EVICT 8
#define BUNKAI_MSG_MAP 9
#define BUNKAI_MSG_UNLOAD_NAME 10
#define BUNKAI_MSG_OK 100
#define BUNKAI_MSG_ERR 101

#endif
