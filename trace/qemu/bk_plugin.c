/* bk_plugin.c: bunkai's QEMU TCG plugin: install, translation, execution.
 * `bunkai trace record --system` loads it into qemu-system-x86_64 as
 *   -plugin bunkai-qemu.so,arg=sock=S,arg=ksyms=F,arg=watch=W,arg=maps=M[,arg=mem=off][,arg=skip=N][,arg=count=on]
 * (skip: let N windows pass unrecorded, the recorder's warm-up requests;
 * start=N,stop=M[,exe=PATH]: a window on a program's own syscalls;
 * count=on: follow the window and count its instructions, record nothing,
 * for QEMU's own speed through it, the baseline of the record throughput)
 *
 * How it records: a translated block (TB) is the unit, as a Valgrind
 * superblock's segment is for the Valgrind tool. Each instruction adds 1 to
 * a counter inline (no call), each memory access calls bk_mem, and each
 * block execution calls bk_exec, which closes the block that ran before:
 * the counter says how many of its instructions ran (fewer than the block
 * holds when an exception cut it: the faulting instruction did not
 * complete and is left out), the accesses say what they touched. A block's
 * (instructions run, accesses' kinds and sizes, whose code) is a segment
 * (BKT_DEF_SEG), defined once per variant; each execution is one record of
 * the segment id and the accesses' address deltas, as the Valgrind tool
 * writes them, so every reader of the format reads it.
 *
 * Kernel work is recognized by address (upper half); watch points (see
 * bk_ksyms.c, bk_task.c) give tasks, syscalls, interrupts, exceptions,
 * address-space switches and the window.
 *
 * Rules: see bk_qemu.h.
 */
#include "bk_qemu.h"
#include "bunkai_trace.h"

#include <qemu-plugin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#define BK_MAXACC 8192

typedef struct bk_var {
    struct bk_var *next;
    uint32_t n_insn, n_acc, cls;
    uint64_t seg;
    uint32_t *meta;
} bk_var;

typedef struct {
    uint32_t n;
    uint8_t kernel;
    uint64_t *addr;
    uint8_t *len;
    uint8_t *endk; /* BKT_END_* if the segment ends at this instruction */
    bk_var *vars;
} bk_tb;

static uint64_t bk_icount;       /* instructions begun, added inline */
static bk_tb *bk_cur_tb;         /* the block running */
static uint64_t bk_tb_icount0;   /* bk_icount when it began */
static uint64_t bk_acc_addr[BK_MAXACC];
static uint32_t bk_acc_meta[BK_MAXACC]; /* (insn + 1) << 8 | store << 4 | size shift */
static uint32_t bk_nacc;
static uint64_t bk_acc_lost;
static uint64_t bk_acc_stale; /* reported by a faulted instruction's callbacks */
static uint64_t bk_next_seg;
static int bk_prev_kernel;
static int bk_mem_on = 1;
int bk_count_only;
static bk_buf bk_seg;
/* Armed: the recorder has written the server's maps, the request comes
 * next. Until then blocks get only the watch points (the boot runs at
 * nearly plain TCG speed); arming flushes every block (qemu_plugin_reset)
 * and instruments them all from there on. */
static int bk_armed, bk_arming;
static qemu_plugin_id_t bk_id;
static const char *bk_maps;

/* How an instruction ends a segment, from its bytes. */
static uint8_t bk_end_kind(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n && (p[i] == 0x66 || p[i] == 0x67 || p[i] == 0xf2 || p[i] == 0xf3 || p[i] == 0x2e ||
                     p[i] == 0x3e || p[i] == 0x26 || p[i] == 0x64 || p[i] == 0x65 || p[i] == 0x36 ||
                     (p[i] >= 0x40 && p[i] <= 0x4f)))
        i++;
    if (i >= n)
        return BKT_END_BRANCH;
    uint8_t op = p[i];
    if (op == 0xe8)
        return BKT_END_CALL;
    if (op == 0xff && i + 1 < n) {
        int reg = (p[i + 1] >> 3) & 7;
        if (reg == 2 || reg == 3)
            return BKT_END_CALL;
    }
    if (op == 0xc3 || op == 0xc2)
        return BKT_END_RET;
    if (op == 0x0f && i + 1 < n && p[i + 1] == 0x05)
        return BKT_END_SYSCALL;
    if (op == 0xcf || op == 0xcb || op == 0xca || (op == 0x0f && i + 1 < n && p[i + 1] == 0x07))
        return BKT_END_OTHER;
    return BKT_END_BRANCH;
}

