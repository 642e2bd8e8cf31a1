/* bk_task.c: tasks, syscalls and the recording window, all from control
 * flow (QEMU 7.2's plugin API reads no registers).
 *
 * A task is named by its kernel stack: the pushes of the syscall entry
 * (after its switch to the task's stack) and the pops that end
 * __switch_to_asm (on the next task's stack) tell which task runs. The
 * syscall in progress is the handler (__x64_sys_*) reached after the entry.
 * Interrupts and exceptions are counted at their entry stubs, address-space
 * switches at switch_mm_irqs_off (which loads CR3).
 *
 * The window, as TURU's (seed 001, §3.1): it opens at the first user-mode
 * block after an accept/accept4 returns (the server's, the only acceptor in
 * the guest), and closes when the same task returns to user mode from a
 * close() during which a socket was released (sock_close: the accepted
 * connection; the server's other closes release files, not sockets).
 * With start=N,stop=M (syscall numbers) the window is instead a program's
 * own: from the return of the first syscall N to the same task's return
 * from syscall M.
 * Everything the CPU runs in between is recorded, whatever the task:
 * interrupts, softirqs, other processes (a CGI child). One window per run.
 *
 * Rules: see bk_qemu.h.
 */
#include "bk_qemu.h"
#include "bunkai_trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BK_NTASKS 8192 /* open addressing, power of two */

bk_task *bk_cur;
int bk_rec;
bk_task *bk_win_task;
uint64_t bk_instr, bk_memrefs, bk_syscalls, bk_traps, bk_asids;

static bk_task bk_tasks[BK_NTASKS];
static uint32_t bk_ntids;
static int bk_win_done;
static const char *bk_maps_path;
static uint64_t bk_last_tid;
static uint64_t bk_open_ns; /* host CLOCK_MONOTONIC when the window opened */
static uint64_t bk_open_icount; /* bk_plugin_icount() then (count=on) */
static unsigned bk_skip;    /* windows to let pass unrecorded (warm-up) */
static int bk_start_sys = -1, bk_stop_sys = -1; /* a window on these instead */
static const char *bk_exe = "/usr/sbin/apache2";
static int bk_skipping;     /* inside one of them */

static bk_task *bk_task_get(uint64_t stack)
{
    uint64_t h = (stack >> 14) * 0x9E3779B97F4A7C15ull;
    for (uint32_t i = 0; i < BK_NTASKS; i++) {
        bk_task *t = &bk_tasks[(h + i) & (BK_NTASKS - 1)];
        if (t->stack == stack)
            return t;
        if (t->stack == 0) {
            t->stack = stack;
            t->tid = ++bk_ntids;
            t->sys = -1;
            return t;
        }
    }
    return &bk_tasks[0]; /* full: all further tasks share one slot */
}

static void bk_ev(uint64_t ev)
{
    bk_put_v(&bk_events, (ev << 1) | 1);
}

static void bk_thread_event(void)
{
    if (bk_rec && bk_cur && bk_cur->tid != bk_last_tid) {
        bk_ev(BKT_EV_THREAD);
        bk_put_v(&bk_events, bk_cur->tid);
        bk_last_tid = bk_cur->tid;
    }
}

void bk_task_set(uint64_t stack_addr)
{
    uint64_t s = stack_addr & BK_STACK_MASK;
    if (bk_cur && bk_cur->stack == s)
        return;
    bk_cur = bk_task_get(s);
    bk_thread_event();
}

void bk_task_watch(const bk_watch *w)
{
    uint32_t tid = bk_cur ? bk_cur->tid : 0;
    switch (w->kind) {
    case BK_W_SYSENTRY:
        if (bk_cur) {
            bk_cur->sys = -1;
            bk_cur->sock_closed = 0;
        }
        break;
    case BK_W_SYSCALL:
        if (bk_cur)
            bk_cur->sys = (int32_t)w->value;
        if (bk_rec) {
            bk_ev(BKT_EV_SYSCALL);
            bk_put_v(&bk_events, tid);
            bk_put_v(&bk_events, w->value);
            bk_put_v(&bk_events, 0); /* arguments: not readable */
            bk_put_z(&bk_events, 0); /* result: not readable */
            bk_put_v(&bk_events, bk_now_ns());
            bk_put_v(&bk_events, 0);
            bk_syscalls++;
        }
        break;
    case BK_W_EXC:
    case BK_W_IRQ:
        if (w->kind == BK_W_IRQ)
            bk_plugin_poll_arm();
        if (bk_rec) {
            bk_ev(BKT_EV_TRAP);
            bk_put_v(&bk_events, tid);
            bk_put_v(&bk_events, w->kind == BK_W_EXC ? BKT_TRAP_EXCEPTION : BKT_TRAP_INTERRUPT);
            bk_put_v(&bk_events, bk_ksym_func(w->start));
            bk_traps++;
        }
        break;
    case BK_W_MM:
        if (bk_rec) {
            bk_ev(BKT_EV_ASID);
            bk_put_v(&bk_events, tid);
            bk_asids++;
        }
        break;
    case BK_W_SOCKCLOSE:
        if (bk_cur)
            bk_cur->sock_closed = 1;
        break;
    }
}

