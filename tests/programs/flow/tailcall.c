/* flow test program: returns a sled may not precede. step's second return
 * is a musttail call, which only its `ret` may follow, so it gets no exit
 * sled (and no after sled); its first return gets one. keep's x lives in
 * memory until its lifetime ends just before the return: the exit sled
 * goes before that end. Output must not change under `bunkai flow cc
 * -mllvm -bunkai-flow-after`. */
#include <stdio.h>

struct s {
  int a;
  long b;
};

__attribute__((noinline)) long leaf(struct s *p, long n) {
  p->b += n;
  return p->b;
}

__attribute__((noinline)) long step(struct s *p, long n) {
  p->a++;
  if (n <= 0)
    return p->b;
  __attribute__((musttail)) return leaf(p, n);
}

__attribute__((noinline)) void touch(int *x) { *x += 1; }

__attribute__((noinline)) int keep(int k) {
  int x = k;
  touch(&x);
  return x;
}

int main(int argc, char **argv) {
  (void)argv;
  struct s v = {0, 0};
  long r = step(&v, argc * 5);
  long z = step(&v, 0);
  printf("%ld %ld %d %d\n", r, z, v.a, keep(argc));
  return 0;
}