/* 1 push, 2 pop, 0 neither. */
static int bk_push_pop(const uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n && (p[i] == 0x66 || (p[i] >= 0x40 && p[i] <= 0x4f) || p[i] == 0x65))
        i++;
    if (i >= n)
        return 0;
    uint8_t op = p[i];
    if ((op >= 0x50 && op <= 0x57) || op == 0x68 || op == 0x6a)
        return 1;
    if (op >= 0x58 && op <= 0x5f)
        return 2;
    if (op == 0xff && i + 1 < n && ((p[i + 1] >> 3) & 7) == 6)
        return 1;
    if (op == 0x8f)
        return 2;
    return 0;
}

uint64_t bk_plugin_icount(void)
{
    return bk_icount;
}

/* Closes the block that ran: its segment (defined if new), its record. */
void bk_plugin_finish_block(void)
{
    bk_tb *t = bk_cur_tb;
    bk_cur_tb = NULL;
    if (!t || !bk_rec || bk_count_only)
        return;
    uint64_t ran = bk_icount - bk_tb_icount0;
    uint32_t n = ran >= t->n ? t->n : (ran ? (uint32_t)ran - 1 : 0);
    uint32_t na = bk_nacc;
    while (na > 0 && (bk_acc_meta[na - 1] >> 8) > n)
        na--;
    if (n == 0 && na == 0)
        return;
    int server = !t->kernel && bk_cur == bk_win_task;
    uint32_t cls = t->kernel ? 0 : server ? 1 : 2;
    bk_var *v = t->vars;
    for (; v; v = v->next)
        if (v->n_insn == n && v->cls == cls && v->n_acc == na &&
            memcmp(v->meta, bk_acc_meta, na * sizeof(uint32_t)) == 0)
            break;
    if (!v) {
        v = calloc(1, sizeof *v);
        v->meta = malloc(na * sizeof(uint32_t) + 1);
        if (!v || !v->meta)
            abort();
        memcpy(v->meta, bk_acc_meta, na * sizeof(uint32_t));
        v->n_insn = n;
        v->n_acc = na;
        v->cls = cls;
        v->seg = ++bk_next_seg;
        v->next = t->vars;
        t->vars = v;
        /* Objects and functions are defined (into bk_defs) before the
         * segment. The segment is packed (BKT_DEF_SEGP) against the DEFS
         * message's previous one: a block's instructions follow each
         * other, so only their lengths travel, and its object and
         * function only where they change. */
        bk_seg.n = 0;
        bk_put_v(&bk_seg, BKT_DEF_SEGP);
        bk_put_z(&bk_seg, (int64_t)(v->seg - (bk_pk.id + 1)));
        bk_put_v(&bk_seg, n);
        uint64_t first = n ? t->addr[0] : bk_pk.first;
        bk_put_z(&bk_seg, (int64_t)(first - bk_pk.first));
        for (uint32_t i = 0; i < n; i++) {
            uint64_t obj = bk_object_of(t->addr[i], server);
            uint64_t fn = t->kernel ? bk_ksym_func(t->addr[i]) : 0;
            uint64_t next = i ? t->addr[i - 1] + t->len[i - 1] : first;
            uint64_t w = (uint64_t)t->len[i] << 3 | (uint64_t)(t->addr[i] != next) << 2 |
                         (uint64_t)(obj != bk_pk.obj) << 1 | (uint64_t)(fn != bk_pk.func);
            bk_put_v(&bk_seg, w);
            if (w & 4)
                bk_put_z(&bk_seg, (int64_t)(t->addr[i] - next));
            if (w & 2)
                bk_put_v(&bk_seg, bk_pk.obj = obj);
            if (w & 1)
                bk_put_v(&bk_seg, bk_pk.func = fn);
        }
        bk_put_v(&bk_seg, na);
        uint32_t prev = 0;
        for (uint32_t k = 0; k < na; k++) {
            uint32_t m = bk_acc_meta[k], shift = m & 15;
            uint64_t code = shift <= 6 ? shift : BKT_SEGP_SIZE_FOLLOWS;
            uint64_t kind = (m >> 4) & 1 ? BKT_ACC_STORE : BKT_ACC_LOAD;
            bk_put_v(&bk_seg, (uint64_t)((m >> 8) - prev) << 5 | kind << 3 | code);
            if (code == BKT_SEGP_SIZE_FOLLOWS)
                bk_put_v(&bk_seg, 1ull << shift);
            prev = m >> 8;
        }
        bk_put_v(&bk_seg, n < t->n || n == 0 ? BKT_END_OTHER : t->endk[n - 1]);
        bk_pk.id = v->seg;
        bk_pk.first = first;
        bk_put_bytes(&bk_defs, bk_seg.p, bk_seg.n);
    }
    int64_t d = (int64_t)(v->seg - bk_prev_seg);
    bk_put_v(&bk_events, (((uint64_t)d << 1) ^ (uint64_t)(d >> 63)) << 1);
    bk_prev_seg = v->seg;
    for (uint32_t k = 0; k < na; k++) {
        bk_put_z(&bk_events, (int64_t)(bk_acc_addr[k] - bk_prev_addr));
        bk_prev_addr = bk_acc_addr[k];
    }
    bk_instr += n;
    bk_memrefs += na;
    if (bk_events.n > (1u << 20))
        bk_out_flush();
}

