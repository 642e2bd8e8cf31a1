/*
 * socket.c - where the host's socket lives: its path, the default
 * directory (ours alone: checked before the socket is made), the sockets of
 * hosts that died without removing theirs. Rules: host.h.
 */
#include "host.h"

char sock_path[108];

void remove_socket(void) {
  if (sock_path[0])
    unlink(sock_path);
}

EXPORT const char *bunkai_host_socket(void) {
  return sock_path[0] ? sock_path : NULL;
}

/* Sockets left by hosts that died without their atexit (killed): removed
 * when another host starts in the default directory. A socket is taken for
 * dead only when no process has its pid here and connecting to it is
 * refused. A host binds a temporary name, listens, and only then renames
 * it to PID.sock (bunkai_host_start), so a PID.sock always had a listener:
 * a live host in another pid namespace (its pid dead here) answers and
 * keeps its socket, even when its pid is reused here meanwhile. The probe
 * does not block: a listener with a full backlog (EAGAIN) is alive. */
void sweep_dead_sockets(const char *dir) {
  DIR *d = opendir(dir);
  if (!d)
    return;
  struct dirent *e;
  while ((e = readdir(d))) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (end == e->d_name || pid <= 0 || strcmp(end, ".sock") != 0 ||
        pid == (long)getpid())
      continue;
    if (kill((pid_t)pid, 0) == 0 || errno == EPERM)
      continue; /* alive */
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if ((size_t)snprintf(a.sun_path, sizeof a.sun_path, "%s/%s", dir,
                         e->d_name) >= sizeof a.sun_path)
      continue;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
      break;
    int dead = connect(fd, (struct sockaddr *)&a, sizeof a) != 0 &&
               errno == ECONNREFUSED;
    close(fd);
    if (dead)
      unlink(a.sun_path);
  }
  closedir(d);
}

/* Whether `dir` is a directory of ours alone: a real directory (lstat: not
 * a symbolic link to one), owned by us, no permission for group or others.
 * Returns NULL, or what is wrong with it (and its fix) in buf. */
static const char *private_dir_problem(const char *dir, char *buf,
                                       size_t len) {
  struct stat st;
  if (lstat(dir, &st))
    snprintf(buf, len, "cannot use %s: %s", dir, strerror(errno));
  else if (S_ISLNK(st.st_mode))
    snprintf(buf, len, "%s is a symbolic link, not a directory of ours "
                       "(remove it)", dir);
  else if (!S_ISDIR(st.st_mode))
    snprintf(buf, len, "%s is not a directory (remove it)", dir);
  else if (st.st_uid != getuid())
    snprintf(buf, len, "%s belongs to uid %u, not to us (uid %u): another "
                       "user could intercept modules (remove it, or set "
                       "XDG_RUNTIME_DIR or BUNKAI_HOST_SOCKET)",
             dir, (unsigned)st.st_uid, (unsigned)getuid());
  else if (st.st_mode & 077)
    snprintf(buf, len, "%s has mode %04o: group and others may use it "
                     "(chmod 700 %s)",
             dir, (unsigned)(st.st_mode & 07777), dir);
  else
    return NULL;
  return buf;
}

/* The default socket directory: $XDG_RUNTIME_DIR/bunkai-mod when that is
 * set and a private directory of ours (as systemd makes it), else
 * /tmp/bunkai-mod-UID. Created 0700 if missing, and checked either way: a
 * directory another user made first is refused, not used. */
int default_dir(char *out, size_t len) {
  char why[400];
  const char *x = getenv("XDG_RUNTIME_DIR");
  if (x && x[0] == '/' && !private_dir_problem(x, why, sizeof why) &&
      (size_t)snprintf(out, len, "%s/bunkai-mod", x) < len - 16) {
    /* $XDG_RUNTIME_DIR/bunkai-mod, unless the path is too long */
  } else {
    snprintf(out, len, "/tmp/bunkai-mod-%u", (unsigned)getuid());
  }
  if (mkdir(out, 0700) && errno != EEXIST) {
    fprintf(stderr, "bunkai mod: cannot create %s: %s (check /tmp)\n", out,
            strerror(errno));
    return -1;
  }
  if (private_dir_problem(out, why, sizeof why)) {
    fprintf(stderr, "bunkai mod: %s\n", why);
    return -1;
  }
  return 0;
}
