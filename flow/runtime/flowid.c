/* flowid.c: flow IDs (get_new_flowid). Rules: runtime.h.
 *
 * Flow IDs: bits 0..47 come from a counter in the shared file BKF_IDS_PATH
 * (one `lock xadd`; every process of the host that maps it shares it, and
 * a fork child inherits the mapping); bits 48..63 are a 16-bit hash of the
 * host name. The counter starts at 1, so an ID is never 0. If the file cannot
 * be used, the counter lives in an anonymous shared page (shared with fork
 * children) starting at pid << 24, so unrelated processes seldom collide.
 */
#include "runtime.h"

static COLD uint64_t *ids_init(void) {
  uint64_t *c = LD_ACQ(&G.ids);
  if (c) return c;
  uint64_t tag = (uint64_t)host_tag16() << 48;
  const char *path = env("BUNKAI_FLOW_IDS");
  if (!path || !*path) path = BKF_IDS_PATH;
  int mode = 1;
  int fd = (int)sc3(SYS_open, path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd >= 0) {
    sc2(SYS_fchmod, fd, 0666); /* other users' processes share it too; fails unless ours */
    struct { uint64_t dev, ino, nlink; uint32_t mode, uid, gid, pad; uint64_t rdev; int64_t size; uint64_t rest[12]; } st;
    if (sc2(SYS_fstat, fd, &st) == 0 && st.size < (int64_t)PAGE) sc2(SYS_ftruncate, fd, PAGE);
    long r = sc6(SYS_mmap, 0, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    sc1(SYS_close, fd);
    c = r < 0 && r > -4096 ? 0 : (uint64_t *)r;
  }
  if (!c) {
    /* Process-local: shared with fork children, apart from other processes
     * by the pid in bits 24..47. */
    mode = 2;
    c = map_anon(PAGE, MAP_SHARED);
    if (!c) {
      static uint64_t last_resort;
      c = &last_resort, mode = 3;
    }
    if (!LD(c)) ST(c, ((uint64_t)getpid_raw() & 0x7fffff) << 24);
  }
  ST(&G.tag, tag);
  ST(&G.ids_mode, mode < 3 ? mode : 2);
  uint64_t *z = 0;
  if (!CAS(&G.ids, &z, c)) { /* another thread was first */
    if (mode < 3) sc2(SYS_munmap, c, PAGE);
    c = z;
  }
  return c;
}

API bkf_id get_new_flowid(void) {
  uint64_t *c = LD_ACQ(&G.ids);
  if (unlikely(!c)) c = ids_init();
  uint64_t n;
  do n = (ADD(c, 1) + 1) & LOW48; /* 0 only after 2^48 IDs: skip it */
  while (unlikely(n == 0));
  return LD(&G.tag) | n;
}

/* 0 no ID yet, 1 IDs from the shared counter file, 2 process-local. */
API int __bunkai_flow_ids_mode(void) { return LD(&G.ids_mode); }
