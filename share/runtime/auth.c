/* auth.c: the handshake every runtime connection opens with
 * (bunkai_share.h section 2). The client's hello names the role, both
 * hosts, a number the client never uses twice for that role and host, and
 * the connection's two ends as the client sees them, and carries a MAC
 * under the run key R; its first message follows at once. The server
 * answers with its own MAC over the same hello before anything else, and
 * reads the first message only once the hello's MAC checks, the ends are
 * this connection's and its number is new (a window per role and peer).
 * So no round trip is added to a connection, a recorded hello is refused
 * everywhere (R is new in every run, the MAC names the two hosts and the
 * connection's ends, so it is good on no other connection, not even one
 * racing the original or sent after the server refused the original
 * unread; the window refuses it on its own), and neither side acts on a
 * word from a peer that has not shown it holds R. The node daemon's
 * handshake with the CLI (share/src/auth.rs) is a separate exchange under
 * the cluster key. Rules: runtime.h. */
#include "runtime.h"
#include <netinet/in.h>
#include <sys/socket.h>

static const char SERVER[] = "bunkai-share server";
static const char CLIENT[] = "bunkai-share client";
#define SIGNED 48 /* the hello's bytes the MACs cover: everything before mac */
_Static_assert(SIGNED == sizeof(struct bks_auth_hello) - 32, "the MACs cover all but the MAC");

/* mac = HMAC(R, label || the hello's first SIGNED bytes) */
static void mac_for(const char *label, const struct bks_auth_hello *h, uint8_t out[32]) {
  uint8_t m[32 + SIGNED];
  size_t l = slen(label);
  memcpy(m, label, l);
  memcpy(m + l, h, SIGNED);
  hmac_sha256(g.key, BKS_KEY_BYTES, m, l + SIGNED, out);
}

/* Compares in time that does not depend on where they differ. */
static int same(const uint8_t *a, const uint8_t *b) {
  uint8_t d = 0;
  for (int i = 0; i < 32; i++) d |= a[i] ^ b[i];
  return d == 0;
}

const char *auth_error(int e) {
  switch (e) {
  case AUTH_IO: return "the connection ended during the handshake";
  case AUTH_PROTO: return "not a bunkai share runtime of this version";
  case AUTH_KEY: return "wrong key";
  case AUTH_TIME: return "no handshake within 5 s";
  case AUTH_REPLAY: return "a hello seen before, or made for another connection (replayed)";
  case AUTH_PEER: return "a hello meant for another host";
  default: return "handshake failed";
  }
}

static int rd(int fd, void *b, size_t n, uint64_t deadline) {
  int r = rd_deadline(fd, b, n, deadline);
  return r == -ETIMEDOUT ? AUTH_TIME : r ? AUTH_IO : AUTH_OK;
}

/* The client's numbers, per role and server host. */
static uint64_t next_seq[3][BKS_MAX_HOSTS];

/* The connection's two ends: ours and the peer's (IPv4). */
static int ends(int fd, struct sockaddr_in *me, struct sockaddr_in *peer) {
  int a = sizeof *me, b = sizeof *peer;
  if (sc3(SYS_getsockname, fd, me, &a) || sc3(SYS_getpeername, fd, peer, &b)) return -1;
  return me->sin_family == AF_INET && peer->sin_family == AF_INET ? 0 : -1;
}

int auth_hello(int fd, uint32_t role, int to, struct bks_auth_hello *h) {
  if (role > 2 || to < 0 || to >= BKS_MAX_HOSTS) return AUTH_PROTO;
  struct sockaddr_in me, peer;
  if (ends(fd, &me, &peer)) return AUTH_IO;
  memset(h, 0, sizeof *h);
  h->magic = BKS_MAGIC, h->version = BKS_VERSION, h->role = role, h->from = (uint32_t)g.self, h->to = (uint32_t)to;
  h->seq = __atomic_add_fetch(&next_seq[role][to], 1, __ATOMIC_RELAXED);
  h->client_ip = me.sin_addr.s_addr, h->client_port = me.sin_port;
  h->server_ip = peer.sin_addr.s_addr, h->server_port = peer.sin_port;
  mac_for(CLIENT, h, h->mac);
  /* MSG_MORE: the first message, sent next, leaves in the same segment */
  long r;
  do r = sc6(SYS_sendto, fd, (long)h, sizeof *h, MSG_MORE | MSG_NOSIGNAL, 0, 0);
  while (r == -EINTR);
  if (r < 0) return AUTH_IO;
  return (size_t)r < sizeof *h && wr_all(fd, (char *)h + r, sizeof *h - (size_t)r) ? AUTH_IO : AUTH_OK;
}

