/* home_manager.c: the memory control part (§3) on the home host: one
 * thread, the manager, owns the page directory and the registered ranges
 * (directory.c), serves every host's page faults and is the only sender
 * of control messages to the nodes. Rules: runtime.h.
 *
 * One piece on purpose (over 800 lines): the invariant below is kept by
 * these functions together (serving a request, taking copies, invalidating,
 * home's pending step and the mapping events share the directory, `todo`
 * and the manager's one order); split, no file would show a reader all of
 * what makes it hold. The directory, the wire and the threads are apart.
 *
 * THE PAGE-STATE PROTOCOL
 *
 * Pages. Every page of a registered range has one state in the directory:
 * Excl(h), host h holds the only copy and may write it (default: Excl(home),
 * where home's own memory holds the contents, zeros if it holds nothing);
 * or Shared(S), the hosts in S hold read-only copies, nobody writes. The
 * hosts' page tables follow the directory: under Excl(h) only h has the
 * page present, writable; under Shared(S) only hosts in S have it present,
 * write-protected (userfaultfd: missing = invalid, present + write-protect
 * = read-only, present = writable).
 *
 * Requests. A host whose thread touches a page it may not access asks the
 * manager (home threads through home's userfaultfd, nodes with PAGE_REQ).
 * The manager serves requests one at a time, and each to completion
 * before the next:
 *   read by r, Excl(o):      o write-protects, sends a copy   -> Shared({o, r})
 *   read by r, Shared(S):    a member of S sends a copy       -> Shared(S + r)
 *   write by r, Excl(o):     o write-protects, sends, drops   -> Excl(r)
 *   write by r, Shared(S):   every other member drops its copy and ACKs
 *                            (r gets the contents first if it has none)
 *                                                             -> Excl(r)
 *   then r's copy is installed (or its write protection lifted).
 * A node does what a control message says before it reads the next one,
 * and answers FETCH/DOWNGRADE/TAKE/INVALIDATE only after its page table
 * has changed (write protection and madvise flush the TLBs).
 *
 * Why this is sequentially consistent. All transitions of all pages are
 * totally ordered by the manager. A write to a page happens only under
 * Excl(writer), granted after every other copy was dropped and
 * acknowledged, so no host can read the old value after the grant; a
 * read-only copy carries the value of the last write (taken from the last
 * writer after its write protection stopped further writes) and stays
 * readable only until the next transition to Excl, which drops it first.
 * So each page's history is a sequence of writes, each followed by reads
 * that all see it, and any two hosts' operations on different pages are
 * ordered through the manager's single order (the store-buffering case:
 * a host that reads an old copy of y does so before the grant that lets
 * the other host write y, which comes after the grant that let it write
 * x; see tests/share/litmus.c). Within a host the program keeps the
 * machine's own model (x86-TSO), as it has natively.
 *
 * Mappings. What nodes have mapped is a subset of the registered ranges
 * (`regs`), and the directory has entries only inside them. Only the
 * manager adds to `regs` (MAPINFO, fresh mappings, libraries prepared
 * after dlopen), each time telling the node that asked with MAP or FRESH;
 * home's unmaps and mremaps reach the manager as userfaultfd events
 * (UNMAP, REMAP), which it applies to `regs` and the directory and sends
 * on to every node. All of these travel on the same control connections
 * as the page messages, in the manager's order, so a node never holds a
 * mapping, or a page of one, that home has already replaced: a stale copy
 * cannot be read after the memory was freed and reused. A node changes
 * its own mappings only when the manager says so (its threads' mmap,
 * munmap, mremap, mprotect, brk and madvise(MADV_DONTNEED) are forwarded
 * home, and answered only once the node has applied what they changed:
 * BKS_RES_MAPS_CHANGED).
 *
 * Home's own mapping changes. The program's threads at home change home's
 * mappings natively, and the kernel tells the manager only afterwards.
 * While such an event is unread, every userfaultfd call the manager makes
 * fails with EAGAIN (the kernel's mmap_changing): the manager then reads
 * the events and tries again. A request that changed nothing yet is served
 * again from the start; a request whose directory change is done keeps
 * its last step (installing home's copy, or lifting its write protection)
 * as `todo`, which follows the events: an unmap drops it, an mremap moves
 * it. Ignoring EAGAIN here lost pages and let home write pages others held
 * copies of (lbzip2's wrong outputs and malloc crashes).
 *
 * Pages home drops. madvise(MADV_DONTNEED) by a home thread is not
 * announced by the kernel (UFFD_FEATURE_EVENT_REMOVE would make the
 * manager's own drops wait on itself); it is seen when home next touches
 * the page: a page the directory says home holds but home does not have
 * was dropped by the program, so it becomes zeros everywhere (other
 * hosts' copies are invalidated first). Threads on nodes forward
 * madvise(MADV_DONTNEED) (ITEM_ZAP): every host drops the range at once.
 */