static void bk_hello(uint64_t pid)
{
    bk_buf h = {0};
    bk_put_v(&h, pid);
    bk_put_v(&h, 0);
    bk_put_v(&h, 1); /* tool version */
    bk_put_s(&h, bk_exe);
    bk_put_v(&h, 0);
    bk_put_v(&h, 0); /* the window opens by an event */
    bk_put_v(&h, BKT_F_MEM | BKT_F_SYSTEM);
    bk_out_send(BKT_CHUNK_HELLO, &h);
    free(h.p);
}

static void bk_window_event(int open, uint64_t reason)
{
    bk_ev(BKT_EV_WINDOW);
    bk_put_v(&bk_events, open);
    bk_put_v(&bk_events, reason);
    bk_put_v(&bk_events, bk_instr);
}

/* Opens the window in task t: HELLO with the traced process's maps, the
 * objects, the window event, the thread. */
static void bk_open_window(bk_task *t)
{
    uint64_t pid = bk_objects_load_maps(bk_maps_path);
    bk_hello(pid);
    bk_objects_define_base();
    bk_win_task = t;
    bk_rec = 1;
    bk_open_ns = bk_now_ns();
    bk_open_icount = bk_plugin_icount();
    bk_last_tid = 0;
    bk_window_event(1, BKT_WIN_SYSCALL);
    bk_thread_event();
}

int bk_task_return_to_user(void)
{
    bk_task *t = bk_cur;
    if (!t)
        return 0;
    int closed = 0;
    if (bk_start_sys >= 0) {
        /* The window on a program's own syscalls: from the return of the
         * first start syscall to the same task's return from the stop one. */
        if (!bk_rec && !bk_win_done && t->sys == bk_start_sys) {
            bk_open_window(t);
        } else if (bk_rec && t == bk_win_task && t->sys == bk_stop_sys) {
            bk_window_event(0, BKT_WIN_SYSCALL);
            bk_task_end();
            closed = 1;
        }
        t->sys = -1;
        return closed;
    }
    if (!bk_rec && !bk_win_done && !bk_skipping && bk_skip > 0 && (t->sys == 43 || t->sys == 288)) {
        bk_skipping = 1; /* a warm-up request: the same window, not recorded */
        bk_win_task = t;
    } else if (bk_skipping && t == bk_win_task && t->sys == 3 && t->sock_closed) {
        bk_skipping = 0;
        bk_skip--;
    } else if (!bk_rec && !bk_win_done && !bk_skipping && (t->sys == 43 || t->sys == 288)) {
        bk_open_window(t);
    } else if (bk_rec && t == bk_win_task && t->sys == 3 && t->sock_closed) {
        bk_window_event(0, BKT_WIN_CLOSE_FD);
        bk_task_end();
        closed = 1;
    }
    t->sys = -1;
    return closed;
}

void bk_task_window(int start_sys, int stop_sys, const char *exe)
{
    bk_start_sys = start_sys;
    bk_stop_sys = stop_sys;
    if (exe)
        bk_exe = exe;
}

void bk_task_init(const char *maps_path, unsigned skip)
{
    bk_maps_path = maps_path;
    bk_skip = skip;
}

void bk_task_end(void)
{
    if (!bk_rec)
        return;
    bk_rec = 0;
    bk_win_done = 1;
    if (bk_count_only)
        bk_instr = bk_plugin_icount() - bk_open_icount;
    /* The window's host times, for the recorder's throughput figure. */
    if (bk_maps_path) {
        char p[4096];
        snprintf(p, sizeof p, "%s.window", bk_maps_path);
        FILE *f = fopen(p, "w");
        if (f) {
            fprintf(f, "%llu %llu %llu\n", (unsigned long long)bk_open_ns, (unsigned long long)bk_now_ns(),
                    (unsigned long long)bk_instr);
            fclose(f);
        }
    }
    bk_out_flush();
    bk_buf b = {0};
    bk_put_v(&b, bk_instr);
    bk_put_v(&b, bk_memrefs);
    bk_put_v(&b, 0);
    bk_put_v(&b, 0);
    bk_put_v(&b, 0);
    bk_put_v(&b, 0);
    bk_out_send(BKT_CHUNK_BYE, &b);
    free(b.p);
    bk_out_close();
}