static void bk_exec(unsigned int vcpu, void *ud)
{
    bk_tb *t = ud;
    bk_plugin_finish_block();
    bk_cur_tb = t;
    bk_tb_icount0 = bk_icount;
    bk_nacc = 0;
    if (!t->kernel && bk_prev_kernel && bk_task_return_to_user())
        bk_cur_tb = NULL;
    bk_prev_kernel = t->kernel;
}

static void bk_mem(unsigned int vcpu, qemu_plugin_meminfo_t info, uint64_t vaddr, void *ud)
{
    if (!bk_rec)
        return;
    /* Only accesses of the instruction running: QEMU 7.2 leaves an
     * instruction's callbacks armed when it faults, and then reports the
     * CPU's own stores of the exception frame through them. */
    if (bk_icount - bk_tb_icount0 != (uintptr_t)ud + 1) {
        bk_acc_stale++;
        return;
    }
    if (bk_nacc == BK_MAXACC) {
        bk_acc_lost++;
        return;
    }
    bk_acc_addr[bk_nacc] = vaddr;
    bk_acc_meta[bk_nacc++] = (uint32_t)(((uintptr_t)ud + 1) << 8) |
                             ((uint32_t)qemu_plugin_mem_is_store(info) << 4) |
                             qemu_plugin_mem_size_shift(info);
}

/* A push's store or a pop's load (ud 1 or 2): the stack is the task's.
 * Filtered here by kind: the instruction's other access (pushq of a
 * memory operand loads it) comes through the same callback. */
static void bk_stack_access(unsigned int vcpu, qemu_plugin_meminfo_t info, uint64_t vaddr, void *ud)
{
    int store = qemu_plugin_mem_is_store(info);
    if (vaddr >= BK_KERNEL_BASE && (vaddr & 7) == 0 && store == ((uintptr_t)ud == 1))
        bk_task_set(vaddr);
}

static void bk_watch_hit(unsigned int vcpu, void *ud)
{
    bk_task_watch(ud);
}

static void bk_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    size_t n = qemu_plugin_tb_n_insns(tb);
    bk_tb *t = calloc(1, sizeof *t);
    t->n = (uint32_t)n;
    t->addr = malloc((n + 1) * sizeof *t->addr);
    t->len = malloc(n + 1);
    t->endk = malloc(n + 1);
    if (!t || !t->addr || !t->len || !t->endk)
        abort();
    t->kernel = qemu_plugin_tb_vaddr(tb) >= BK_KERNEL_BASE;
    if (!bk_armed && !t->kernel) {
        free(t->addr);
        free(t->len);
        free(t->endk);
        free(t);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        uint64_t a = qemu_plugin_insn_vaddr(insn);
        size_t len = qemu_plugin_insn_size(insn);
        const uint8_t *data = qemu_plugin_insn_data(insn);
        t->addr[i] = a;
        t->len[i] = (uint8_t)len;
        t->endk[i] = bk_end_kind(data, len);
        if (bk_armed)
            qemu_plugin_register_vcpu_insn_exec_inline(insn, QEMU_PLUGIN_INLINE_ADD_U64, &bk_icount, 1);
        if (bk_mem_on && bk_armed && !bk_count_only)
            qemu_plugin_register_vcpu_mem_cb(insn, bk_mem, QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_MEM_RW,
                                             (void *)(uintptr_t)i);
        if (!t->kernel)
            continue;
        const bk_watch *w = bk_watch_find(a);
        if (!w)
            continue;
        if (w->kind == BK_W_PUSHES && bk_push_pop(data, len) == 1)
            qemu_plugin_register_vcpu_mem_cb(insn, bk_stack_access, QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_MEM_RW,
                                             (void *)(uintptr_t)1);
        else if (w->kind == BK_W_POPS && bk_push_pop(data, len) == 2)
            qemu_plugin_register_vcpu_mem_cb(insn, bk_stack_access, QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_MEM_RW,
                                             (void *)(uintptr_t)2);
        else if (w->kind != BK_W_PUSHES && w->kind != BK_W_POPS && w->start == a)
            qemu_plugin_register_vcpu_insn_exec_cb(insn, bk_watch_hit, QEMU_PLUGIN_CB_NO_REGS, (void *)w);
    }
    if (bk_armed)
        qemu_plugin_register_vcpu_tb_exec_cb(tb, bk_exec, QEMU_PLUGIN_CB_NO_REGS, t);
    else {
        free(t->addr);
        free(t->len);
        free(t->endk);
        free(t);
    }
}

