/* audit.c: libbunkai-share-audit.so, the rtld-audit module `bunkai share
 * run` puts in LD_AUDIT. The dynamic linker calls la_activity with
 * LA_ACT_CONSISTENT when it has mapped new objects (dlopen, and glibc's
 * own loads such as NSS modules) and before it relocates them; if this is
 * a shared process on its home host, we ring the runtime's doorbell
 * (start.c) with the load addresses la_objopen gave us for the new
 * objects, and its manager makes their writable parts shared memory
 * before anything is written there. Everything else (other processes that
 * inherited LD_AUDIT, the replicas, start-up) returns at once.
 *
 * Rules: this module lives in a link namespace of its own, so it cannot
 * see the runtime's data; it finds the doorbell at a fixed address and
 * reads it with process_vm_readv (a process where nothing is mapped there
 * gets EFAULT, not a fault). No libc: raw system calls only, no
 * dependencies, so the namespace costs nothing to set up. */
#include <stdint.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include "bunkai_share.h"
#include "bunkai_syscall_x86_64.h"

#define LA_ACT_CONSISTENT 0
#define DOORBELL_MAGIC 0x6c6c65626f6f6442ull

struct doorbell {
  uint64_t magic;
  uint32_t pid;
  uint32_t pad;
  void (*loaded)(const uint64_t *bases, int n);
};

/* The public head of glibc's struct link_map (<link.h>). */
struct link_map_head {
  uintptr_t l_addr;
};

#define MAX_NEW 32
static uint64_t new_bases[MAX_NEW];
static int nnew; /* > MAX_NEW: too many to name */

/* The doorbell, if this process is a shared process on its home host. */
static int doorbell(struct doorbell *d) {
  long pid = sc0(SYS_getpid);
  struct iovec local = {d, sizeof *d}, remote = {(void *)BKS_PRIVATE_BASE, sizeof *d};
  if (sc6(SYS_process_vm_readv, pid, (long)&local, 1, (long)&remote, 1, 0) != (long)sizeof *d) return 0;
  return d->magic == DOORBELL_MAGIC && d->pid == (uint32_t)pid && d->loaded;
}

__attribute__((visibility("default"))) unsigned int la_version(unsigned int version) {
  return version >= 1 ? 1 : 0; /* la_objopen and la_activity are in version 1 */
}

__attribute__((visibility("default"))) unsigned int la_objopen(struct link_map_head *map, long lmid, uintptr_t *cookie) {
  (void)lmid, (void)cookie;
  struct doorbell d;
  if (!doorbell(&d)) return 0;
  if (nnew < MAX_NEW) new_bases[nnew] = map->l_addr;
  nnew++;
  return 0; /* no symbol binding callbacks */
}

__attribute__((visibility("default"))) void la_activity(uintptr_t *cookie, unsigned int flag) {
  (void)cookie;
  if (flag != LA_ACT_CONSISTENT || !nnew) return;
  struct doorbell d;
  int n = nnew;
  nnew = 0;
  if (doorbell(&d)) d.loaded(new_bases, n > MAX_NEW ? -1 : n);
}
