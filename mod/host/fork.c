/*
 * fork.c - a host in every fork child. A server that daemonizes or forks
 * its workers would otherwise keep one socket, its parent's, whose command
 * thread does not exist in the children. pthread_atfork handlers:
 *   - prepare takes txn_lock (server.c), which the command thread holds
 *     while it carries out a message, and from a connection's first
 *     COMMIT or unload to its end (not while it waits for the next message
 *     of a client that only staged memory), so a fork waits for a load or
 *     unload in progress (at most FORK_WAIT_S) and the child never
 *     inherits half of one; the child closes its copy of a connection in
 *     service and undoes its copy of that session's staging (the parent
 *     goes on with it); then mod_lock and reg_lock, which program threads take for a
 *     moment (bunkai_iface, bunkai_lookup), so the child never inherits
 *     one whose owner does not exist in it. A fork from a signal handler
 *     during a fork (glibc runs the handlers again) takes nothing more:
 *     only the outermost prepare locks, and its parent handler unlocks;
 *   - the child keeps the registry's calls in flight of the forking
 *     thread only (registry.c), so an unload there does not wait for the
 *     parent's other threads;
 *   - the child closes its copies of the parent's listening socket and
 *     pending connections and forgets the parent's socket path (its atexit
 *     must not remove the parent's socket). When the parent's socket is in
 *     the default directory, the child starts a thread that, after
 *     FORK_DELAY_MS, listens on <dir>/<its pid>.sock and becomes its
 *     command thread. The delay keeps the many children that exec or _exit
 *     at once (shells, helpers, a daemon's first fork) from each leaving a
 *     socket behind (_exit and exec run no atexit): they are gone before
 *     it ends. A child that forks before its own host has started gives
 *     its child a delayed host too (a daemon's double fork). A child of
 *     root listens at once instead (root's children often drop privileges
 *     right away, as httpd's workers do, and could not make their socket in
 *     root's private directory later), so they leave sockets behind when
 *     they _exit or exec another program; the next host to start in the
 *     directory removes those.
 *   A host on an explicit path (BUNKAI_HOST_SOCKET, bunkai_host_start(path))
 *   gives its children no socket: they cannot share its name.
 * The child inherits the loaded modules (their memory is private, so the
 * child has its own copy) and the table of them, so `bunkai mod list` in a
 * child shows what its parent had at the fork, and unloading there runs
 * the module's exit in the child only.
 * Rules: host.h. The child handler uses system calls, string copies,
 * free (undoing a staging) and pthread_create, which glibc supports in a
 * fork child (its fork resets the allocator's and the thread list's locks
 * before the child handlers run; POSIX does not promise it). Processes started by posix_spawn or vfork run no handler;
 * with the preload in their environment they start a host at exec, as any
 * process does.
 */
#include "host.h"

#define FORK_WAIT_S 5
#define FORK_DELAY_MS 100

static int watching;       /* the handlers are registered */
static int child_hosts;    /* the socket is in the default directory */
static int pending_host;   /* this process's delayed host has not started yet */
static char dir[108];      /* that directory */
static char child_path[108]; /* the socket a delayed host listens on */
static __thread int held;  /* this fork's prepare took txn_lock (and the others) */
static __thread int depth; /* forks in progress on this thread (a handler may fork) */

static size_t cat(char *dst, size_t at, size_t cap, const char *s) {
  while (*s && at + 1 < cap)
    dst[at++] = *s++;
  dst[at] = 0;
  return at;
}

static size_t cat_u(char *dst, size_t at, size_t cap, unsigned long v) {
  char t[24];
  int n = 0;
  do
    t[n++] = (char)('0' + v % 10);
  while ((v /= 10));
  while (n && at + 1 < cap)
    dst[at++] = t[--n];
  dst[at] = 0;
  return at;
}

static void say(const char *what, const char *path, int err) {
  char m[400];
  size_t n = cat(m, 0, sizeof m, "bunkai mod: fork child ");
  n = cat_u(m, n, sizeof m, (unsigned long)getpid());
  n = cat(m, n, sizeof m, ": ");
  n = cat(m, n, sizeof m, what);
  if (path) {
    n = cat(m, n, sizeof m, " ");
    n = cat(m, n, sizeof m, path);
  }
  if (err) {
    n = cat(m, n, sizeof m, ": errno ");
    n = cat_u(m, n, sizeof m, (unsigned long)err);
  }
  n = cat(m, n, sizeof m, " (it has no module host: weave or load into the "
                          "parent before it forks)\n");
  ssize_t w = write(2, m, n);
  (void)w;
}

