/* clock.c: time stamps: the vDSO's clock_gettime, found by hand, and the
 * TSC with the (tsc, CLOCK_MONOTONIC) pairs that let a reader convert it.
 * Rules: runtime.h.
 */
#include "runtime.h"

#include <cpuid.h>
#include <elf.h>

/* ------------------------------------------------------------------ */
/* The vDSO's clock_gettime (found in the ELF image the kernel maps; its
 * address is the AT_SYSINFO_EHDR entry of the process's auxiliary vector).
 * The vector comes from prctl(PR_GET_AUXV) (Linux 6.4), else from
 * /proc/self/auxv; else the vDSO's line in /proc/self/maps gives the base.
 * Not /proc/self/auxv alone: a server that drops privileges (httpd, as
 * nobody) is no longer dumpable, its /proc files are root's and that open
 * fails (maps stays readable to the process itself); without the vDSO every
 * record's time stamp was a system call (Apache: 84,400 a second).       */

#ifndef PR_GET_AUXV
#define PR_GET_AUXV 0x41555856
#endif

static uint64_t auxv_find(const uint64_t *auxv, long bytes, uint64_t type) {
  for (long i = 0; i + 1 < bytes / 8; i += 2)
    if (auxv[i] == type) return auxv[i + 1];
  return 0;
}

/* The start of the mapping named [vdso] in /proc/self/maps, or 0. (Not
 * inlined, nor is vdso_from_auxv: this may run on a signal stack, and only
 * one of their buffers should be on it at a time.) */
static __attribute__((noinline)) uint64_t vdso_from_maps(void) {
  int fd = (int)sc3(SYS_open, "/proc/self/maps", O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return 0;
  char b[256], tail[8] = {0}; /* the line's last 7 characters */
  uint64_t start = 0, found = 0;
  int in_addr = 1;
  for (long n; !found && (n = sc3(SYS_read, fd, b, sizeof b)) > 0;)
    for (long i = 0; i < n && !found; i++) {
      char c = b[i];
      if (c == '\n') {
        if (rt_sequal(tail, " [vdso]")) found = start; /* the whole name: not a file called x[vdso] */
        start = 0, in_addr = 1;
        for (int k = 0; k < 8; k++) tail[k] = 0;
        continue;
      }
      if (in_addr) {
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) in_addr = 0;
        else start = start << 4 | (uint64_t)d;
      }
      for (int k = 0; k < 7; k++) tail[k] = tail[k + 1];
      tail[6] = c, tail[7] = 0;
    }
  sc1(SYS_close, fd);
  return found;
}

