/* sledcheck.c: a test helper, LD_PRELOADed into a program built by
 * `bunkai flow cc`. Before main it patches EVERY sled of the main program
 * the way flow/include/bunkai_flow.h says (eb 09 over the nop, then
 * e8 rel32 + nopl at offset 2..10, then 66 90), so every join point calls one
 * trampoline. The trampoline saves all registers, %xmm0-15 and the flags,
 * and the handler writes one line per join point executed to
 * $BKF_CHECK_LOG:
 *
 *     <index> <function> <line> <struct.member|entry> <access> name=0x<hex> ...
 *
 * with each operand's value read from where the table says it is (a
 * register at its width, a stack slot, an immediate). The test checks the
 * values against what the program computes, and that the program's output
 * is unchanged with every sled patched (nothing clobbered, red zone
 * included).
 *
 * Rules: the handler runs at any join point of the program's own code,
 * between two of its instructions; it formats with snprintf into its own
 * buffer and writes with write(2), never through the program's stdio. */
#define _GNU_SOURCE
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SECTION "bunkai_flow_jp"
#define MAGIC 0x50464b42u

struct frame { /* what the trampoline pushed, lowest address first */
  uint8_t xmm[16][16];
  uint64_t r15, r14, r13, r12, r11, r10, r9, r8, rdi, rsi, rbp, rbx, rdx,
      rcx, rax;
  uint64_t flags;
  uint64_t ret; /* sled + 7 */
};

struct jp {
  uint64_t sled;
  unsigned index;
  const char *text;
};

static struct jp *jps;
static unsigned njps;
static int log_fd = -1;

void bkf_check_tramp(void);
__asm__(".text\n"
        ".globl bkf_check_tramp\n"
        ".type bkf_check_tramp,@function\n"
        "bkf_check_tramp:\n"
        "  pushfq\n"
        "  push %rax\n push %rcx\n push %rdx\n push %rbx\n push %rbp\n"
        "  push %rsi\n push %rdi\n push %r8\n push %r9\n push %r10\n"
        "  push %r11\n push %r12\n push %r13\n push %r14\n push %r15\n"
        "  sub $256, %rsp\n"
        "  movdqu %xmm0, 0(%rsp)\n movdqu %xmm1, 16(%rsp)\n"
        "  movdqu %xmm2, 32(%rsp)\n movdqu %xmm3, 48(%rsp)\n"
        "  movdqu %xmm4, 64(%rsp)\n movdqu %xmm5, 80(%rsp)\n"
        "  movdqu %xmm6, 96(%rsp)\n movdqu %xmm7, 112(%rsp)\n"
        "  movdqu %xmm8, 128(%rsp)\n movdqu %xmm9, 144(%rsp)\n"
        "  movdqu %xmm10, 160(%rsp)\n movdqu %xmm11, 176(%rsp)\n"
        "  movdqu %xmm12, 192(%rsp)\n movdqu %xmm13, 208(%rsp)\n"
        "  movdqu %xmm14, 224(%rsp)\n movdqu %xmm15, 240(%rsp)\n"
        "  mov %rsp, %rdi\n"
        "  mov %rsp, %rbp\n"
        "  and $-16, %rsp\n"
        "  call bkf_check_handler\n"
        "  mov %rbp, %rsp\n"
        "  movdqu 0(%rsp), %xmm0\n movdqu 16(%rsp), %xmm1\n"
        "  movdqu 32(%rsp), %xmm2\n movdqu 48(%rsp), %xmm3\n"
        "  movdqu 64(%rsp), %xmm4\n movdqu 80(%rsp), %xmm5\n"
        "  movdqu 96(%rsp), %xmm6\n movdqu 112(%rsp), %xmm7\n"
        "  movdqu 128(%rsp), %xmm8\n movdqu 144(%rsp), %xmm9\n"
        "  movdqu 160(%rsp), %xmm10\n movdqu 176(%rsp), %xmm11\n"
        "  movdqu 192(%rsp), %xmm12\n movdqu 208(%rsp), %xmm13\n"
        "  movdqu 224(%rsp), %xmm14\n movdqu 240(%rsp), %xmm15\n"
        "  add $256, %rsp\n"
        "  pop %r15\n pop %r14\n pop %r13\n pop %r12\n pop %r11\n"
        "  pop %r10\n pop %r9\n pop %r8\n pop %rdi\n pop %rsi\n"
        "  pop %rbp\n pop %rbx\n pop %rdx\n pop %rcx\n pop %rax\n"
        "  popfq\n"
        "  ret\n"
        ".size bkf_check_tramp, .-bkf_check_tramp\n");

