/* bk_qemu.h: what the files of bunkai's QEMU TCG plugin share (the
 * full-system recorder behind `bunkai trace record --system`).
 *
 * Rules for the plugin's files:
 *  - Plain C11 against QEMU 7.2's plugin API (version 1: no registers, no
 *    guest memory reads); everything it learns comes from the addresses of
 *    the instructions and memory accesses it sees.
 *  - Everything it sends follows trace/include/bunkai_trace.h (the same
 *    messages as the Valgrind tool's), over the recorder's Unix socket.
 *  - One vCPU (the recorder boots the guest with -smp 1): the state is
 *    global and unlocked.
 *  - One concept per file: bk_plugin.c (install, translation, execution),
 *    bk_out.c (buffers and the socket), bk_ksyms.c (kernel symbols and
 *    watch points), bk_task.c (tasks, syscalls and the window),
 *    bk_objects.c (objects: the kernel, user code, the server's maps).
 *  - Names: bk_ for the plugin's own functions and types, BK_ for its
 *    constants; only qemu_plugin_install and qemu_plugin_version are
 *    exported.
 */
#ifndef BK_QEMU_H
#define BK_QEMU_H

#include <stddef.h>
#include <stdint.h>

/* Kernel code is in the upper canonical half. */
#define BK_KERNEL_BASE 0xffff800000000000ull
/* Kernel stacks are THREAD_SIZE (16 KiB) and aligned to it: a stack
 * address masked with this names the task whose stack it is. */
#define BK_STACK_MASK (~0x3fffull)

/* ---- bk_out.c: growable byte buffers, varints, the socket ---- */
typedef struct {
    uint8_t *p;
    size_t n, cap;
} bk_buf;

void bk_put_v(bk_buf *b, uint64_t v);
void bk_put_z(bk_buf *b, int64_t v);
void bk_put_s(bk_buf *b, const char *s);
void bk_put_bytes(bk_buf *b, const void *p, size_t n);

extern bk_buf bk_defs;   /* DEFS records not yet sent */
extern bk_buf bk_events; /* the EVENTS message being filled */
extern uint64_t bk_prev_seg, bk_prev_addr; /* reset per EVENTS message */
/* What the next BKT_DEF_SEGP is packed against: the DEFS message's
 * previous one (segment id, first address, object, function); reset per
 * DEFS message. */
typedef struct {
    uint64_t id, first, obj, func;
} bk_packed;
extern bk_packed bk_pk;

int bk_out_connect(const char *path);
void bk_out_send(int kind, const bk_buf *b);
void bk_out_flush(void); /* DEFS, then EVENTS */
void bk_out_close(void);
uint64_t bk_now_ns(void);

/* ---- bk_ksyms.c: kernel symbols (System.map) and watch points ---- */
int bk_ksyms_load(const char *path);
uint64_t bk_ksym_func(uint64_t addr); /* func id (defined on first use), 0 none */
uint64_t bk_ksym_addr(const char *name); /* 0 if absent */

/* Watch kinds: a point fires when its first instruction executes; a range
 * applies to every instruction in [start, end). */
enum {
    BK_W_SYSENTRY = 'a', /* point: syscall entry, after the stack switch */
    BK_W_SYSCALL = 's',  /* point: the syscall's handler (value: number) */
    BK_W_PUSHES = 'e',   /* range: pushes there write the task's stack */
    BK_W_POPS = 'w',     /* range: pops there read the next task's stack */
    BK_W_EXC = 'x',      /* point: an exception's entry stub */
    BK_W_IRQ = 'i',      /* point: an interrupt's entry stub */
    BK_W_MM = 'm',       /* point: an address-space switch */
    BK_W_SOCKCLOSE = 'k' /* point: a socket's file is released */
};
typedef struct {
    uint64_t start, end;
    int kind;
    uint64_t value;
} bk_watch;
int bk_watch_load(const char *path);
const bk_watch *bk_watch_find(uint64_t addr);

/* ---- bk_task.c: tasks, syscalls, the window ---- */
typedef struct {
    uint64_t stack;
    uint32_t tid;       /* small number, in order of first sight */
    int32_t sys;        /* syscall in progress (-1 none) */
    int sock_closed;    /* a socket was released during it */
} bk_task;

extern bk_task *bk_cur;    /* the task running */
extern int bk_rec;         /* recording (inside the window) */
extern bk_task *bk_win_task;
extern uint64_t bk_instr, bk_memrefs, bk_syscalls, bk_traps, bk_asids;
/* count=on: the window is followed, nothing recorded; bk_instr is then
 * the inline counter's advance across the window. */
extern int bk_count_only;
uint64_t bk_plugin_icount(void); /* instructions begun since arming */

void bk_task_set(uint64_t stack_addr);
void bk_task_watch(const bk_watch *w);
/* The first user-mode block after kernel code: opens or closes the window
 * (returns 1 if it closed it). */
int bk_task_return_to_user(void);
void bk_task_init(const char *maps_path, unsigned skip);
void bk_task_window(int start_sys, int stop_sys, const char *exe);
void bk_task_end(void);

/* ---- bk_objects.c: object ids of instructions ---- */
#define BK_OBJ_KERNEL 1
#define BK_OBJ_USER 2
void bk_objects_define_base(void);
uint64_t bk_objects_load_maps(const char *path); /* returns the server's pid */
uint64_t bk_object_of(uint64_t addr, int server);

/* ---- bk_plugin.c ---- */
void bk_plugin_finish_block(void);
void bk_plugin_poll_arm(void); /* at interrupts: are the maps there yet? */

#endif
