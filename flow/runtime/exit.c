/* exit.c: what the runtime does when its process exits: every flow table
 * that still holds keys leaves a BKF_JP_LIVE_AT_EXIT record in the
 * process's buffer (bunkai_flow.h §3), which `bunkai flow report` turns
 * into a warning: an object that ended without a quit left its key, and
 * the next object at that address joins the old flow. Rules: runtime.h,
 * but for one exception, this file's reason to be: a destructor. It is
 * compiled into the shared library only (the dynamic loader runs it at
 * exit()); the static archive, which bunkai mod's linker takes into
 * advice modules and which must have no constructors or destructors, has
 * no exit summary. Threads may still run: the count and the sample are
 * read without the table's lock, as get_flowid reads. A process killed by
 * a signal, or one that ends with _exit, writes none. */
#include "runtime.h"

__attribute__((destructor)) static void tables_at_exit(void) {
  for (struct bkf_table *t = LD_ACQ(&G.tables); t; t = t->next) {
    uint64_t live = LD(&t->live);
    if (!live) continue;
    uint64_t v[4 + 2 * BKF_LIVE_SAMPLE] = {live, 0, 0, 0};
    char *name = (char *)&v[1];
    for (int i = 0; i < 24 && t->name[i]; i++) name[i] = t->name[i];
    int n = 4;
    struct arr *a = LD_ACQ(&t->cur);
    for (uint64_t i = 0; a->maplen && i <= a->mask && n < 4 + 2 * BKF_LIVE_SAMPLE; i++) {
      uint64_t k = LD_ACQ(&a->s[i].key), val = LD(&a->s[i].val);
      if (k && val) v[n++] = k, v[n++] = val;
    }
    bkf_store(0, BKF_JP_LIVE_AT_EXIT, n, v);
  }
}