#include "runtime.h"
#include <linux/futex.h>
#include <linux/userfaultfd.h>

#ifndef MADV_DONTNEED_LOCKED
#define MADV_DONTNEED_LOCKED 24
#endif

struct rangeset regs;

/* Drops our copy of [p, p + len) (mlocked memory too). */
static void drop(uint64_t p, uint64_t len) {
  if (sc3(SYS_madvise, p, len, MADV_DONTNEED_LOCKED) == -EINVAL) sc3(SYS_madvise, p, len, MADV_DONTNEED);
}

/* ------------------------------------------------------------------ */
/* Requests                                                            */

struct req {
  int host;
  uint64_t page;
  int write;
  uint64_t t0;
};

/* FIFO queues of requests, growing in the private region. */
struct reqq {
  struct req *q;
  uint32_t head, tail, cap;
};
static struct reqq pending;  /* to serve */

static void rq_push(struct reqq *r, struct req x) {
  if (r->tail - r->head == r->cap) {
    uint32_t nc = r->cap ? r->cap * 2 : 1024;
    struct req *n = priv_alloc((uint64_t)nc * sizeof *n);
    for (uint32_t i = r->head; i != r->tail; i++) n[i - r->head] = r->q[i & (r->cap - 1)];
    if (r->q) sc2(SYS_munmap, r->q, PAGE_UP((uint64_t)r->cap * sizeof *n));
    r->tail -= r->head, r->head = 0, r->q = n, r->cap = nc;
  }
  r->q[r->tail++ & (r->cap - 1)] = x;
}
static int rq_pop(struct reqq *r, struct req *x) {
  if (r->head == r->tail) return 0;
  *x = r->q[r->head++ & (r->cap - 1)];
  return 1;
}

/* Threads that handed over their TID word (hand_over_tid_word), until they
 * have gone. */
static struct item *exiting[BKS_MAX_THREADS];
static int nexiting;

/* Executor -> manager queue. */
static volatile int qlock;
static struct item *queue[64];
static volatile int qlen;
static int qevent;

static void host_send(int h, uint32_t type, uint64_t a, uint64_t b, uint64_t c, const void *pl, uint32_t len) {
  send_msg(g.hosts[h].fd, type, a, b, c, pl, len);
  g.hosts[h].sent++;
}
static void all_send(uint32_t type, uint64_t a, uint64_t b, uint64_t c) {
  for (int h = 1; h < g.nhosts; h++) host_send(h, type, a, b, c, 0, 0);
}

void node_gone(int h, int err) {
  if (g.stats && !g.stats->failed_host) g.stats->failed_host = (uint32_t)h, g.stats->failed_err = err;
  die("node %d vanished (%s; check that `bunkai share node` still runs there and the link is up)", h,
      (long)(err == -ETIMEDOUT ? "connection timed out" : err == -ECONNRESET ? "connection reset" : "connection closed"),
      0, 0);
}

/* ------------------------------------------------------------------ */
/* Home's pending step, and the events that move it                    */

enum { TODO_NONE, TODO_INSTALL, TODO_UPGRADE, TODO_ZERO, TODO_RESTORE };
static struct {
  int kind;
  uint64_t page;
  int ro;
} todo;
static uint8_t todo_data[PAGE] __attribute__((aligned(64)));

static void handle_ctrl(int h, struct bks_msg *m, char *pl);

/* The program unmapped [s, e) at home. */
static void on_unmap(uint64_t s, uint64_t e) {
  dir_forget(s, e);
  /* nodes map only registered ranges: nothing else can be there */
  if (rs_cut(&regs, s, e, 1)) all_send(BKS_UNMAP, s, e, 0);
  if (todo.kind && todo.page >= s && todo.page < e) todo.kind = TODO_NONE;
}

