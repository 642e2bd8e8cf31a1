/* syscall_x86_64.h: raw system calls for libbunkai-flow (the `syscall`
 * instruction itself, six arguments in registers), and the few calls every
 * file makes, inline. Rules: runtime.h (no libc: its wrappers may be
 * intercepted, and may take locks).
 */
#ifndef BUNKAI_FLOW_SYSCALL_X86_64_H
#define BUNKAI_FLOW_SYSCALL_X86_64_H

#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>

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

static inline void *map_anon(uint64_t len, int flags) {
  long r = sc6(SYS_mmap, 0, (long)len, PROT_READ | PROT_WRITE, flags | MAP_ANONYMOUS, -1, 0);
  return r < 0 && r > -4096 ? 0 : (void *)r;
}
static inline int getpid_raw(void) { return (int)sc0(SYS_getpid); }
static inline int gettid_raw(void) { return (int)sc0(SYS_gettid); }
static inline void yield_raw(void) { sc0(SYS_sched_yield); }
static inline void cpu_relax(void) { __asm__ volatile("pause" ::: "memory"); }

#endif
