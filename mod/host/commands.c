/*
 * commands.c - the commands that stage nothing: HELLO (what the host
 * expects and has loaded), RESOLVE (symbol addresses in the host), UNLOAD
 * and UNLOAD_NAME. Rules: host.h.
 */
#include "host.h"

int do_hello(int fd) {
  struct out o = {0};
  put32(&o, BUNKAI_MOD_VERSION);
  put32(&o, (uint32_t)getpid());
  put64(&o, budget);
  put64(&o, used);
  pthread_mutex_lock(&reg_lock);
  uint32_t n = 0;
  for (struct expect *e = expects; e; e = e->next)
    n++;
  put32(&o, n);
  for (struct expect *e = expects; e; e = e->next) {
    putstr(&o, e->name, strlen(e->name));
    putstr(&o, e->text, strlen(e->text));
  }
  pthread_mutex_unlock(&reg_lock);
  pthread_mutex_lock(&mod_lock);
  n = 0;
  for (struct module *m = modules; m; m = m->next)
    n++;
  put32(&o, n);
  for (struct module *m = modules; m; m = m->next) {
    put32(&o, m->id);
    put64(&o, (uint64_t)(uintptr_t)m->mem);
    put64(&o, m->mem_len);
    putstr(&o, m->blob, m->blob_len);
  }
  pthread_mutex_unlock(&mod_lock);
  int rc = send_msg(fd, BUNKAI_MSG_OK, &o);
  free(o.p);
  return rc;
}

/* The registry API resolves to this library's own functions even when the
 * host was linked without -rdynamic (dlsym cannot see an executable's
 * symbols then); everything else is looked up in the host's global scope. */
static void *api_symbol(const char *name) {
  static const struct {
    const char *name;
    void *addr;
  } api[] = {
      {"bunkai_iface", (void *)bunkai_iface},
      {"bunkai_acquire", (void *)bunkai_acquire},
      {"bunkai_release", (void *)bunkai_release},
      {"bunkai_lookup", (void *)bunkai_lookup},
      {"bunkai_provider", (void *)bunkai_provider},
  };
  for (size_t i = 0; i < sizeof api / sizeof api[0]; i++)
    if (!strcmp(api[i].name, name))
      return api[i].addr;
  return NULL;
}

int do_resolve(int fd, struct msg *m) {
  uint32_t n = get32(m);
  struct out o = {0};
  for (uint32_t i = 0; i < n && !m->bad; i++) {
    char *name = getstr(m);
    void *a = name ? api_symbol(name) : NULL;
    if (name && !a)
      a = dlsym(RTLD_DEFAULT, name);
    free(name);
    put64(&o, (uint64_t)(uintptr_t)a);
  }
  int rc = m->bad ? send_err(fd, "malformed RESOLVE")
                  : send_msg(fd, BUNKAI_MSG_OK, &o);
  free(o.p);
  return rc;
}

int do_unload(int fd, struct msg *m) {
  uint64_t t0 = now_ns();
  uint32_t id = get32(m);
  if (m->bad || m->off != m->len)
    return send_err(fd, "malformed UNLOAD");
  struct module *mod = find_module(id);
  if (!mod)
    return send_err(fd, "module %u is not loaded", id);
  char users[300];
  if (dependents(id, users, sizeof users))
    return send_err(fd, "module %s (id %u) is needed by %s (unload them first)",
                    mod->name, id, users);
  remove_module(mod);
  return send_ok_since(fd, t0);
}

/* UNLOAD_NAME: `bunkai mod unload NAME` in one round trip. The module is
 * unloaded unless another module needs it; the answer says which case. */
int do_unload_name(int fd, struct msg *m) {
  uint64_t t0 = now_ns();
  char *name = getstr(m);
  if (!name || m->bad) {
    free(name);
    return send_err(fd, "malformed UNLOAD_NAME");
  }
  struct out o = {0};
  struct module *target = NULL;
  uint32_t nusers = 0;
  pthread_mutex_lock(&mod_lock);
  for (struct module *x = modules; x; x = x->next)
    if (x->name && !strcmp(x->name, name))
      target = x;
  for (struct module *x = modules; target && x; x = x->next)
    nusers += x != target && needs(x, name);
  if (!target) {
    put32(&o, 1);
  } else if (nusers) {
    put32(&o, 2);
    put32(&o, nusers);
    for (struct module *x = modules; x; x = x->next)
      if (x != target && needs(x, name))
        putstr(&o, x->name, strlen(x->name));
  }
  pthread_mutex_unlock(&mod_lock);
  free(name);
  if (target && !nusers) {
    uint32_t id = target->id;
    remove_module(target);
    put32(&o, 0);
    put32(&o, id);
    put64(&o, now_ns() - t0);
  }
  int rc = send_msg(fd, BUNKAI_MSG_OK, &o);
  free(o.p);
  return rc;
}
