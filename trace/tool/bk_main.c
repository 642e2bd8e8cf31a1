/* bk_main.c: bunkai's Valgrind tool, the recorder behind `bunkai trace
 * record` (TURU, seed 001, §2.1-2.2 rebuilt on Valgrind).
 *
 * Rules for this file:
 *  - It runs inside Valgrind, linked statically at 0x58000000 against
 *    libcoregrind and libvex: no libc at all, only VG_(...) functions, and a
 *    few core functions declared by hand below (marked "core").
 *  - Everything it records follows trace/include/bunkai_trace.h; any change
 *    of layout bumps BKT_VERSION there.
 *  - Valgrind runs one guest thread at a time, so the buffers are global and
 *    unlocked.
 *  - Symbols: the tool is its own executable; names are static except
 *    Valgrind's entry points and the two wrappers of core functions at the
 *    end (__wrap_vgPlain_client_exit, __wrap_vgPlain_kill_self; the link
 *    passes --wrap for them), through which the tool learns how the process
 *    ends after Valgrind has called its fini with a constant 0.
 *
 * How it records: each superblock is cut into segments at its side exits
 * (chasing is turned off, so a call or return always ends a superblock).
 * A segment is defined once (its instructions and, for each memory access,
 * the instruction, kind and size) and costs one helper call per execution,
 * made at the segment's end, which appends the segment id and the
 * addresses of its accesses to a word buffer. The buffer is encoded
 * (varints, deltas) into EVENTS messages and sent over a Unix socket to the
 * recorder, which compresses and writes the file. Loads and stores merge
 * into "modify" exactly where lackey merges them, so `bunkai trace dump
 * --lackey` reproduces lackey's --trace-mem output.
 *
 * One file on purpose (about 1,200 lines): a Valgrind tool is one
 * executable whose instrumentation, helpers and event callbacks share the
 * tool's global buffers and segment table, and Valgrind's own tools are
 * written the same way (lackey is one lk_main.c; cachegrind's
 * instrumentation and callbacks are one cg_main.c).
 */
#include "pub_tool_basics.h"
#include "pub_tool_tooliface.h"
#include "pub_tool_libcassert.h"
#include "pub_tool_libcprint.h"
#include "pub_tool_libcbase.h"
#include "pub_tool_libcfile.h"
#include "pub_tool_libcproc.h"
#include "pub_tool_debuginfo.h"
#include "pub_tool_options.h"
#include "pub_tool_machine.h"
#include "pub_tool_mallocfree.h"
#include "pub_tool_aspacemgr.h"
#include "pub_tool_vki.h"
#include "pub_tool_vkiscnums.h"
#include "pub_tool_threadstate.h"
#include "pub_tool_clientstate.h"
#include "pub_tool_xarray.h"
#include "bunkai_trace.h"

/* core: not in the pub_tool headers, present in libcoregrind. */
extern SysRes VG_(do_syscall)(UWord sysno, RegWord, RegWord, RegWord, RegWord,
                              RegWord, RegWord, RegWord, RegWord);
extern Int VG_(socket)(Int domain, Int type, Int protocol);
extern Int VG_(safe_fd)(Int oldfd);
extern void __real_vgPlain_client_exit(Int status);
extern void __real_vgPlain_kill_self(Int sig);

#define BK_TOOL_VERSION 1

/* ---------------------------------------------------------------- options */

static const HChar *clo_dir = NULL;   /* recorder's directory: sock, state.<pid> */
static Bool clo_mem = True;           /* record memory references */
static Long clo_buffer = 0;           /* >0: fixed in-memory buffer of this size */
static const HChar *clo_start_sys = NULL; /* comma list of syscall numbers */
static const HChar *clo_stop_sys = NULL;
static Bool clo_stop_close = False;   /* stop at close() of the start fd */
static const HChar *clo_start_fn = NULL;
static const HChar *clo_stop_fn = NULL;
static Long clo_skip = 0;             /* open after this many instructions */
static Long clo_max = 0;              /* close after this many in the window */
static const HChar *clo_objects = NULL; /* comma list of object name parts */

static Bool bk_process_cmd_line_option(const HChar *arg)
{
   if VG_STR_CLO(arg, "--bk-dir", clo_dir) {}
   else if VG_BOOL_CLO(arg, "--bk-mem", clo_mem) {}
   else if VG_INT_CLO(arg, "--bk-buffer", clo_buffer) {}
   else if VG_STR_CLO(arg, "--bk-start-syscall", clo_start_sys) {}
   else if VG_STR_CLO(arg, "--bk-stop-syscall", clo_stop_sys) {}
   else if VG_BOOL_CLO(arg, "--bk-stop-close", clo_stop_close) {}
   else if VG_STR_CLO(arg, "--bk-start-func", clo_start_fn) {}
   else if VG_STR_CLO(arg, "--bk-stop-func", clo_stop_fn) {}
   else if VG_INT_CLO(arg, "--bk-skip", clo_skip) {}
   else if VG_INT_CLO(arg, "--bk-max", clo_max) {}
   else if VG_STR_CLO(arg, "--bk-objects", clo_objects) {}
   else return False;
   return True;
}

static void bk_print_usage(void)
{
   VG_(printf)(
"    --bk-dir=DIR              recorder directory (socket DIR/sock) [required]\n"
"    --bk-mem=no|yes           record memory references [yes]\n"
"    --bk-buffer=BYTES         hold the trace in a fixed buffer, send at exit [0: stream]\n"
"    --bk-start-syscall=N,..   open the window when syscall N returns successfully\n"
"    --bk-stop-syscall=N,..    close it when syscall N is entered\n"
"    --bk-stop-close=yes       close it at close() of the start syscall's descriptor\n"
"    --bk-start-func=NAME      open the window at entry to function NAME\n"
"    --bk-stop-func=NAME       close it at entry to function NAME\n"
"    --bk-skip=N               open the window after N instructions\n"
"    --bk-max=N                close it after N instructions inside it\n"
"    --bk-objects=A,B          record only code of objects whose name contains A or B\n"
"  Use `bunkai trace record`, which sets these.\n");
}

static void bk_print_debug_usage(void) { VG_(printf)("    (none)\n"); }

/* Is `n` one of the numbers in the comma list `list`? */
static Bool in_list(const HChar *list, Long n)
{
   if (list == NULL) return False;
   const HChar *p = list;
   while (*p) {
      Long v = 0;
      Bool any = False;
      while (*p >= '0' && *p <= '9') { v = v * 10 + (*p - '0'); p++; any = True; }
      if (any && v == n) return True;
      while (*p && *p != ',') p++;
      if (*p == ',') p++;
   }
   return False;
}

/* ------------------------------------------------------------- the output */

static Int sock_fd = -1;

static void die(const HChar *what)
{
   VG_(umsg)("bunkai trace: %s (the recorder is gone; run through `bunkai trace record`)\n", what);
   VG_(exit)(127);
}

static void write_all(const void *buf, SizeT n)
{
   const UChar *p = buf;
   while (n > 0) {
      Int k = VG_(write)(sock_fd, p, n > 0x40000000 ? 0x40000000 : (Int)n);
      if (k <= 0) die("cannot write to the recorder's socket");
      p += k;
      n -= k;
   }
}

/* Fixed-buffer mode (TURU's pinned memory area, §2.2(3)(a)). The last
   FIXED_RESERVE bytes are kept for the "buffer full" event. */
static UChar *fixed_buf = NULL;
static SizeT fixed_used = 0;
static Bool fixed_full = False;
#define FIXED_RESERVE 64

/* Sends one message (or keeps it, in fixed-buffer mode). Returns False if
   the fixed buffer has no room for it. */
static Bool send_msg(UInt kind, const UChar *payload, SizeT len)
{
   UChar h[8];
   h[0] = kind; h[1] = h[2] = h[3] = 0;
   h[4] = len & 0xff; h[5] = (len >> 8) & 0xff;
   h[6] = (len >> 16) & 0xff; h[7] = (len >> 24) & 0xff;
   if (fixed_buf != NULL && kind != BKT_CHUNK_HELLO && kind != BKT_CHUNK_BYE) {
      if (fixed_used + 8 + len + FIXED_RESERVE > (SizeT)clo_buffer) return False;
      VG_(memcpy)(fixed_buf + fixed_used, h, 8);
      VG_(memcpy)(fixed_buf + fixed_used + 8, payload, len);
      fixed_used += 8 + len;
      return True;
   }
   write_all(h, 8);
   if (len) write_all(payload, len);
   return True;
}

