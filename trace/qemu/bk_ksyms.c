/* bk_ksyms.c: the guest kernel's symbols and the plugin's watch points.
 *
 * Symbols come from the guest's System.map (trace/guest/build.sh writes
 * the kernel's own /proc/kallsyms there; the guest boots with nokaslr, so
 * the addresses hold): every text symbol, sorted, names the instructions
 * from its address up to the next symbol. A symbol becomes a function
 * definition (BKT_DEF_FUNC) the first time an instruction of it is
 * recorded.
 *
 * Watch points come from a file the recorder writes from the same map
 * (lines "START END KIND VALUE", hex addresses, KIND a letter of bk_qemu.h):
 * the recorder decides what to watch (syscall handlers with their numbers,
 * entry stubs, the address-space switch), the plugin only looks them up.
 *
 * Rules: see bk_qemu.h.
 */
#include "bk_qemu.h"
#include "bunkai_trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t addr;
    char *name;
    int defined;
} bk_sym;

static bk_sym *bk_syms;
static size_t bk_nsyms;
static bk_watch *bk_watches;
static size_t bk_nwatches;

static int bk_sym_cmp(const void *a, const void *b)
{
    const bk_sym *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

int bk_ksyms_load(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[512], name[400], type;
    unsigned long long a;
    size_t cap = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%llx %c %399s", &a, &type, name) != 3)
            continue;
        if (type != 't' && type != 'T' && type != 'w' && type != 'W')
            continue;
        if (a < BK_KERNEL_BASE)
            continue;
        if (bk_nsyms == cap) {
            cap = cap ? cap * 2 : 65536;
            bk_syms = realloc(bk_syms, cap * sizeof *bk_syms);
            if (!bk_syms)
                abort();
        }
        bk_syms[bk_nsyms].addr = a;
        bk_syms[bk_nsyms].name = strdup(name);
        bk_syms[bk_nsyms].defined = 0;
        bk_nsyms++;
    }
    fclose(f);
    qsort(bk_syms, bk_nsyms, sizeof *bk_syms, bk_sym_cmp);
    return bk_nsyms ? 0 : -1;
}

static long bk_sym_index(uint64_t addr)
{
    size_t lo = 0, hi = bk_nsyms;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (bk_syms[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (long)lo - 1;
}

uint64_t bk_ksym_func(uint64_t addr)
{
    long i = bk_sym_index(addr);
    if (i < 0)
        return 0;
    bk_sym *s = &bk_syms[i];
    if (!s->defined) {
        s->defined = 1;
        bk_put_v(&bk_defs, BKT_DEF_FUNC);
        bk_put_v(&bk_defs, (uint64_t)i + 1);
        bk_put_s(&bk_defs, s->name);
        bk_put_s(&bk_defs, "");
        bk_put_v(&bk_defs, 0);
        bk_put_v(&bk_defs, s->addr);
    }
    return (uint64_t)i + 1;
}

uint64_t bk_ksym_addr(const char *name)
{
    for (size_t i = 0; i < bk_nsyms; i++)
        if (strcmp(bk_syms[i].name, name) == 0)
            return bk_syms[i].addr;
    return 0;
}

static int bk_watch_cmp(const void *a, const void *b)
{
    const bk_watch *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

int bk_watch_load(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    unsigned long long s, e, v;
    char k;
    size_t cap = 0;
    while (fscanf(f, "%llx %llx %c %llu", &s, &e, &k, &v) == 4) {
        if (bk_nwatches == cap) {
            cap = cap ? cap * 2 : 1024;
            bk_watches = realloc(bk_watches, cap * sizeof *bk_watches);
            if (!bk_watches)
                abort();
        }
        bk_watches[bk_nwatches++] = (bk_watch){s, e, k, v};
    }
    fclose(f);
    qsort(bk_watches, bk_nwatches, sizeof *bk_watches, bk_watch_cmp);
    return bk_nwatches ? 0 : -1;
}

const bk_watch *bk_watch_find(uint64_t addr)
{
    size_t lo = 0, hi = bk_nwatches;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (bk_watches[mid].start <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    /* Several watches may start at one address: any containing it. */
    for (long i = (long)lo - 1; i >= 0 && i >= (long)lo - 4; i--)
        if (bk_watches[i].start <= addr && addr < bk_watches[i].end)
            return &bk_watches[i];
    return NULL;
}