/* The program moved [from, from + len) to to (mremap). */
static void on_remap(uint64_t from, uint64_t to, uint64_t len) {
  dir_move(from, to, len);
  if (rs_cut(&regs, from, from + len, 1)) {
    rs_add(&regs, to, to + len);
    all_send(BKS_REMAP, from, to, len);
  }
  if (todo.kind && todo.page >= from && todo.page < from + len) todo.page = todo.page - from + to;
}

static uint64_t layout_changes; /* events applied: a way to see that some came in between */
static uint64_t last_lo, last_hi; /* the span the last events touched (for MAPINFO's check) */

static void handle_event(struct uffd_msg *m) {
  if (m->event == UFFD_EVENT_PAGEFAULT) {
    uint64_t f = m->arg.pagefault.flags;
    rq_push(&pending, (struct req){0, PAGE_DOWN(m->arg.pagefault.address),
                                   (f & (UFFD_PAGEFAULT_FLAG_WRITE | UFFD_PAGEFAULT_FLAG_WP)) != 0, now_ns()});
    return;
  }
  uint64_t lo, hi;
  if (m->event == UFFD_EVENT_UNMAP) {
    lo = m->arg.remove.start, hi = m->arg.remove.end;
    on_unmap(lo, hi);
  } else if (m->event == UFFD_EVENT_REMAP) {
    uint64_t from = m->arg.remap.from, to = m->arg.remap.to, len = m->arg.remap.len;
    on_remap(from, to, len);
    lo = from < to ? from : to, hi = (from > to ? from : to) + len;
  } else {
    return;
  }
  layout_changes++;
  if (lo < last_lo) last_lo = lo;
  if (hi > last_hi) last_hi = hi;
}

/* Reads and applies every event the kernel has for us; returns how many
 * messages it read. */
static int drain_events(void) {
  struct uffd_msg msgs[16];
  int n = 0;
  for (;;) {
    long r = sc3(SYS_read, g.uffd, msgs, sizeof msgs);
    if (r == -EINTR) continue;
    if (r <= 0) break;
    for (long i = 0; i < r / (long)sizeof msgs[0]; i++) handle_event(&msgs[i]);
    n += (int)(r / (long)sizeof msgs[0]);
  }
  return n;
}

/* A home-side call failed with EAGAIN: a mapping change is in flight. The
 * kernel flags it before the change and queues its event after, so the
 * event may not be there yet: wait for it rather than spin (on two cores
 * the spinning would hold up the very thread that is unmapping). */
static void changed_meanwhile(void) {
  g.stats->retries++;
  if (drain_events()) return;
  struct pollfd pf = {g.uffd, POLLIN, 0};
  sc3(SYS_poll, &pf, 1, 1);
  drain_events();
}

/* Carries out `todo`, following mapping changes until it is done or its
 * memory is gone. */
static void home_apply(void) {
  while (todo.kind) {
    long e;
    uint64_t p = todo.page;
    if (todo.kind == TODO_INSTALL) {
      e = uffd_copy(p, todo_data, todo.ro);
      if (e == -EEXIST)
        die("internal error: page 0x%x is already at home (directory out of step; please report)", (long)p, 0, 0, 0);
    } else if (todo.kind == TODO_RESTORE) {
      /* putting back a copy we dropped: if the drop missed it (the page
       * had moved first), it is there already */
      e = uffd_copy(p, todo_data, todo.ro);
      if (e == -EEXIST) e = 0;
    } else if (todo.kind == TODO_ZERO) {
      e = uffd_copy(p, zero_page, 0);
      if (e == -EEXIST) e = uffd_wp(p, PAGE, 0); /* a thread raced us here: fine, it is home's */
    } else {
      e = uffd_wp(p, PAGE, 0);
    }
    if (e == -EAGAIN) {
      changed_meanwhile();
      continue;
    }
    if (e) uffd_wake(p, PAGE); /* -ENOENT: unmapped meanwhile (the thread will see it) */
    todo.kind = TODO_NONE;
  }
}

/* ------------------------------------------------------------------ */
/* Copies of pages                                                     */

static uint32_t awaited; /* hosts await() read from since the loop's last poll */

/* Waits for host h's reply of the given type for page; other messages
 * from h are queued. Returns the payload length. */