/* Growable byte buffers with LEB128 writers. */
typedef struct { UChar *b; SizeT n, cap; } Buf;

static void buf_grow(Buf *b, SizeT need)
{
   if (b->n + need <= b->cap) return;
   SizeT cap = b->cap ? b->cap : 4096;
   while (cap < b->n + need) cap *= 2;
   b->b = VG_(realloc)("bk.buf", b->b, cap);
   b->cap = cap;
}

static inline void put_v(Buf *b, ULong v)
{
   buf_grow(b, 10);
   UChar *p = b->b + b->n;
   while (v >= 0x80) { *p++ = (UChar)v | 0x80; v >>= 7; }
   *p++ = (UChar)v;
   b->n = p - b->b;
}

static inline void put_z(Buf *b, Long v) { put_v(b, ((ULong)v << 1) ^ (ULong)(v >> 63)); }

static void put_s(Buf *b, const HChar *s)
{
   SizeT n = s ? VG_(strlen)(s) : 0;
   put_v(b, n);
   buf_grow(b, n);
   if (n) VG_(memcpy)(b->b + b->n, s, n);
   b->n += n;
}

static Buf defs_new;   /* definitions not sent yet */
static Buf defs_all;   /* every definition, resent by a forked child */
static Buf events;     /* the EVENTS message being built */

/* Segment executions are appended as words by the helpers: a header word
   (segment id << 20 | accesses << 8 | instructions, all known when the
   segment is instrumented) and one word per access. They are encoded into
   `events` before any other event and when the buffer fills. The header
   carries the number of accesses so that the encoder reads nothing but
   the words (looking it up in the segment table cost a cache miss per
   execution; docs/trace.md, "Where the recording time goes"). */
#define W_ID_SHIFT 20
#define W_NACC(w) (((w) >> 8) & 0xfff)   /* MAX_SEG_ACC (2048) fits */
#define SEG_WORD(id, nacc, ninstr) (((HWord)(id) << W_ID_SHIFT) | ((HWord)(nacc) << 8) | (ninstr))
#define RAW_WORDS (1 << 16)
#define RAW_SLACK 8192          /* more than any one segment's words */
static ULong raw[RAW_WORDS + RAW_SLACK];
static UInt raw_n = 0;

/* Definitions are written when made (at translation) into a pool and sent
   only when first needed: a segment's when it is first recorded, an
   object's or function's when a sent segment or event names it. So a
   trace with a narrow window carries only what ran inside it. */
typedef struct { UInt off, len; Bool sent; } Def;
typedef struct { Def *v; UInt cap; } DefTab;
static Buf def_pool;
static DefTab seg_defs, obj_defs, fn_defs;

static Def *def_at(DefTab *t, UInt id)
{
   if (id >= t->cap) {
      UInt ncap = t->cap ? t->cap : 4096;
      while (ncap <= id) ncap *= 2;
      t->v = VG_(realloc)("bk.defs", t->v, ncap * sizeof(Def));
      VG_(memset)(t->v + t->cap, 0, (ncap - t->cap) * sizeof(Def));
      t->cap = ncap;
   }
   return &t->v[id];
}

/* Starts a definition in the pool; def_end records where it lies. */
static SizeT def_begin(void) { return def_pool.n; }
static void def_end(DefTab *t, UInt id, SizeT start)
{
   Def *d = def_at(t, id);
   d->off = start;
   d->len = def_pool.n - start;
   d->sent = False;
}

static void send_def(DefTab *t, UInt id)
{
   if (id == 0 || id >= t->cap) return;
   Def *d = &t->v[id];
   if (d->sent || d->len == 0) return;
   d->sent = True;
   buf_grow(&defs_new, d->len);
   VG_(memcpy)(defs_new.b + defs_new.n, def_pool.b + d->off, d->len);
   defs_new.n += d->len;
}

/* Per segment id: object and function (the lazy definitions need them). */
typedef struct { UInt obj, fn; } SegInfo;
static SegInfo *segs = NULL;
/* Per segment id: its definition has been sent (seg_defs' flag, one byte
   a segment, so that the check every execution makes stays in cache). */
static UChar *seg_sent = NULL;
static UInt seg_cap = 0, seg_next = 1;

static void seg_room(UInt id)
{
   if (id < seg_cap) return;
   UInt ncap = seg_cap ? seg_cap * 2 : 65536;
   while (ncap <= id) ncap *= 2;
   segs = VG_(realloc)("bk.seg", segs, ncap * sizeof(SegInfo));
   seg_sent = VG_(realloc)("bk.seg.sent", seg_sent, ncap);
   VG_(memset)(seg_sent + seg_cap, 0, ncap - seg_cap);
   seg_cap = ncap;
}

static void send_seg_def(UInt id)
{
   seg_sent[id] = 1;
   if (seg_defs.v[id].sent) return;
   send_def(&obj_defs, segs[id].obj);
   send_def(&fn_defs, segs[id].fn);
   send_def(&seg_defs, id);
}

static ULong enc_prev_seg = 0, enc_prev_addr = 0;
static ULong n_instr_rec = 0, n_mem_rec = 0, n_dropped = 0, n_segs_rec = 0;
static ULong n_dropped_instr = 0; /* instructions of the dropped executions */
/* The counts as of the last EVENTS message kept: in fixed-buffer mode a
   message that does not fit is dropped whole and its executions counted
   as dropped. */
static ULong ok_instr = 0, ok_mem = 0, ok_segs = 0;

/* EVENTS messages are cut at this size: large when streaming, small in
   fixed-buffer mode so that little is lost when the buffer fills. */
#define EVENTS_MSG_BYTES (1 << 20)
#define EVENTS_MSG_BYTES_FIXED (16 << 10)
static SizeT events_msg_bytes = EVENTS_MSG_BYTES;

static void send_events(void);

/* One LEB128 varint at p (room for 10 bytes is the caller's): the short
   ones, most deltas, without the loop. */
static inline UChar *vput(UChar *p, ULong v)
{
   if (v < 0x80) { p[0] = (UChar)v; return p + 1; }
   if (v < 0x4000) { p[0] = (UChar)v | 0x80; p[1] = (UChar)(v >> 7); return p + 2; }
   while (v >= 0x80) { *p++ = (UChar)v | 0x80; v >>= 7; }
   *p++ = (UChar)v;
   return p;
}

static void encode_raw(void)
{
   UInt i = 0;
   ULong prev_seg = enc_prev_seg, prev_addr = enc_prev_addr;
   while (i < raw_n) {
      ULong w = raw[i++];
      ULong id = w >> W_ID_SHIFT;
      UInt na = W_NACC(w);
      buf_grow(&events, 10 + (SizeT)na * 10);
      UChar *p = events.b + events.n;
      Long d = (Long)(id - prev_seg);
      prev_seg = id;
      p = vput(p, (((ULong)d << 1) ^ (ULong)(d >> 63)) << 1);
      for (UInt k = 0; k < na; k++) {
         ULong a = raw[i++];
         Long da = (Long)(a - prev_addr);
         prev_addr = a;
         p = vput(p, ((ULong)da << 1) ^ (ULong)(da >> 63));
      }
      events.n = p - events.b;
   }
   enc_prev_seg = prev_seg;
   enc_prev_addr = prev_addr;
   raw_n = 0;
   if (events.n >= events_msg_bytes) send_events();
}

static void buffer_full(void);
static void copy_defs_all(void);

/* Sends pending definitions, then the events built so far. */
static void send_events(void)
{
   if (raw_n) encode_raw();
   if (defs_new.n) {
      if (!fixed_full && !send_msg(BKT_CHUNK_DEFS, defs_new.b, defs_new.n)) buffer_full();
      copy_defs_all();
      defs_new.n = 0;
   }
   if (events.n) {
      if (!fixed_full && !send_msg(BKT_CHUNK_EVENTS, events.b, events.n)) buffer_full();
      if (fixed_full) {
         n_dropped += n_segs_rec - ok_segs;
         n_dropped_instr += n_instr_rec - ok_instr;
         n_instr_rec = ok_instr;
         n_mem_rec = ok_mem;
         n_segs_rec = ok_segs;
      }
      ok_instr = n_instr_rec;
      ok_mem = n_mem_rec;
      ok_segs = n_segs_rec;
      events.n = 0;
   }
   enc_prev_seg = enc_prev_addr = 0;
}

