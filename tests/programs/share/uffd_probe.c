#define _GNU_SOURCE
/* bunkai share test: the kernel behaviour the home manager's cheap check
 * for a mapping change in flight relies on (uffd_changing, share/runtime/
 * uffd.c). Usage: uffd_probe ROUNDS
 *
 * The manager asks "has a mapping change begun?" with a write protection
 * of an empty range: the kernel must answer EAGAIN while a change's event
 * is unread (mmap_changing) and EINVAL (the empty range) otherwise; a
 * kernel that looked at the range first would answer EINVAL in both cases
 * and the manager would hand out a page the program had just moved or
 * unmapped. Each round registers an anonymous range for unmap and remap
 * events, lets a thread munmap (then, another round, mremap) it, which
 * blocks that thread until the event is read, and checks the answers
 * before and after reading it. Prints one line; exit 0 when every answer
 * was right. Needs userfaultfd (root, or vm.unprivileged_userfaultfd=1). */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define LEN (4 * 4096)

static int uffd;
static char *region, *elsewhere;
static int remap_round, changed;

static int probe(void) {
  struct uffdio_writeprotect w = {.range = {0, 0}, .mode = UFFDIO_WRITEPROTECT_MODE_WP};
  return ioctl(uffd, UFFDIO_WRITEPROTECT, &w) ? errno : 0;
}

static void *change(void *unused) {
  (void)unused;
  if (remap_round) {
    if (mremap(region, LEN, LEN, MREMAP_MAYMOVE | MREMAP_FIXED, elsewhere) == MAP_FAILED) perror("mremap");
  } else if (munmap(region, LEN)) {
    perror("munmap");
  }
  __atomic_store_n(&changed, 1, __ATOMIC_RELEASE);
  return 0;
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 20;
  uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  if (uffd < 0) {
    printf("uffd_probe: userfaultfd: %s\n", strerror(errno));
    return 2;
  }
  struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMAP};
  if (ioctl(uffd, UFFDIO_API, &api)) {
    printf("uffd_probe: UFFDIO_API: %s\n", strerror(errno));
    return 2;
  }
  int wrong = 0, idle_einval = 0, busy_eagain = 0;
  for (int r = 0; r < rounds; r++) {
    remap_round = r & 1, changed = 0;
    region = mmap(0, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    elsewhere = mmap(0, LEN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(region, 1, LEN);
    struct uffdio_register reg = {.range = {(unsigned long)region, LEN},
                                  .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP};
    if (ioctl(uffd, UFFDIO_REGISTER, &reg)) {
      printf("uffd_probe: UFFDIO_REGISTER: %s\n", strerror(errno));
      return 2;
    }
    int e = probe();
    if (e == EINVAL) idle_einval++;
    else wrong++, printf("uffd_probe: round %d: nothing in flight, the probe said %s (EINVAL expected)\n", r, strerror(e));
    pthread_t t;
    pthread_create(&t, 0, change, 0);
    /* the change's event arrives after the change; the flag is set before */
    struct pollfd pf = {uffd, POLLIN, 0};
    if (poll(&pf, 1, 10000) != 1) {
      printf("uffd_probe: round %d: no event from the %s within 10 s\n", r, remap_round ? "mremap" : "munmap");
      return 1;
    }
    e = probe();
    if (e == EAGAIN) busy_eagain++;
    else wrong++, printf("uffd_probe: round %d: %s in flight, the probe said %s (EAGAIN expected)\n", r,
                         remap_round ? "mremap" : "munmap", e ? strerror(e) : "0");
    struct uffd_msg m;
    if (read(uffd, &m, sizeof m) != sizeof m) {
      printf("uffd_probe: round %d: reading the event: %s\n", r, strerror(errno));
      return 1;
    }
    /* a change may bring more than one event (mremap over a mapping):
     * read them until the thread is through */
    while (!__atomic_load_n(&changed, __ATOMIC_ACQUIRE))
      if (poll(&pf, 1, 10) == 1 && read(uffd, &m, sizeof m) < 0 && errno != EAGAIN) break;
    pthread_join(t, 0);
    e = probe();
    if (e == EINVAL) idle_einval++;
    else wrong++, printf("uffd_probe: round %d: event read, the probe said %s (EINVAL expected)\n", r, strerror(e));
    /* what is left: unregistered first (an unmap of a registered range
     * would wait for us to read its event) */
    if (remap_round) {
      struct uffdio_range left = {(unsigned long)elsewhere, LEN};
      ioctl(uffd, UFFDIO_UNREGISTER, &left);
    }
    munmap(elsewhere, LEN);
  }
  printf("uffd_probe: %d rounds, %d idle answers EINVAL, %d in-flight answers EAGAIN, %d wrong\n", rounds, idle_einval,
         busy_eagain, wrong);
  return wrong != 0;
}