static uint32_t await(int h, uint32_t type, uint64_t page, void *data) {
  static char pl[PAGE + 512];
  awaited |= 1u << h;
  for (;;) {
    struct bks_msg m;
    int r = recv_msg(g.hosts[h].fd, &m, pl, sizeof pl);
    if (r) node_gone(h, r);
    if (m.type == type && m.a == page) {
      if (data) {
        if (m.len == PAGE) memcpy(data, pl, PAGE);
        else memset(data, 0, PAGE);
      }
      return m.len;
    }
    handle_ctrl(h, &m, pl);
  }
}

enum { DONE = 0, AGAIN = 1 };

/* A copy of page from host src: FETCH (src keeps it as it is), DOWNGRADE
 * (src keeps a read-only copy) or TAKE (src drops it). AGAIN: home could
 * not stop its own writes yet (a mapping change in flight); nothing
 * changed. */
/* Did a mapping change begin since home's last check? Reads and drops of
 * home's memory are not refused during one, as the userfaultfd calls are,
 * so each is followed by a look at the kernel's flag that refuses them
 * (uffd_changing: the flag is set before the change, under the mmap lock
 * our read or drop took too, and stays set until we read the change's
 * event, so a read that saw the change is always followed by a look that
 * sees the flag. The drop, madvise, takes the mmap lock here because the
 * range is registered with userfaultfd: since 6.16 it takes only the
 * mapping's own lock elsewhere, which is released after the flag is set
 * too). If one began, what was dropped is
 * put back (`todo` follows the change), and the request is served again
 * from the start: nothing else has changed yet. */
static int changed_since(uint64_t page, const uint8_t *dropped, int ro) {
  if (uffd_changing() != -EAGAIN) return 0;
  if (dropped) {
    memcpy(todo_data, dropped, PAGE);
    todo.kind = TODO_RESTORE, todo.page = page, todo.ro = ro;
  }
  changed_meanwhile();
  home_apply();
  return 1;
}

static int get_copy(int src, uint64_t page, uint32_t kind, void *data) {
  if (src != 0) {
    host_send(src, kind, page, 0, 0, 0, 0);
    await(src, BKS_DATA, page, data);
    g.stats->host[src].pages_out++;
    return DONE;
  }
  if (kind != BKS_FETCH) {
    long e = uffd_wp(page, PAGE, 1);
    if (e == -EAGAIN) return AGAIN;
  }
  /* write-protected now (or missing: a home thread's touch would come to
   * us), so what we read is the page's last value */
  int here = mem_read(page, data, PAGE);
  if (kind == BKS_DOWNGRADE && !here) {
    /* untouched: the read-only copy home keeps is zeros */
    long e = uffd_copy(page, zero_page, 1);
    if (e == -EAGAIN) return AGAIN;
  }
  if (kind == BKS_TAKE) drop(page, PAGE);
  return changed_since(page, kind == BKS_TAKE ? data : 0, 0) ? AGAIN : DONE;
}

static int is_zero(const uint8_t *p) {
  const uint64_t *w = (const uint64_t *)p;
  for (unsigned i = 0; i < PAGE / 8; i++)
    if (w[i]) return 0;
  return 1;
}

/* Gives node r the page: its contents (zeros travel as a flag) or none
 * (r holds it), in mode 1 (read-only) or 2. */
static void grant_node(int r, uint64_t page, const uint8_t *data, int mode) {
  if (!data) {
    host_send(r, BKS_GRANT, page, (uint64_t)mode, 0, 0, 0);
  } else if (is_zero(data)) {
    host_send(r, BKS_GRANT, page, (uint64_t)mode, BKS_GRANT_ZERO, 0, 0);
    g.stats->host[r].pages_in++;
  } else {
    host_send(r, BKS_GRANT, page, (uint64_t)mode, 0, data, PAGE);
    g.stats->host[r].pages_in++;
  }
}

/* Every host in cs but keep drops its copy; returns once all have. Home
 * drops first: if a mapping change came in between, its copy is put back
 * and nothing else has changed (AGAIN). */
static int invalidate(uint16_t cs, int keep, uint64_t page) {
  static uint8_t mine[PAGE] __attribute__((aligned(64)));
  uint16_t others = cs & (uint16_t)~(1u << keep);
  if (others & 1) {
    mem_read(page, mine, PAGE);
    drop(page, PAGE);
    if (changed_since(page, mine, 1)) return AGAIN;
    g.stats->host[0].invalidations++;
  }
  for (int s = 1; s < g.nhosts; s++)
    if (others & (1u << s)) host_send(s, BKS_INVALIDATE, page, 0, 0, 0, 0);
  for (int s = 1; s < g.nhosts; s++)
    if (others & (1u << s)) {
      await(s, BKS_ACK, page, 0);
      g.stats->host[s].invalidations++;
    }
  return DONE;
}