/* Starts an event record: flushes pending segment words first so that the
   order of the stream is the order of execution. */
static Buf *event(UInt tag)
{
   if (raw_n) encode_raw();
   put_v(&events, ((ULong)tag << 1) | 1);
   return &events;
}

/* ---------------------------------------------------------------- windows */

static Bool win_open = False;
static ULong icount = 0;        /* instructions executed, in or out */
static ULong win_icount = 0;    /* instructions inside the window */
static Long start_fd = -1;      /* descriptor the start syscall returned */
static Bool win_done = False;   /* the window closed for good */

/* Start conditions hold in sequence: the function is entered, then the
   syscall returns, then N more instructions run; each is armed when the
   one before it (if given) has happened. `stage` is the one armed now. */
#define STAGE_FUNC 0
#define STAGE_SYS 1
#define STAGE_COUNT 2
#define STAGE_NONE 3            /* nothing armed: open, or closed for good */
static Int stage = STAGE_NONE;
static ULong skip_left = 0;     /* STAGE_COUNT: instructions still to run */

/* How the process ends (see "the end" below). */
static Bool fini_done = False;  /* Valgrind has called the tool's fini */
static Bool exit_sent = False;  /* BYE sent */
static UInt cur_seg = 0;        /* the segment that started last */

static void emit_ctxsw(void);
static void window(Bool open, UInt reason);

/* The first stage at or after `from` whose condition was given. */
static Int next_stage(Int from)
{
   if (from <= STAGE_FUNC && clo_start_fn) return STAGE_FUNC;
   if (from <= STAGE_SYS && clo_start_sys) return STAGE_SYS;
   if (from <= STAGE_COUNT && clo_skip > 0) return STAGE_COUNT;
   return STAGE_NONE;
}

/* The armed condition happened: arm the next one, or open the window. */
static void stage_done(UInt reason)
{
   stage = next_stage(stage + 1);
   if (stage == STAGE_COUNT) skip_left = clo_skip;
   if (stage == STAGE_NONE) window(True, reason);
}

static void window(Bool open, UInt reason)
{
   if (open == win_open) return;
   if (!open) {
      Buf *b = event(BKT_EV_WINDOW);
      put_v(b, 0); put_v(b, reason); put_v(b, icount);
      emit_ctxsw();
      win_open = False;
      win_done = True;
      stage = STAGE_NONE;
   } else {
      win_open = True;
      emit_ctxsw();
      Buf *b = event(BKT_EV_WINDOW);
      put_v(b, 1); put_v(b, reason); put_v(b, icount);
   }
}

/* In fixed-buffer mode, the first message that does not fit fills the
   buffer: a "buffer full" window event goes into the reserve, and from
   then on nothing more is stored. The window stays open as far as the
   window options go, so the executions it would have recorded are counted
   as dropped (n_dropped, n_dropped_instr) until it closes. */
static void buffer_full(void)
{
   if (fixed_full) return;
   fixed_full = True;
   Buf b = {0};
   put_v(&b, ((ULong)BKT_EV_WINDOW << 1) | 1);
   put_v(&b, 0); put_v(&b, BKT_WIN_FULL); put_v(&b, icount);
   UChar h[8] = { BKT_CHUNK_EVENTS, 0, 0, 0, (UChar)b.n, 0, 0, 0 };
   if (fixed_used + 8 + b.n <= (SizeT)clo_buffer) {
      VG_(memcpy)(fixed_buf + fixed_used, h, 8);
      VG_(memcpy)(fixed_buf + fixed_used + 8, b.b, b.n);
      fixed_used += 8 + b.n;
   }
   VG_(free)(b.b);
}

/* Context switches so far, from /proc/self/status (the stand-in for the
   paper's CR3 changes). */
static void emit_ctxsw(void)
{
   HChar buf[4096];
   ULong vol = 0, invol = 0;
   SysRes r = VG_(open)("/proc/self/status", VKI_O_RDONLY, 0);
   if (!sr_isError(r)) {
      Int fd = sr_Res(r);
      Int n = VG_(read)(fd, buf, sizeof buf - 1);
      VG_(close)(fd);
      if (n > 0) {
         buf[n] = 0;
         const HChar *p = VG_(strstr)(buf, "\nvoluntary_ctxt_switches:");
         if (p) vol = VG_(strtoull10)(p + 25, NULL);
         p = VG_(strstr)(buf, "\nnonvoluntary_ctxt_switches:");
         if (p) invol = VG_(strtoull10)(p + 28, NULL);
      }
   }
   Buf *b = event(BKT_EV_CTXSW);
   put_v(b, vol);
   put_v(b, invol);
}

/* ------------------------------------------------- helpers run per segment */

/* The first helper call of a segment execution: counts its instructions,
   opens a count window, and appends the header word when recording. */
static Bool inline_seg_head(HWord w)
{
   UInt n = w & 0xff;
   icount += n;
   if (!win_open) {
      if (stage != STAGE_COUNT) return False;
      /* The window opens at the start of the segment that reaches N. */
      if (n < skip_left) { skip_left -= n; return False; }
      skip_left = 0;
      stage_done(BKT_WIN_COUNT);
   }
   if (fixed_full) { n_dropped++; n_dropped_instr += n; return False; }
   if (raw_n >= RAW_WORDS) encode_raw();
   UInt id = (UInt)(w >> W_ID_SHIFT);
   if (!seg_sent[id]) send_seg_def(id);
   win_icount += n;
   n_instr_rec += n;
   n_segs_rec++;
   raw[raw_n++] = w;
   return True;
}

/* After a segment's words are complete: close a count window. */
static inline void seg_tail(void)
{
   if (clo_max > 0 && win_open && (Long)win_icount >= clo_max) window(False, BKT_WIN_COUNT);
}

#define A(x) raw[raw_n++] = (x)
static void h_seg0(HWord w)
{ if (inline_seg_head(w)) { seg_tail(); } }
static void h_seg1(HWord w, HWord a0)
{ if (inline_seg_head(w)) { A(a0); n_mem_rec += 1; seg_tail(); } }
static void h_seg2(HWord w, HWord a0, HWord a1)
{ if (inline_seg_head(w)) { A(a0); A(a1); n_mem_rec += 2; seg_tail(); } }
static void h_seg3(HWord w, HWord a0, HWord a1, HWord a2)
{ if (inline_seg_head(w)) { A(a0); A(a1); A(a2); n_mem_rec += 3; seg_tail(); } }
static void h_seg4(HWord w, HWord a0, HWord a1, HWord a2, HWord a3)
{ if (inline_seg_head(w)) { A(a0); A(a1); A(a2); A(a3); n_mem_rec += 4; seg_tail(); } }
static void h_seg5(HWord w, HWord a0, HWord a1, HWord a2, HWord a3, HWord a4)
{ if (inline_seg_head(w)) { A(a0); A(a1); A(a2); A(a3); A(a4); n_mem_rec += 5; } }
/* Continuations for segments with five or more accesses: the head call
   (h_seg5) decided whether the segment is recorded; these follow it, and
   h_tail ends it. */
static Bool more_ok(void) { return raw_n > 0 && win_open && !fixed_full; }
static void h_more1(HWord a0)
{ if (more_ok()) { A(a0); n_mem_rec += 1; } }
static void h_more2(HWord a0, HWord a1)
{ if (more_ok()) { A(a0); A(a1); n_mem_rec += 2; } }
static void h_more3(HWord a0, HWord a1, HWord a2)
{ if (more_ok()) { A(a0); A(a1); A(a2); n_mem_rec += 3; } }
static void h_more4(HWord a0, HWord a1, HWord a2, HWord a3)
{ if (more_ok()) { A(a0); A(a1); A(a2); A(a3); n_mem_rec += 4; } }
static void h_more5(HWord a0, HWord a1, HWord a2, HWord a3, HWord a4)
{ if (more_ok()) { A(a0); A(a1); A(a2); A(a3); A(a4); n_mem_rec += 5; } }
static void h_more6(HWord a0, HWord a1, HWord a2, HWord a3, HWord a4, HWord a5)
{ if (more_ok()) { A(a0); A(a1); A(a2); A(a3); A(a4); A(a5); n_mem_rec += 6; } }
#undef A
static void h_tail(void) { seg_tail(); }

