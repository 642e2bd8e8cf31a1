/* flow test program: which named variables a join point lists. Parameters
 * and locals in scope, at the location of the value they hold there; a
 * shadowed name once, the innermost; a block's locals not after the block;
 * a constant as an immediate; a variable in memory (its address taken) by
 * its loaded value.
 *
 * A comment `jp FUNCTION: ITEM; ITEM` on a line names join points that
 * tests/e2e/flow.rs expects there at -O2. ITEM is `entry` or
 * `STRUCT.MEMBER load|store|addr`, then operand names that must be listed
 * (`a=b`: both listed, at one location; `n=$7`: at that location; `!x`:
 * not listed). */
#include <stdio.h>
#include <stdlib.h>

struct acc {
  long total;
  long count;
  long last;
};

__attribute__((noinline)) void note(long v) { printf("note %ld\n", v); }

__attribute__((noinline)) void add(struct acc *a, long v) {  /* jp add: entry $arg0=a $arg1=v */
  long n = v * 3;
  if (v > 10) {
    long big = n + 1;
    note(big);
    a->total += big;  /* jp add: acc.total load $base=a v n big */
  }
  {
    long n = 7;
    note(n);
    a->last = v;  /* jp add: acc.last store $base=a v n=$7 !big */
  }
  a->count += n;  /* jp add: acc.count load $base=a v n !big */
}

__attribute__((noinline)) long watch(struct acc *a) {  /* jp watch: entry $arg0=a */
  long seen = a->count;  /* jp watch: acc.count load $base=a */
  long *where = &seen;
  note((long)(where != NULL));
  a->last = seen;  /* jp watch: acc.last store $base=a seen */
  return seen;
}

int main(int argc, char **argv) {
  struct acc *a = calloc(1, sizeof *a);
  long rounds = argc > 1 ? atol(argv[1]) : 20;
  for (long i = 0; i < rounds; i++)
    add(a, i);
  printf("total %ld count %ld last %ld watch %ld\n", a->total, a->count,
         a->last, watch(a));
  free(a);
  return 0;
}
