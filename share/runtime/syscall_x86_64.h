/* syscall_x86_64.h: the runtime's system calls, the raw `syscall`
 * instruction inlined into this library's text (on the nodes Syscall User
 * Dispatch lets through only calls made from that text; libc's wrappers
 * would also write errno, which is the program's memory). Returns the
 * kernel's value: a result, or -errno. Also the one other instruction the
 * runtime needs by name: a spinning wait's pause. */
#ifndef BUNKAI_SHARE_SYSCALL_X86_64_H
#define BUNKAI_SHARE_SYSCALL_X86_64_H

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

/* A spinning wait's pause (the lock in util.c). */
static inline void cpu_relax(void) { __asm__ volatile("pause" ::: "memory"); }

#endif