static void set_dir(uint64_t page, int owner, uint16_t cs) {
  struct dent *e = dir_find(page, owner != 0 || cs != 0 || dir_find(page, 0));
  if (e) e->owner = (uint8_t)owner, e->copyset = cs;
}

/* ------------------------------------------------------------------ */
/* Serving one request                                                 */

static uint8_t data[PAGE] __attribute__((aligned(64)));

/* A node's request. */
static int serve_node(int r, uint64_t page, int write, int owner, uint16_t cs) {
  int holds_w = owner == r, holds_r = owner == SHARED_OWNER && (cs >> r) & 1;
  if (holds_w) {
    /* its own page: a fresh page it stopped tracking, or a request that
     * crossed the grant it answers: zeros if it has nothing there */
    host_send(r, BKS_GRANT, page, 2, BKS_GRANT_ZERO, 0, 0);
    return DONE;
  }
  if (!write) {
    if (holds_r) {
      grant_node(r, page, 0, 1);
      return DONE;
    }
    if (owner != SHARED_OWNER) {
      if (get_copy(owner, page, BKS_DOWNGRADE, data) == AGAIN) return AGAIN;
      cs = (uint16_t)((1u << owner) | (1u << r));
    } else {
      int src = (cs & 1) ? 0 : __builtin_ctz(cs);
      if (get_copy(src, page, BKS_FETCH, data) == AGAIN) return AGAIN;
      cs |= (uint16_t)(1u << r);
    }
    set_dir(page, SHARED_OWNER, cs);
    grant_node(r, page, data, 1);
    return DONE;
  }
  if (owner != SHARED_OWNER) {
    if (get_copy(owner, page, BKS_TAKE, data) == AGAIN) return AGAIN;
    set_dir(page, r, 0);
    grant_node(r, page, data, 2);
    return DONE;
  }
  if (!holds_r) {
    int src = (cs & 1) ? 0 : __builtin_ctz(cs);
    if (get_copy(src, page, BKS_FETCH, data) == AGAIN) return AGAIN;
  }
  if (invalidate(cs, r, page) == AGAIN) return AGAIN;
  set_dir(page, r, 0);
  grant_node(r, page, holds_r ? 0 : data, 2);
  return DONE;
}

/* A home thread's fault. */
static int serve_home(uint64_t page, int write, int owner, uint16_t cs) {
  int holds = owner == 0 || (owner == SHARED_OWNER && (cs & 1));
  if (holds) {
    if (!page_here(page)) {
      /* never touched, or the program dropped it (MADV_DONTNEED): zeros,
       * everywhere */
      if (owner == SHARED_OWNER) invalidate(cs, 0, page);
      set_dir(page, 0, 0);
      todo.kind = TODO_ZERO, todo.page = page;
      home_apply();
      return DONE;
    }
    if (!write) {
      uffd_wake(page, PAGE);
      return DONE;
    }
    if (owner == SHARED_OWNER) {
      invalidate(cs, 0, page);
      set_dir(page, 0, 0);
    }
    todo.kind = TODO_UPGRADE, todo.page = page;
    home_apply();
    return DONE;
  }
  if (owner != SHARED_OWNER) {
    get_copy(owner, page, write ? BKS_TAKE : BKS_DOWNGRADE, todo_data);
    if (write) set_dir(page, 0, 0);
    else set_dir(page, SHARED_OWNER, (uint16_t)((1u << owner) | 1u));
  } else {
    int src = __builtin_ctz(cs);
    get_copy(src, page, BKS_FETCH, todo_data);
    if (write) {
      invalidate(cs, 0, page);
      set_dir(page, 0, 0);
    } else {
      set_dir(page, SHARED_OWNER, (uint16_t)(cs | 1u));
    }
  }
  g.stats->host[0].pages_in++;
  todo.kind = TODO_INSTALL, todo.page = page, todo.ro = !write;
  home_apply();
  return DONE;
}

