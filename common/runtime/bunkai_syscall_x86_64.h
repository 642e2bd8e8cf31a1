/* bunkai_syscall_x86_64.h: the raw system calls of the code bunkai runs
 * inside other processes (the runtimes of share and flow): the `syscall`
 * instruction inlined into the caller's own text, six arguments in
 * registers, the kernel's value returned as it is (a result, or -errno).
 *
 * Rules: freestanding (no libc: its wrappers may be intercepted, may take
 * locks, and write errno, which is the program's memory); static inline
 * only, so each library keeps the instructions in its own text (share's
 * nodes let through, with Syscall User Dispatch, only calls made from the
 * runtime's text). Also the one other instruction the runtimes need by
 * name: a spinning wait's pause. */
#ifndef BUNKAI_SYSCALL_X86_64_H
#define BUNKAI_SYSCALL_X86_64_H

static inline long sc6(long n, long a, long b, long c, long d, long e, long f) {
  register long r10 __asm__("r10") = d;
  register long r8 __asm__("r8") = e;
  register long r9 __asm__("r9") = f;
  long ret;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                   : "rcx", "r11", "memory");
  return ret;
}
#define sc0(n) sc6(n, 0, 0, 0, 0, 0, 0)
#define sc1(n, a) sc6(n, (long)(a), 0, 0, 0, 0, 0)
#define sc2(n, a, b) sc6(n, (long)(a), (long)(b), 0, 0, 0, 0)
#define sc3(n, a, b, c) sc6(n, (long)(a), (long)(b), (long)(c), 0, 0, 0)
#define sc4(n, a, b, c, d) sc6(n, (long)(a), (long)(b), (long)(c), (long)(d), 0, 0)
#define sc5(n, a, b, c, d, e) sc6(n, (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), 0)

/* A spinning wait's pause. */
static inline void cpu_relax(void) { __asm__ volatile("pause" ::: "memory"); }

#endif