/* Is `name` (as Valgrind names a function) the function the user named?
   Symbols of shared libraries carry a version (puts@@GLIBC_2.2.5). */
static Bool same_function(const HChar *name, const HChar *want)
{
   SizeT n = VG_(strlen)(want);
   return VG_(strncmp)(name, want, n) == 0 && (name[n] == 0 || name[n] == '@');
}

/* Entry to the start or stop function. */
static void h_start_fn(void) { if (stage == STAGE_FUNC) stage_done(BKT_WIN_FUNC); }
static void h_stop_fn(void) { if (win_open) window(False, BKT_WIN_FUNC); }

/* ------------------------------------------------------ objects, functions */

typedef struct { Addr start, end; UInt id; } ObjRange;
#define MAX_OBJ_RANGES 4096
static ObjRange obj_ranges[MAX_OBJ_RANGES];
static UInt n_obj_ranges = 0, next_obj_id = 1;

/* The object (mapped file) holding `a`: defined on first use. */
static UInt object_of(Addr a)
{
   static UInt last = (UInt)-1;
   if (last < n_obj_ranges && a >= obj_ranges[last].start && a < obj_ranges[last].end)
      return obj_ranges[last].id;
   for (UInt i = 0; i < n_obj_ranges; i++)
      if (a >= obj_ranges[i].start && a < obj_ranges[i].end) { last = i; return obj_ranges[i].id; }
   NSegment const *seg = VG_(am_find_nsegment)(a);
   if (seg == NULL) return 0;
   const HChar *name = VG_(am_get_filename)(seg);
   UInt id = next_obj_id++;
   SizeT start = def_begin();
   put_v(&def_pool, BKT_DEF_OBJECT);
   put_v(&def_pool, id);
   put_s(&def_pool, name ? name : "[anon]");
   put_v(&def_pool, seg->start);
   put_v(&def_pool, seg->end + 1);
   put_v(&def_pool, name ? (ULong)seg->offset : 0);
   def_end(&obj_defs, id, start);
   if (n_obj_ranges == MAX_OBJ_RANGES) n_obj_ranges = 0; /* a cache: forget */
   obj_ranges[n_obj_ranges].start = seg->start;
   obj_ranges[n_obj_ranges].end = seg->end + 1;
   obj_ranges[n_obj_ranges].id = id;
   last = n_obj_ranges++;
   return id;
}

/* Should code at `a` be recorded (the --bk-objects filter)? */
static Bool object_wanted(Addr a)
{
   if (clo_objects == NULL) return True;
   NSegment const *seg = VG_(am_find_nsegment)(a);
   const HChar *name = seg ? VG_(am_get_filename)(seg) : NULL;
   if (name == NULL) return False;
   const HChar *p = clo_objects;
   HChar part[256];
   while (*p) {
      UInt k = 0;
      while (*p && *p != ',' && k < sizeof part - 1) part[k++] = *p++;
      part[k] = 0;
      if (*p == ',') p++;
      if (k && VG_(strstr)(name, part)) return True;
   }
   return False;
}

/* Functions: deduplicated by (object, name) in an open-addressing table. */
typedef struct { UInt hash, obj, id; HChar *name; } FnEnt;
static FnEnt *fn_tab = NULL;
static UInt fn_cap = 0, fn_n = 0, next_fn_id = 1;

static UInt str_hash(const HChar *s, UInt obj)
{
   UInt h = 2166136261u ^ obj;
   for (; *s; s++) h = (h ^ (UChar)*s) * 16777619u;
   return h ? h : 1;
}

static void fn_rehash(void)
{
   UInt ncap = fn_cap ? fn_cap * 2 : 4096;
   FnEnt *nt = VG_(calloc)("bk.fn", ncap, sizeof(FnEnt));
   for (UInt i = 0; i < fn_cap; i++) {
      if (!fn_tab[i].hash) continue;
      UInt j = fn_tab[i].hash & (ncap - 1);
      while (nt[j].hash) j = (j + 1) & (ncap - 1);
      nt[j] = fn_tab[i];
   }
   if (fn_tab) VG_(free)(fn_tab);
   fn_tab = nt;
   fn_cap = ncap;
}

static UInt function_of(Addr a, UInt obj)
{
   DiEpoch ep = VG_(current_DiEpoch)();
   const HChar *name = NULL;
   if (!VG_(get_fnname)(ep, a, &name) || name == NULL) name = "";
   UInt h = str_hash(name, obj);
   if (fn_n * 2 >= fn_cap) fn_rehash();
   UInt j = h & (fn_cap - 1);
   while (fn_tab[j].hash) {
      if (fn_tab[j].hash == h && fn_tab[j].obj == obj && VG_(strcmp)(fn_tab[j].name, name) == 0)
         return fn_tab[j].id;
      j = (j + 1) & (fn_cap - 1);
   }
   UInt id = next_fn_id++;
   fn_tab[j].hash = h;
   fn_tab[j].obj = obj;
   fn_tab[j].id = id;
   fn_tab[j].name = VG_(strdup)("bk.fn.name", name);
   fn_n++;
   const HChar *file = NULL, *dir = NULL;
   UInt line = 0;
   if (!VG_(get_filename_linenum)(ep, a, &file, &dir, &line)) { file = ""; line = 0; }
   const HChar *entry_name = NULL;
   Bool is_entry = VG_(get_fnname_if_entry)(ep, a, &entry_name);
   SizeT start = def_begin();
   put_v(&def_pool, BKT_DEF_FUNC);
   put_v(&def_pool, id);
   put_s(&def_pool, fn_tab[j].name);
   if (dir && dir[0] && file && file[0] != '/') {
      HChar *full = VG_(malloc)("bk.fn.path", VG_(strlen)(dir) + VG_(strlen)(file) + 2);
      VG_(sprintf)(full, "%s/%s", dir, file);
      put_s(&def_pool, full);
      VG_(free)(full);
   } else {
      put_s(&def_pool, file ? file : "");
   }
   put_v(&def_pool, line);
   put_v(&def_pool, is_entry ? a : 0);
   def_end(&fn_defs, id, start);
   return id;
}

/* ---------------------------------------------------------- instrumenting */

/* One access of the segment being built. */
typedef struct { UInt instr; UInt kind; UInt size; IRExpr *addr; Bool guarded; } Acc;
#define MAX_SEG_INSTR 255 /* fits the helper word's low byte */
#define MAX_SEG_ACC 2048

typedef struct {
   Addr addr[MAX_SEG_INSTR];
   UInt len[MAX_SEG_INSTR];
   UInt n_instr;
   Acc acc[MAX_SEG_ACC];
   UInt n_acc;
   /* The last event in lackey's terms: a store merges into the access
      before it ("modify") only when that is an unguarded load of the same
      size and address expression, with nothing flushed in between (lackey
      checks this before it flushes a full event buffer, so only side exits
      and instructions separate them). */
   Int last_kind;      /* -1 none, BKT_ACC_LOAD / _STORE / _MODIFY, 3 instruction */
   IRExpr *last_addr;
   UInt last_size;
   Bool last_guarded;
} SegBuild;

static SegBuild sb_cur;
static Bool seg_wanted = True;

/* Every segment starts with a store of its id to cur_seg (one host store;
   the id is known only when the segment is closed, so the constant is
   filled in then), so that a fatal signal can tell where it struck. */
static IRConst *seg_id_const = NULL;

static void seg_start_store(IRSB *out)
{
   IRConst *c = IRConst_U32(0);
   addStmtToIRSB(out, IRStmt_Store(Iend_LE, mkIRExpr_HWord((HWord)&cur_seg), IRExpr_Const(c)));
   seg_id_const = c;
}

static void seg_id_is(UInt id)
{
   if (seg_id_const) seg_id_const->Ico.U32 = id;
   seg_id_const = NULL;
}

static void seg_reset(void)
{
   sb_cur.n_instr = 0;
   sb_cur.n_acc = 0;
   sb_cur.last_kind = -1;
}