int auth_check(int fd, const struct bks_auth_hello *h) {
  uint64_t deadline = now_ns() + (uint64_t)BKS_AUTH_MS * 1000000ull;
  struct bks_auth_reply r;
  int e = rd(fd, &r, sizeof r, deadline);
  if (e) return e;
  uint8_t want[32];
  mac_for(SERVER, h, want);
  return same(want, r.mac) ? AUTH_OK : AUTH_KEY;
}

/* The numbers a server has seen, per role and client host: the highest,
 * and which of the BKS_AUTH_WINDOW below it (a bit for seq s at s %
 * BKS_AUTH_WINDOW). */
static struct window {
  uint64_t top;
  uint64_t bits[BKS_AUTH_WINDOW / 64];
} seen[3][BKS_MAX_HOSTS];
static volatile int seen_lock;

#define BIT(w, s) ((w)->bits[((s) % BKS_AUTH_WINDOW) / 64])
#define MASK(s) (1ull << ((s) % 64))

/* 1 if seq is new for w (and now seen), 0 if seen or too old. */
static int fresh(struct window *w, uint64_t seq) {
  if (!seq) return 0;
  if (seq > w->top) {
    if (seq - w->top >= BKS_AUTH_WINDOW) memset(w->bits, 0, sizeof w->bits);
    else
      for (uint64_t s = w->top + 1; s < seq; s++) BIT(w, s) &= ~MASK(s);
    w->top = seq;
    BIT(w, seq) |= MASK(seq);
    return 1;
  }
  if (w->top - seq >= BKS_AUTH_WINDOW || (BIT(w, seq) & MASK(seq))) return 0;
  BIT(w, seq) |= MASK(seq);
  return 1;
}

int auth_server(int fd, uint32_t role, int *from) {
  uint64_t deadline = now_ns() + (uint64_t)BKS_AUTH_MS * 1000000ull;
  struct bks_auth_hello h;
  int e = rd(fd, &h, sizeof h, deadline);
  if (e) return e;
  if (h.magic != BKS_MAGIC || h.version != BKS_VERSION || h.role != role || h.from >= BKS_MAX_HOSTS || h.pad ||
      h.pad2)
    return AUTH_PROTO;
  uint8_t want[32];
  mac_for(CLIENT, &h, want);
  if (!same(want, h.mac)) return AUTH_KEY;
  /* for us, and from a host that may call with this role: threads come
   * from home only, control connections from the run's nodes only */
  if (h.to != (uint32_t)g.self) return AUTH_PEER;
  if (role == BKS_ROLE_THREAD ? h.from != 0 : h.from < 1 || h.from >= (uint32_t)g.nhosts) return AUTH_PEER;
  /* this connection's ends, as we see them: a hello copied onto another
   * connection names other ends */
  struct sockaddr_in me, peer;
  if (ends(fd, &me, &peer)) return AUTH_IO;
  if (h.client_ip != peer.sin_addr.s_addr || h.client_port != peer.sin_port || h.server_ip != me.sin_addr.s_addr ||
      h.server_port != me.sin_port)
    return AUTH_REPLAY;
  lock(&seen_lock);
  int ok = fresh(&seen[role][h.from], h.seq);
  unlock(&seen_lock);
  if (!ok) return AUTH_REPLAY;
  struct bks_auth_reply r;
  mac_for(SERVER, &h, r.mac);
  if (wr_all(fd, &r, sizeof r)) return AUTH_IO;
  *from = (int)h.from;
  return AUTH_OK;
}
