/* wire.c: TCP for the runtime (bunkai_share.h section 3): whole writes and
 * reads, messages, and the socket options every connection gets. Rules:
 * runtime.h. */
#include "runtime.h"
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* 0, or -1 when the connection is gone (the reader sees its end). */
int wr_all(int fd, const void *b, size_t n) {
  const char *p = b;
  while (n) {
    long r = sc4(SYS_sendto, fd, p, n, MSG_NOSIGNAL);
    if (r == -EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

/* One read of up to n bytes, waiting while there is nothing to read: the
 * bytes read, 0 at the end of the stream, or -errno. */
static long read_some(int fd, void *b, size_t n) {
  for (;;) {
    long r = sc3(SYS_read, fd, b, n);
    if (r == -EINTR) continue;
    if (r == -EAGAIN) {
      struct pollfd pf = {fd, POLLIN, 0};
      sc3(SYS_poll, &pf, 1, -1);
      continue;
    }
    return r;
  }
}

/* 0, or -1 at the end of the stream, or -errno. */
int rd_all(int fd, void *b, size_t n) {
  char *p = b;
  while (n) {
    long r = read_some(fd, p, n);
    if (r <= 0) return r == 0 ? -1 : (int)r;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

/* rd_all that gives up at deadline (CLOCK_MONOTONIC ns): -ETIMEDOUT. */
int rd_deadline(int fd, void *b, size_t n, uint64_t deadline) {
  char *p = b;
  while (n) {
    uint64_t now = now_ns();
    if (now >= deadline) return -ETIMEDOUT;
    struct pollfd pf = {fd, POLLIN, 0};
    long pr = sc3(SYS_poll, &pf, 1, (long)((deadline - now) / 1000000 + 1));
    if (pr == -EINTR || pr == 0) continue;
    if (pr < 0) return (int)pr;
    long r = sc4(SYS_recvfrom, fd, p, n, MSG_DONTWAIT);
    if (r == -EINTR || r == -EAGAIN) continue;
    if (r <= 0) return r == 0 ? -1 : (int)r;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

void send_msg(int fd, uint32_t type, uint64_t a, uint64_t b, uint64_t c, const void *pl, uint32_t len) {
  struct bks_msg m = {type, len, a, b, c};
  if (!len) {
    wr_all(fd, &m, sizeof m);
    return;
  }
  struct iovec v[2] = {{&m, sizeof m}, {(void *)pl, len}};
  struct msghdr h = {.msg_iov = v, .msg_iovlen = 2};
  long r;
  do r = sc3(SYS_sendmsg, fd, &h, MSG_NOSIGNAL);
  while (r == -EINTR);
  if (r > 0 && (size_t)r < sizeof m + len) {
    size_t done = (size_t)r;
    if (done < sizeof m) {
      wr_all(fd, (char *)&m + done, sizeof m - done);
      done = sizeof m;
    }
    wr_all(fd, (const char *)pl + (done - sizeof m), sizeof m + len - done);
  }
}

/* Reads one message; its payload (up to cap bytes) into pl. <0 at the end
 * or when the payload is larger than cap (-EPROTO). */
int recv_msg(int fd, struct bks_msg *m, void *pl, uint32_t cap) {
  int r = rd_all(fd, m, sizeof *m);
  if (r) return r;
  if (m->len > cap) return -EPROTO;
  if (m->len) return rd_all(fd, pl, m->len);
  return 0;
}

/* A buffered reader for a connection read by one thread only (a node's
 * control connection): each read takes whatever the socket holds, so a
 * page and its header come in one system call, and messages that arrived
 * together in one. A message's payload is handed out in place, valid
 * until the next call. */
int mb_ready(const struct msgbuf *r) {
  uint32_t have = r->len - r->off;
  if (have < sizeof(struct bks_msg)) return 0;
  const struct bks_msg *m = (const struct bks_msg *)(r->b + r->off);
  return have - sizeof *m >= m->len;
}

/* One message, waiting for it if need be: 0, or -1 at the end of the
 * stream, -EPROTO for a payload over cap, -errno. */
int mb_recv(int fd, struct msgbuf *r, struct bks_msg *m, char **pl, uint32_t cap) {
  for (;;) {
    uint32_t have = r->len - r->off;
    if (have >= sizeof *m) {
      memcpy(m, r->b + r->off, sizeof *m);
      if (m->len > cap || sizeof *m + m->len > r->cap) return -EPROTO;
      if (have - sizeof *m >= m->len) {
        *pl = (char *)r->b + r->off + sizeof *m;
        r->off += (uint32_t)sizeof *m + m->len;
        return 0;
      }
    }
    if (r->off) { /* the part of a message left goes to the front (a forward copy: safe to the left) */
      memcpy(r->b, r->b + r->off, have);
      r->off = 0, r->len = have;
    }
    long n = read_some(fd, r->b + r->len, r->cap - r->len);
    if (n <= 0) return n == 0 ? -1 : (int)n;
    r->len += (uint32_t)n;
  }
}

/* No Nagle delay, and a dead peer or a cut link noticed within seconds
 * (keepalive probes when idle, TCP_USER_TIMEOUT when data stays
 * unacknowledged). */
void tune_socket(int fd) {
  int one = 1, idle = 2, intvl = 1, cnt = 3, uto = 5000;
  sc5(SYS_setsockopt, fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sc5(SYS_setsockopt, fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  sc5(SYS_setsockopt, fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  sc5(SYS_setsockopt, fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  sc5(SYS_setsockopt, fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  sc5(SYS_setsockopt, fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &uto, sizeof uto);
}

int tcp_connect(uint32_t ip, uint16_t port) {
  int fd = hide_fd((int)sc3(SYS_socket, AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd < 0) return fd;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = __builtin_bswap16(port), .sin_addr = {ip}};
  long r;
  do r = sc3(SYS_connect, fd, &a, sizeof a);
  while (r == -EINTR);
  if (r) {
    sc1(SYS_close, fd);
    return (int)r;
  }
  tune_socket(fd);
  return fd;
}