static void add_instr(Addr a, UInt len)
{
   sb_cur.last_kind = 3;
   if (sb_cur.n_instr < MAX_SEG_INSTR) {
      sb_cur.addr[sb_cur.n_instr] = a;
      sb_cur.len[sb_cur.n_instr] = len;
      sb_cur.n_instr++;
   }
}

static void add_acc(UInt kind, IRExpr *addr, UInt size, Bool guarded)
{
   if (!clo_mem || sb_cur.n_acc >= MAX_SEG_ACC) return;
   Acc *x = &sb_cur.acc[sb_cur.n_acc++];
   x->instr = sb_cur.n_instr; /* index + 1; 0: the instruction in flight */
   x->kind = kind; x->size = size; x->addr = addr; x->guarded = guarded;
   sb_cur.last_kind = kind;
   sb_cur.last_addr = addr;
   sb_cur.last_size = size;
   sb_cur.last_guarded = guarded;
}

static void add_load(IRExpr *addr, UInt size, Bool guarded)
{
   add_acc(BKT_ACC_LOAD, addr, size, guarded);
}

static void add_store(IRExpr *addr, UInt size, Bool guarded)
{
   if (clo_mem && !guarded && sb_cur.last_kind == BKT_ACC_LOAD && sb_cur.last_size == size
       && !sb_cur.last_guarded && eqIRAtom(sb_cur.last_addr, addr)) {
      sb_cur.acc[sb_cur.n_acc - 1].kind = BKT_ACC_MODIFY;
      sb_cur.last_kind = BKT_ACC_MODIFY;
      return;
   }
   add_acc(BKT_ACC_STORE, addr, size, guarded);
}

/* A guarded access records its address when the guard holds and all-ones
   (the format's "not performed") when it does not. */
static IRExpr *guarded_addr(IRSB *out, IRExpr *addr, IRExpr *guard)
{
   IRTemp t = newIRTemp(out->tyenv, Ity_I64);
   addStmtToIRSB(out, IRStmt_WrTmp(t, IRExpr_ITE(guard, addr, mkIRExpr_HWord((HWord)BKT_NOT_PERFORMED))));
   return IRExpr_RdTmp(t);
}

static void call(IRSB *out, const HChar *name, void *fn, Int regparms, IRExpr **args)
{
   IRDirty *di = unsafeIRDirty_0_N(regparms, name, VG_(fnptr_to_fnentry)(fn), args);
   addStmtToIRSB(out, IRStmt_Dirty(di));
}

static UInt end_kind(IRJumpKind jk)
{
   switch (jk) {
   case Ijk_Boring: return BKT_END_BRANCH;
   case Ijk_Call: return BKT_END_CALL;
   case Ijk_Ret: return BKT_END_RET;
   case Ijk_Sys_syscall: case Ijk_Sys_int32: case Ijk_Sys_int128:
   case Ijk_Sys_int129: case Ijk_Sys_int130: case Ijk_Sys_int145:
   case Ijk_Sys_int210: case Ijk_Sys_sysenter: return BKT_END_SYSCALL;
   default: return BKT_END_OTHER;
   }
}

/* Defines the segment built so far and emits the call(s) that record one
   execution of it. */
static void seg_close(IRSB *out, UInt endk)
{
   if (sb_cur.n_instr == 0 && sb_cur.n_acc == 0) { seg_id_is(0); return; }
   if (!seg_wanted) { seg_id_is(0); seg_reset(); return; }
   UInt id = seg_next++;
   seg_id_is(id);
   seg_room(id);

   /* Objects and functions are defined before the segment that uses them.
      Accesses made before the segment's first instruction (the rest of an
      instruction cut by a side exit, e.g. a rep loop or an alignment check)
      belong to the instruction in flight. */
   UInt obj = sb_cur.n_instr ? object_of(sb_cur.addr[0]) : 0;
   UInt fn = sb_cur.n_instr ? function_of(sb_cur.addr[0], obj) : 0;
   segs[id].obj = obj;
   segs[id].fn = fn;
   SizeT start = def_begin();
   put_v(&def_pool, BKT_DEF_SEG);
   put_v(&def_pool, id);
   put_v(&def_pool, sb_cur.n_instr);
   for (UInt i = 0; i < sb_cur.n_instr; i++) {
      put_v(&def_pool, i == 0 ? sb_cur.addr[0] : sb_cur.addr[i] - sb_cur.addr[i - 1]);
      put_v(&def_pool, sb_cur.len[i]);
      put_v(&def_pool, obj);
      put_v(&def_pool, fn);
   }
   put_v(&def_pool, sb_cur.n_acc);
   for (UInt k = 0; k < sb_cur.n_acc; k++) {
      put_v(&def_pool, sb_cur.acc[k].instr);
      put_v(&def_pool, sb_cur.acc[k].kind);
      put_v(&def_pool, sb_cur.acc[k].size);
   }
   put_v(&def_pool, endk);
   def_end(&seg_defs, id, start);

   HWord w = SEG_WORD(id, sb_cur.n_acc, sb_cur.n_instr);
   IRExpr *wE = mkIRExpr_HWord(w);
   IRExpr *a[MAX_SEG_ACC];
   for (UInt k = 0; k < sb_cur.n_acc; k++) a[k] = sb_cur.acc[k].addr;
   UInt n = sb_cur.n_acc;
   switch (n < 5 ? n : 5) {
   case 0: call(out, "h_seg0", h_seg0, 0, mkIRExprVec_1(wE)); break;
   case 1: call(out, "h_seg1", h_seg1, 0, mkIRExprVec_2(wE, a[0])); break;
   case 2: call(out, "h_seg2", h_seg2, 0, mkIRExprVec_3(wE, a[0], a[1])); break;
   case 3: call(out, "h_seg3", h_seg3, 0, mkIRExprVec_4(wE, a[0], a[1], a[2])); break;
   case 4: call(out, "h_seg4", h_seg4, 0, mkIRExprVec_5(wE, a[0], a[1], a[2], a[3])); break;
   default: call(out, "h_seg5", h_seg5, 0, mkIRExprVec_6(wE, a[0], a[1], a[2], a[3], a[4])); break;
   }
   if (n >= 5) {
      UInt k = 5;
      while (k < n) {
         UInt m = n - k > 6 ? 6 : n - k;
         IRExpr **v;
         switch (m) {
         case 1: call(out, "h_more1", h_more1, 0, mkIRExprVec_1(a[k])); break;
         case 2: call(out, "h_more2", h_more2, 0, mkIRExprVec_2(a[k], a[k + 1])); break;
         case 3: call(out, "h_more3", h_more3, 0, mkIRExprVec_3(a[k], a[k + 1], a[k + 2])); break;
         case 4: call(out, "h_more4", h_more4, 0, mkIRExprVec_4(a[k], a[k + 1], a[k + 2], a[k + 3])); break;
         case 5: call(out, "h_more5", h_more5, 0, mkIRExprVec_5(a[k], a[k + 1], a[k + 2], a[k + 3], a[k + 4])); break;
         default:
            v = mkIRExprVec_6(a[k], a[k + 1], a[k + 2], a[k + 3], a[k + 4], a[k + 5]);
            call(out, "h_more6", h_more6, 0, v);
            break;
         }
         k += m;
      }
      call(out, "h_tail", h_tail, 0, mkIRExprVec_0());
   }
   seg_reset();
}

