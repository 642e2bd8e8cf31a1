/* crash.c: a program that dies of SIGSEGV in a function of its own, after
 * a loop whose instructions the trace must keep (tests/e2e/trace.rs). */
#include <stdio.h>

volatile int sink;

__attribute__((noinline)) static int crash(int *p, int n)
{
    int s = 0;
    for (int i = 0; i < n; i++)
        s += i;
    sink = s;
    return *p + s; /* p is NULL: the load faults */
}

int main(int argc, char **argv)
{
    printf("about to crash\n");
    fflush(stdout);
    return crash(argc > 5 ? &argc : NULL, 100);
}
