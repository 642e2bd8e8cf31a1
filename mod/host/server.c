/*
 * server.c - the command thread: bunkai_host_start makes the socket and
 * starts it; it admits connections, serves them one at a time once they
 * have sent something, and dispatches each message. Everything it does
 * after a poll returns holds txn_lock, except waiting for the next message
 * of a client that has published nothing yet, and fork.c's prepare handler
 * takes it, so a fork never copies a half-done message, half of what one
 * connection publishes (or a locked registry) into the child, and a client
 * stalled while it stages does not hold up the program's forks. Rules:
 * host.h.
 */
#include "host.h"

/* One receive buffer, grown as needed and kept: a fresh malloc per 1 MB
 * message would map and fault new pages each time (glibc serves big blocks
 * with mmap), making load times depend on the host's history. */
static unsigned char *rbuf;
static size_t rcap;

/* The connection being served and its session, for a fork child to undo
 * (serving_after_fork). Set and cleared under txn_lock. */
static struct session *serving;
static int serving_fd = -1;

/* Called with txn_lock held, as handle() is. It gives the lock up while it
 * waits for the client's next message, so that a client that stalls
 * between messages holds up no fork of the program (fork.c's prepare waits
 * for txn_lock), as long as the session has staged nothing but private
 * memory: once it has published (a COMMIT, an unload), it keeps the lock
 * to its end, so a fork child never sees half of what one connection
 * changes (the evictions of a load without the modules that replace them).
 * Each message is carried out under the lock, and the receive buffer grows
 * under it, so a fork child sees the session and the buffer between two
 * changes; the child forgets a descriptor received meanwhile
 * (serving_after_fork). */
static void serve(int fd) {
  struct session s = {.passed_fd = -1};
  serving = &s;
  serving_fd = fd;
  int published = 0;
  for (;;) {
    uint32_t hdr[2];
    if (!published)
      pthread_mutex_unlock(&txn_lock);
    int got = read_full(fd, hdr, 4, &s.passed_fd);
    if (!published)
      pthread_mutex_lock(&txn_lock);
    if (got)
      break;
    if (hdr[0] < 4 || hdr[0] > MAX_MSG) {
      send_err(fd, "message of %u bytes refused", hdr[0]);
      break;
    }
    struct msg m = {0};
    m.len = hdr[0] - 4;
    if (m.len + 1 > rcap) {
      unsigned char *p = realloc(rbuf, m.len + 1);
      if (!p) {
        send_err(fd, "out of memory for a %zu-byte message", m.len);
        break;
      }
      rbuf = p;
      rcap = m.len + 1;
    }
    m.p = rbuf;
    if (!published)
      pthread_mutex_unlock(&txn_lock);
    got = read_full(fd, &hdr[1], 4, &s.passed_fd) || (m.len && read_full(fd, m.p, m.len, &s.passed_fd));
    if (!published)
      pthread_mutex_lock(&txn_lock);
    if (got)
      break;
    if (hdr[1] == BUNKAI_MSG_COMMIT || hdr[1] == BUNKAI_MSG_UNLOAD || hdr[1] == BUNKAI_MSG_UNLOAD_NAME)
      published = 1;
    int rc;
    switch (hdr[1]) {
    case BUNKAI_MSG_HELLO:
      rc = do_hello(fd);
      break;
    case BUNKAI_MSG_RESOLVE:
      rc = do_resolve(fd, &m);
      break;
    case BUNKAI_MSG_ALLOC:
      rc = do_alloc(fd, &s, &m);
      break;
    case BUNKAI_MSG_WRITE:
      rc = do_write(fd, &s, &m);
      break;
    case BUNKAI_MSG_PROTECT:
      rc = do_protect(fd, &s, &m);
      break;
    case BUNKAI_MSG_COMMIT:
      rc = do_commit(fd, &s, &m);
      break;
    case BUNKAI_MSG_UNLOAD:
      rc = do_unload(fd, &m);
      break;
    case BUNKAI_MSG_EVICT:
      rc = do_evict(fd, &s, &m);
      break;
    case BUNKAI_MSG_MAP:
      rc = do_map(fd, &s, &m);
      break;
    case BUNKAI_MSG_UNLOAD_NAME:
      rc = do_unload_name(fd, &m);
      break;
    default:
      rc = send_err(fd, "unknown message type %u", hdr[1]);
    }
    if (rc)
      break;
  }
  /* Whatever this connection staged and did not commit goes away. */
  rollback(&s);
  serving = NULL;
  serving_fd = -1;
}

