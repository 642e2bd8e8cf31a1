/* syscall_x86_64.h: the few system calls every file of libbunkai-flow
 * makes, inline, over the raw calls of
 * common/runtime/bunkai_syscall_x86_64.h. Rules: runtime.h (no libc: its
 * wrappers may be intercepted, and may take locks).
 */
#ifndef BUNKAI_FLOW_SYSCALL_X86_64_H
#define BUNKAI_FLOW_SYSCALL_X86_64_H

#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#include "bunkai_syscall_x86_64.h" /* sc0..sc6, cpu_relax: shared with share's runtime */

static inline void *map_anon(uint64_t len, int flags) {
  long r = sc6(SYS_mmap, 0, (long)len, PROT_READ | PROT_WRITE, flags | MAP_ANONYMOUS, -1, 0);
  return r < 0 && r > -4096 ? 0 : (void *)r;
}
static inline int getpid_raw(void) { return (int)sc0(SYS_getpid); }
static inline int gettid_raw(void) { return (int)sc0(SYS_gettid); }
static inline void yield_raw(void) { sc0(SYS_sched_yield); }

#endif
