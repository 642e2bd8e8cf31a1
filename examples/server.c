/* server.c: a small HTTP server for the README's quick starts (trace and
 * flow).
 *
 *   server PORTFILE [N]
 *
 * listens on a free port of 127.0.0.1, writes the port to PORTFILE once it
 * is listening, answers N requests (default: until it is killed) and exits.
 * Each request goes through one struct request: read, parsed, answered,
 * sent and freed, one function each (never inlined), so a trace or a flow
 * names the steps. */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct request {
  char *buf;      /* the request as read */
  size_t len;
  char method[8];
  char path[256];
  int status;
  char *reply;    /* the whole response */
  size_t reply_len;
};

__attribute__((noinline)) static struct request *read_request(int fd) {
  struct request *r = calloc(1, sizeof *r);
  r->buf = malloc(4096);
  ssize_t n = read(fd, r->buf, 4095);
  r->len = n > 0 ? (size_t)n : 0;
  r->buf[r->len] = '\0';
  return r;
}

__attribute__((noinline)) static void parse_request(struct request *r) {
  if (sscanf(r->buf, "%7s %255s", r->method, r->path) != 2)
    r->method[0] = r->path[0] = '\0';
}

__attribute__((noinline)) static void handle_request(struct request *r) {
  char body[512];
  int blen;
  if (strcmp(r->method, "GET") != 0) {
    r->status = 405;
    blen = snprintf(body, sizeof body, "only GET\n");
  } else {
    r->status = 200;
    blen = snprintf(body, sizeof body, "hello from %s\n", r->path);
  }
  r->reply = malloc(sizeof body + 128);
  r->reply_len = (size_t)snprintf(r->reply, sizeof body + 128,
                                  "HTTP/1.0 %d %s\r\nContent-Type: text/plain\r\n"
                                  "Content-Length: %d\r\n\r\n%s",
                                  r->status, r->status == 200 ? "OK" : "Method Not Allowed",
                                  blen, body);
}

__attribute__((noinline)) static void send_reply(int fd, struct request *r) {
  size_t off = 0;
  while (off < r->reply_len) {
    ssize_t n = write(fd, r->reply + off, r->reply_len - off);
    if (n <= 0)
      break;
    off += (size_t)n;
  }
}

__attribute__((noinline)) static void free_request(struct request *r) {
  free(r->buf);
  free(r->reply);
  free(r);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: server PORTFILE [N]\n");
    return 2;
  }
  long left = argc > 2 ? atol(argv[2]) : -1;
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof a;
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 16) < 0 ||
      getsockname(s, (struct sockaddr *)&a, &alen) < 0) {
    perror("server");
    return 1;
  }
  /* the port goes to a temporary name first, so a reader never sees half */
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
  FILE *f = fopen(tmp, "w");
  if (!f || fprintf(f, "%d\n", ntohs(a.sin_port)) < 0 || fclose(f) != 0 || rename(tmp, argv[1]) != 0) {
    perror(argv[1]);
    return 1;
  }
  while (left != 0) {
    int c = accept(s, NULL, NULL);
    if (c < 0)
      continue;
    struct request *r = read_request(c);
    parse_request(r);
    handle_request(r);
    send_reply(c, r);
    free_request(r);
    close(c);
    if (left > 0)
      left--;
  }
  close(s);
  return 0;
}
