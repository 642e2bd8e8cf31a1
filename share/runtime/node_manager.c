/* node_manager.c: the memory control part on a node (a replica). The
 * replica's main thread becomes this manager: it asks home for the pages
 * the node's threads fault on, and carries out every control message in
 * the order home sent it (home_manager.c explains the protocol). It is
 * the only thread that changes the node's mappings. Thread connections
 * are accepted by a thread of their own (acceptor), so that a peer that
 * connects and says nothing cannot stall the pages. Rules: runtime.h. */
#include "runtime.h"
#include <linux/futex.h>
#include <linux/userfaultfd.h>
#include <netinet/in.h>
#include <sys/socket.h>

#ifndef MADV_DONTNEED_LOCKED
#define MADV_DONTNEED_LOCKED 24
#endif

/* A message to home on the control connection (a dying thread may write
 * there too: die(), util.c). */
static void up(uint32_t type, uint64_t a, uint64_t b, const void *pl, uint32_t len) {
  lock(&g.ctrl_lock);
  send_msg(g.hosts[0].fd, type, a, b, 0, pl, len);
  unlock(&g.ctrl_lock);
}

static void drop(uint64_t p, uint64_t len) {
  if (sc3(SYS_madvise, p, len, MADV_DONTNEED_LOCKED) == -EINVAL) sc3(SYS_madvise, p, len, MADV_DONTNEED);
}

/* ------------------------------------------------------------------ */
/* Fresh ranges: pages of mappings this node's threads made, still
 * untouched zeros owned by this node (BKS_FRESH): their first touch is
 * filled here, with no round trip. A page leaves the set when it is filled
 * or when home says anything about it.                                */

static struct rangeset fresh;

/* First touches out of order split ranges; past this many, a range that
 * would split goes whole instead (its other pages then take the ordinary
 * path, where home answers with zeros: slower, still right), so the set
 * stays small. */
#define FRESH_MAX 4096

static int fresh_take(uint64_t a, uint64_t b) {
  if (!fresh.n) return 0;
  return rs_cut(&fresh, a, b, fresh.n < FRESH_MAX);
}

/* ------------------------------------------------------------------ */
/* Requests this node has sent and not yet had answered: one per page
 * and mode at most (a write request after a read request is a second
 * one). Home answers every request with GRANT or GONE.                */

struct out {
  uint64_t page;
  uint16_t count;
  uint8_t mode;
};
#define OUTS 4096 /* a power of two, at least twice the threads a node can run */
static struct out outs[OUTS];

static unsigned slot_of(uint64_t page) { return (unsigned)((page >> 12) * 0x9E3779B97F4A7C15ull >> 52) & (OUTS - 1); }

static struct out *out_find(uint64_t page) {
  for (unsigned k = slot_of(page);; k = (k + 1) & (OUTS - 1)) {
    if (outs[k].page == page) return &outs[k];
    if (!outs[k].page) return 0;
  }
}
static struct out *out_add(uint64_t page) {
  for (unsigned k = slot_of(page);; k = (k + 1) & (OUTS - 1))
    if (!outs[k].page) {
      outs[k] = (struct out){page, 0, 0};
      return &outs[k];
    }
}
/* One answer came: forget the page when none is left (deletion by
 * shifting back, so lookups need no tombstones). */
static void out_done(uint64_t page) {
  struct out *o = out_find(page);
  if (!o || --o->count) return;
  unsigned i = (unsigned)(o - outs);
  outs[i].page = 0;
  for (unsigned j = (i + 1) & (OUTS - 1); outs[j].page; j = (j + 1) & (OUTS - 1)) {
    unsigned h = slot_of(outs[j].page);
    /* can j's entry move to the hole at i? only if its home slot is not in (i, j] */
    if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
      outs[i] = outs[j];
      outs[j].page = 0;
      i = j;
    }
  }
}

/* ------------------------------------------------------------------ */
/* This node's own mappings                                            */

static char *maps;
#define NODE_MAPS_CAP (4l << 20)

/* The parts of [s, e) this node has mapped (not ours), in order, one a
 * mapping (mremap moves one mapping at a time). */
static int run_prot[4096]; /* each run's protection, for map_shared */
static int mapped_runs(uint64_t s, uint64_t e, struct range *out, int cap) {
  read_maps(maps, NODE_MAPS_CAP);
  const char *p = maps;
  struct vma v;
  int n = 0;
  while (next_vma(&p, &v)) {
    if (v.end <= s || v.start >= e || ours(&v)) continue;
    uint64_t lo = v.start > s ? v.start : s, hi = v.end < e ? v.end : e;
    if (n < cap) run_prot[n] = v.prot, out[n++] = (struct range){lo, hi};
    else die("more than %d mappings in 0x%x-0x%x", cap, (long)s, (long)e, 0);
  }
  return n;
}

