/* uffd.c: userfaultfd, as the runtime uses it: missing + write-protect
 * mode on every shared range (invalid = missing, read-only copy = present
 * and write-protected, writable = present). Every call returns 0 or
 * -errno and decides nothing: at home, where the program changes its own
 * mappings, any call may fail with -EAGAIN while such a change is in
 * flight (the kernel's mmap_changing), and the home manager must then read
 * the change before it tries again (home_manager.c). Rules: runtime.h. */
#include "runtime.h"
#include <sys/ioctl.h>
#include <linux/userfaultfd.h>

const uint8_t zero_page[PAGE] __attribute__((aligned(4096)));

/* A write protection of an empty range (uffd_changing below). */
static long wp_empty(int fd) {
  struct uffdio_writeprotect w = {.range = {0, 0}, .mode = UFFDIO_WRITEPROTECT_MODE_WP};
  return sc3(SYS_ioctl, fd, UFFDIO_WRITEPROTECT, &w);
}

void uffd_open(int events) {
  int fd = (int)sc1(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) die("userfaultfd failed (%d) (run as root or set vm.unprivileged_userfaultfd=1)", fd, 0, 0, 0);
  struct uffdio_api api = {.api = UFFD_API,
                           .features = UFFD_FEATURE_THREAD_ID |
                                       (events ? UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMAP : 0)};
  long r = sc3(SYS_ioctl, fd, UFFDIO_API, &api);
  if (r) die("userfaultfd API handshake failed (%d)", r, 0, 0, 0);
  if (events && (r = wp_empty(fd)) != -EINVAL)
    die("this kernel answers an empty userfaultfd write protection with %d, not EINVAL (bunkai share needs Linux 5.7 or later)",
        r, 0, 0, 0);
  g.uffd = hide_fd(fd);
}

long uffd_register(uint64_t start, uint64_t end) {
  struct uffdio_register reg = {.range = {start, end - start},
                                .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP};
  long r = sc3(SYS_ioctl, g.uffd, UFFDIO_REGISTER, &reg);
  if (!r) sc3(SYS_madvise, start, end - start, MADV_NOHUGEPAGE);
  return r;
}

long uffd_wp(uint64_t page, uint64_t len, int on) {
  struct uffdio_writeprotect w = {.range = {page, len}, .mode = on ? UFFDIO_WRITEPROTECT_MODE_WP : 0};
  return sc3(SYS_ioctl, g.uffd, UFFDIO_WRITEPROTECT, &w);
}

/* Is a mapping change of home's in flight (the kernel's mmap_changing,
 * set from before the change until the manager has read its event)?
 * -EAGAIN if so, else 0. An empty write-protect range: the kernel looks at
 * mmap_changing before it looks at the range (and then refuses the empty
 * range, -EINVAL), so this takes no lock and walks no page table, where a
 * write protection of one page did both (tests/programs/share/uffd_probe.c
 * pins the order on the kernel the tests run on; it has been so since
 * write protection came, in 5.7, and uffd_open checks at start-up that
 * an empty range is refused, EINVAL, as it must be when nothing is in
 * flight). */
long uffd_changing(void) { return wp_empty(g.uffd) == -EAGAIN ? -EAGAIN : 0; }

/* Installs data at a missing page (write-protected when ro). -EEXIST: the
 * page is there already (nothing changed). */
long uffd_copy(uint64_t page, const void *data, int ro) {
  struct uffdio_copy c = {.dst = page, .src = (uint64_t)data, .len = PAGE, .mode = ro ? UFFDIO_COPY_MODE_WP : 0};
  long r = sc3(SYS_ioctl, g.uffd, UFFDIO_COPY, &c);
  if (r < 0 && c.copy < 0) r = c.copy;
  return r;
}

long uffd_zero(uint64_t page) {
  struct uffdio_zeropage z = {.range = {page, PAGE}};
  long r = sc3(SYS_ioctl, g.uffd, UFFDIO_ZEROPAGE, &z);
  if (r < 0 && z.zeropage < 0) r = z.zeropage;
  return r;
}

long uffd_wake(uint64_t start, uint64_t len) {
  struct uffdio_range r = {start, len};
  return sc3(SYS_ioctl, g.uffd, UFFDIO_WAKE, &r);
}