/* The socket directory is still the private one the host checked when it
 * started (it may have been removed and made again, by another user or as
 * a symbolic link, since): system calls only. */
static int dir_still_ours(void) {
  struct stat st;
  return !lstat(dir, &st) && S_ISDIR(st.st_mode) && st.st_uid == getuid() && !(st.st_mode & 077);
}

/* The delayed host of a fork child: listens once FORK_DELAY_MS have passed
 * and serves as its command thread. */
static void *late_start(void *arg) {
  (void)arg;
  struct timespec d = {0, FORK_DELAY_MS * 1000000L};
  while (nanosleep(&d, &d) && errno == EINTR) {
  }
  /* under the lock: a fork meanwhile sees the socket in listen_fd (its
   * child closes it) or not at all */
  pthread_mutex_lock(&txn_lock);
  if (!dir_still_ours()) {
    pthread_mutex_unlock(&txn_lock);
    say("the socket directory is no longer a private one of ours:", dir, 0);
    return NULL;
  }
  int fd = listen_on(child_path);
  if (fd < 0) {
    int e = errno;
    pthread_mutex_unlock(&txn_lock);
    say("cannot listen on", child_path, e);
    return NULL;
  }
  memcpy(sock_path, child_path, sizeof sock_path);
  listen_fd = fd;
  pending_host = 0;
  pthread_mutex_unlock(&txn_lock);
  return command_thread((void *)(intptr_t)fd);
}

static void prepare(void) {
  if (depth++)
    return; /* a fork inside a fork's handlers: the outer one holds them */
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += FORK_WAIT_S;
  held = pthread_mutex_timedlock(&txn_lock, &t) == 0;
  if (held) {
    /* the command thread is between connections: it holds neither */
    pthread_mutex_lock(&mod_lock);
    pthread_mutex_lock(&reg_lock);
  }
}

static void parent(void) {
  if (--depth)
    return;
  if (held) {
    pthread_mutex_unlock(&reg_lock);
    pthread_mutex_unlock(&mod_lock);
    pthread_mutex_unlock(&txn_lock);
  }
  held = 0;
}

static void child(void) {
  int had = held;
  held = 0;
  depth = 0;
  pthread_mutex_init(&txn_lock, NULL);
  if (had) {
    pthread_mutex_init(&mod_lock, NULL);
    pthread_mutex_init(&reg_lock, NULL);
  }
  readers_after_fork();
  serving_after_fork(had);
  if (listen_fd < 0 && !pending_host)
    return; /* no host here, none coming */
  if (listen_fd >= 0)
    close(listen_fd);
  listen_fd = -1;
  for (int k = 0; k < npending; k++)
    close(pending[k].fd);
  npending = 0;
  sock_path[0] = 0;
  pending_host = 0;
  if (!child_hosts)
    return;
  if (!had) {
    say("forked while a module load or unload went on for more than 5 s", 0, 0);
    return;
  }
  size_t n = cat(child_path, 0, sizeof child_path, dir);
  n = cat(child_path, n, sizeof child_path, "/");
  n = cat_u(child_path, n, sizeof child_path, (unsigned long)getpid());
  n = cat(child_path, n, sizeof child_path, ".sock");
  if (n + 1 >= sizeof child_path) {
    say("the socket path is too long in", dir, 0);
    return;
  }
  if (geteuid() == 0) {
    /* root's children often drop privileges at once (httpd's workers
     * become nobody) and could not make their socket in root's private
     * directory later: it is made now */
    if (!dir_still_ours()) {
      say("the socket directory is no longer a private one of ours:", dir, 0);
      return;
    }
    int fd = listen_on(child_path);
    if (fd < 0) {
      say("cannot listen on", child_path, errno);
      return;
    }
    memcpy(sock_path, child_path, sizeof sock_path);
    listen_fd = fd;
    int rc = start_thread();
    if (rc) {
      close(fd);
      listen_fd = -1;
      unlink(child_path);
      sock_path[0] = 0;
      say("cannot start the command thread", 0, rc);
    }
    return;
  }
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t t;
  int rc = pthread_create(&t, NULL, late_start, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    say("cannot start the command thread", 0, rc);
    return;
  }
  pthread_detach(t);
  pending_host = 1;
}

void fork_watch(int in_default) {
  child_hosts = in_default;
  if (in_default) {
    size_t n = strlen(sock_path);
    while (n && sock_path[n - 1] != '/')
      n--;
    if (n > 1)
      n--; /* the directory, without its last slash */
    memcpy(dir, sock_path, n);
    dir[n] = 0;
  }
  if (!watching) {
    watching = 1;
    pthread_atfork(prepare, parent, child);
  }
}
