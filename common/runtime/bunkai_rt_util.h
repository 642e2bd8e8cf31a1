/* bunkai_rt_util.h: the small helpers that the runtimes of share and flow
 * (the code bunkai runs inside other processes with no libc) both need,
 * written once: a string's length, two strings compared for equality.
 *
 * Rules: freestanding (no libc, no libc headers beyond the compiler's own
 * stddef.h: libc's string functions may be intercepted, and some read libc
 * data, which is the program's); static inline only, with the rt_ prefix,
 * so that nothing here has external linkage and each runtime chooses: flow
 * inlines them where they are used, share's util.c wraps each in the
 * hidden out-of-line function its other files call (its instructions are
 * certified as they are). Includers compile with -fno-builtin, so that the
 * compiler does not turn these loops back into calls to libc. No global
 * data, no constructors.
 *
 * Only what is the same in both runtimes lives here; the helpers that
 * differ on purpose stay with their runtime (share/runtime/util.c,
 * flow/runtime/runtime.h say why): the locks (share: spin, then sleep on a
 * futex; flow: spin, then yield, and unlock with a plain store), the
 * clocks, number formatting and parsing. */
#ifndef BUNKAI_RT_UTIL_H
#define BUNKAI_RT_UTIL_H

#include <stddef.h>

/* The length of s, without the terminating NUL. */
static inline size_t rt_slen(const char *s) {
  size_t n = 0;
  while (s[n]) n++;
  return n;
}

/* 1 when a and b are the same string, else 0. */
static inline int rt_sequal(const char *a, const char *b) {
  while (*a && *a == *b) a++, b++;
  return *a == *b;
}

#endif
