/* flow test program: the shapes of member access the join-point pass must
 * recognise: nested structs (o->in.x), arrays of structs (v[i].w), a
 * global struct, bitfields, a typedef'd anonymous struct, &p->member
 * handed to a function ("addr"), an inlined helper, many and floating
 * arguments, and a local whose address is taken.
 *
 * A comment `jp FUNCTION: ITEM; ITEM` on a line names join points that
 * tests/e2e/flow.rs expects there at -O2. ITEM is `entry` or
 * `STRUCT.MEMBER load|store|addr`, then operand names that must be listed
 * (`a=b`: both listed, at one location; `n=$7`: at that location; `!x`:
 * not listed). */
#include <stdio.h>
#include <string.h>

struct inner {
  int x;
  int y;
};

struct outer {
  long id;
  struct inner in;
  struct inner pts[4];
};

struct item {
  double w;
  int tag;
};

struct flags {
  unsigned ready : 1;
  unsigned mode : 3;
  unsigned rest : 28;
  int after;
};

typedef struct {
  int used;
  char name[16];
} slot_t;

struct stats {
  long hits;
  long misses;
} g_stats;

__attribute__((noinline)) int sum_inner(const struct outer *o) {  /* jp sum_inner: entry $arg0=o */
  int s = o->in.x + o->in.y;  /* jp sum_inner: inner.x load o; inner.y load o */
  for (int k = 0; k < 4; k++)
    s += o->pts[k].x * o->pts[k].y;  /* jp sum_inner: inner.x load o k s; inner.y load o k s */
  return s;
}

__attribute__((noinline)) double weigh(const struct item *v, int n) {  /* jp weigh: entry $arg0=v $arg1=n */
  double total = 0;
  for (int i = 0; i < n; i++)
    if (v[i].tag & 1)  /* jp weigh: item.tag load v n i total */
      total += v[i].w;  /* jp weigh: item.w load v n i total */
  return total;
}

__attribute__((noinline)) void hit(int yes) {
  if (yes)
    g_stats.hits++;
  else
    g_stats.misses++;
}

__attribute__((noinline)) unsigned set_mode(struct flags *f, unsigned m) {
  f->mode = m;  /* jp set_mode: flags.ready|mode|rest load $base=f m */
  f->ready = 1;  /* jp set_mode: flags.ready|mode|rest store $base=f m */
  f->after = (int)m * 2;  /* jp set_mode: flags.after store $base=f */
  return f->mode;
}

__attribute__((noinline)) void bump(int *counter) { (*counter)++; }

__attribute__((noinline)) int name_slot(slot_t *s, const char *name) {
  strncpy(s->name, name, sizeof s->name - 1);  /* jp name_slot: slot_t.name addr $base=s name */
  s->name[sizeof s->name - 1] = 0;
  bump(&s->used);  /* jp name_slot: slot_t.used addr $base=s */
  return s->used;  /* jp name_slot: slot_t.used load $base=s */
}

static inline int twice_x(struct inner *p) { return p->x * 2; }  /* jp twice_x: inner.x load $base=p !q */

__attribute__((noinline)) int use_inline(struct inner *q) {
  int t = twice_x(q);
  return t + q->y;  /* jp use_inline: inner.y load $base=q t !p */
}

__attribute__((noinline)) double many(int a, int b, int c, int d, int e, int f,  /* jp many: entry $arg0=a $arg7=h $arg8=u $arg9=v */
                                      int g, int h, double u, double v) {
  return a + b + c + d + e + f + g + h + u * v;
}

__attribute__((noinline)) int escaped(struct inner *p) {
  int local = p->x;
  bump(&local);
  return local + p->y;  /* jp escaped: inner.y load $base=p local */
}

int main(void) {
  struct outer o = {7, {3, 4}, {{1, 2}, {3, 4}, {5, 6}, {7, 8}}};
  struct item items[5];
  for (int i = 0; i < 5; i++) {
    items[i].w = 1.5 * i;  /* jp main: item.w store i */
    items[i].tag = i;  /* jp main: item.tag store i */
  }
  struct flags fl = {0};
  slot_t sl = {0};
  struct inner q = {10, 20};
  for (int i = 0; i < 10; i++)
    hit(i % 3 == 0);
  printf("sum_inner %d\n", sum_inner(&o));
  printf("weigh %.2f\n", weigh(items, 5));
  printf("stats %ld %ld\n", g_stats.hits, g_stats.misses);  /* jp main: stats.hits load; stats.misses load */
  printf("mode %u after %d\n", set_mode(&fl, 5), fl.after);
  printf("slot %d %s\n", name_slot(&sl, "alpha"), sl.name);  /* jp main: slot_t.name addr */
  printf("inline %d\n", use_inline(&q));
  printf("many %.1f\n", many(1, 2, 3, 4, 5, 6, 7, 8, 1.5, 2.0));
  printf("escaped %d\n", escaped(&q));
  return 0;
}
