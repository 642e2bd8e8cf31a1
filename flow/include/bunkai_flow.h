/* bunkai_flow.h: what the parts of `bunkai flow` (seed 003, XenLASY) agree
 * on: the join-point table the LLVM pass leaves in a program, the flow-ID
 * runtime's C API, and the record buffer STORE_DATA writes and `bunkai flow
 * dump` reads. Versions: BKF_VERSION for the join-point table (§1) and
 * BKF_BUF_VERSION for the buffer (§3); any change to a layout bumps its
 * version, and readers refuse other versions.
 *
 * Rules: plain C, fixed-width integers, little-endian, usable from C++ (the
 * pass), from C (the runtime, generated advice) and mirrored in Rust.
 *
 * ---------------------------------------------------------------------------
 * 1. Join points and sleds (written by the pass, flow/pass/)
 *
 * At every join point (an access to a struct member; a function entry) the
 * pass inserts an inline-asm sled of BKF_SLED_SIZE bytes, 2-byte aligned.
 * Unpatched it is one 11-byte nop that falls through (what assemblers pad
 * with):
 *
 *     66 66 2e 0f 1f 84 00 00 00 00 00   data16 data16 cs nopw 0(%rax,%rax,1)
 *
 * and patched:
 *
 *     66 90                      xchg %ax,%ax
 *     e8 rel32                   call trampoline      (offset 2..6)
 *     0f 1f 40 00                nopl 0(%rax)         (offset 7..10)
 *
 * with, in between, the jump form (XRay's unpatched sled):
 *
 *     eb 09                      jmp .+11
 *     (bytes 2..10 as patched)
 *
 * Patching: (1) store `eb 09` over bytes 0..1 with one aligned 2-byte store:
 * a thread at the sled now runs the whole nop or the jump, both ending at
 * 11, and no thread can be inside the sled (the nop has no instruction
 * boundary inside); (2) membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE)
 * so no core still holds the old decode; (3) write bytes 2..10; (4) sync
 * again; (5) store `66 90` over bytes 0..1. The call returns to offset 7.
 * Unpatching stores `eb 09` back and leaves bytes 2..10 alone (a thread may
 * be between the `66 90` and the call, or inside the trampoline), so an
 * unwoven sled is the jump form; patching it again with the same trampoline
 * address is just (5). A trampoline at a fixed address per sled keeps bytes
 * 2..10 the same forever.
 *
 * Why a nop and not XRay's jump: XRay has two sleds per function; struct
 * member accesses are far denser, and a taken jump at each costs the front
 * end dearly. SQLite's shell with a sled at each of its 65k join points,
 * no operands, on an insert/index/query workload: +75% run time with the
 * jump form, +15% with the nop. (A first draft also had a 7-byte nop at
 * 2..8, whose displacement bytes `00 00` at 7..8 would have run as
 * `add %al,(%rax)` after a call returned.)
 *
 * The sled's asm declares no clobbers (not even the flags: an unpatched sled
 * costs the surrounding code nothing), so a trampoline preserves every
 * register, %xmm0-15 and the flags, and aligns the stack itself (at a sled
 * %rsp may be 8 mod 16). Functions with sleds are compiled without the red
 * zone (the pass sets noredzone): the call's push at -8(%rsp) destroys
 * nothing.
 *
 * Each sled leaves a record in the section BKF_SECTION ("aw" is not needed:
 * the record holds only PC-relative offsets and text), 4-byte aligned:
 *
 *     i32  sled - &this field          (PC-relative: no dynamic relocation)
 *     u32  BKF_JP_MAGIC
 *     u16  kind                        (BKF_KIND_*)
 *     u16  version                     (BKF_VERSION: tables outlive builds)
 *     u32  text_len                    (bytes of text, with its NUL)
 *     char text[text_len]              then padding to 4 bytes
 *
 * A record's index in the section is the join point's number (the `jp` of a
 * buffer record). Sample (pass output, tabs shown as \t):
 *     pkt\tlen\tpkt_clone\tpackets.c\t36\tload\t32\t$base=%r14 skb=%r14 n=%rax
 *     -\t-\tqueue_push\tpackets.c\t44\tentry\t0\t$arg0=%rdi $arg1=%rsi q=%rdi p=%rsi
 *
 * text is tab-separated: kind-specific fields, then the operands:
 *     access:  "struct\tmember\tfunction\tfile\tline\tload|store|addr\tBITS\tOPERANDS"
 *     entry:   "-\t-\tfunction\tfile\tline\tentry\t0\tOPERANDS"
 * BITS is the member's width in bits (its storage unit for bitfields), so
 * that check can tell whether an xin field fits in it.
 *     after:   as access (kind BKF_KIND_AFTER): a second sled right after the
 *              accessing instruction, for <after> advice; only with the
 *              pass option -bunkai-flow-after. A load's operands add
 *              "$value", the value it read.
 *     exit:    "-\t-\tfunction\tfile\tline\texit\t0\tOPERANDS" (kind
 *              BKF_KIND_EXIT): a sled right before each return of a
 *              function that has an entry join point, for <after> advice
 *              on the entry (the paper's after-return); only with
 *              -bunkai-flow-after. Operands: "$retval" (the value returned,
 *              if any) and the variables visible at the return.
 * OPERANDS is a space-separated list of name=location, where name is
 * "$base" (the struct pointer of an access), "$arg0".."$argN" (function
 * arguments at entry) or a C local variable or parameter visible at the join
 * point, and location is what the compiler substituted into the asm template
 * for that operand: a register ("%rdi"), a memory operand relative to %rsp or
 * %rbp ("16(%rsp)", "-24(%rbp)"), or an immediate ("$5"). Locations are as of
 * the sled's first byte; a trampoline called from the sled sees %rsp 8 lower.
 * Registers are named at the value's width: "%rdi" 64 bits, "%edi" the low
 * 32 bits of %rdi, "%r15d", "%si", "%sil"; a float or double is in "%xmmN".
 * An operand named twice (a parameter that is also $base) is one location.
 * $base is the address of the innermost struct instance accessed: for
 * `o->in.x` the address of o->in, for `v[i].w` that of v[i]. The pass as
 * built uses register and immediate operands only (LLVM 14 turns "rm" into
 * a store to a fresh stack slot before every sled); a reader still accepts
 * the memory forms.
 *
 * 2. The flow-ID runtime (flow/runtime/, libbunkai-flow.so, also linkable
 *    into a module)
 *
 * IDs are 64-bit, 0 means "no flow". get_new_flowid never returns 0 and IDs
 * are unique among the processes of one host that share the ID counter
 * (BKF_IDS_PATH); a host tag in bits 48..63 keeps hosts apart (those bits are
 * the first lost when a field packs fewer bits, as the paper accepts).
 * Tables are keyed by the struct instance's address, one per flow name,
 * thread-safe, growing without limit. get_flowid takes no lock and is
 * async-signal-safe, as is bkf_store; register_flowid and remove_flowid
 * take a per-table lock (not from a signal handler). A NULL table or key
 * is ignored (get returns 0); registering ID 0 removes the key.
 * Environment, read when the thing is first needed: BUNKAI_FLOW_IDS (the
 * counter file instead of BKF_IDS_PATH), BUNKAI_FLOW_DIR (instead of
 * BKF_BUF_DIR), BUNKAI_FLOW_BUF (buffer bytes, suffix K/M/G allowed,
 * default 64M, 0: record nothing), BUNKAI_FLOW_POPULATE=1 (fault the whole
 * buffer in when it is created, instead of 256 KiB ahead of the records),
 * BUNKAI_FLOW_CLOCK (ns or tsc: what records' time stamps hold, §3).
 *
 * 3. The record buffer (per process: BKF_BUF_DIR/bunkai-flow.<pid>.buf),
 *    version BKF_BUF_VERSION (its own: a buffer does not outlive its run the
 *    way a join-point table outlives its build)
 *
 *     struct bkf_buf_header (BKF_BUF_HEADER_SIZE bytes), then the area:
 *     reservations back to back (not a ring: a full buffer drops, it never
 *     overwrites), each a record or a writer's chunk of records. A record:
 *     u32 size (bytes of this record, multiple of 8), u16 nvals, u16 flags
 *     u64 time (when the advice ran: CLOCK_REALTIME in ns, or with
 *              clock == BKF_CLOCK_TSC the time stamp counter, which a
 *              reader converts to CLOCK_REALTIME by the header's pairs, so
 *              hosts' buffers merge by time either way)
 *     u64 pc   (the sled's address: $pc$)
 *     u32 tid, u32 jp (join-point index in the module's table, or ~0)
 *     u64 vals[nvals]
 * A chunk: u32 size (bytes of the chunk, its head included, multiple of 8),
 * u16 0, u16 flags = BKF_REC_CHUNK, then records back to back, up to size
 * or to a zero word (the unused rest). A writing thread reserves a chunk
 * (BKF_CHUNK bytes, fewer at the end of the area) with one atomic add on
 * `head`, stores its head, and then writes its records into it one after
 * the other with no atomic operation; a record that does not fit in the
 * rest of its thread's chunk goes into a new chunk, or, when it is larger
 * than BKF_CHUNK / 4, into a reservation of its own (the thread keeps its
 * chunk); so does a record made in a signal handler that interrupted its
 * thread's own store. A record's writer stores its first word (size,
 * nvals, flags 0), the rest, and last sets flags to BKF_REC_DONE
 * (release). When a reservation does not fit it counts `dropped` instead
 * (head may then run past capacity). A reader walks from offset 0 up to
 * min(head, capacity): a zero word ends the walk (not written yet: the
 * space of a reservation that did not fit, or a writer between its add and
 * its first store) or, in a chunk, the chunk; a record without
 * BKF_REC_DONE is being written (or its writer died) and is skipped by its
 * size. A thread's records lie in order in its chunks; records of
 * different threads are in no order in the area: readers sort by time.
 * The header is valid once magic is set.
 *
 * Time stamps: a record's clock_gettime was about 23 of its 45-60 ns, rdtsc
 * is 10. When the kernel's clocksource is the TSC (it found it invariant
 * and in step across CPUs), records hold the TSC, and the header what a
 * reader needs to map it to CLOCK_REALTIME: at creation the TSC (tsc0),
 * CLOCK_REALTIME (ns0) and CLOCK_MONOTONIC (mono0), read together, and
 * cal[], later (tsc, CLOCK_MONOTONIC) pairs. The rate comes from the
 * monotonic clock, which runs at the wall clock's rate but never steps:
 *     ns = ns0 + (t - tsc0) * (cal.ns - mono0) / (cal.tsc - tsc0)
 * with the latest pair; a change of the wall clock during the run moves no
 * record (times are the wall clock at creation plus the time since). The
 * runtime takes the first cal[] pair 2^14 cycles after creation and a new
 * one whenever a record's TSC reaches cal_next: each step is the span since
 * creation (2^14 cycles at least, 2^31 at most), so a record lies no
 * further past the latest pair than that pair lies from tsc0 (until the
 * 2^31 cap). cal_seq picks the pair: even, cal[(cal_seq >> 1) & 1]; odd, a
 * writer is filling the other slot and (cal_seq >> 1) & 1 is still the
 * latest complete one. Pairs are published at least a step apart. With
 * clock == BKF_CLOCK_NS records hold CLOCK_REALTIME and cal[] is unused.
 * BUNKAI_FLOW_CLOCK=ns or tsc chooses (tsc only when the CPU says its TSC
 * is invariant). */
