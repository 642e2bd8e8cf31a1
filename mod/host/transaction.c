/*
 * transaction.c - one connection's session, which is a transaction: the
 * evictions it stages, COMMIT (what it says is checked against what the
 * session staged, then the module is published), and the undo of whatever
 * did not commit. Rules: host.h.
 */
#include "host.h"

void rollback(struct session *s) {
  if (s->passed_fd >= 0)
    close(s->passed_fd);
  s->passed_fd = -1;
  s->nevict = 0;
  s->evict_bytes = 0;
  while (s->staged) {
    struct staged *st = s->staged;
    s->staged = st->next;
    munmap(st->mem, st->mem_len);
    used -= st->mem_len;
    free(st);
  }
}

int do_commit(int fd, struct session *s, struct msg *m) {
  char why[400] = "";
  uint32_t replace = get32(m);
  uint32_t blob_len;
  const unsigned char *blob = getbytes(m, &blob_len);
  uint64_t mem = get64(m);
  (void)get64(m); /* rw address: inside the same mapping */
  uint64_t init = get64(m), exitp = get64(m);
  uint32_t nregs = get32(m);
  if (m->bad || nregs > 1024)
    return send_err(fd, "malformed COMMIT");
  struct staged *st = find_staged(s, mem);
  if (!st)
    return send_err(fd, "COMMIT of memory not staged for this load");
  if (!st->sealed) /* its code would not be executable */
    return send_err(fd, "COMMIT of a module not loaded (no MAP or PROTECT)");
  struct module *old = replace ? find_module(replace) : NULL;
  if (replace && !old)
    return send_err(fd, "module %u to replace is not loaded", replace);
  struct module *mod = calloc(1, sizeof *mod);
  struct reg *regs = calloc(nregs ? nregs : 1, sizeof *regs);
  char *b = malloc(blob_len + 1);
  if (!mod || !regs || !b) {
    free(mod), free(regs), free(b);
    return send_err(fd, "out of memory");
  }
  memcpy(b, blob, blob_len);
  b[blob_len] = 0;
  /* Code pointers must lie in this module's own code: the RX part of the
   * memory this transaction staged, mapped or protected r-x. */
  uint64_t lo = (uint64_t)(uintptr_t)st->mem, hi = lo + st->rx_len;
#define IN_CODE(a) ((a) >= lo && (a) < hi)
  uint32_t i;
  for (i = 0; i < nregs && !m->bad && !why[0]; i++) {
    char *name = getname(m, "an interface name", why, sizeof why);
    uint32_t nfn = get32(m);
    if (!name || m->bad || nfn > 256) {
      if (name && nfn > 256 && !m->bad)
        snprintf(why, sizeof why, "interface %s with %u functions (at most 256)",
                 name, nfn);
      free(name);
      if (!why[0])
        m->bad = 1;
      break;
    }
    for (uint32_t k = 0; k < i; k++)
      if (!strcmp(regs[k].iface->name, name))
        snprintf(why, sizeof why, "interface %s is implemented twice", name);
    int64_t want = why[0] ? -1 : iface_length(name, replace);
    if (want >= 0 && nfn != (uint64_t)want)
      snprintf(why, sizeof why,
               "interface %s has %lld functions, the table sent has %u", name,
               (long long)want, nfn);
    else if (nfn == 0 && !why[0])
      snprintf(why, sizeof why, "interface %s with an empty table", name);
    const void **table = calloc(nfn ? nfn : 1, sizeof *table);
    char **names = calloc(nfn ? nfn : 1, sizeof *names);
    regs[i].table = table;
    regs[i].names = names;
    regs[i].nfn = nfn;
    for (uint32_t k = 0; k < nfn && table && names && !m->bad && !why[0];
         k++) {
      names[k] = getname(m, "a function name", why, sizeof why);
      uint64_t a = get64(m);
      table[k] = (const void *)(uintptr_t)a;
      if (!names[k] && !why[0])
        m->bad = 1;
      else if (!why[0] && !m->bad && !IN_CODE(a))
        snprintf(why, sizeof why,
                 "%s.%s at %#llx is outside the module's code "
                 "[%#llx, %#llx)",
                 name, names[k], (unsigned long long)a,
                 (unsigned long long)lo, (unsigned long long)hi);
    }
    if (!why[0] && !m->bad) {
      regs[i].iface = bunkai_iface(name);
      if (!table || !names || !regs[i].iface)
        snprintf(why, sizeof why, "out of memory");
    }
    free(name);
  }
  uint32_t nreg_parsed = i; /* regs[0..i] may hold allocations */
  if (nreg_parsed < nregs)
    nreg_parsed++;
  char *mname = m->bad || why[0]
                    ? NULL
                    : getname(m, "the module's name", why, sizeof why);
  uint32_t ndeps = mname ? get32(m) : 0;
  char **deps = NULL;
  if (mname && !m->bad && ndeps > 1024)
    snprintf(why, sizeof why, "%u modules needed (at most 1024)", ndeps);
  else if (mname && !m->bad &&
           !(deps = calloc(ndeps ? ndeps : 1, sizeof *deps)))
    snprintf(why, sizeof why, "out of memory");
  for (uint32_t k = 0; k < ndeps && deps && !m->bad && !why[0]; k++)
    if (!(deps[k] = getname(m, "a needed module's name", why, sizeof why)) &&
        !why[0])
      m->bad = 1;
  if (!why[0] && !m->bad && !mname)
    m->bad = 1;
  if (!why[0] && !m->bad && m->off != m->len)
    snprintf(why, sizeof why, "%zu bytes after the end", m->len - m->off);

  /* What the pieces say together. */
  size_t at;
  const char *jerr;
  if (!why[0] && !m->bad &&
      (jerr = json_object_error((const unsigned char *)b, blob_len, &at)))
    snprintf(why, sizeof why, "the module's record %s (byte %zu)", jerr, at);
  if (!why[0] && !m->bad && init && !IN_CODE(init))
    snprintf(why, sizeof why,
             "init at %#llx is outside the module's code [%#llx, %#llx)",
             (unsigned long long)init, (unsigned long long)lo,
             (unsigned long long)hi);
  if (!why[0] && !m->bad && exitp && !IN_CODE(exitp))
    snprintf(why, sizeof why,
             "exit at %#llx is outside the module's code [%#llx, %#llx)",
             (unsigned long long)exitp, (unsigned long long)lo,
             (unsigned long long)hi);
#undef IN_CODE
  if (!why[0] && !m->bad && module_named(mname, replace))
    snprintf(why, sizeof why, "a module named %s is already loaded", mname);
  for (uint32_t k = 0; k < ndeps && !why[0] && !m->bad; k++) {
    struct module *d = module_named(deps[k], replace);
    int evicted = 0;
    for (uint32_t e = 0; d && e < s->nevict; e++)
      evicted |= s->evict[e] == d->id;
    if (!d || evicted || !strcmp(deps[k], mname))
      snprintf(why, sizeof why, "%s needs module %s, which is %s", mname,
               deps[k],
               !strcmp(deps[k], mname) ? "itself"
               : evicted               ? "being unloaded"
                                       : "not loaded");
  }
  for (uint32_t e = 0; replace && e < s->nevict && !why[0] && !m->bad; e++)
    if (s->evict[e] == replace)
      snprintf(why, sizeof why, "module %u is both replaced and unloaded",
               replace);
  if (m->bad || why[0]) {
    for (uint32_t k = 0; k < nreg_parsed; k++)
      free_reg(&regs[k]);
    free(mod), free(regs), free(b), free(mname);
    free_strv(deps, ndeps);
    drop_staged(s, st);
    if (m->bad)
      return send_err(fd, "malformed COMMIT (the module was not loaded)");
    return send_err(fd, "COMMIT refused: %s (the module was not loaded)", why);
  }

  /* Evictions staged by this transaction (memory pressure) happen now. */
  for (uint32_t k = 0; k < s->nevict; k++) {
    struct module *ev = find_module(s->evict[k]);
    if (ev)
      remove_module(ev);
  }
  s->nevict = 0;
  s->evict_bytes = 0;

  /* The module's own initialisation runs before anyone can call it. */
  uint64_t t0 = now_ns();
  if (init) {
    int rc = ((int (*)(void))(uintptr_t)init)();
    if (rc != 0) {
      for (uint32_t k = 0; k < nregs; k++)
        free_reg(&regs[k]);
      free(mod), free(regs), free(b), free(mname);
      free_strv(deps, ndeps);
      drop_staged(s, st);
      return send_err(fd, "the module's init function returned %d", rc);
    }
  }
  uint64_t t1 = now_ns();
  mod->blob = b;
  mod->blob_len = blob_len;
  mod->name = mname;
  mod->deps = deps;
  mod->ndeps = ndeps;
  mod->mem = st->mem;
  mod->mem_len = st->mem_len;
  mod->exit_fn = (void (*)(void))(uintptr_t)exitp;
  mod->nregs = nregs;
  mod->regs = regs;

  /* Publication: the new module's tables go on top, and a replaced module's
   * come off, under one lock; each interface changes with one store. */
  pthread_mutex_lock(&mod_lock);
  mod->id = next_id++;
  mod->next = modules;
  modules = mod;
  pthread_mutex_unlock(&mod_lock);
  pthread_mutex_lock(&reg_lock);
  for (i = 0; i < nregs; i++) {
    struct bunkai_iface *h = regs[i].iface;
    struct provider *p = calloc(1, sizeof *p);
    if (!p)
      abort();
    p->module = mod->id;
    p->table = regs[i].table;
    p->names = regs[i].names;
    p->nfn = regs[i].nfn;
    if (old) {
      /* Swap: take the old module's place in the stack. */
      struct provider **pp = &h->providers;
      while (*pp && (*pp)->module != old->id)
        pp = &(*pp)->next;
      p->next = *pp;
      *pp = p;
    } else {
      p->next = h->providers;
      h->providers = p;
    }
  }
  if (old)
    drop_providers(old);
  publish_tables();
  pthread_mutex_unlock(&reg_lock);
  /* The staged memory now belongs to the module. */
  for (struct staged **pp = &s->staged; *pp; pp = &(*pp)->next)
    if (*pp == st) {
      *pp = st->next;
      free(st);
      break;
    }
  uint64_t t2 = now_ns();
  if (old)
    retire(old);
  struct out o = {0};
  put32(&o, mod->id);
  put64(&o, t1 - t0);
  put64(&o, t2 - t1);
  int rc = send_msg(fd, BUNKAI_MSG_OK, &o);
  free(o.p);
  return rc;
}

int do_evict(int fd, struct session *s, struct msg *m) {
  uint32_t id = get32(m);
  if (m->bad)
    return send_err(fd, "malformed EVICT");
  if (s->nevict == sizeof s->evict / sizeof s->evict[0])
    return send_err(fd, "too many evictions in one load");
  struct module *mod = find_module(id);
  if (!mod)
    return send_err(fd, "module %u is not loaded", id);
  for (uint32_t k = 0; k < s->nevict; k++)
    if (s->evict[k] == id)
      return send_err(fd, "module %u is already being unloaded", id);
  char users[300];
  if (dependents(id, users, sizeof users))
    return send_err(fd, "module %s (id %u) is needed by %s (unload them first)",
                    mod->name, id, users);
  s->evict[s->nevict++] = id;
  s->evict_bytes += mod->mem_len;
  return send_msg(fd, BUNKAI_MSG_OK, NULL);
}