static int serve(struct req *q) {
  int r = q->host;
  uint64_t page = q->page;
  if (!rs_find(&regs, page)) {
    if (r != 0) {
      host_send(r, BKS_GONE, page, 0, 0, 0, 0);
      return DONE;
    }
    /* home memory no node knows of (a stack that grew, the new end of an
     * mremap'ed range): home's own, zeros */
    long e = q->write ? uffd_copy(page, zero_page, 0) : uffd_zero(page);
    if (e == -EEXIST) e = uffd_wp(page, PAGE, 0);
    if (e == -EAGAIN) return AGAIN;
    if (e) uffd_wake(page, PAGE);
    return DONE;
  }
  struct dent *e = dir_find(page, 0);
  int owner = e ? e->owner : 0;
  uint16_t cs = e ? e->copyset : 0;
  if (q->write) g.stats->host[r].write_faults++;
  else g.stats->host[r].read_faults++;
  int res = r ? serve_node(r, page, q->write, owner, cs) : serve_home(page, q->write, owner, cs);
  if (res == DONE) g.stats->host[r].fault_ns += now_ns() - q->t0;
  return res;
}

static void serve_pending(void) {
  struct req q;
  while (rq_pop(&pending, &q)) {
    while (serve(&q) == AGAIN) changed_meanwhile();
  }
}

static void handle_ctrl(int h, struct bks_msg *m, char *pl) {
  switch (m->type) {
  case BKS_PAGE_REQ:
    rq_push(&pending, (struct req){h, PAGE_DOWN(m->a), (m->b & BKS_REQ_WRITE) != 0, now_ns()});
    break;
  case BKS_ERROR:
    pl[m->len < PAGE ? m->len : PAGE - 1] = 0;
    die("node %d: %s", h, (long)pl, 0, 0);
  default:
    die("node %d sent an unexpected message (type %d)", h, m->type, 0, 0);
  }
}

/* ------------------------------------------------------------------ */
/* Mappings                                                            */

static char *maps_buf;
#define MAPS_CAP (8l << 20)

/* Registers [s, e) for sharing (home threads' accesses now go through the
 * directory). */
static int share_range(uint64_t s, uint64_t e) {
  long r = uffd_register(s, e);
  if (r) return (int)r;
  rs_add(&regs, s, e);
  g.stats->mappings++;
  return 0;
}

/* How often mapinfo reads the maps before it gives up on a changing layout. */
#define MAPINFO_TRIES 100000

/* A node's thread faulted at addr: make the home mapping there shared
 * memory and tell the node to map it. */
static void mapinfo(struct item *it) {
  uint64_t addr = it->page;
  int access = (int)it->len; /* 0 read, 1 write, 2 execute */
  int need = access == 1 ? PROT_WRITE : access == 2 ? PROT_EXEC : PROT_READ;
  int misses = 0;
  for (int tries = 0;; tries++) {
    if (tries > MAPINFO_TRIES) die("the mappings at 0x%x keep changing while a node maps them", (long)addr, 0, 0, 0);
    drain_events();
    struct vma v;
    int found = find_vma(maps_buf, MAPS_CAP, addr, &v);
    if (!found && mapped_at(addr)) {
      /* this kernel reads the maps without the mmap lock, and our read
       * caught a mremap in the middle (mapped_at holds the lock): look
       * again once it is done */
      sc0(SYS_sched_yield);
      continue;
    }
    if (!found || ours(&v) || (!v.shared && !(v.prot & need))) {
      /* a real fault, unless an mprotect or munmap was under way: look
       * twice more */
      if (++misses < 3) continue;
      it->result_status = BKS_MAPPED_NONE;
      if (found) it->prot = (uint64_t)v.prot;
      break;
    }
    it->prot = (uint64_t)v.prot;
    if (v.shared) {
      it->result_status = BKS_MAPPED_SHARED;
      break;
    }
    uint64_t seen = layout_changes;
    last_lo = ~0ull, last_hi = 0;
    if (v.inode != 0) {
      /* a file mapping made after start-up (dlopen, mmap): the executor
       * makes it shared memory with the same contents (convert.c), so
       * that home's unmapping of it reaches the nodes; then asks again */
      it->result_status = BKS_MAPPED_CONVERT;
      return;
    }
    if (share_range(v.start, v.end)) continue; /* it changed since we read it: look again */
    drain_events();
    if (layout_changes != seen && last_lo < v.end && last_hi > v.start) continue; /* changed under us: look again */
    host_send(it->host, BKS_MAP, v.start, v.end, (uint64_t)v.prot, 0, 0);
    it->result_status = BKS_MAPPED_OK;
    break;
  }
  it->result = g.hosts[it->host].sent;
}

