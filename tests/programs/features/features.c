/* Every case bunkai scatter must get right, in one program. Its output is
 * compared byte for byte with the same program built normally. Each section
 * prints what it checks, so a difference points at the case. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "features.h"

/* --- varargs: integer, double and mixed, through the manager's first call */
static long isum(int n, ...) {
  va_list ap;
  va_start(ap, n);
  long s = 0;
  for (int i = 0; i < n; i++)
    s += va_arg(ap, long);
  va_end(ap);
  return s;
}

static double dsum(int n, ...) {
  va_list ap;
  va_start(ap, n);
  double s = 0;
  for (int i = 0; i < n; i++)
    s += va_arg(ap, double);
  va_end(ap);
  return s;
}

static int fmt(char *buf, size_t cap, const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  int n = vsnprintf(buf, cap, f, ap);
  va_end(ap);
  return n;
}

/* Many arguments: some on the stack, floats in all eight xmm registers. */
double many(int a, double b, int c, double d, int e, double f, int g, double h,
            int i, double j, int k, double l, int m, double n, long o, double p,
            double q, double r) {
  return a + b + c + d + e + f + g + h + i + j + k + l + m + n + o + p + q + r;
}

struct big { long v[6]; };
struct big make_big(long x) { /* returned through memory (hidden pointer) */
  struct big b;
  for (int i = 0; i < 6; i++)
    b.v[i] = x * (i + 1);
  return b;
}

/* --- function pointers: taken in launcher data and inside a library */
int square(int x) { return x * x; }
static int cube(int x) { return x * x * x; }
int (*const table_ptrs[])(int) = {square, cube};
static int (*static_ptr)(int) = cube;

static void pointers(void) {
  int (*local_sq)(int) = square;
  int (*local_cu)(int) = cube;
  printf("pointers: square eq %d cube eq %d static eq %d calls %d %d %d\n",
         local_sq == table_ptrs[0], local_cu == table_ptrs[1],
         static_ptr == local_cu, table_ptrs[0](7), table_ptrs[1](3),
         static_ptr(2));
  printf("pointers: other file eq %d\n", other_square_ptr() == square);
}

/* --- recursion and mutual recursion across libraries */
int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
static int is_odd(unsigned n);
static int is_even(unsigned n) { return n == 0 ? 1 : is_odd(n - 1); }
static int is_odd(unsigned n) { return n == 0 ? 0 : is_even(n - 1); }

/* --- setjmp/longjmp across functions in different libraries */
static jmp_buf env;
static void deep(int n) {
  if (n == 0)
    longjmp(env, 42);
  deep(n - 1);
}
static void jumps(void) {
  volatile int stage = 0;
  int r = setjmp(env);
  if (r == 0) {
    stage = 1;
    deep(10);
    stage = 2;
  }
  printf("setjmp: returned %d stage %d\n", r, stage);
}

/* --- constructors and destructors */
static int ctor_ran;
__attribute__((constructor)) static void early(void) { ctor_ran = 17; }
__attribute__((constructor(200))) static void earlier(void) { ctor_ran += 100; }
__attribute__((destructor)) static void late(void) {
  printf("destructor: ran, ctor_ran was %d\n", ctor_ran);
  fflush(stdout);
}
static void at_exit_handler(void) { printf("atexit: ran\n"); }

/* --- thread-local variables, one used by several functions */
static __thread int tls_counter;
__thread long tls_public = 5;
static void tls_bump(int n) { tls_counter += n; tls_public += n; }
static int tls_read(void) { return tls_counter; }

/* --- threads racing to resolve the same functions */
#define NTHREADS 8
static pthread_barrier_t barrier;
static long racer_target(long x) { return x * 3 + tls_read(); }
static long racer_target2(long x) { return x + 1; }
static void *racer(void *arg) {
  long id = (long)arg;
  pthread_barrier_wait(&barrier);
  tls_bump((int)id);
  long r = 0;
  for (int i = 0; i < 1000; i++)
    r += racer_target(i) + racer_target2(i);
  return (void *)r;
}
static void threads(void) {
  pthread_t t[NTHREADS];
  pthread_barrier_init(&barrier, NULL, NTHREADS);
  for (long i = 0; i < NTHREADS; i++)
    pthread_create(&t[i], NULL, racer, (void *)i);
  long total = 0;
  for (int i = 0; i < NTHREADS; i++) {
    void *r;
    pthread_join(t[i], &r);
    total += (long)r;
  }
  printf("threads: total %ld main tls %d\n", total, tls_read());
}

/* --- string literals and constant tables */
static const char *const names[] = {"alpha", "beta", "gamma", "delta"};
static const int primes[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29};
static const char *name_of(int i) { return names[i & 3]; }
static int prime_sum(void) {
  int s = 0;
  for (unsigned i = 0; i < sizeof primes / sizeof primes[0]; i++)
    s += primes[i];
  return s;
}
static int shared_state; /* used by two functions: merged into a struct */
static void bump_shared(void) { shared_state += 3; }
static int read_shared(void) { return shared_state; }
static int only_mine(void) { static int calls; return ++calls; }

/* --- libm and errno */
__attribute__((noinline)) static double my_abs(double x) { return x < 0 ? -x : x; }
static void mathy(void) {
  printf("math: %.6f %.6f %.6f %.6f\n", sqrt(2.0), sin(1.0), pow(2.5, 3.5),
         log1p(0.5));
  errno = 1234;
  double z = my_abs(-3.0); /* first call loads a library: errno must survive */
  int e = errno;
  printf("errno: preserved %d (%g)\n", e == 1234, z);
}

static int cmp_int(const void *a, const void *b) {
  return *(const int *)a - *(const int *)b;
}

int main(int argc, char **argv) {
  char buf[128];
  printf("start: argc %d ctor %d\n", argc, ctor_ran);
  atexit(at_exit_handler);
  printf("varargs: %ld %.3f\n", isum(5, 1L, 2L, 3L, 4L, 5L),
         dsum(9, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5));
  fmt(buf, sizeof buf, "%s-%d-%.2f-%c", "mix", 42, 3.14159, 'z');
  printf("varargs: %s\n", buf);
  printf("many: %.2f\n", many(1, 2.5, 3, 4.5, 5, 6.5, 7, 8.5, 9, 10.5, 11, 12.5,
                               13, 14.5, 15, 16.5, 17.5, 18.5));
  struct big b = make_big(7);
  printf("struct: %ld %ld\n", b.v[0], b.v[5]);
  pointers();
  printf("recursion: fib(20) %d even(101) %d odd(77) %d\n", fib(20),
         is_even(101), is_odd(77));
  printf("cross-file: %d %d\n", other_file_twice(21), other_file_calls_back(5));
  jumps();
  tls_bump(10);
  printf("tls: %d %ld\n", tls_read(), tls_public);
  threads();
  printf("strings: %s %s %d\n", name_of(2), name_of(5), prime_sum());
  bump_shared();
  bump_shared();
  printf("shared: %d mine %d %d\n", read_shared(), only_mine(), only_mine());
  mathy();
  int arr[] = {5, 3, 9, 1, 7};
  qsort(arr, 5, sizeof arr[0], cmp_int); /* callback from libc into a stub */
  printf("qsort: %d %d %d %d %d\n", arr[0], arr[1], arr[2], arr[3], arr[4]);
  if (argc > 1) {
    FILE *f = fopen(argv[1], "w");
    if (!f)
      return 2;
    fprintf(f, "written by features: %d\n", fib(10));
    fclose(f);
  }
  fflush(stdout);
  return 7;
}
