/* handshake: what the runtime's handshake (share/runtime/auth.c, compiled
 * in from the runtime's own files) adds to a connection, beside the same
 * connection without it, in the same run.
 *
 *   handshake server PORT KEYFILE   two listeners: PORT (plain) and PORT+1
 *                                   (the handshake first); each connection
 *                                   then gets a 32-byte message and answers
 *                                   32 bytes (a HELLO and its answer)
 *   handshake client IP PORT KEYFILE N
 *                                   N connections of each kind, interleaved:
 *                                   connect, [hello,] message, [the
 *                                   server's proof,] answer, close;
 *                                   medians in ns as JSON.
 * The plain exchange is what a runtime connection cost before
 * authentication (connect, then HELLO or START at once). */
#include "runtime.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>

static void key_from(const char *path) {
  FILE *f = fopen(path, "r");
  char hex[80] = {0};
  if (!f || !fgets(hex, sizeof hex, f)) {
    fprintf(stderr, "handshake: cannot read %s\n", path);
    exit(1);
  }
  for (int i = 0; i < 32; i++) {
    unsigned v;
    sscanf(hex + 2 * i, "%2x", &v);
    g.key[i] = (uint8_t)v;
  }
  fclose(f);
}

static int listen_on(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  if (bind(fd, (void *)&a, sizeof a) || listen(fd, 64)) {
    perror("handshake: listen");
    exit(1);
  }
  return fd;
}

static void *serve(void *p) {
  int lfd = (int)(long)p >> 1, auth = (int)(long)p & 1;
  for (;;) {
    int fd = accept(lfd, 0, 0);
    if (fd < 0) continue;
    tune_socket(fd);
    char b[32];
    int from;
    if ((!auth || auth_server(fd, BKS_ROLE_CONTROL, &from) == 0) && rd_all(fd, b, 32) == 0) wr_all(fd, b, 32);
    close(fd);
  }
  return 0;
}

static int cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc >= 4 && !strcmp(argv[1], "server")) {
    key_from(argv[3]);
    g.nhosts = 2; /* home, and the client as node 1 */
    int port = atoi(argv[2]);
    pthread_t t[2];
    for (int k = 0; k < 2; k++) pthread_create(&t[k], 0, serve, (void *)(long)(listen_on(port + k) << 1 | k));
    pthread_join(t[0], 0);
    return 0;
  }
  if (argc < 6 || strcmp(argv[1], "client")) {
    fprintf(stderr, "usage: handshake server PORT KEYFILE | client IP PORT KEYFILE N\n");
    return 2;
  }
  key_from(argv[4]);
  g.self = 1; /* a control connection comes from a node */
  struct in_addr ip;
  inet_aton(argv[2], &ip);
  int port = atoi(argv[3]), n = atoi(argv[5]);
  uint64_t *t[2] = {calloc((size_t)n, 8), calloc((size_t)n, 8)};
  for (int i = 0; i < n; i++)
    for (int k = 0; k < 2; k++) {
      uint64_t s = now_ns();
      int fd = tcp_connect(ip.s_addr, (uint16_t)(port + k));
      char b[32] = {1};
      struct bks_auth_hello h;
      if (fd < 0 || (k && auth_hello(fd, BKS_ROLE_CONTROL, 0, &h)) || wr_all(fd, b, 32) ||
          (k && auth_check(fd, &h)) || rd_all(fd, b, 32)) {
        fprintf(stderr, "handshake: connection %d failed\n", i);
        return 1;
      }
      t[k][i] = now_ns() - s;
      close(fd);
    }
  qsort(t[0], (size_t)n, 8, cmp);
  qsort(t[1], (size_t)n, 8, cmp);
  printf("{\"plain_ns\":%llu,\"handshake_ns\":%llu,\"n\":%d}\n", (unsigned long long)t[0][n / 2],
         (unsigned long long)t[1][n / 2], n);
  return 0;
}