#ifndef BUNKAI_FLOW_H
#define BUNKAI_FLOW_H

#include <stdint.h>

#define BKF_VERSION 2u /* the join-point table's; 2: the member's width in the join-point text */
#define BKF_SECTION "bunkai_flow_jp"
#define BKF_JP_MAGIC 0x50464b42u /* "BKFP" */
#define BKF_SLED_SIZE 11
enum { BKF_KIND_ACCESS = 1, BKF_KIND_ENTRY = 2, BKF_KIND_AFTER = 3, BKF_KIND_EXIT = 4 };

#define BKF_IDS_PATH "/dev/shm/bunkai-flow.ids"
#define BKF_BUF_DIR "/dev/shm"
#define BKF_BUF_MAGIC 0x46554246u /* "FBUF" */

#ifdef __cplusplus
extern "C" {
#endif

typedef uint64_t bkf_id;
struct bkf_table;

/* The table of the flow called name (created on first use). */
struct bkf_table *bkf_table(const char *name);
bkf_id get_new_flowid(void);
void register_flowid(struct bkf_table *t, const void *key, bkf_id id);
bkf_id get_flowid(struct bkf_table *t, const void *key); /* 0: not in the flow */
void remove_flowid(struct bkf_table *t, const void *key);
/* Entries in a table (for tests and the memory experiment). */
uint64_t bkf_table_size(struct bkf_table *t);

/* A record whose jp is BKF_JP_LIVE_AT_EXIT is no step of a flow: the
 * runtime writes one at the process's exit for each table that still holds
 * keys (an object that ended without a quit leaves its key, and the next
 * object at that address joins the old flow). pc 0; vals: the number of
 * live keys, the table's name in 3 words (24 bytes, NUL-padded, cut), then
 * up to BKF_LIVE_SAMPLE (key, flow ID) pairs. */
#define BKF_JP_LIVE_AT_EXIT 0xfffffffeu
#define BKF_LIVE_SAMPLE 4
#define BKF_REC_DONE 1u        /* flags: the record is complete */
#define BKF_REC_CHUNK 2u       /* flags: a writer's chunk of records, not a record */
#define BKF_CHUNK 4096u        /* bytes a writer reserves at a time (§3) */
#define BKF_REC_HEADER 32u     /* bytes before vals[] */
#define BKF_BUF_VERSION 4u /* 3: TSC time stamps (clock, cal_*, tsc0, ns0, mono0); 4: writers' chunks */
#define BKF_BUF_HEADER_SIZE 384u
enum { BKF_CLOCK_NS = 0, BKF_CLOCK_TSC = 1 };

struct bkf_buf_time_pair {
  uint64_t tsc, ns;
};

struct bkf_buf_header {
  uint32_t magic, version;
  uint32_t pid, host_tag;
  uint64_t capacity;          /* bytes of the ring after this header */
  volatile uint64_t head;     /* bytes reserved so far (monotonic) */
  volatile uint64_t dropped;  /* records that did not fit */
  uint64_t started_ns;        /* CLOCK_REALTIME at creation */
  volatile uint64_t cal_next; /* TSC at which a writer takes a new pair (head's cache line) */
  uint32_t clock;             /* BKF_CLOCK_NS or BKF_CLOCK_TSC: what records' time holds */
  volatile uint32_t cal_seq;  /* which cal[] is the latest (see above) */
  uint64_t tsc0;              /* at creation: the TSC, */
  uint64_t ns0;               /* CLOCK_REALTIME (started_ns) and */
  uint64_t mono0;             /* CLOCK_MONOTONIC */
  uint64_t reserved;
  struct bkf_buf_time_pair cal[2]; /* later (tsc, CLOCK_MONOTONIC) pairs */
  char host[64];              /* the host name (uname) */
  char exe[192];              /* the program */
};
#ifdef __cplusplus
static_assert(sizeof(struct bkf_buf_header) == BKF_BUF_HEADER_SIZE, "record area offset");
#else
_Static_assert(sizeof(struct bkf_buf_header) == BKF_BUF_HEADER_SIZE, "record area offset");
#endif

/* Appends a record; used by the STORE_DATA macros of generated advice. */
void bkf_store(uint64_t pc, uint32_t jp, int n, const uint64_t *vals);
/* bkf_store whose time stamp is tsc, an rdtsc the caller made a moment
 * before, where records hold the TSC (tsc 0 or older than the buffer: the
 * clock is read, as bkf_store does). Generated advice's STORE_DATA uses it
 * with the TSC its DO_RDTSC read in the same pass (see the macros below). */
void bkf_store_tsc(uint64_t pc, uint32_t jp, int n, const uint64_t *vals, uint64_t tsc);

/* The size of the buffer files this process (and the fork children it
 * makes from now on) creates, in bytes, header included, in place of
 * BUNKAI_FLOW_BUF (which means the same): `flow
 * weave --buffer-size` has the advice module's init call it. A buffer that
 * exists already keeps its size. 0 when this process has no buffer yet, 1
 * when it has one (kept), -EINVAL for 0 bytes. */
int bkf_buffer_size(uint64_t bytes);

/* 4. Weaving (in libbunkai-flow.so: one copy per process, never unloaded)
 *
 * bkf_weave patches n sleds (addresses as mapped in this process) so that
 * each calls h(frame, xsave, jp[i], arg) on the thread that reaches it, and
 * bkf_unweave puts them back (the jump form of §1); when it returns, no
 * thread runs h for those sleds any more. Both return 0 or -errno: EINVAL
 * (not a sled of ours, odd address), EEXIST (already woven), ENOMEM (no
 * stub page within reach), ENOSYS (no XSAVE), EACCES (text not writable).
 * A failed bkf_weave patches nothing. One weave or unweave at a time.
 *
 * The frame is what the trampoline saved, lowest address first; the
 * program's %rsp at the sled is (uint64_t)&frame->ret + 8. Writing a field
 * changes the register when the trampoline returns. xsave is the XSAVE
 * area (64-byte aligned): %xmmN's low 8 bytes are at offset 160 + 16 * N.
 * The handler runs on the program's stack, below its frames, with the
 * program's signal mask; it must not unwind past the trampoline. */
struct bkf_frame {
  uint64_t r15, r14, r13, r12, r11, r10, r9, r8, rdi, rsi, rbp, rbx, rdx, rcx, rax;
  uint64_t flags;
  uint64_t slot;  /* the sled's slot in the runtime */
  uint64_t ret;   /* the sled's address + 7 */
};
typedef void (*bkf_handler)(struct bkf_frame *frame, void *xsave, uint32_t jp, void *arg);
int bkf_weave(int n, const uint64_t *sleds, const uint32_t *jp, bkf_handler h, void *arg);
/* bkf_weave with flags. BKF_WEAVE_NO_VECTOR: h, and everything it calls,
 * leaves the vector registers (%xmm, %ymm, %zmm, %k, x87) alone, e.g. it is
 * built with -mgeneral-regs-only and calls only this runtime, which is.
 * The trampoline then skips XSAVE/XRSTOR (most of its cost) and h gets
 * xsave == NULL. */
#define BKF_WEAVE_NO_VECTOR 1u
int bkf_weave_ex(int n, const uint64_t *sleds, const uint32_t *jp, bkf_handler h, void *arg, unsigned flags);
/* bkf_weave_ex with a guard per sled (guards[i] for sleds[i]; NULL: none).
 * A guard promises that h does nothing at that sled unless one of its n
 * tests holds, each on the value of register reg[k] at the sled:
 *   BKF_GUARD_KEY:   the value is a key of table[k] (get_flowid != 0): h is
 *                    filtered on a flow, as xflow()-filtered advice,
 *                    transits and quits are;
 *   BKF_GUARD_FIELD: the value is a pointer, not NULL, to a struct whose
 *                    width[k]-byte (1, 2, 4, 8) member at byte off[k] has
 *                    a bit of mask[k] set: h reads a flow ID packed there
 *                    (xout).
 * The sled then calls the guard's code (shared by every sled with the same
 * tests), which runs the tests before it saves anything and returns at once
 * when none holds; h runs otherwise. A key test reads the table's filter
 * (64 Ki counters of live keys by hash, kept by register/remove), which
 * has false positives, never false negatives. The guard uses %rcx and
 * %rdx (saved on the stack), MULX, RORX and PEXT (BMI2), and no instruction
 * that writes the flags. reg is the x86 register number: 0 rax, 1 rcx,
 * 2 rdx, 3 rbx, 5 rbp, 6 rsi, 7 rdi, 8..15 r8..r15 (4, %rsp, is refused:
 * -EINVAL). n == 0 is no guard. Without BMI2, or for a table without a
 * filter, the sled is woven unguarded (correct, slower);
 * __bunkai_flow_guarded(sled) says which. */
#define BKF_GUARD_MAX 4
enum { BKF_GUARD_KEY = 0, BKF_GUARD_FIELD = 1 };
struct bkf_guard {
  uint32_t n;
  uint8_t kind[BKF_GUARD_MAX];
  uint8_t reg[BKF_GUARD_MAX];
  uint8_t width[BKF_GUARD_MAX];      /* FIELD */
  uint32_t off[BKF_GUARD_MAX];       /* FIELD */
  uint64_t mask[BKF_GUARD_MAX];      /* FIELD */
  struct bkf_table *table[BKF_GUARD_MAX]; /* KEY */
};
int bkf_weave_guarded(int n, const uint64_t *sleds, const uint32_t *jp, bkf_handler h, void *arg, unsigned flags,
                      const struct bkf_guard *guards);
int bkf_unweave(int n, const uint64_t *sleds);

#ifdef __cplusplus
}
#endif