/* The dynamic linker mapped new objects and the thread that loaded them
 * converted their writable file mappings (convert.c, convert_loaded):
 * register those that are still what it made. */
static void prepare(struct item *it) {
  drain_events();
  for (int i = 0; i < it->nbases; i++) {
    struct vma v;
    if (!find_vma(maps_buf, MAPS_CAP, it->bases[i].start, &v) || v.inode != 0 || v.start != it->bases[i].start ||
        v.end != it->bases[i].end || rs_overlaps(&regs, v.start, v.end))
      continue;
    if (!share_range(v.start, v.end)) g.stats->converted++;
  }
  drain_events();
}

/* A node's thread made a private anonymous mapping: its pages belong to
 * that node from the start, as zeros (first touch). */
static void fresh(struct item *it) {
  uint64_t s = it->page, e = it->page + it->len;
  drain_events();
  it->result_status = 0;
  if (!rs_overlaps(&regs, s, e) && !page_here(s)) {
    uint64_t seen = layout_changes;
    if (!uffd_register(s, e)) {
      drain_events();
      if (layout_changes == seen) {
        rs_add(&regs, s, e);
        g.stats->mappings++;
        dir_set_owner(s, e, it->host);
        g.stats->host[it->host].fresh_pages += it->len / PAGE;
        host_send(it->host, BKS_FRESH, s, e, it->prot, 0, 0);
        it->result_status = 1;
      }
    }
  }
  it->result = g.hosts[it->host].sent;
}

/* madvise(MADV_DONTNEED) (and alike) by a node's thread: the range is
 * dropped on every host, so it reads as zeros everywhere. */
static void zap(struct item *it) {
  uint64_t s = it->page, e = it->page + it->len;
  drain_events();
  long r = sc3(SYS_madvise, s, it->len, (long)it->prot);
  it->result_status = (uint64_t)r;
  if (r == 0 && rs_overlaps(&regs, s, e)) {
    for (int h = 1; h < g.nhosts; h++) host_send(h, BKS_ZAP, s, e, 0, 0, 0);
    for (int h = 1; h < g.nhosts; h++) await(h, BKS_ACK, s, 0);
    dir_forget(s, e);
    g.stats->zapped_pages += it->len / PAGE;
  }
  it->result = g.hosts[it->host].sent;
}

/* ------------------------------------------------------------------ */
/* The executor -> manager queue                                       */

static void run_queue(void) {
  for (;;) {
    struct item *it = 0;
    lock(&qlock);
    if (qlen) {
      it = queue[0];
      for (int i = 1; i < qlen; i++) queue[i - 1] = queue[i];
      qlen--;
    }
    unlock(&qlock);
    if (!it) return;
    switch (it->kind) {
    case ITEM_TID:
      if (nexiting < BKS_MAX_THREADS) {
        exiting[nexiting++] = it;
        __atomic_store_n(&it->done, 1, __ATOMIC_RELEASE);
        sc6(SYS_futex, (long)&it->done, FUTEX_WAKE_PRIVATE, 1, 0, 0, 0);
        continue; /* ours now: released when the thread has gone */
      }
      /* table full: let the kernel clear it, as natively */
      sc1(SYS_close, it->pidfd);
      break;
    case ITEM_BARRIER:
      drain_events();
      it->result = g.hosts[it->host].sent;
      break;
    case ITEM_PROTECT:
      drain_events();
      all_send(BKS_PROTECT, it->page, it->len, it->prot);
      it->result = g.hosts[it->host].sent;
      break;
    case ITEM_FRESH: fresh(it); break;
    case ITEM_MAPINFO: mapinfo(it); break;
    case ITEM_ZAP: zap(it); break;
    case ITEM_PREPARE: prepare(it); break;
    }
    __atomic_store_n(&it->done, 1, __ATOMIC_RELEASE);
    sc6(SYS_futex, (long)&it->done, FUTEX_WAKE_PRIVATE, 1, 0, 0, 0);
  }
}

/* A free list of items in our private region. */
static volatile int item_lock;
static struct item *free_items;

struct item *item_get(void) {
  lock(&item_lock);
  if (!free_items) {
    struct item *a = priv_alloc(64 * sizeof *a);
    for (int i = 0; i < 64; i++) a[i].next = free_items, free_items = &a[i];
  }
  struct item *it = free_items;
  free_items = it->next;
  unlock(&item_lock);
  memset(it, 0, sizeof *it);
  return it;
}