static void die(const char *why) {
  fprintf(stderr, "sledcheck: %s\n", why);
  _exit(99);
}

/* A register by the name the compiler printed, at its width. */
static int reg_value(const struct frame *f, const char *name, uint64_t *out) {
  static const char *n64[] = {"rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
                              "r8",  "r9",  "r10", "r11", "r12", "r13", "r14", "r15"};
  static const char *n32[] = {"eax", "ecx", "edx", "ebx", "esp", "ebp", "esi", "edi",
                              "r8d", "r9d", "r10d", "r11d", "r12d", "r13d", "r14d", "r15d"};
  static const char *n16[] = {"ax", "cx", "dx", "bx", "sp", "bp", "si", "di",
                              "r8w", "r9w", "r10w", "r11w", "r12w", "r13w", "r14w", "r15w"};
  static const char *n8[] = {"al", "cl", "dl", "bl", "spl", "bpl", "sil", "dil",
                             "r8b", "r9b", "r10b", "r11b", "r12b", "r13b", "r14b", "r15b"};
  uint64_t v[16] = {f->rax, f->rcx, f->rdx, f->rbx, (uint64_t)&f->ret + 8, f->rbp,
                    f->rsi, f->rdi, f->r8,  f->r9,  f->r10, f->r11, f->r12, f->r13,
                    f->r14, f->r15};
  for (int i = 0; i < 16; i++) {
    if (!strcmp(name, n64[i])) { *out = v[i]; return 1; }
    if (!strcmp(name, n32[i])) { *out = v[i] & 0xffffffffu; return 1; }
    if (!strcmp(name, n16[i])) { *out = v[i] & 0xffffu; return 1; }
    if (!strcmp(name, n8[i])) { *out = v[i] & 0xffu; return 1; }
  }
  if (!strncmp(name, "xmm", 3)) {
    int k = atoi(name + 3);
    if (k >= 0 && k < 16) { memcpy(out, f->xmm[k], 8); return 1; }
  }
  return 0;
}

static int location_value(const struct frame *f, const char *loc, uint64_t *out) {
  if (loc[0] == '%')
    return reg_value(f, loc + 1, out);
  if (loc[0] == '$') {
    *out = (uint64_t)strtoll(loc + 1, NULL, 0);
    return 1;
  }
  char *end;
  long off = strtol(loc, &end, 10);
  uint64_t base;
  if (!strcmp(end, "(%rsp)"))
    base = (uint64_t)&f->ret + 8;
  else if (!strcmp(end, "(%rbp)"))
    base = f->rbp;
  else
    return 0;
  memcpy(out, (void *)(base + off), 8);
  return 1;
}

void bkf_check_handler(struct frame *f) {
  uint64_t sled = f->ret - 7;
  const struct jp *j = NULL;
  for (unsigned i = 0; i < njps; i++)
    if (jps[i].sled == sled) { j = &jps[i]; break; }
  if (!j)
    die("a call from an unknown sled");
  /* struct \t member \t function \t file \t line \t access \t bits \t operands */
  char fields[8][1024];
  const char *p = j->text;
  for (int k = 0; k < 8; k++) {
    const char *e = k < 7 ? strchr(p, '\t') : p + strlen(p);
    if (!e) die("bad record text");
    size_t n = (size_t)(e - p) < 1023 ? (size_t)(e - p) : 1023;
    memcpy(fields[k], p, n);
    fields[k][n] = 0;
    p = k < 7 ? e + 1 : e;
  }
  char line[4096];
  int len = snprintf(line, sizeof line, "%u %s %s %s%s%s %s", j->index, fields[2], fields[4],
                     fields[0][0] == '-' ? "entry" : fields[0], fields[0][0] == '-' ? "" : ".",
                     fields[0][0] == '-' ? "" : fields[1], fields[5]);
  char ops[1024];
  strcpy(ops, fields[7]);
  for (char *save, *op = strtok_r(ops, " ", &save); op; op = strtok_r(NULL, " ", &save)) {
    char *eq = strchr(op, '=');
    uint64_t v;
    if (!eq || !location_value(f, eq + 1, &v)) {
      char why[300];
      snprintf(why, sizeof why, "join point %u: cannot read operand %s", j->index, op);
      die(why);
    }
    *eq = 0;
    len += snprintf(line + len, sizeof line - len, " %s=0x%llx", op, (unsigned long long)v);
  }
  line[len++] = '\n';
  if (write(log_fd, line, len) != len)
    die("cannot write the log");
}

static uint64_t main_bias;
static int first_object(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  (void)data;
  main_bias = info->dlpi_addr;
  return 1; /* the main program comes first */
}