/* Macros available in advice bodies (the paper's Figs. 2, 8). Generated
 * advice declares bkf_pc__ (the sled's address, also what $pc$ becomes) and
 * bkf_jp__ (the join point's index); other users declare them too. */
#ifdef BKF_ADVICE_TSC__
/* In generated advice (which defines BKF_ADVICE_TSC__ and declares
 * uint64_t bkf_tsc__ = 0 in its handler): the TSC that DO_RDTSC read last
 * in this pass is also the record's time stamp, so a record reads the
 * TSC once, not twice (each rdtsc is about 10 ns; the store waited for
 * its own). A record stored before any DO_RDTSC reads the clock itself. */
#define DO_RDTSC(v) do { uint32_t lo__, hi__; __asm__ volatile("rdtsc" : "=a"(lo__), "=d"(hi__)); bkf_tsc__ = ((uint64_t)hi__ << 32) | lo__; (v) = bkf_tsc__; } while (0)
#define BKF_STORE_N(pc, ...) do { uint64_t v__[] = {__VA_ARGS__}; bkf_store_tsc((uint64_t)(pc), (uint32_t)(bkf_jp__), (int)(sizeof v__ / sizeof v__[0]), v__, bkf_tsc__); } while (0)
#else
#define DO_RDTSC(v) do { uint32_t lo__, hi__; __asm__ volatile("rdtsc" : "=a"(lo__), "=d"(hi__)); (v) = ((uint64_t)hi__ << 32) | lo__; } while (0)
#define BKF_STORE_N(pc, ...) do { uint64_t v__[] = {__VA_ARGS__}; bkf_store((uint64_t)(pc), (uint32_t)(bkf_jp__), (int)(sizeof v__ / sizeof v__[0]), v__); } while (0)
#endif
#define STORE_DATA1(a) BKF_STORE_N(bkf_pc__, (uint64_t)(a))
#define STORE_DATA2(a, b) BKF_STORE_N(bkf_pc__, (uint64_t)(a), (uint64_t)(b))
#define STORE_DATA3(a, b, c) BKF_STORE_N(bkf_pc__, (uint64_t)(a), (uint64_t)(b), (uint64_t)(c))
#define STORE_DATA4(a, b, c, d) BKF_STORE_N(bkf_pc__, (uint64_t)(a), (uint64_t)(b), (uint64_t)(c), (uint64_t)(d))
#define STORE_DATA5(a, b, c, d, e) BKF_STORE_N(bkf_pc__, (uint64_t)(a), (uint64_t)(b), (uint64_t)(c), (uint64_t)(d), (uint64_t)(e))

#endif
