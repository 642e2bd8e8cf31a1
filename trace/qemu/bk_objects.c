/* bk_objects.c: which object each recorded instruction belongs to.
 *
 * Object 1 is the kernel ("[kernel]", the name the readers know it by),
 * object 2 user code the plugin cannot place ("[user]": processes other
 * than the traced server, or addresses outside its maps). The traced
 * server's own objects come from its /proc/PID/maps, which the guest's init
 * writes on the console and the recorder saves in a file before it sends
 * the request; the plugin reads that file when the window opens (first
 * line "pid N", then the maps lines). Ids 3 and up, one per mapping.
 *
 * Rules: see bk_qemu.h.
 */
#include "bk_qemu.h"
#include "bunkai_trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t start, end, id;
} bk_map;

static bk_map *bk_maps;
static size_t bk_nmaps;

static void bk_def_object(uint64_t id, const char *name, uint64_t start, uint64_t end, uint64_t off)
{
    bk_put_v(&bk_defs, BKT_DEF_OBJECT);
    bk_put_v(&bk_defs, id);
    bk_put_s(&bk_defs, name);
    bk_put_v(&bk_defs, start);
    bk_put_v(&bk_defs, end);
    bk_put_v(&bk_defs, off);
}

void bk_objects_define_base(void)
{
    uint64_t ks = bk_ksym_addr("_stext"), ke = bk_ksym_addr("_etext");
    if (!ks || !ke || ke < ks) {
        ks = BK_KERNEL_BASE;
        ke = ~0ull;
    }
    bk_def_object(BK_OBJ_KERNEL, "[kernel]", ks, ke, 0);
    bk_def_object(BK_OBJ_USER, "[user]", 0, BK_KERNEL_BASE, 0);
}

uint64_t bk_objects_load_maps(const char *path)
{
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return 0;
    char line[1024];
    unsigned long long pid = 0;
    size_t cap = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long s, e, off;
        char perms[8], name[900] = "";
        if (sscanf(line, "pid %llu", &pid) == 1)
            continue;
        int k = sscanf(line, "%llx-%llx %7s %llx %*s %*s %899[^\n]", &s, &e, perms, &off, name);
        if (k < 4)
            continue;
        if (!name[0])
            strcpy(name, "[anon]");
        if (bk_nmaps == cap) {
            cap = cap ? cap * 2 : 64;
            bk_maps = realloc(bk_maps, cap * sizeof *bk_maps);
            if (!bk_maps)
                abort();
        }
        uint64_t id = 3 + bk_nmaps;
        bk_maps[bk_nmaps++] = (bk_map){s, e, id};
        bk_def_object(id, name, s, e, off);
    }
    fclose(f);
    return pid;
}

uint64_t bk_object_of(uint64_t addr, int server)
{
    if (addr >= BK_KERNEL_BASE)
        return BK_OBJ_KERNEL;
    if (server)
        for (size_t i = 0; i < bk_nmaps; i++)
            if (bk_maps[i].start <= addr && addr < bk_maps[i].end)
                return bk_maps[i].id;
    return BK_OBJ_USER;
}