static IRSB *bk_instrument(VgCallbackClosure *closure, IRSB *in, const VexGuestLayout *layout,
                           const VexGuestExtents *vge, const VexArchInfo *archinfo_host,
                           IRType gWordTy, IRType hWordTy)
{
   if (gWordTy != hWordTy) VG_(tool_panic)("host/guest word size mismatch");
   IRSB *out = deepCopyIRSBExceptStmts(in);
   Int i = 0;
   while (i < in->stmts_used && in->stmts[i]->tag != Ist_IMark) {
      addStmtToIRSB(out, in->stmts[i]);
      i++;
   }
   seg_reset();
   seg_start_store(out);
   Addr first = (i < in->stmts_used) ? (Addr)in->stmts[i]->Ist.IMark.addr : 0;
   seg_wanted = object_wanted(first);
   if (seg_wanted && (clo_start_fn || clo_stop_fn) && i < in->stmts_used) {
      const HChar *name = NULL;
      DiEpoch ep = VG_(current_DiEpoch)();
      if (VG_(get_fnname_if_entry)(ep, first, &name) && name) {
         if (clo_start_fn && same_function(name, clo_start_fn))
            call(out, "h_start_fn", h_start_fn, 0, mkIRExprVec_0());
         if (clo_stop_fn && same_function(name, clo_stop_fn))
            call(out, "h_stop_fn", h_stop_fn, 0, mkIRExprVec_0());
      }
   }
   IRTypeEnv *tyenv = in->tyenv;
   for (; i < in->stmts_used; i++) {
      IRStmt *st = in->stmts[i];
      if (!st || st->tag == Ist_NoOp) continue;
      switch (st->tag) {
      case Ist_IMark:
         add_instr((Addr)st->Ist.IMark.addr, st->Ist.IMark.len);
         addStmtToIRSB(out, st);
         break;
      case Ist_WrTmp: {
         IRExpr *d = st->Ist.WrTmp.data;
         if (d->tag == Iex_Load) add_load(d->Iex.Load.addr, sizeofIRType(d->Iex.Load.ty), False);
         addStmtToIRSB(out, st);
         break;
      }
      case Ist_Store: {
         IRType ty = typeOfIRExpr(tyenv, st->Ist.Store.data);
         add_store(st->Ist.Store.addr, sizeofIRType(ty), False);
         addStmtToIRSB(out, st);
         break;
      }
      case Ist_StoreG: {
         IRStoreG *sg = st->Ist.StoreG.details;
         IRType ty = typeOfIRExpr(tyenv, sg->data);
         if (clo_mem) add_store(guarded_addr(out, sg->addr, sg->guard), sizeofIRType(ty), True);
         addStmtToIRSB(out, st);
         break;
      }
      case Ist_LoadG: {
         IRLoadG *lg = st->Ist.LoadG.details;
         IRType ty = Ity_INVALID, ty_wide = Ity_INVALID;
         typeOfIRLoadGOp(lg->cvt, &ty_wide, &ty);
         if (clo_mem) add_load(guarded_addr(out, lg->addr, lg->guard), sizeofIRType(ty), True);
         addStmtToIRSB(out, st);
         break;
      }
      case Ist_Dirty: {
         IRDirty *d = st->Ist.Dirty.details;
         if (d->mFx != Ifx_None) {
            if (d->mFx == Ifx_Read || d->mFx == Ifx_Modify) add_load(d->mAddr, d->mSize, False);
            if (d->mFx == Ifx_Write || d->mFx == Ifx_Modify) add_store(d->mAddr, d->mSize, False);
         }
         addStmtToIRSB(out, st);
         break;
      }
      case Ist_CAS: {
         IRCAS *cas = st->Ist.CAS.details;
         UInt size = sizeofIRType(typeOfIRExpr(tyenv, cas->dataLo));
         if (cas->dataHi != NULL) size *= 2;
         add_load(cas->addr, size, False);
         add_store(cas->addr, size, False);
         addStmtToIRSB(out, st);
         break;
      }
      case Ist_LLSC: {
         if (st->Ist.LLSC.storedata == NULL)
            add_load(st->Ist.LLSC.addr, sizeofIRType(typeOfIRTemp(tyenv, st->Ist.LLSC.result)), False);
         else
            add_store(st->Ist.LLSC.addr, sizeofIRType(typeOfIRExpr(tyenv, st->Ist.LLSC.storedata)), False);
         addStmtToIRSB(out, st);
         break;
      }
      case Ist_Exit:
         seg_close(out, end_kind(st->Ist.Exit.jk));
         addStmtToIRSB(out, st);
         seg_start_store(out);
         break;
      default:
         addStmtToIRSB(out, st);
         break;
      }
   }
   seg_close(out, end_kind(in->jumpkind));
   return out;
}

/* ---------------------------------------------------------------- syscalls */