/* In a fork child: the connection the parent was serving is the parent's.
 * The child closes its copy (set under the lock before the connection was
 * served, so it is that connection's). When its prepare handler held
 * txn_lock (`consistent`), the session was between two messages, and the
 * child undoes its copy (its private copies of the staged memory); a
 * descriptor the session received is left alone: it may have come in
 * after the fork copied the descriptor table, and its number be free or
 * another file's here (at worst the child keeps a memfd open). Otherwise
 * the session may be half changed: forgotten, not undone. */
void serving_after_fork(int consistent) {
  if (serving && consistent) {
    serving->passed_fd = -1;
    rollback(serving);
  }
  if (serving_fd >= 0)
    close(serving_fd);
  serving = NULL;
  serving_fd = -1;
}

int listen_fd = -1;
pthread_mutex_t txn_lock = PTHREAD_MUTEX_INITIALIZER;
struct pending pending[MAX_PENDING]; /* fork.c closes them in a child */
int npending;

/* What follows one poll: serve the oldest connection that has sent
 * something (or hung up), close silent ones, accept. 0 to go on, -1 when
 * the listening socket failed. Runs under txn_lock. */
static int handle(struct pollfd *pf, int n) {
  uint64_t now = now_ns();
  int ready = -1;
  for (int k = 0; n > 0 && k < npending && ready < 0; k++)
    if (pf[k + 1].revents)
      ready = k;
  if (ready >= 0) {
    int fd = pending[ready].fd;
    uint64_t ino = pending[ready].ino;
    pending[ready] = pending[--npending];
    /* a program that closed every descriptor (a daemon) may have the
     * number for a file or socket of its own now: not ours to serve or
     * close */
    if (!same_socket(fd, ino))
      return 0;
    txn_deadline = now_ns() + (uint64_t)TXN_MS * 1000000u;
    serve(fd);
    close(fd);
    return 0;
  }
  for (int k = 0; k < npending;)
    if (!same_socket(pending[k].fd, pending[k].ino)) {
      pending[k] = pending[--npending]; /* closed by the program: forget it */
    } else if (now - pending[k].since > (uint64_t)IDLE_MS * 1000000u) {
      close(pending[k].fd);
      pending[k] = pending[--npending];
    } else {
      k++;
    }
  if (n > 0 && (pf[0].revents & POLLIN)) {
    int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE)
        usleep(10000); /* out of descriptors: not a busy loop meanwhile */
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN ||
          errno == EMFILE || errno == ENFILE)
        return 0;
      return -1;
    }
    if (!admit(fd)) {
      close(fd);
      return 0;
    }
    if (npending == MAX_PENDING) { /* the oldest silent one makes room */
      int old = 0;
      for (int k = 1; k < npending; k++)
        if (pending[k].since < pending[old].since)
          old = k;
      close(pending[old].fd);
      pending[old] = pending[--npending];
    }
    struct stat st;
    pending[npending].fd = fd;
    pending[npending].since = now_ns();
    pending[npending].ino = fstat(fd, &st) ? 0 : (uint64_t)st.st_ino;
    npending++;
  }
  return 0;
}

/* Connections are served one at a time (a connection is a transaction),
 * each only once it has sent something: until then it waits in `pending`,
 * so a client that connects and stays silent holds up nobody, and is
 * closed after IDLE_MS. */
