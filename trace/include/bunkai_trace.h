/* bunkai_trace.h: the trace format shared by the recorder (the Valgrind tool
 * in trace/tool/, which writes records) and the reader (trace/src/, which
 * writes the file and analyses it). Version BKT_VERSION; any change to the
 * layout below bumps it, and the reader refuses other versions.
 *
 * Rules: plain C, no libc types (the tool is built without libc), all
 * integers little-endian.
 *
 * ---------------------------------------------------------------------------
 * 1. The file (written by `bunkai trace record`, never by the tool)
 *
 *   header   "BKTRACE\0"  u32 version  u32 meta_len  meta_len bytes of JSON
 *            (command line, options, start time, tool version)  u32 crc32
 *            of the JSON
 *   chunk*   "BKCH" u8 kind  u8 codec  u16 zero  u32 stream  u32 raw_len
 *            u32 stored_len  u32 crc32(bytes 4..20 of this header, then
 *            the stored bytes)                                 = 24 bytes
 *            then stored_len bytes; codec 0 = stored as is, 1 = zstd frame
 *   end      "BKEN" u32 nchunks  u64 raw_bytes  u32 crc32(the 16 bytes
 *            before it)                                        = 20 bytes
 *
 * A file without its end record is truncated; the reader names the offset
 * where the damage starts. Chunk kinds (BKT_CHUNK_*) are those of the socket
 * messages below, plus BKT_CHUNK_CUT, which only the recorder writes; the
 * recorder numbers streams (one per process image: a fork or an exec starts
 * a new stream) in connection order from 1.
 *
 * CUT (the recorder, at most one per stream, instead of a BYE): the stream
 * ended without BYE: v reason (BKT_CUT_*), v bytes of a message the process
 * did not finish sending (dropped), v signal that ended the process (0 when
 * the recorder does not know it: it only waits for the command itself).
 * A stream that exec'd also ends without BYE, and without CUT: its last
 * message is an EVENTS message holding only its BKT_EV_EXEC event.
 *
 * Version 1 files (no CUT chunks, a BYE of four fields) are still read;
 * version 2 files are version 3 without its system-mode additions
 * (BKT_F_SYSTEM, BKT_EV_TRAP, BKT_EV_ASID).
 *
 * System mode (`record --system`, the QEMU plugin in trace/qemu/): one
 * stream for the whole machine inside the window. Its HELLO names the
 * traced server; THREAD events name kernel tasks (small numbers, in order
 * of first sight, not pids); SYSCALL events carry no arguments, result or
 * duration (the plugin cannot read registers); segments are QEMU's
 * translated blocks, as far as they ran.
 *
 * Sample (`xxd`, a trace of /bin/true, cut):
 *   00000000: 424b 5452 4143 4500 0100 0000 5b00 0000  BKTRACE.....[...
 *   00000010: 7b22 636f 6d6d 616e 6422 3a5b 222f 6269  {"command":["/bi
 *   ...       424b 4348 0300 0000 0100 0000 3a00 0000  BKCH........:...
 *
 * ---------------------------------------------------------------------------
 * 2. The socket protocol (tool -> recorder, a Unix stream socket)
 *
 * Each traced process image connects to the recorder's socket and sends
 * messages: u8 kind, u8 zero, u16 zero, u32 len, then len bytes. The first
 * message is BKT_CHUNK_HELLO; then DEFS and EVENTS messages in any order
 * (a definition is always sent before the first EVENTS message that uses
 * it); the last is BKT_CHUNK_BYE. A stream without BYE ended abnormally
 * (killed, or it exec'd: then its last event is BKT_EV_EXEC).
 *
 * Every payload is a sequence of LEB128 varints ("v"), zigzag varints for
 * signed values ("z") and strings ("s": v length, then the bytes).
 *
 * HELLO:  v pid, v ppid, v tool_version, s executable, v nargs, s argv...,
 *         v window_open (1 if recording starts open, e.g. after an exec
 *         inside an open window), v flags (BKT_F_*)
 * BYE:    v instructions, v memory references, v dropped (buffer mode: how
 *         many segment executions did not fit), v exit status (the argument
 *         of exit_group, as the parent's wait() sees it in its low 8 bits),
 *         v fatal signal (0: the process exited), v dropped instructions
 *         (buffer mode: the instructions of the dropped executions)
 *
 * DEFS, each record starting with v tag:
 *   BKT_DEF_OBJECT  v id, s name (path of the mapped file, or "[anon]"),
 *                   v map_start, v map_end, v file_offset
 *   BKT_DEF_FUNC    v id, s name ("" when unknown), s source file (""),
 *                   v line (0), v entry address (0 when unknown)
 *   BKT_DEF_SEG     v id, v n_instr, then per instruction: v address (the
 *                   first absolute, the rest as v distance from the previous
 *                   instruction's address), v length, v object id, v func id;
 *                   then v n_acc, per access: v instruction (1-based index
 *                   into this segment's instructions, non-decreasing; 0 =
 *                   the instruction in flight, see below), v kind
 *                   (BKT_ACC_*), v size in bytes; then v end (BKT_END_*).
 *   BKT_DEF_SEGP    (version 4; the QEMU plugin writes it) the same
 *                   segment, packed. What it leaves out is carried from the
 *                   DEFS message's previous SEGP (all zero at the start of
 *                   every DEFS message): z id - (previous id + 1), v n_instr,
 *                   z first address - previous first address; per
 *                   instruction v w = length << 3 | jump << 2 | obj << 1 |
 *                   func, then z (address - (previous instruction's address
 *                   + its length)) if jump (never on the first), v object id
 *                   if obj, v func id if func (without the bit, the previous
 *                   instruction's, across segments); v n_acc, per access
 *                   v (instruction - previous access's instruction) << 5 |
 *                   kind << 3 | size code (0-6: 1 << code bytes;
 *                   BKT_SEGP_SIZE_FOLLOWS: v size follows); then v end.
 *
 * A segment is a straight run of guest instructions ending at a side exit
 * or at the end of a Valgrind superblock. If a side exit is not taken, the
 * next segment of the same superblock (id + 1) executes next.
 *
 * A side exit can sit inside an instruction (a rep prefix's loop test, an
 * alignment check): the accesses that instruction makes after the exit open
 * the next segment, with instruction number 0, meaning the last instruction
 * of the segment executed just before (the "instruction in flight"). Such
 * a segment may have no instructions of its own.
 *
 * EVENTS: a sequence of records. Each starts with v h:
 *   h even: one execution of segment (prev_seg + unzigzag(h >> 1)), then
 *           one z per access of that segment: address - prev_addr; the
 *           address becomes prev_addr. An address of all ones (BKT_NOT_PERFORMED)
 *           is a guarded access whose guard was false: it did not happen. prev_seg and prev_addr are 0 at the
 *           start of every EVENTS message, so messages decode independently.
 *   h odd:  event (h >> 1) = BKT_EV_*, fields as listed below.
 *
 * The thread of a segment execution is the one named by the last
 * BKT_EV_THREAD (1 until then).
 */