static struct range runs[4096];

/* New anonymous memory at [s, e), registered before any thread of ours
 * can touch it: mapped PROT_NONE, registered, then given its protection.
 * Mapped with its protection at once, a second thread touching it before
 * the registration (the first one's SIGSEGV is what brought the MAP; the
 * second may be running the same code) would get the kernel's zero page
 * without a fault, and read zeros there for good. Under PROT_NONE it
 * takes SIGSEGV instead, asks home, and retries once this is done. */
static void changed_layout(void) { __atomic_add_fetch(&g.layout, 1, __ATOMIC_RELEASE); }

static void map_registered(uint64_t s, uint64_t e, int prot) {
  long r = sc6(SYS_mmap, s, e - s, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (r != (long)s) die("cannot map 0x%x-0x%x: something of ours is there (%d; please report)", (long)s, (long)e, r, 0);
  if (uffd_register(s, e)) die("cannot register 0x%x-0x%x with userfaultfd", (long)s, (long)e, 0, 0);
  if (prot != PROT_NONE) sc3(SYS_mprotect, s, e - s, prot);
  changed_layout();
}

/* MAP: shared memory home has; map what of it is not mapped here. */
static void map_shared(uint64_t s, uint64_t e, int prot) {
  int n = mapped_runs(s, e, runs, 4096);
  uint64_t at = s;
  for (int i = 0; i <= n; i++) {
    uint64_t gap_end = i < n ? runs[i].start : e;
    if (gap_end > at) map_registered(at, gap_end, prot);
    if (i < n) {
      if (run_prot[i] != prot) { /* home's protection now */
        sc3(SYS_mprotect, runs[i].start, runs[i].end - runs[i].start, prot);
        changed_layout();
      }
      at = runs[i].end;
    }
  }
}

/* FRESH: a new mapping of one of our threads; its pages are ours. */
static void map_fresh(uint64_t s, uint64_t e, int prot) {
  map_registered(s, e, prot);
  rs_add(&fresh, s, e);
}

/* REMAP: home moved [from, from + len) to to; what we hold moves too.
 * Our userfaultfd has no REMAP events (our own mremap would wait for us to
 * read them), so the kernel drops the moved range's registration and the
 * pages' write protection: register it again and write-protect every page
 * we hold there. Read-only copies are read-only again; a page of ours
 * that was writable costs one request on its next write (home answers
 * "you hold it"). All before the next control message, so no thread of
 * ours can use the range in between (it learns of the new address only
 * through a later message). */
static void remap(uint64_t from, uint64_t to, uint64_t len) {
  fresh_take(from, from + len);
  fresh_take(to, to + len);
  sc2(SYS_munmap, to, len); /* nothing of ours can be there: an UNMAP said so first */
  int n = mapped_runs(from, from + len, runs, 4096);
  for (int i = 0; i < n; i++) {
    uint64_t l = runs[i].end - runs[i].start, dst = to + (runs[i].start - from);
    long r = sc5(SYS_mremap, runs[i].start, l, l, MREMAP_MAYMOVE | MREMAP_FIXED, dst);
    if (r < 0) die("cannot move 0x%x-0x%x as home did (%d)", (long)runs[i].start, (long)runs[i].end, r, 0);
    if (uffd_register(dst, dst + l)) die("cannot register 0x%x-0x%x with userfaultfd again", (long)dst, (long)(dst + l), 0, 0);
    uffd_wp(dst, l, 1);
  }
  uffd_wake(from, len);
  uffd_wake(to, len);
}

static void protect(uint64_t s, uint64_t len, int prot) {
  int n = mapped_runs(s, s + len, runs, 4096);
  for (int i = 0; i < n; i++) sc3(SYS_mprotect, runs[i].start, runs[i].end - runs[i].start, prot);
}

/* ------------------------------------------------------------------ */
/* Control messages                                                    */

static void control(struct bks_msg *m, char *pl) {
  static uint8_t data[PAGE] __attribute__((aligned(64)));
  uint64_t page = m->a;
  switch (m->type) {
  case BKS_GRANT: {
    out_done(page);
    int ro = m->b == 1, woke = 0; /* a page copied in, or write protection taken off, wakes the threads waiting there */
    long e;
    if (m->len == PAGE) {
      e = uffd_copy(page, pl, ro);
      if (e == -EEXIST)
        die("internal error: home sent page 0x%x, which is here already (please report)", (long)page, 0, 0, 0);
      woke = !e;
    } else if (m->c & BKS_GRANT_ZERO) {
      e = uffd_copy(page, zero_page, ro);
      woke = !e;
      if (e == -EEXIST) e = uffd_wp(page, PAGE, ro), woke = !e && !ro;
    } else {
      if (!page_here(page))
        die("internal error: home says page 0x%x is here, and it is not (please report)", (long)page, 0, 0, 0);
      e = uffd_wp(page, PAGE, ro);
      woke = !e && !ro;
    }
    if (!woke) uffd_wake(page, PAGE); /* write protection set, or a failure */
    break;
  }
  case BKS_GONE:
    /* home has no shared page there: our mapping of it is one home never
     * gave us (our stack grew into it) or one it has replaced. Drop it, so
     * that the thread's retry faults into the ordinary way (SIGSEGV, then
     * MAPINFO) instead of asking again for ever. */
    out_done(page);
    if (sc3(SYS_msync, page, PAGE, MS_ASYNC) != -ENOMEM) sc2(SYS_munmap, page, PAGE);
    changed_layout();
    uffd_wake(page, PAGE);
    break;
  case BKS_FETCH:
  case BKS_DOWNGRADE:
  case BKS_TAKE: {
    fresh_take(page, page + PAGE);
    int here = page_here(page);
    if (m->type == BKS_DOWNGRADE && !here) {
      /* an untouched page of ours: the read-only copy we keep is zeros */
      uffd_copy(page, zero_page, 1);
    } else if (m->type != BKS_FETCH) {
      uffd_wp(page, PAGE, 1);
    }
    if (here && mem_read(page, data, PAGE)) up(BKS_DATA, page, 0, data, PAGE);
    else up(BKS_DATA, page, 0, 0, 0);
    if (m->type == BKS_TAKE) drop(page, PAGE);
    break;
  }
  case BKS_INVALIDATE:
    fresh_take(page, page + PAGE);
    drop(page, PAGE);
    up(BKS_ACK, page, 0, 0, 0);
    break;
  case BKS_ZAP:
    fresh_take(m->a, m->b);
    drop(m->a, m->b - m->a);
    up(BKS_ACK, m->a, 0, 0, 0);
    break;
  case BKS_MAP:
    map_shared(m->a, m->b, (int)m->c);
    break;
  case BKS_FRESH:
    map_fresh(m->a, m->b, (int)m->c);
    break;
  case BKS_UNMAP:
    fresh_take(m->a, m->b);
    sc2(SYS_munmap, m->a, m->b - m->a);
    changed_layout();
    uffd_wake(m->a, m->b - m->a); /* threads waiting there see the unmap */
    break;
  case BKS_REMAP:
    remap(m->a, m->b, m->c);
    changed_layout();
    break;
  case BKS_PROTECT:
    protect(m->a, m->b, (int)m->c);
    changed_layout();
    break;
  case BKS_QUIT:
    sc1(SYS_exit_group, (long)m->a);
    break;
  default:
    die("unexpected message from home (type %d)", m->type, 0, 0, 0);
  }
}

/* A fault of one of our threads. */
static void fault(struct uffd_msg *msg) {
  uint64_t f = msg->arg.pagefault.flags;
  uint64_t page = PAGE_DOWN(msg->arg.pagefault.address);
  int wp = (f & UFFD_PAGEFAULT_FLAG_WP) != 0;
  int write = wp || (f & UFFD_PAGEFAULT_FLAG_WRITE);
  if (!wp && fresh_take(page, page + PAGE)) {
    if (uffd_copy(page, zero_page, 0) == -EEXIST) uffd_wake(page, PAGE);
    return;
  }
  int mode = write ? 2 : 1;
  struct out *o = out_find(page);
  if (o && o->mode >= mode) return; /* asked already: the answer wakes every thread waiting there */
  if (!o) o = out_add(page);
  o->mode = (uint8_t)mode;
  o->count++;
  up(BKS_PAGE_REQ, page, (write ? BKS_REQ_WRITE : 0) | (wp ? BKS_REQ_HAVE : 0), 0, 0);
}

static uint64_t last_activity; /* for spin_poll */

/* The control connection's reader: home's messages, read as they come
 * (a page with its header in one read). */
#define CTRL_BUF (64 << 10)
static struct msgbuf ctrl;

void node_manager(void) {
  maps = priv_alloc(NODE_MAPS_CAP);
  ctrl = (struct msgbuf){priv_alloc(CTRL_BUF), 0, 0, CTRL_BUF};
  struct pollfd pf[2];
  for (;;) {
    pf[0] = (struct pollfd){g.uffd, POLLIN, 0};
    pf[1] = (struct pollfd){g.hosts[0].fd, POLLIN, 0};
    /* a message read already: only a look at the faults before it */
    int buffered = mb_ready(&ctrl);
    long r = buffered ? sc3(SYS_poll, pf, 2, 0) : spin_poll(pf, 2, &last_activity);
    if (r < 0) continue;
    if (buffered) {
      pf[1].revents |= POLLIN;
      last_activity = now_ns(); /* a burst read at once is activity too: keep polling after it */
    }
    if (pf[0].revents) {
      struct uffd_msg msgs[16];
      long n = sc3(SYS_read, g.uffd, msgs, sizeof msgs);
      for (long i = 0; n > 0 && i < n / (long)sizeof msgs[0]; i++)
        if (msgs[i].event == UFFD_EVENT_PAGEFAULT) fault(&msgs[i]);
    }
    if (pf[1].revents) {
      struct bks_msg m;
      char *pl;
      int e = mb_recv(g.hosts[0].fd, &ctrl, &m, &pl, PAGE + 512);
      if (e) home_ended(e, "reading a control message");
      control(&m, pl);
      __atomic_add_fetch(&g.processed, 1, __ATOMIC_RELEASE);
      if (__atomic_load_n(&g.processed_waiters, __ATOMIC_ACQUIRE))
        sc6(SYS_futex, (long)&g.processed, FUTEX_WAKE_PRIVATE, 1 << 30, 0, 0, 0);
    }
  }
}

/* ------------------------------------------------------------------ */
/* The acceptor: thread connections from home's executors              */

static void ip_text(uint32_t ip, char *out) {
  long a[4] = {ip & 255, (ip >> 8) & 255, (ip >> 16) & 255, ip >> 24};
  fmt(out, 16, "%d.%d.%d.%d", a);
}

static void refuse(int fd, uint32_t ip, uint16_t port, const char *why) {
  char t[16];
  ip_text(ip, t);
  say("bunkai share: node %d: refused a thread connection from %s:%d (%s)", g.self, (long)t, port, (long)why);
  sc1(SYS_close, fd);
}

/* Handshakes run on threads of their own, at most HANDSHAKES at once, so
 * that peers that connect and say nothing (anyone on the home host can)
 * cannot hold up the executors' connections. A worker's stack is reused
 * once the kernel has cleared its slot's TID (CLONE_CHILD_CLEARTID). */
#define HANDSHAKES 16
static struct hs_slot {
  volatile int tid; /* nonzero while the worker lives */
  int fd;
  uint32_t ip;
  uint16_t port;
  char *stack;
} hs[HANDSHAKES];

static void handshake(void *p) {
  struct hs_slot *s = p;
  block_signals();
  int from = -1;
  int e = auth_server(s->fd, BKS_ROLE_THREAD, &from);
  if (e) {
    refuse(s->fd, s->ip, s->port, auth_error(e));
    return;
  }
  struct bks_msg m;
  struct bks_start st;
  uint64_t deadline = now_ns() + (uint64_t)BKS_AUTH_MS * 1000000ull;
  if (rd_deadline(s->fd, &m, sizeof m, deadline) || m.type != BKS_START || m.len != sizeof st ||
      rd_deadline(s->fd, &st, sizeof st, deadline)) {
    refuse(s->fd, s->ip, s->port, "no START after the handshake");
    return;
  }
  tune_socket(s->fd);
  if (remote_thread_spawn(s->fd, &st)) refuse(s->fd, s->ip, s->port, "a START for a thread this node runs already");
}

static void acceptor(void *unused) {
  (void)unused;
  block_signals();
  for (;;) {
    struct sockaddr_in a;
    int alen = sizeof a;
    int fd = (int)sc4(SYS_accept4, g.listen_fd, &a, &alen, SOCK_CLOEXEC);
    if (fd < 0) {
      if (fd != -EINTR && fd != -ECONNABORTED) sleep_ms(10);
      continue;
    }
    fd = hide_fd(fd);
    uint16_t port = __builtin_bswap16(a.sin_port);
    if (a.sin_addr.s_addr != g.home_ip) {
      refuse(fd, a.sin_addr.s_addr, port, "not the home host");
      continue;
    }
    struct hs_slot *s = 0;
    for (int i = 0; i < HANDSHAKES && !s; i++)
      if (!__atomic_load_n(&hs[i].tid, __ATOMIC_ACQUIRE)) s = &hs[i];
    if (!s) {
      refuse(fd, a.sin_addr.s_addr, port, "16 handshakes in progress already");
      continue;
    }
    if (!s->stack) s->stack = priv_alloc(64 * 1024);
    s->fd = fd, s->ip = a.sin_addr.s_addr, s->port = port, s->tid = 1;
    long r = __bunkai_clone(THREAD_FLAGS | CLONE_CHILD_CLEARTID, s->stack + 64 * 1024, 0, handshake, s, &s->tid);
    if (r < 0) {
      s->tid = 0;
      refuse(fd, a.sin_addr.s_addr, port, "no thread for its handshake");
    }
  }
}

void start_acceptor(void) {
  char *stack = priv_alloc(256 * 1024);
  long r = __bunkai_clone(THREAD_FLAGS, stack + 256 * 1024, 0, acceptor, 0, 0);
  if (r < 0) die("cannot start the acceptor thread (%d)", r, 0, 0, 0);
}
