/* Test program for `bunkai trace record` windows: phases separated by
   marker functions and by distinctive syscalls (getppid, getuid). */
#include <stdio.h>
#include <unistd.h>

volatile long sink;

__attribute__((noinline)) void phase_outside(void)
{
    for (long i = 0; i < 2000; i++) sink += i;
}

__attribute__((noinline)) void marker_start(void) { __asm__ volatile(""); }
__attribute__((noinline)) void marker_stop(void) { __asm__ volatile(""); }

__attribute__((noinline)) long inner(long x) { return x * 3 + 1; }

__attribute__((noinline)) void work_inside(void)
{
    for (long i = 0; i < 1000; i++) sink += inner(i);
}

int main(void)
{
    phase_outside();
    getppid();
    marker_start();
    work_inside();
    marker_stop();
    getuid();
    phase_outside();
    printf("%ld\n", (long)sink);
    return 0;
}
