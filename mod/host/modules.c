/*
 * modules.c - the table of loaded modules: their memory budget, finding
 * them by id or name, who needs whom, and taking one out (off the
 * registry, a grace period, its exit function, its memory unmapped).
 * Rules: host.h.
 */
#include "host.h"

void free_strv(char **v, uint32_t n) {
  for (uint32_t k = 0; v && k < n; k++)
    free(v[k]);
  free(v);
}

void free_reg(struct reg *r) {
  for (uint32_t k = 0; r->names && k < r->nfn; k++)
    free(r->names[k]);
  free(r->names);
  free(r->table);
}

struct module *modules; /* guarded by the command thread (only writer)
                           and mod_lock for provider names */
pthread_mutex_t mod_lock = PTHREAD_MUTEX_INITIALIZER;
uint32_t next_id = 1;
uint64_t budget, used;

EXPORT void bunkai_host_set_budget(uint64_t bytes) { budget = bytes; }

EXPORT const char *bunkai_provider(const char *iface, char *buf,
                                   unsigned long len) {
  const char *out = NULL;
  pthread_mutex_lock(&reg_lock);
  struct bunkai_iface *h;
  for (h = ifaces; h; h = h->next)
    if (!strcmp(h->name, iface))
      break;
  uint32_t id = h && h->providers ? h->providers->module : 0;
  pthread_mutex_unlock(&reg_lock);
  if (!id)
    return NULL;
  pthread_mutex_lock(&mod_lock);
  for (struct module *m = modules; m; m = m->next)
    if (m->id == id && m->name && len) {
      size_t i = 0;
      while (m->name[i] && i + 1 < len) {
        buf[i] = m->name[i];
        i++;
      }
      buf[i] = 0;
      out = buf;
    }
  pthread_mutex_unlock(&mod_lock);
  return out;
}

/* After unregister + grace period: nobody can be running the module. */
static void destroy(struct module *m) {
  if (m->exit_fn)
    m->exit_fn();
  munmap(m->mem, m->mem_len);
  used -= m->mem_len;
  for (uint32_t i = 0; i < m->nregs; i++)
    free_reg(&m->regs[i]);
  free(m->regs);
  free(m->blob);
  free(m->name);
  free_strv(m->deps, m->ndeps);
  free(m);
}

struct module *find_module(uint32_t id) {
  pthread_mutex_lock(&mod_lock);
  struct module *m = modules;
  while (m && m->id != id)
    m = m->next;
  pthread_mutex_unlock(&mod_lock);
  return m;
}

static struct module *unlink_module(uint32_t id) {
  pthread_mutex_lock(&mod_lock);
  struct module *found = NULL;
  for (struct module **pp = &modules; *pp; pp = &(*pp)->next)
    if ((*pp)->id == id) {
      found = *pp;
      *pp = found->next;
      break;
    }
  pthread_mutex_unlock(&mod_lock);
  return found;
}

/* Once nothing can reach module m any more (its tables are off the stacks):
 * waits for the calls in flight, then frees it. */
void retire(struct module *m) {
  grace_period();
  unlink_module(m->id);
  destroy(m);
}

void remove_module(struct module *m) {
  unregister(m);
  retire(m);
}

struct module *module_named(const char *name, uint32_t skip) {
  struct module *found = NULL;
  pthread_mutex_lock(&mod_lock);
  for (struct module *x = modules; x && !found; x = x->next)
    if (x->id != skip && x->name && !strcmp(x->name, name))
      found = x;
  pthread_mutex_unlock(&mod_lock);
  return found;
}

/* Whether module x needs the module called `name`. */
int needs(const struct module *x, const char *name) {
  for (uint32_t k = 0; k < x->ndeps; k++)
    if (!strcmp(x->deps[k], name))
      return 1;
  return 0;
}

/* The modules that need module `id`, comma-separated into buf; 0 if none.
 * (By id as by name: a dependent left without its dependency would call
 * into unmapped memory.) */
int dependents(uint32_t id, char *buf, size_t len) {
  int n = 0;
  size_t off = 0;
  buf[0] = 0;
  pthread_mutex_lock(&mod_lock);
  struct module *t = modules;
  while (t && t->id != id)
    t = t->next;
  for (struct module *x = modules; t && x; x = x->next)
    if (x != t && needs(x, t->name)) {
      int w = snprintf(buf + off, len - off, "%s%s", n ? ", " : "", x->name);
      if (w > 0 && off + (size_t)w < len)
        off += (size_t)w;
      n++;
    }
  pthread_mutex_unlock(&mod_lock);
  return n;
}
