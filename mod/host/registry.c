/*
 * registry.c - the registry programs call modules through: interfaces and
 * their stacks of providers, the function table each publishes with one
 * atomic store, bunkai_acquire/bunkai_release and the grace period an unload
 * waits for, the interfaces the host expects. Rules: host.h.
 */
#include "host.h"

pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
struct bunkai_iface *ifaces;
struct expect *expects;

/* Grace periods: readers count themselves in the generation they entered,
 * and each thread keeps its own share of the counts: a fork child, where
 * only the forking thread lives, keeps just that thread's (readers_after_fork),
 * or an unload there would wait for ever for threads that do not exist. */
static _Atomic uint32_t gen;
static _Atomic int64_t readers[2];
static __thread __attribute__((tls_model("initial-exec"))) int64_t mine[2];

EXPORT bunkai_iface_t *bunkai_iface(const char *name) {
  pthread_mutex_lock(&reg_lock);
  struct bunkai_iface *h;
  for (h = ifaces; h; h = h->next)
    if (!strcmp(h->name, name))
      break;
  if (!h) {
    h = calloc(1, sizeof *h);
    if (h && !(h->name = strdup(name))) {
      free(h);
      h = NULL;
    }
    if (h) {
      h->next = ifaces;
      ifaces = h;
    }
  }
  pthread_mutex_unlock(&reg_lock);
  return h;
}

EXPORT const void *bunkai_acquire(bunkai_iface_t *h, struct bunkai_guard *g) {
  uint32_t e;
  for (;;) {
    e = atomic_load(&gen);
    atomic_fetch_add(&readers[e & 1], 1);
    if (atomic_load(&gen) == e)
      break;
    atomic_fetch_sub(&readers[e & 1], 1);
  }
  mine[e & 1]++;
  g->gen = e;
  return h ? atomic_load(&h->table) : NULL;
}

EXPORT void bunkai_release(struct bunkai_guard *g) {
  mine[g->gen & 1]--;
  atomic_fetch_sub(&readers[g->gen & 1], 1);
}

/* In a fork child: the calls in flight are the forking thread's only. */
void readers_after_fork(void) {
  atomic_store(&readers[0], mine[0]);
  atomic_store(&readers[1], mine[1]);
}

/* Waits until no call that may have seen the old tables is in flight. */
void grace_period(void) {
  uint32_t e = atomic_load(&gen);
  atomic_store(&gen, e + 1);
  while (atomic_load(&readers[e & 1]) != 0)
    sched_yield();
}

EXPORT void *bunkai_lookup(const char *iface, const char *name) {
  void *fn = NULL;
  pthread_mutex_lock(&reg_lock);
  for (struct bunkai_iface *h = ifaces; h; h = h->next)
    if (!strcmp(h->name, iface) && h->providers)
      for (uint32_t i = 0; i < h->providers->nfn; i++)
        if (!strcmp(h->providers->names[i], name))
          fn = (void *)h->providers->table[i];
  pthread_mutex_unlock(&reg_lock);
  return fn;
}

EXPORT int bunkai_host_expect(const char *name, const char *text) {
  struct expect *e = calloc(1, sizeof *e);
  if (!e || !(e->name = strdup(name)) || !(e->text = strdup(text))) {
    free(e);
    return -1;
  }
  pthread_mutex_lock(&reg_lock);
  e->next = expects;
  expects = e;
  pthread_mutex_unlock(&reg_lock);
  bunkai_iface(name);
  return 0;
}

/* Takes module m's entries off the provider stacks of its interfaces.
 * Caller holds reg_lock and republishes the tables. */
void drop_providers(const struct module *m) {
  for (uint32_t i = 0; i < m->nregs; i++) {
    struct bunkai_iface *h = m->regs[i].iface;
    for (struct provider **pp = &h->providers; *pp;) {
      if ((*pp)->module == m->id) {
        struct provider *dead = *pp;
        *pp = dead->next;
        free(dead);
      } else {
        pp = &(*pp)->next;
      }
    }
  }
}

/* Publishes each interface's top provider (caller holds reg_lock). */
void publish_tables(void) {
  for (struct bunkai_iface *h = ifaces; h; h = h->next)
    atomic_store(&h->table, h->providers ? (const void *)h->providers->table
                                         : NULL);
}

/* Removes module m's registrations and republishes the tables. */
void unregister(struct module *m) {
  pthread_mutex_lock(&reg_lock);
  drop_providers(m);
  publish_tables();
  pthread_mutex_unlock(&reg_lock);
}

/* How many functions interface `name` has: the prototypes of the text the
 * host expects (one ';' each), else the length of the tables its current
 * providers (other than module `skip`, which a swap takes out) registered;
 * -1 if nobody has said yet. */
int64_t iface_length(const char *name, uint32_t skip) {
  int64_t n = -1;
  pthread_mutex_lock(&reg_lock);
  for (struct expect *e = expects; e && n < 0; e = e->next)
    if (!strcmp(e->name, name)) {
      int64_t k = 0;
      for (const char *c = e->text; *c; c++)
        k += *c == ';';
      if (k > 0)
        n = k;
    }
  for (struct bunkai_iface *h = ifaces; h && n < 0; h = h->next)
    if (!strcmp(h->name, name))
      for (struct provider *p = h->providers; p && n < 0; p = p->next)
        if (p->module != skip)
          n = p->nfn;
  pthread_mutex_unlock(&reg_lock);
  return n;
}
