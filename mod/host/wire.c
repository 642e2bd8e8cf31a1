/*
 * wire.c - one connection to the command socket: who may use it
 * (SO_PEERCRED), its timeouts and the transaction's deadline, whole reads
 * (with the descriptors SCM_RIGHTS passes) and writes, and the framing of
 * messages: reading fields and names, building and sending answers.
 * Rules: host.h.
 */
#include "host.h"

uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

uint64_t txn_deadline; /* now_ns() after which a read gives up */

/* Reads exactly len bytes. A file descriptor passed with SCM_RIGHTS (MAP's
 * memfd) arrives with the bytes it was sent with; it is kept in *passed for
 * the message that uses it (an earlier one never claimed is closed). recvmsg
 * everywhere: a plain read() would silently drop the descriptor. */
int read_full(int fd, void *buf, size_t len, int *passed) {
  unsigned char *b = buf;
  while (len) {
    if (now_ns() > txn_deadline)
      return -1; /* the transaction took too long: it is rolled back */
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(4 * sizeof(int))];
    } ctl;
    struct iovec iov = {b, len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1,
                        .msg_control = &ctl, .msg_controllen = sizeof ctl};
    ssize_t n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
        continue;
      size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t k = 0; k < nfd; k++) {
        int got;
        memcpy(&got, CMSG_DATA(c) + k * sizeof(int), sizeof got);
        if (*passed >= 0)
          close(*passed);
        *passed = got;
      }
    }
    b += n;
    len -= (size_t)n;
  }
  return 0;
}

static int write_full(int fd, const void *buf, size_t len) {
  const unsigned char *b = buf;
  while (len) {
    ssize_t n = send(fd, b, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    b += n;
    len -= (size_t)n;
  }
  return 0;
}

uint32_t get32(struct msg *m) {
  uint32_t v = 0;
  if (m->off + 4 > m->len) {
    m->bad = 1;
    return 0;
  }
  memcpy(&v, m->p + m->off, 4);
  m->off += 4;
  return v;
}

uint64_t get64(struct msg *m) {
  uint64_t v = 0;
  if (m->off + 8 > m->len) {
    m->bad = 1;
    return 0;
  }
  memcpy(&v, m->p + m->off, 8);
  m->off += 8;
  return v;
}

/* A string; returns a pointer into the message (not NUL-terminated) */
const unsigned char *getbytes(struct msg *m, uint32_t *len) {
  *len = get32(m);
  if (m->bad || m->off + *len > m->len) {
    m->bad = 1;
    *len = 0;
    return NULL;
  }
  const unsigned char *p = m->p + m->off;
  m->off += *len;
  return p;
}

char *getstr(struct msg *m) {
  uint32_t n;
  const unsigned char *p = getbytes(m, &n);
  if (!p)
    return NULL;
  char *s = malloc(n + 1);
  if (!s)
    return NULL;
  memcpy(s, p, n);
  s[n] = 0;
  return s;
}

static void put(struct out *o, const void *d, size_t n) {
  if (o->len + n > o->cap) {
    size_t cap = o->cap ? o->cap * 2 : 256;
    while (cap < o->len + n)
      cap *= 2;
    unsigned char *p = realloc(o->p, cap);
    if (!p)
      abort(); /* the command thread cannot answer without memory */
    o->p = p;
    o->cap = cap;
  }
  memcpy(o->p + o->len, d, n);
  o->len += n;
}
void put32(struct out *o, uint32_t v) { put(o, &v, 4); }
void put64(struct out *o, uint64_t v) { put(o, &v, 8); }
void putstr(struct out *o, const char *s, size_t n) {
  put32(o, (uint32_t)n);
  put(o, s, n);
}

int send_msg(int fd, uint32_t type, struct out *body) {
  uint32_t hdr[2] = {(uint32_t)(4 + (body ? body->len : 0)), type};
  if (write_full(fd, hdr, sizeof hdr))
    return -1;
  return body && body->len ? write_full(fd, body->p, body->len) : 0;
}

int send_err(int fd, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  struct out o = {0};
  putstr(&o, buf, strlen(buf));
  int rc = send_msg(fd, BUNKAI_MSG_ERR, &o);
  free(o.p);
  return rc;
}

/* OK carrying the time the command took (ns since t0). */
int send_ok_since(int fd, uint64_t t0) {
  struct out o = {0};
  put64(&o, now_ns() - t0);
  int rc = send_msg(fd, BUNKAI_MSG_OK, &o);
  free(o.p);
  return rc;
}

/* A name from the message: 1 to MAX_NAME bytes, no NUL (a NUL would make
 * the C side see a shorter name than the one checked) and no other control
 * character (names appear in one-line answers and logs). Sets *why and
 * returns NULL if it is not one; m->bad if the message ends first. */
char *getname(struct msg *m, const char *what, char *why, size_t wl) {
  uint32_t n;
  const unsigned char *p = getbytes(m, &n);
  if (!p)
    return NULL;
  int ctl = 0;
  for (uint32_t k = 0; k < n && k <= MAX_NAME; k++)
    ctl |= p[k] < 0x20 || p[k] == 0x7f;
  if (n == 0 || n > MAX_NAME || memchr(p, 0, n) || ctl) {
    snprintf(why, wl, "%s %s", what,
             n == 0              ? "is empty"
             : n > MAX_NAME      ? "is longer than 255 bytes"
             : memchr(p, 0, n)   ? "contains a NUL byte"
                                 : "contains a control character");
    return NULL;
  }
  char *s = malloc(n + 1);
  if (!s) {
    snprintf(why, wl, "out of memory");
    return NULL;
  }
  memcpy(s, p, n);
  s[n] = 0;
  return s;
}

/* Every connection gets timeouts on its reads and writes: a client that
 * stops half-way through a message, or stops reading our answers, is
 * dropped (its transaction rolled back) instead of stopping the host's
 * module server for ever. */
static void set_timeouts(int fd) {
  struct timeval tv = {.tv_sec = IO_TIMEOUT_S};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* Accepts one connection; 1 if it may be served, 0 if it was refused. */
int admit(int fd) {
  set_timeouts(fd);
  struct ucred cred;
  socklen_t cl = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0 &&
      (cred.uid == getuid() || cred.uid == 0))
    return 1;
  send_err(fd, "permission denied: only the host's owner or root may load "
               "code into it");
  return 0;
}