#ifndef BUNKAI_TRACE_H
#define BUNKAI_TRACE_H

#define BKT_VERSION 4

#define BKT_FILE_MAGIC "BKTRACE\0"
#define BKT_CHUNK_MAGIC "BKCH"
#define BKT_END_MAGIC "BKEN"

/* Chunk and message kinds. */
#define BKT_CHUNK_HELLO 1
#define BKT_CHUNK_DEFS 2
#define BKT_CHUNK_EVENTS 3
#define BKT_CHUNK_BYE 4
#define BKT_CHUNK_CUT 5    /* written by the recorder only, see above */

/* Why a stream was cut (CUT chunk). */
#define BKT_CUT_PARTIAL 1  /* closed inside a message (the process was killed) */
#define BKT_CUT_CLOSED 2   /* closed between messages without BYE (killed) */
#define BKT_CUT_RUNNING 3  /* still running when the recording ended */

/* HELLO flags. */
#define BKT_F_MEM 1        /* memory references recorded */
#define BKT_F_BUFFERED 2   /* fixed in-memory buffer mode */
#define BKT_F_SYSTEM 4     /* full system (the QEMU plugin, version 3): the
                              stream is the whole machine inside the window;
                              object "[kernel]" is the kernel, "[user]" user
                              code outside the traced server's maps */