static void bk_atexit(qemu_plugin_id_t id, void *ud);

/* After the flush: instrument everything, and tell the recorder (a file
 * beside the maps) that the request may come. */
static void bk_rearmed(qemu_plugin_id_t id)
{
    bk_armed = 1;
    qemu_plugin_register_vcpu_tb_trans_cb(id, bk_trans);
    qemu_plugin_register_atexit_cb(id, bk_atexit, NULL);
    char p[4096];
    snprintf(p, sizeof p, "%s.armed", bk_maps);
    FILE *f = fopen(p, "w");
    if (f)
        fclose(f);
}

void bk_plugin_poll_arm(void)
{
    if (bk_armed || bk_arming || !bk_maps || access(bk_maps, R_OK) != 0)
        return;
    bk_arming = 1;
    qemu_plugin_reset(bk_id, bk_rearmed);
}

static void bk_atexit(qemu_plugin_id_t id, void *ud)
{
    /* A window still open: send what was recorded, without BYE (the
     * recorder marks the stream cut). */
    if (bk_rec) {
        bk_plugin_finish_block();
        bk_out_flush();
        bk_out_close();
    }
    if (bk_acc_lost) {
        char m[128];
        snprintf(m, sizeof m, "bunkai-qemu: %llu memory accesses not recorded (over %d in one block)\n",
                 (unsigned long long)bk_acc_lost, BK_MAXACC);
        qemu_plugin_outs(m);
    }
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv)
{
    const char *sock = NULL, *ksyms = NULL, *watch = NULL, *maps = NULL;
    unsigned skip = 0;
    int start_sys = -1, stop_sys = -1;
    const char *exe = NULL;
    for (int i = 0; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq) {
            fprintf(stderr, "bunkai-qemu: argument %s is not KEY=VALUE\n", argv[i]);
            return -1;
        }
        *eq = 0;
        const char *k = argv[i], *v = eq + 1;
        if (!strcmp(k, "sock"))
            sock = v;
        else if (!strcmp(k, "ksyms"))
            ksyms = v;
        else if (!strcmp(k, "watch"))
            watch = v;
        else if (!strcmp(k, "maps"))
            maps = v;
        else if (!strcmp(k, "start"))
            start_sys = atoi(v);
        else if (!strcmp(k, "stop"))
            stop_sys = atoi(v);
        else if (!strcmp(k, "exe"))
            exe = v;
        else if (!strcmp(k, "skip"))
            skip = (unsigned)strtoul(v, NULL, 10);
        else if (!strcmp(k, "mem"))
            bk_mem_on = strcmp(v, "off") != 0;
        else if (!strcmp(k, "count"))
            bk_count_only = strcmp(v, "on") == 0;
        else {
            fprintf(stderr, "bunkai-qemu: unknown argument %s\n", k);
            return -1;
        }
    }
    if (!info->system_emulation || strcmp(info->target_name, "x86_64") != 0) {
        fprintf(stderr, "bunkai-qemu: needs qemu-system-x86_64\n");
        return -1;
    }
    if (info->system.smp_vcpus != 1) {
        fprintf(stderr, "bunkai-qemu: needs one vCPU (-smp 1)\n");
        return -1;
    }
    if (!sock || !ksyms || !watch) {
        fprintf(stderr, "bunkai-qemu: needs sock=, ksyms= and watch=\n");
        return -1;
    }
    if (bk_ksyms_load(ksyms) < 0) {
        fprintf(stderr, "bunkai-qemu: no kernel text symbols in %s\n", ksyms);
        return -1;
    }
    if (bk_watch_load(watch) < 0) {
        fprintf(stderr, "bunkai-qemu: no watch points in %s\n", watch);
        return -1;
    }
    if (bk_out_connect(sock) < 0) {
        fprintf(stderr, "bunkai-qemu: cannot connect to %s\n", sock);
        return -1;
    }
    if ((start_sys < 0) != (stop_sys < 0)) {
        fprintf(stderr, "bunkai-qemu: start= and stop= go together\n");
        return -1;
    }
    bk_task_init(maps, skip);
    bk_task_window(start_sys, stop_sys, exe);
    bk_id = id;
    bk_maps = maps;
    if (!maps)
        bk_armed = 1;
    qemu_plugin_register_vcpu_tb_trans_cb(id, bk_trans);
    qemu_plugin_register_atexit_cb(id, bk_atexit, NULL);
    return 0;
}