static ULong now_ns(void)
{
   struct vki_timespec ts;
   SysRes r = VG_(do_syscall)(__NR_clock_gettime, VKI_CLOCK_MONOTONIC, (RegWord)&ts, 0, 0, 0, 0, 0, 0);
   if (sr_isError(r)) return 0;
   return (ULong)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

#define MAX_TIDS 4096   /* Valgrind's --max-threads is far below this */
static ULong sys_start[MAX_TIDS];
static Bool sys_in_window[MAX_TIDS];
static UInt cur_tid = 1;

static void write_state_file(void);
static void remove_state_file(void);
static void flush_all(void);

/* Syscalls that may wait indefinitely: a process is often killed while it
   waits in one, so what it holds is sent before it enters one. */
static Bool may_block(UInt sysno)
{
   switch (sysno) {
   case __NR_read: case __NR_readv: case __NR_recvfrom: case __NR_recvmsg:
   case __NR_nanosleep: case __NR_clock_nanosleep: case __NR_pause:
   case __NR_rt_sigsuspend: case __NR_rt_sigtimedwait: case __NR_wait4:
   case __NR_waitid: case __NR_poll: case __NR_ppoll: case __NR_select:
   case __NR_pselect6: case __NR_epoll_wait: case __NR_epoll_pwait:
   case __NR_accept: case __NR_accept4: case __NR_connect: case __NR_msgrcv:
   case __NR_semop: case __NR_semtimedop: case __NR_flock: case __NR_futex:
      return True;
   default:
      return False;
   }
}

/* Streaming mode: what the tool holds (at most one EVENTS message, 1 MiB)
   is lost if the process is killed. It is sent before a syscall that may
   block if 10 ms have passed since the last send, and before any syscall
   after 200 ms, so a killed process loses at most what it ran since. */
#define FLUSH_BLOCKING_NS 10000000ull
#define FLUSH_ANY_NS 200000000ull
static ULong last_flush_ns = 0;

static void bk_pre_syscall(ThreadId tid, UInt sysno, UWord *args, UInt nArgs)
{
   if (tid >= MAX_TIDS) return;
   if (fixed_buf == NULL && (raw_n || events.n || defs_new.n)) {
      ULong t = now_ns();
      if (t - last_flush_ns >= (may_block(sysno) ? FLUSH_BLOCKING_NS : FLUSH_ANY_NS)) {
         send_events();
         last_flush_ns = t;
      }
   }
   /* The start syscall itself is inside the window (the paper's window
      starts while httpd waits in accept()); so is the stop syscall. */
   sys_in_window[tid] = win_open || (stage == STAGE_SYS && in_list(clo_start_sys, sysno));
   if (sysno == __NR_execve || sysno == __NR_execveat) {
      /* This image ends here if the exec succeeds: hand the window state to
         the next one (same pid) and flush everything we hold. The EXEC
         event goes in a message of its own, the last of the stream, by
         which the recorder tells an exec from a kill. */
      send_events();
      Buf *b = event(BKT_EV_EXEC);
      HChar path[4096];
      path[0] = 0;
      const HChar *p = (const HChar *)args[sysno == __NR_execve ? 0 : 1];
      if (p && VG_(am_is_valid_for_client)((Addr)p, 1, VKI_PROT_READ)) {
         UInt k = 0;
         while (k < sizeof path - 1 && VG_(am_is_valid_for_client)((Addr)p + k, 1, VKI_PROT_READ) && p[k]) {
            path[k] = p[k];
            k++;
         }
         path[k] = 0;
      }
      put_s(b, path);
      write_state_file();
      flush_all();
   }
   sys_start[tid] = now_ns();
}

static void bk_post_syscall(ThreadId tid, UInt sysno, UWord *args, UInt nArgs, SysRes res)
{
   if (tid >= MAX_TIDS) return;
   ULong end = now_ns();
   Bool err = sr_isError(res);
   Long result = err ? -(Long)sr_Err(res) : (Long)sr_Res(res);
   if (sysno == __NR_execve || sysno == __NR_execveat) remove_state_file(); /* it failed */
   if (sys_in_window[tid] && !fixed_full) {
      if (tid != cur_tid) {
         Buf *t = event(BKT_EV_THREAD);
         put_v(t, tid);
         cur_tid = tid;
      }
      Buf *b = event(BKT_EV_SYSCALL);
      put_v(b, tid);
      put_v(b, sysno);
      put_v(b, nArgs);
      for (UInt i = 0; i < nArgs; i++) put_v(b, args[i]);
      put_z(b, result);
      put_v(b, sys_start[tid]);
      put_v(b, end - sys_start[tid]);
   }
   if (!err && (sysno == __NR_clone || sysno == __NR_fork || sysno == __NR_vfork || sysno == __NR_clone3)
       && result > 0) {
      Bool thread = sysno == __NR_clone && (args[0] & VKI_CLONE_THREAD);
      if (!thread) {
         Buf *b = event(BKT_EV_FORK);
         put_v(b, result);
      }
   }
   if (!err && sysno == __NR_arch_prctl && (args[0] == 0x1002 || args[0] == 0x1001)) {
      Buf *b = event(BKT_EV_TLS);
      put_v(b, tid);
      put_v(b, args[0] == 0x1002 ? 0 : 1);
      put_v(b, args[1]);
   }
   /* Windows: open after the start syscall returns successfully, close
      after the stop syscall (or the close() of the start descriptor). */
   if (stage == STAGE_SYS && !err && in_list(clo_start_sys, sysno)) {
      start_fd = result;
      stage_done(BKT_WIN_SYSCALL);
   } else if (win_open && in_list(clo_stop_sys, sysno)) {
      window(False, BKT_WIN_SYSCALL);
   } else if (win_open && clo_stop_close && sysno == __NR_close && (Long)args[0] == start_fd) {
      window(False, BKT_WIN_CLOSE_FD);
   }
}

/* ---------------------------------------------- threads, signals, memory */

static void bk_start_client_code(ThreadId tid, ULong blocks)
{
   if (tid != cur_tid) {
      cur_tid = tid;
      Buf *b = event(BKT_EV_THREAD);
      put_v(b, tid);
   }
}

static void bk_thread_create(ThreadId parent, ThreadId child)
{
   Buf *b = event(BKT_EV_THREAD_NEW);
   put_v(b, parent);
   put_v(b, child);
}

static void bk_thread_exit(ThreadId tid)
{
   Buf *b = event(BKT_EV_THREAD_EXIT);
   put_v(b, tid);
}

static void bk_signal(ThreadId tid, Int sig, Bool alt)
{
   if (!win_open) return;
   Buf *b = event(BKT_EV_SIGNAL);
   put_v(b, tid);
   put_v(b, sig);
}

static UInt prot_of(Bool r, Bool w, Bool x)
{
   return (r ? VKI_PROT_READ : 0) | (w ? VKI_PROT_WRITE : 0) | (x ? VKI_PROT_EXEC : 0);
}

static void bk_mmap(Addr a, SizeT len, Bool r, Bool w, Bool x, ULong di)
{
   UInt obj = 0;
   NSegment const *seg = VG_(am_find_nsegment)(a);
   if (seg && VG_(am_get_filename)(seg)) obj = object_of(a);
   send_def(&obj_defs, obj);
   Buf *b = event(BKT_EV_MMAP);
   put_v(b, a);
   put_v(b, len);
   put_v(b, prot_of(r, w, x));
   put_v(b, obj);
}

static void bk_munmap(Addr a, SizeT len)
{
   /* Forget cached object ranges that the unmapping touches. */
   for (UInt i = 0; i < n_obj_ranges; i++)
      if (obj_ranges[i].start < a + len && a < obj_ranges[i].end) obj_ranges[i].end = obj_ranges[i].start;
   Buf *b = event(BKT_EV_MUNMAP);
   put_v(b, a);
   put_v(b, len);
}

static void bk_mprotect(Addr a, SizeT len, Bool r, Bool w, Bool x)
{
   Buf *b = event(BKT_EV_MPROTECT);
   put_v(b, a);
   put_v(b, len);
   put_v(b, prot_of(r, w, x));
}

static void bk_brk_grow(Addr a, SizeT len, ThreadId tid)
{
   Buf *b = event(BKT_EV_BRK);
   put_v(b, a); put_v(b, len); put_v(b, 1);
}

static void bk_brk_shrink(Addr a, SizeT len)
{
   Buf *b = event(BKT_EV_BRK);
   put_v(b, a); put_v(b, len); put_v(b, 0);
}

/* --------------------------------------------- connection, fork and exec */

static void state_path(HChar *out, Int pid)
{
   VG_(sprintf)(out, "%s/state.%d", clo_dir, pid);
}

/* Before an exec: the next image (same pid) starts with our window state. */
static void write_state_file(void)
{
   HChar path[4200], txt[64];
   state_path(path, VG_(getpid)());
   SysRes r = VG_(open)(path, VKI_O_WRONLY | VKI_O_CREAT | VKI_O_TRUNC, 0600);
   if (sr_isError(r)) return;
   Int fd = sr_Res(r);
   VG_(sprintf)(txt, "%d %d %d %llu\n", win_open ? 1 : 0, win_done ? 1 : 0, stage, skip_left);
   VG_(write)(fd, txt, VG_(strlen)(txt));
   VG_(close)(fd);
}

static void remove_state_file(void)
{
   HChar path[4200];
   state_path(path, VG_(getpid)());
   VG_(unlink)(path);
}

/* After an exec: the state the previous image left, if any. */
static void read_state_file(void)
{
   HChar path[4200], txt[64];
   state_path(path, VG_(getpid)());
   SysRes r = VG_(open)(path, VKI_O_RDONLY, 0);
   if (sr_isError(r)) return;
   Int fd = sr_Res(r);
   Int n = VG_(read)(fd, txt, sizeof txt - 1);
   VG_(close)(fd);
   VG_(unlink)(path);
   if (n >= 7) {
      txt[n] = 0;
      win_open = txt[0] == '1';
      win_done = txt[2] == '1';
      stage = txt[4] - '0';
      if (stage < STAGE_FUNC || stage > STAGE_NONE) stage = STAGE_NONE;
      skip_left = VG_(strtoull10)(txt + 6, NULL);
   }
}

static void connect_recorder(void)
{
   struct vki_sockaddr_un sa;
   VG_(memset)(&sa, 0, sizeof sa);
   sa.sun_family = VKI_AF_UNIX;
   if (VG_(strlen)(clo_dir) + 6 >= sizeof sa.sun_path) die("--bk-dir is too long for a socket path");
   VG_(sprintf)(sa.sun_path, "%s/sock", clo_dir);
   Int fd = VG_(socket)(VKI_AF_UNIX, VKI_SOCK_STREAM, 0);
   if (fd < 0) die("cannot create a socket");
   SysRes r = VG_(do_syscall)(__NR_connect, fd, (RegWord)&sa, sizeof sa, 0, 0, 0, 0, 0);
   if (sr_isError(r)) die("cannot connect to the recorder's socket");
   sock_fd = VG_(safe_fd)(fd);
}

static void send_hello(void)
{
   Buf b = {0};
   put_v(&b, VG_(getpid)());
   put_v(&b, VG_(getppid)());
   put_v(&b, BK_TOOL_VERSION);
   put_s(&b, VG_(args_the_exename));
   Int n = VG_(sizeXA)(VG_(args_for_client));
   put_v(&b, n + 1);
   put_s(&b, VG_(args_the_exename));
   for (Int i = 0; i < n; i++) put_s(&b, *(HChar **)VG_(indexXA)(VG_(args_for_client), i));
   put_v(&b, win_open ? 1 : 0);
   put_v(&b, (clo_mem ? BKT_F_MEM : 0) | (clo_buffer > 0 ? BKT_F_BUFFERED : 0));
   send_msg(BKT_CHUNK_HELLO, b.b, b.n);
   VG_(free)(b.b);
}

/* Sends everything held: fixed-buffer contents too (before an exec). */
static void flush_all(void)
{
   send_events();
   if (fixed_buf != NULL && fixed_used) {
      write_all(fixed_buf, fixed_used);
      fixed_used = 0;
   }
}

static void copy_defs_all(void)
{
   buf_grow(&defs_all, defs_new.n);
   VG_(memcpy)(defs_all.b + defs_all.n, defs_new.b, defs_new.n);
   defs_all.n += defs_new.n;
}

/* Before a fork: everything so far belongs to the parent's stream (in
   fixed-buffer mode it stays in the parent's buffer). */
static void atfork_pre(ThreadId tid)
{
   send_events();
}

static void atfork_parent(ThreadId tid) {}

/* The child of a fork is a new stream: it reconnects, says hello and
   resends every definition (it inherited the translations). */
static void atfork_child(ThreadId tid)
{
   /* The parent's buffers are the parent's (reset before anything is
      kept: in buffer mode the definitions below go into the buffer). */
   events.n = 0;
   raw_n = 0;
   enc_prev_seg = enc_prev_addr = 0;
   n_instr_rec = n_mem_rec = n_dropped = n_segs_rec = n_dropped_instr = 0;
   exit_sent = False;
   last_flush_ns = now_ns();
   ok_instr = ok_mem = ok_segs = 0;
   fixed_used = 0;
   fixed_full = False;
   VG_(close)(sock_fd);
   connect_recorder();
   send_hello();
   if (defs_all.n && !send_msg(BKT_CHUNK_DEFS, defs_all.b, defs_all.n)) buffer_full();
   /* The connection belongs to the parent: a child closing its copy of the
      descriptor (as every fork-exec does) does not end the window. */
   start_fd = -1;
   if (win_open) emit_ctxsw();
}

/* ---------------------------------------------------------------- set-up */

static void bk_post_clo_init(void)
{
   if (clo_dir == NULL) {
      VG_(umsg)("bunkai trace: the tool needs --bk-dir (run it through `bunkai trace record`)\n");
      VG_(exit)(2);
   }
   /* Open from the start unless some start condition was given. */
   stage = next_stage(STAGE_FUNC);
   if (stage == STAGE_COUNT) skip_left = clo_skip;
   win_open = stage == STAGE_NONE;
   read_state_file();
   if (clo_buffer > 0) {
      fixed_buf = VG_(malloc)("bk.fixed", clo_buffer);
      events_msg_bytes = EVENTS_MSG_BYTES_FIXED;
   }
   connect_recorder();
   send_hello();
   if (win_open) emit_ctxsw();
   VG_(atfork)(atfork_pre, atfork_parent, atfork_child);
}

/* ------------------------------------------------------------ the end */

/* Valgrind calls the tool's fini with 0 whatever the process does, then
   ends the process with VG_(client_exit)(status) or, after a fatal signal,
   VG_(kill_self)(signal). The tool wraps both (the link passes --wrap), so
   the BYE, sent from the wrappers, carries the real status. The fini only
   sends what is held, in case neither wrapper runs (the stream then ends
   without BYE and the recorder marks it cut). */

static void bk_fini(Int exitcode_always_0)
{
   send_events();
   fini_done = True;
}

/* A fatal signal struck inside the segment that started last (cur_seg, set
   by a store at the start of every segment): the instructions it ran up
   to the one the signal struck (the guest IP; exact for a fault at a
   memory access) are recorded as a segment of their own. */
static void record_cut_segment(Addr ip)
{
   UInt id = cur_seg;
   if (id == 0 || id >= seg_next || id >= seg_defs.cap || seg_defs.v[id].len == 0) return;
   Def *d = &seg_defs.v[id];
   const UChar *p = def_pool.b + d->off, *end = p + d->len;
#define GETV(x) do { ULong v_ = 0; UInt sh_ = 0; \
      while (p < end) { UChar c_ = *p++; v_ |= (ULong)(c_ & 0x7f) << sh_; sh_ += 7; if (!(c_ & 0x80)) break; } \
      (x) = v_; } while (0)
   ULong tag, sid, n, a = 0, dist, len, unused;
   GETV(tag); GETV(sid); GETV(n);
   if (tag != BKT_DEF_SEG || sid != id || n == 0) return;
   Addr addr[MAX_SEG_INSTR];
   UInt lens[MAX_SEG_INSTR];
   UInt k = 0, hit = 0;
   for (; k < n && k < MAX_SEG_INSTR; k++) {
      GETV(dist); GETV(len); GETV(unused); GETV(unused);
      a = k == 0 ? dist : a + dist;
      addr[k] = a;
      lens[k] = len;
      if (a == ip) { hit = k + 1; break; }
   }
(void)unused;
#undef GETV
   if (hit == 0) return; /* the signal struck after the segment had ended */
   UInt pid = seg_next++;
   seg_room(pid);
   segs[pid].obj = segs[id].obj;
   segs[pid].fn = segs[id].fn;
   SizeT start = def_begin();
   put_v(&def_pool, BKT_DEF_SEG);
   put_v(&def_pool, pid);
   put_v(&def_pool, hit);
   for (UInt i = 0; i < hit; i++) {
      put_v(&def_pool, i == 0 ? addr[0] : addr[i] - addr[i - 1]);
      put_v(&def_pool, lens[i]);
      put_v(&def_pool, segs[id].obj);
      put_v(&def_pool, segs[id].fn);
   }
   put_v(&def_pool, 0);
   put_v(&def_pool, BKT_END_FATAL);
   def_end(&seg_defs, pid, start);
   if (inline_seg_head(SEG_WORD(pid, 0, hit))) seg_tail();
}

