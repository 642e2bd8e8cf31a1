/* probe.cgi: a CGI program with a known number of syscalls and page faults
 * between two markers, for tests/e2e/trace_system.rs (a system window that
 * opens at the return of its getppid() and closes at the return of its
 * getpid()): inside, exactly one mmap, 16 page faults on the fresh pages
 * it maps, and five one-byte writes to /dev/null. Raw syscalls, so libc
 * adds none of its own. trace/guest/build.sh puts it in the guest. */
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void)
{
    int fd = open("/dev/null", O_WRONLY);
    syscall(SYS_getppid); /* the window opens when this returns */
    char *p = (char *)syscall(SYS_mmap, 0, 16 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (int i = 0; i < 16; i++)
        p[i * 4096] = 1;
    for (int i = 0; i < 5; i++)
        syscall(SYS_write, fd, "x", 1);
    syscall(SYS_getpid); /* and closes when this returns */
    printf("Content-type: text/plain\n\nprobe done\n");
    return 0;
}