/* The table's link-time address and size, from /proc/self/exe. */
static int find_section(uint64_t *addr, uint64_t *size, uint64_t *text_end) {
  int fd = open("/proc/self/exe", O_RDONLY);
  if (fd < 0) return 0;
  off_t n = lseek(fd, 0, SEEK_END);
  uint8_t *img = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (img == MAP_FAILED) return 0;
  Elf64_Ehdr *eh = (Elf64_Ehdr *)img;
  Elf64_Shdr *sh = (Elf64_Shdr *)(img + eh->e_shoff);
  const char *names = (const char *)img + sh[eh->e_shstrndx].sh_offset;
  int found = 0;
  *text_end = 0;
  for (int i = 0; i < eh->e_shnum; i++) {
    if (!strcmp(names + sh[i].sh_name, SECTION)) {
      *addr = sh[i].sh_addr;
      *size = sh[i].sh_size;
      found = 1;
    }
    if (sh[i].sh_addr + sh[i].sh_size > *text_end)
      *text_end = sh[i].sh_addr + sh[i].sh_size;
  }
  munmap(img, n);
  return found;
}

__attribute__((constructor)) static void patch_all(void) {
  const char *logp = getenv("BKF_CHECK_LOG");
  if (!logp) die("BKF_CHECK_LOG is not set");
  log_fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
  if (log_fd < 0) die("cannot open BKF_CHECK_LOG");
  dl_iterate_phdr(first_object, NULL);
  uint64_t addr, size, end;
  if (!find_section(&addr, &size, &end)) die("the program has no " SECTION);

  const uint8_t *t = (const uint8_t *)(main_bias + addr);
  for (uint64_t at = 0; at < size;) {
    int32_t rel;
    uint32_t magic, len;
    memcpy(&rel, t + at, 4);
    memcpy(&magic, t + at + 4, 4);
    memcpy(&len, t + at + 12, 4);
    if (magic != MAGIC) die("bad magic");
    jps = realloc(jps, (njps + 1) * sizeof *jps);
    jps[njps].sled = main_bias + addr + at + rel;
    jps[njps].index = njps;
    jps[njps].text = (const char *)t + at + 16;
    njps++;
    at += 16 + ((len + 3) & ~3u);
  }

  /* An absolute jump to the trampoline within rel32 reach of the program. */
  uint64_t page = 4096;
  uint8_t *stub = MAP_FAILED;
  for (uint64_t hint = (main_bias + end + 0x100000) & ~(page - 1);
       hint < main_bias + end + 0x40000000; hint += 0x100000) {
    stub = mmap((void *)hint, page, PROT_READ | PROT_WRITE | PROT_EXEC,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (stub != MAP_FAILED) break;
  }
  if (stub == MAP_FAILED) die("no page for the trampoline stub near the program");
  uint64_t target = (uint64_t)&bkf_check_tramp;
  stub[0] = 0xff;
  stub[1] = 0x25;
  memset(stub + 2, 0, 4);
  memcpy(stub + 6, &target, 8);

  static const uint8_t unpatched[11] = {0x66, 0x66, 0x2e, 0x0f, 0x1f, 0x84,
                                        0x00, 0x00, 0x00, 0x00, 0x00};
  for (unsigned i = 0; i < njps; i++) {
    uint8_t *s = (uint8_t *)jps[i].sled;
    if ((uint64_t)s & 1) die("a sled at an odd address");
    if (memcmp(s, unpatched, 11)) die("a sled that is not the unpatched sled");
    uint64_t lo = (uint64_t)s & ~(page - 1), hi = ((uint64_t)s + 11 + page - 1) & ~(page - 1);
    if (mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE | PROT_EXEC)) die("mprotect");
    int64_t d = (int64_t)((uint64_t)stub - ((uint64_t)s + 7));
    if (d != (int32_t)d) die("the stub is out of rel32 reach");
    /* The header's protocol (one thread, so no membarrier): the jump
     * form, then bytes 2..10, then 66 90. */
    int32_t r = (int32_t)d;
    __atomic_store_n((uint16_t *)s, (uint16_t)0x09eb, __ATOMIC_RELEASE); /* eb 09 */
    s[2] = 0xe8;
    memcpy(s + 3, &r, 4);
    memcpy(s + 7, "\x0f\x1f\x40\x00", 4);
    __atomic_store_n((uint16_t *)s, (uint16_t)0x9066, __ATOMIC_RELEASE); /* 66 90 */
    if (mprotect((void *)lo, hi - lo, PROT_READ | PROT_EXEC)) die("mprotect");
  }
}