void *command_thread(void *arg) {
  int fd = (int)(intptr_t)arg; /* this thread's socket (a fork child has its own) */
  struct stat st;
  uint64_t ino = fstat(fd, &st) ? 0 : (uint64_t)st.st_ino;
  for (;;) {
    struct pollfd pf[MAX_PENDING + 1];
    pf[0] = (struct pollfd){.fd = fd, .events = POLLIN};
    for (int k = 0; k < npending; k++)
      pf[k + 1] = (struct pollfd){.fd = pending[k].fd, .events = POLLIN};
    int n = poll(pf, (nfds_t)npending + 1, 1000);
    if (n < 0 && errno != EINTR)
      return NULL;
    pthread_mutex_lock(&txn_lock);
    int rc = -1;
    if (fd == listen_fd && same_socket(fd, ino)) {
      rc = handle(pf, n);
    } else if (fd == listen_fd) {
      /* the program closed our socket (a daemon closing every
       * descriptor): the number may be its own now; this host ends
       * without touching it */
      listen_fd = -1;
      for (int k = 0; k < npending; k++)
        if (same_socket(pending[k].fd, pending[k].ino))
          close(pending[k].fd);
      npending = 0;
    }
    pthread_mutex_unlock(&txn_lock);
    if (rc)
      return NULL;
  }
}

int same_socket(int fd, uint64_t ino) {
  struct stat st;
  return ino && !fstat(fd, &st) && S_ISSOCK(st.st_mode) && (uint64_t)st.st_ino == ino;
}

/* Binds and listens on `path` with system calls only: PATH.tmp, listen,
 * then rename, so another host's sweep never finds PATH without a
 * listener. The descriptor, or -1 with errno. */
int listen_on(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  size_t n = strlen(path);
  memcpy(a.sun_path, path, n + 1);
  if (n + 4 < sizeof a.sun_path)
    memcpy(a.sun_path + n, ".tmp", 5); /* else the name at once */
  unlink(a.sun_path);
  if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 16) ||
      chmod(a.sun_path, 0600) ||
      (strcmp(a.sun_path, path) && rename(a.sun_path, path))) {
    int e = errno;
    unlink(a.sun_path);
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

/* Starts the command thread on listen_fd with every signal blocked. 0, or
 * pthread_create's error. */
int start_thread(void) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t t;
  int rc = pthread_create(&t, NULL, command_thread, (void *)(intptr_t)listen_fd);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (!rc)
    pthread_detach(t);
  return rc;
}

EXPORT int bunkai_host_start(const char *path) {
  if (listen_fd >= 0)
    return 0;
  char def[108];
  if (!path)
    path = getenv("BUNKAI_HOST_SOCKET");
  int in_default = !path || !*path;
  if (in_default) {
    if (default_dir(def, sizeof def))
      return -1;
    sweep_dead_sockets(def);
    size_t used_len = strlen(def), room = sizeof def - used_len;
    if ((size_t)snprintf(def + used_len, room, "/%d.sock", (int)getpid()) >=
        room) {
      fprintf(stderr, "bunkai mod: the socket path in %s is too long (set "
                      "BUNKAI_HOST_SOCKET to a shorter path)\n", def);
      return -1;
    }
    path = def;
  }
  if (strlen(path) >= sizeof sock_path) {
    fprintf(stderr, "bunkai mod: socket path %s is longer than %zu bytes "
                    "(choose a shorter one)\n", path, sizeof sock_path - 1);
    return -1;
  }
  int fd = listen_on(path);
  if (fd < 0) {
    fprintf(stderr, "bunkai mod: cannot listen on %s: %s (check the "
                    "directory exists and is writable, and the process's "
                    "descriptor limit)\n", path, strerror(errno));
    return -1;
  }
  strcpy(sock_path, path);
  listen_fd = fd;
  static int once;
  if (!once) {
    once = 1;
    atexit(remove_socket);
  }
  int rc = start_thread();
  if (rc) {
    fprintf(stderr, "bunkai mod: cannot start the host's command thread: %s "
                    "(check the process's thread limit)\n", strerror(rc));
    close(fd);
    listen_fd = -1;
    unlink(path);
    sock_path[0] = 0;
    return -1;
  }
  fork_watch(in_default);
  return 0;
}