/* Definition tags. */
#define BKT_DEF_OBJECT 1
#define BKT_DEF_FUNC 2
#define BKT_DEF_SEG 3
#define BKT_DEF_SEGP 4
#define BKT_SEGP_SIZE_FOLLOWS 7

/* Access kinds, as Valgrind's lackey names them. */
#define BKT_ACC_LOAD 0   /* L */
#define BKT_ACC_STORE 1  /* S */
#define BKT_ACC_MODIFY 2 /* M: a load and a store of the same address */

/* The address of a guarded access that did not happen. */
#define BKT_NOT_PERFORMED 0xffffffffffffffffull

/* How a segment ends. */
#define BKT_END_BRANCH 0  /* side exit or plain jump */
#define BKT_END_CALL 1
#define BKT_END_RET 2
#define BKT_END_SYSCALL 3
#define BKT_END_OTHER 4   /* signal return, client request, yield, ... */
#define BKT_END_FATAL 5   /* cut by a fatal signal: its last instruction
                             began and was struck (BKT_EV_FATAL follows) */

/* Events (fields after the tag). Times are CLOCK_MONOTONIC nanoseconds. */
#define BKT_EV_SYSCALL 1  /* v tid, v sysno, v nargs, v args..., z result,
                             v start_ns, v duration_ns */
#define BKT_EV_SIGNAL 2   /* v tid, v signo */
#define BKT_EV_THREAD 3   /* v tid: this thread runs from here on */
#define BKT_EV_MMAP 4     /* v addr, v len, v prot, v object id (0: anon) */
#define BKT_EV_MUNMAP 5   /* v addr, v len */
#define BKT_EV_MPROTECT 6 /* v addr, v len, v prot */
#define BKT_EV_BRK 7      /* v addr, v len, v grow (1) or shrink (0) */
#define BKT_EV_EXEC 8     /* s path: this image is about to be replaced */
#define BKT_EV_FORK 9     /* v child pid */
#define BKT_EV_WINDOW 10  /* v open (1/0), v reason (BKT_WIN_*),
                             v instructions executed so far (in or out) */
#define BKT_EV_TLS 11     /* v tid, v which (0 fs, 1 gs), v base */
#define BKT_EV_THREAD_NEW 12  /* v parent tid, v child tid */
#define BKT_EV_THREAD_EXIT 13 /* v tid */
#define BKT_EV_CTXSW 14   /* v voluntary, v involuntary: context switches of
                             this process so far (/proc/self/status) */
#define BKT_EV_FATAL 15   /* v tid, v signo, v address of the instruction it
                             struck (0 unknown): the process ends by this
                             signal (a segment cut by it was recorded before,
                             as far as it ran, as a segment of its own) */

#define BKT_EV_TRAP 16    /* v tid, v kind (BKT_TRAP_*), v func id of its
                             entry stub (system mode, version 3) */
#define BKT_EV_ASID 17    /* v tid: an address-space switch (CR3 load, at
                             switch_mm_irqs_off; system mode, version 3) */

/* Kinds of BKT_EV_TRAP. */
#define BKT_TRAP_INTERRUPT 1 /* asm_common_interrupt, asm_sysvec_* */
#define BKT_TRAP_EXCEPTION 2 /* asm_exc_* (page faults among them) */

/* Why a window opened or closed. */
#define BKT_WIN_START 0    /* recording starts open */
#define BKT_WIN_SYSCALL 1  /* the start/stop syscall */
#define BKT_WIN_FUNC 2     /* entry to the start/stop function */
#define BKT_WIN_COUNT 3    /* after N instructions */
#define BKT_WIN_CLOSE_FD 4 /* close() of the descriptor the start syscall returned */
#define BKT_WIN_FULL 5     /* buffer mode: the buffer is full */
#define BKT_WIN_EXIT 6     /* the process ends */

#endif
