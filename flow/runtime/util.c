/* util.c: the environment (environ, read by hand), sizes in it, and the
 * host's name and tag. The string helpers are inline (runtime.h, and
 * common/runtime/bunkai_rt_util.h for those share's runtime uses too), and
 * so is the writers' lock. Rules: runtime.h.
 */
#include "runtime.h"

extern char **environ __attribute__((weak));

const char *env(const char *name) {
  char **e = &environ ? environ : 0;
  if (!e) return 0;
  uint64_t n = rt_slen(name);
  for (; *e; e++) {
    const char *s = *e;
    uint64_t i = 0;
    while (i < n && s[i] == name[i]) i++;
    if (i == n && s[n] == '=') return s + n + 1;
  }
  return 0;
}

/* "65536", "64K", "64M", "1G" (binary units, optional "iB"/"B"); -1 if bad. */
int64_t parse_size(const char *s) {
  uint64_t v = 0;
  int digits = 0;
  for (; *s >= '0' && *s <= '9'; s++, digits++) {
    if (v > (1ull << 50)) return -1;
    v = v * 10 + (uint64_t)(*s - '0');
  }
  if (!digits) return -1;
  int sh = 0;
  if (*s == 'K' || *s == 'k') sh = 10, s++;
  else if (*s == 'M' || *s == 'm') sh = 20, s++;
  else if (*s == 'G' || *s == 'g') sh = 30, s++;
  if (sh && *s == 'i') s++;
  if (*s == 'B') s++;
  if (*s || v > (1ull << 40) >> sh) return -1;
  return (int64_t)(v << sh);
}

/* ------------------------------------------------------------------ */
/* Host name, host tag, program name                                  */

struct utsname_raw {
  char sysname[65], nodename[65], release[65], version[65], machine[65], domain[65];
};

void host_name(char *out, uint64_t cap) {
  struct utsname_raw u;
  out[0] = 0;
  if (sc1(SYS_uname, &u) == 0) scopy(out, cap, u.nodename);
}

uint32_t host_tag16(void) {
  char h[65];
  host_name(h, sizeof h);
  uint32_t x = fnv1a(h);
  return (x ^ (x >> 16)) & 0xffff;
}