void item_put(struct item *it) {
  lock(&item_lock);
  it->next = free_items, free_items = it;
  unlock(&item_lock);
}

/* An executor (or a home thread) asks the manager something and waits. */
uint64_t ask_manager(struct item *it) {
  for (;;) {
    lock(&qlock);
    if (qlen < 64) {
      queue[qlen++] = it;
      unlock(&qlock);
      break;
    }
    unlock(&qlock);
    sc0(SYS_sched_yield);
  }
  uint64_t one = 1;
  sc3(SYS_write, qevent, &one, 8);
  while (!__atomic_load_n(&it->done, __ATOMIC_ACQUIRE)) sc6(SYS_futex, (long)&it->done, FUTEX_WAIT_PRIVATE, 0, 0, 0, 0);
  return it->result;
}

/* A thread that handed over its TID word has gone: the word becomes 0 and
 * its waiters (pthread_join, glibc's stack cache) are woken, as the kernel
 * would have done. The page is made home's, writable, first (a home write
 * request, served here and now). */
static void clear_tid(struct item *it) {
  uint64_t word = it->page;
  struct req q = {0, PAGE_DOWN(word), 1, now_ns()};
  while (serve(&q) == AGAIN) changed_meanwhile();
  uint32_t zero = 0;
  long r = sc4(SYS_pwrite64, g.memw_fd, &zero, 4, word);
  if (r == 4) sc6(SYS_futex, (long)word, FUTEX_WAKE, 0x7fffffff, 0, 0, 0); /* shared, as the kernel's */
  sc1(SYS_close, it->pidfd);
  item_put(it);
}

/* ------------------------------------------------------------------ */
/* The loop                                                            */

static uint64_t last_activity; /* for spin_poll */

static void home_manager(void *unused) {
  (void)unused;
  block_signals();
  static struct pollfd pf[2 + BKS_MAX_HOSTS + BKS_MAX_THREADS];
  static char pl[PAGE + 512];
  for (;;) {
    serve_pending();
    int n = 0;
    pf[n++] = (struct pollfd){g.uffd, POLLIN, 0};
    pf[n++] = (struct pollfd){qevent, POLLIN, 0};
    for (int h = 1; h < g.nhosts; h++) pf[n++] = (struct pollfd){g.hosts[h].fd, POLLIN, 0};
    int ex0 = n, polled = nexiting; /* run_queue below may add more: they were not polled */
    for (int i = 0; i < nexiting; i++) pf[n++] = (struct pollfd){exiting[i]->pidfd, POLLIN, 0};
    awaited = 0;
    long r = spin_poll(pf, n, &last_activity);
    if (r < 0) continue;
    if (pf[0].revents) drain_events();
    if (pf[1].revents) {
      uint64_t v;
      sc3(SYS_read, qevent, &v, 8);
      run_queue();
    }
    for (int h = 1; h < g.nhosts; h++) {
      if (!pf[1 + h].revents) continue;
      /* the queue or the events above may have waited on this node and
       * read what poll saw: then look again before a read that would block */
      struct pollfd one = {g.hosts[h].fd, POLLIN, 0};
      if (((awaited >> h) & 1) && sc3(SYS_poll, &one, 1, 0) <= 0) continue;
      struct bks_msg m;
      int e = recv_msg(g.hosts[h].fd, &m, pl, sizeof pl);
      if (e) node_gone(h, e);
      handle_ctrl(h, &m, pl);
    }
    for (int i = polled - 1; i >= 0; i--) {
      if (!pf[ex0 + i].revents) continue;
      struct item *it = exiting[i];
      exiting[i] = exiting[--nexiting];
      clear_tid(it);
    }
  }
}

void home_manager_start(void) {
  maps_buf = priv_alloc(MAPS_CAP);
  qevent = hide_fd((int)sc2(SYS_eventfd2, 0, O_CLOEXEC));
  char *stack = priv_alloc(1 << 20);
  long r = __bunkai_clone(THREAD_FLAGS, stack + (1 << 20), 0, home_manager, 0, 0);
  if (r < 0) die("cannot start the manager thread (%d)", r, 0, 0, 0);
}

/* Start-up (before the manager runs): register every shared mapping. */
void home_register(uint64_t s, uint64_t e) {
  if (share_range(s, e)) die("cannot register 0x%x-0x%x with userfaultfd", (long)s, (long)e, 0, 0);
}
