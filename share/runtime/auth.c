/* auth.c: the handshake every runtime connection opens with
 * (bunkai_share.h section 2): both sides prove they hold the run key R,
 * each with a MAC over both sides' fresh nonces, before anything else is
 * read. The node daemon's handshake (share/src/auth.rs) is the same
 * exchange under the cluster key. Rules: runtime.h. */
#include "runtime.h"

static const char SERVER[] = "bunkai-share server";
static const char CLIENT[] = "bunkai-share client";

/* mac = HMAC(R, label || role || nonce_c || nonce_s) */
static void mac_for(const char *label, uint32_t role, const uint8_t *nc, const uint8_t *ns, uint8_t out[32]) {
  uint8_t m[32 + 4 + 64];
  size_t l = slen(label);
  memcpy(m, label, l);
  for (int i = 0; i < 4; i++) m[l + i] = (uint8_t)(role >> (8 * i));
  memcpy(m + l + 4, nc, 32);
  memcpy(m + l + 36, ns, 32);
  hmac_sha256(g.key, BKS_KEY_BYTES, m, l + 68, out);
}

/* Compares in time that does not depend on where they differ. */
static int same(const uint8_t *a, const uint8_t *b) {
  uint8_t d = 0;
  for (int i = 0; i < 32; i++) d |= a[i] ^ b[i];
  return d == 0;
}

enum { AUTH_OK = 0, AUTH_IO = -1, AUTH_PROTO = -2, AUTH_KEY = -3, AUTH_TIME = -4 };

const char *auth_error(int e) {
  switch (e) {
  case AUTH_IO: return "the connection ended during the handshake";
  case AUTH_PROTO: return "not a bunkai share runtime of this version";
  case AUTH_KEY: return "wrong key";
  case AUTH_TIME: return "no handshake within 5 s";
  default: return "handshake failed";
  }
}

static int rd(int fd, void *b, size_t n, uint64_t deadline) {
  int r = rd_deadline(fd, b, n, deadline);
  return r == -ETIMEDOUT ? AUTH_TIME : r ? AUTH_IO : AUTH_OK;
}

int auth_client(int fd, uint32_t role) {
  uint64_t deadline = now_ns() + (uint64_t)BKS_AUTH_MS * 1000000ull;
  struct bks_auth_hello h = {BKS_MAGIC, BKS_VERSION, role, 0, {0}};
  if (random_bytes(h.nonce, 32)) return AUTH_IO;
  if (wr_all(fd, &h, sizeof h)) return AUTH_IO;
  struct bks_auth_reply r;
  int e = rd(fd, &r, sizeof r, deadline);
  if (e) return e;
  uint8_t want[32];
  mac_for(SERVER, role, h.nonce, r.nonce, want);
  if (!same(want, r.mac)) return AUTH_KEY;
  struct bks_auth_proof p;
  mac_for(CLIENT, role, h.nonce, r.nonce, p.mac);
  return wr_all(fd, &p, sizeof p) ? AUTH_IO : AUTH_OK;
}

int auth_server(int fd, uint32_t role) {
  uint64_t deadline = now_ns() + (uint64_t)BKS_AUTH_MS * 1000000ull;
  struct bks_auth_hello h;
  int e = rd(fd, &h, sizeof h, deadline);
  if (e) return e;
  if (h.magic != BKS_MAGIC || h.version != BKS_VERSION || h.role != role) return AUTH_PROTO;
  struct bks_auth_reply r;
  if (random_bytes(r.nonce, 32)) return AUTH_IO;
  mac_for(SERVER, role, h.nonce, r.nonce, r.mac);
  if (wr_all(fd, &r, sizeof r)) return AUTH_IO;
  struct bks_auth_proof p;
  e = rd(fd, &p, sizeof p, deadline);
  if (e) return e;
  uint8_t want[32];
  mac_for(CLIENT, role, h.nonce, r.nonce, want);
  return same(want, p.mac) ? AUTH_OK : AUTH_KEY;
}