static __attribute__((noinline)) uint64_t vdso_from_auxv(void) {
  uint64_t auxv[2 * 24]; /* AT_SYSINFO_EHDR comes first on x86-64 */
  long n = sc3(SYS_prctl, PR_GET_AUXV, auxv, sizeof auxv);
  /* n is the vector's full size; what did not fit was cut off. */
  if (n > 0) {
    uint64_t b = auxv_find(auxv, n < (long)sizeof auxv ? n : (long)sizeof auxv, AT_SYSINFO_EHDR);
    if (b) return b;
  }
  uint64_t base = 0;
  int fd = (int)sc3(SYS_open, "/proc/self/auxv", O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return 0;
  for (;;) {
    long r = sc3(SYS_read, fd, auxv, sizeof auxv); /* /proc gives whole entries */
    if (r <= 0) break;
    uint64_t b = auxv_find(auxv, r, AT_SYSINFO_EHDR);
    if (b) base = b;
  }
  sc1(SYS_close, fd);
  return base;
}

static uint64_t vdso_base(void) {
  uint64_t b = vdso_from_auxv();
  return b ? b : vdso_from_maps();
}

static clock_fn vdso_lookup(void) {
  uint64_t base = vdso_base();
  if (!base) return 0;
  const Elf64_Ehdr *eh = (const Elf64_Ehdr *)base;
  if (eh->e_ident[0] != 0x7f || eh->e_ident[1] != 'E' || eh->e_ident[4] != ELFCLASS64) return 0;
  const Elf64_Phdr *ph = (const Elf64_Phdr *)(base + eh->e_phoff);
  uint64_t load = 0, dyn = 0;
  int have_load = 0;
  for (int i = 0; i < eh->e_phnum; i++) {
    if (ph[i].p_type == PT_LOAD && !have_load) load = base + ph[i].p_offset - ph[i].p_vaddr, have_load = 1;
    if (ph[i].p_type == PT_DYNAMIC) dyn = base + ph[i].p_offset;
  }
  if (!have_load || !dyn) return 0;
  const Elf64_Sym *sym = 0;
  const char *str = 0;
  const uint32_t *hash = 0;
  for (const Elf64_Dyn *d = (const Elf64_Dyn *)dyn; d->d_tag != DT_NULL; d++) {
    if (d->d_tag == DT_SYMTAB) sym = (const Elf64_Sym *)(load + d->d_un.d_ptr);
    if (d->d_tag == DT_STRTAB) str = (const char *)(load + d->d_un.d_ptr);
    if (d->d_tag == DT_HASH) hash = (const uint32_t *)(load + d->d_un.d_ptr);
  }
  if (!sym || !str || !hash) return 0;
  for (uint32_t i = 0; i < hash[1]; i++) /* nchain = number of symbols */
    if (sym[i].st_shndx != SHN_UNDEF && ELF64_ST_TYPE(sym[i].st_info) == STT_FUNC &&
        rt_sequal(str + sym[i].st_name, "__vdso_clock_gettime"))
      return (clock_fn)(load + sym[i].st_value);
  return 0;
}

static uint64_t clock_ns(clockid_t c) {
  struct timespec ts;
  clock_fn f = LD_ACQ(&G.vclock);
  if (unlikely(!f)) {
    int s = LD_ACQ(&G.vclock_state), z = 0;
    if (s == 0 && CAS(&G.vclock_state, &z, 1)) {
      f = vdso_lookup();
      ST_REL(&G.vclock, f);
      ST_REL(&G.vclock_state, 2);
    }
  }
  if (!f || f(c, &ts) != 0) sc2(SYS_clock_gettime, c, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t now_ns(void) { return clock_ns(CLOCK_REALTIME); }

/* ------------------------------------------------------------------ */
/* TSC time stamps (bunkai_flow.h §3): rdtsc is 10 ns here, the vDSO's
 * clock_gettime 22. Records hold the TSC when the kernel's clocksource is
 * the TSC (it checked that the TSC is invariant and in step across CPUs);
 * the header's clock readings at creation and (tsc, CLOCK_MONOTONIC) pairs
 * let a reader convert. */


/* CPUID 0x80000007 EDX bit 8: the TSC runs at a constant rate in every
 * power state (<cpuid.h> is the compiler's, inline, no libc). */
static int tsc_invariant(void) {
  unsigned a, b, c, d;
  return __get_cpuid(0x80000007u, &a, &b, &c, &d) && (d >> 8 & 1);
}

/* BKF_CLOCK_TSC or BKF_CLOCK_NS: BUNKAI_FLOW_CLOCK=ns|tsc, else the TSC when
 * it is the kernel's clocksource. Never the TSC unless the CPU says it is
 * invariant. */
int choose_clock(void) {
  if (!tsc_invariant()) return BKF_CLOCK_NS;
  const char *e = env("BUNKAI_FLOW_CLOCK");
  if (e && rt_sequal(e, "ns")) return BKF_CLOCK_NS;
  if (e && rt_sequal(e, "tsc")) return BKF_CLOCK_TSC;
  char b[16] = {0};
  int fd = (int)sc3(SYS_open, "/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return BKF_CLOCK_NS;
  long n = sc3(SYS_read, fd, b, sizeof b - 1);
  sc1(SYS_close, fd);
  return n == 4 && rt_sequal(b, "tsc\n") ? BKF_CLOCK_TSC : BKF_CLOCK_NS;
}

/* A (tsc, CLOCK_MONOTONIC) pair, and CLOCK_REALTIME at the same moment
 * when real is not null: the TSC halfway between two reads around the
 * clocks, retried when something (an interrupt) came between them. The
 * rate comes from CLOCK_MONOTONIC, which runs at the wall clock's rate
 * (NTP's slewing included) but never steps, so setting the wall clock
 * during a run moves no record. */
struct bkf_buf_time_pair time_pair(uint64_t *real) {
  struct bkf_buf_time_pair p;
  for (int i = 0;; i++) {
    uint64_t a = rdtsc();
    p.ns = clock_ns(CLOCK_MONOTONIC);
    if (real) *real = now_ns();
    uint64_t b = rdtsc();
    p.tsc = a + (b - a) / 2;
    if (b - a < 2048 || i == 7) return p;
  }
}


/* The next step: the span since creation (so no record lies further past
 * the latest pair than that pair lies from the first), within bounds. */
uint64_t cal_step(const struct bkf_buf_header *h, uint64_t tsc) {
  uint64_t span = tsc - h->tsc0;
  return span < CAL_MIN ? CAL_MIN : span > CAL_MAX ? CAL_MAX : span;
}

/* A record's TSC reached cal_next: one writer takes a new pair into the
 * slot readers are not using, then publishes it; the others go on. A
 * writer that wins the sequence just after another published (it loaded
 * the old cal_next) gives it back unchanged, so pairs are published at
 * least a step apart and a reader's copy of the header is not torn by two
 * publications in a row. (A thread killed in here leaves cal_seq odd: no
 * more pairs for this buffer, whose times then stretch the last rate.) */
COLD void recalibrate(struct bkf_buf_header *h) {
  uint32_t s = LD_ACQ(&h->cal_seq);
  if ((s & 1) || !CAS(&h->cal_seq, &s, s + 1)) return;
  if (rdtsc() < LD(&h->cal_next)) {
    ST_REL(&h->cal_seq, s);
    return;
  }
  struct bkf_buf_time_pair p = time_pair(0);
  h->cal[((s >> 1) + 1) & 1] = p;
  ST(&h->cal_next, p.tsc + cal_step(h, p.tsc));
  ST_REL(&h->cal_seq, s + 2);
}
