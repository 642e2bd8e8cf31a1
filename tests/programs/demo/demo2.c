/* demo2 (Kawai & Sasada, Fig. 10): a busy loop, few instructions, many
 * steps. The outer count may be given as argv[1] so tests can run it short;
 * the benchmark uses the paper's 1,000,000. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    volatile unsigned i, j;
    unsigned n = argc > 1 ? (unsigned)strtoul(argv[1], 0, 10) : 1000000;
    for (i = 0; i < n; i++)
        for (j = 0; j < 10000; j++)
            /* Null statement */;
    printf("demo2 %u %u\n", i, j);
    return 0;
}
