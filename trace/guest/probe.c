/* probe.cgi: a CGI program with a known number of syscalls and page faults
 * between two markers, for tests/e2e/trace_system.rs (a system window that
 * opens at the return of its getppid() and closes at the return of its
 * getpid()): inside, exactly one mmap, 16 page faults on the fresh pages
 * it maps, a fixed piece of user-mode work (work() below) and five
 * one-byte writes to /dev/null. Raw syscalls, so libc adds none of its own.
 * trace/guest/build.sh puts it in the guest.
 *
 * The same binary runs on the host under the Valgrind mode, and the test
 * compares the user-mode instructions of the two windows (docs/trace.md,
 * "The two modes against each other"). For them to be the same work:
 *  - glibc picks its string functions by the CPU's features, and the two
 *    CPUs differ (Valgrind shows a Haswell with AVX2, QEMU's default
 *    qemu64 only SSE3). The probe re-executes itself once with
 *    GLIBC_TUNABLES masking every feature those choices consult that
 *    qemu64 lacks, so both pick the SSE2 versions. PROBE_KEEP_CPU=1 skips
 *    that (the test's check that the comparison sees the difference).
 *  - every libc function work() calls is called once before the window,
 *    so lazy binding (the dynamic linker's resolver, whose register-saving
 *    trampoline also depends on the CPU) happens outside it;
 *  - work() touches only static buffers, whose alignment comes from the
 *    binary, not from the environment or the stack. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TUNABLES                                                                                      \
    "glibc.cpu.hwcaps=-AVX,-AVX2,-ERMS,-SSSE3,-SSE4_1,-SSE4_2,-BMI1,-BMI2,-LZCNT,-MOVBE,-POPCNT,-FMA," \
    "-AVX_Fast_Unaligned_Load,-Fast_Unaligned_Load,-Fast_Unaligned_Copy,-Fast_Rep_String,"              \
    "-Prefer_PMINUB_for_stringop,-Prefer_No_AVX512"

static char src[20000] __attribute__((aligned(64)));
static char dst[20000] __attribute__((aligned(64)));
static char line[128];

/* Fixed user-mode work: libc's string functions and snprintf (whose
 * versions glibc chooses by CPU features), rep-prefixed string
 * instructions (each iteration counts as an instruction in both modes),
 * and a plain loop. About 200,000 instructions. */
static unsigned work(void)
{
    unsigned h = 0;
    for (int i = 0; i < 8; i++) {
        size_t n = 1000 * (size_t)(i + 1) + 7 * (size_t)i;
        __asm__("" : "+r"(n)); /* a size the compiler cannot see: libc's memset and memcpy, not its own */
        memset(dst + i, 'a' + i, n);
        memcpy(src + 3, dst + i, n);
        h += memcmp(src + 3, dst + i, n) == 0;
        src[3 + n] = 0;
        src[3 + n / 2] = 'Z';
        h += (unsigned)strlen(src + 3);
        h += (unsigned)(strchr(src + 3, 'Z') - src);
        h += (unsigned)snprintf(line, sizeof line, "%d %s %08x %ld", i, "probe", h, (long)n * 12345);
        h += strcmp(line, "3 probe") < 0;
    }
    size_t n = 300;
    char *d = dst, *s = src;
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
    n = 300;
    d = dst;
    s = src;
    __asm__ volatile("repe cmpsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory", "cc");
    h += (unsigned)n;
    for (int i = 0; i < 20000; i++)
        h = h * 31 + (unsigned char)src[i];
    return h;
}

int main(int argc, char **argv)
{
    const char *t = getenv("GLIBC_TUNABLES");
    if (!getenv("PROBE_KEEP_CPU") && (!t || strcmp(t, TUNABLES) != 0)) {
        char self[4096];
        ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
        if (k > 0) {
            self[k] = 0;
            setenv("GLIBC_TUNABLES", TUNABLES, 1);
            execv(self, argv);
        }
        /* Not re-executed: the comparison will show it. */
    }
    (void)argc;
    int fd = open("/dev/null", O_WRONLY);
    unsigned h = work(); /* lazy binding and first touches, outside */
    syscall(SYS_getppid); /* the window opens when this returns */
    char *p = (char *)syscall(SYS_mmap, 0, 16 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (int i = 0; i < 16; i++)
        p[i * 4096] = 1;
    h += work();
    for (int i = 0; i < 5; i++)
        syscall(SYS_write, fd, "x", 1);
    syscall(SYS_getpid); /* and closes when this returns */
    printf("Content-type: text/plain\n\nprobe done %08x\n", h);
    return 0;
}