/* The last messages of the stream: the window's end, then BYE. */
static void send_end(ULong status, Int sig)
{
   if (exit_sent || sock_fd < 0) return;
   exit_sent = True;
   if (sig != 0) {
      ThreadId tid = VG_(get_running_tid)();
      Addr ip = (tid > 0 && tid < MAX_TIDS) ? VG_(get_IP)(tid) : 0;
      if (ip) record_cut_segment(ip);
      Buf *b = event(BKT_EV_FATAL);
      put_v(b, tid);
      put_v(b, sig);
      put_v(b, ip);
   }
   if (win_open) {
      Buf *b = event(BKT_EV_WINDOW);
      put_v(b, 0); put_v(b, BKT_WIN_EXIT); put_v(b, icount);
      emit_ctxsw();
   }
   flush_all();
   Buf b = {0};
   put_v(&b, n_instr_rec);
   put_v(&b, n_mem_rec);
   put_v(&b, n_dropped);
   put_v(&b, status & 0xff);
   put_v(&b, (ULong)sig);
   put_v(&b, n_dropped_instr);
   send_msg(BKT_CHUNK_BYE, b.b, b.n);
   VG_(free)(b.b);
   VG_(close)(sock_fd);
   sock_fd = -1;
}

void __wrap_vgPlain_client_exit(Int status);
void __wrap_vgPlain_client_exit(Int status)
{
   if (fini_done) send_end((ULong)(UInt)status, 0);
   __real_vgPlain_client_exit(status);
}

void __wrap_vgPlain_kill_self(Int sig);
void __wrap_vgPlain_kill_self(Int sig)
{
   if (fini_done) send_end(0, sig);
   __real_vgPlain_kill_self(sig);
}

static void bk_pre_clo_init(void)
{
   VG_(details_name)("bunkai-trace");
   VG_(details_version)("1");
   VG_(details_description)("the TURU instruction tracer of bunkai");
   VG_(details_copyright_author)("bunkai authors");
   VG_(details_bug_reports_to)("the bunkai repository");
   VG_(details_avg_translation_sizeB)(400);
   VG_(basic_tool_funcs)(bk_post_clo_init, bk_instrument, bk_fini);
   VG_(needs_command_line_options)(bk_process_cmd_line_option, bk_print_usage, bk_print_debug_usage);
   VG_(needs_syscall_wrapper)(bk_pre_syscall, bk_post_syscall);
   VG_(track_start_client_code)(bk_start_client_code);
   VG_(track_pre_thread_ll_create)(bk_thread_create);
   VG_(track_pre_thread_ll_exit)(bk_thread_exit);
   VG_(track_pre_deliver_signal)(bk_signal);
   VG_(track_new_mem_startup)(bk_mmap);
   VG_(track_new_mem_mmap)(bk_mmap);
   VG_(track_die_mem_munmap)(bk_munmap);
   VG_(track_change_mem_mprotect)(bk_mprotect);
   VG_(track_new_mem_brk)(bk_brk_grow);
   VG_(track_die_mem_brk)(bk_brk_shrink);
   /* Superblocks end at every jump, so calls and returns end segments. */
   VG_(clo_vex_control).guest_chase = False;
}

VG_DETERMINE_INTERFACE_VERSION(bk_pre_clo_init)
