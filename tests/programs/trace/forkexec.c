/* Test program: fork; the child execs a program given as argv[1]; the
   parent waits and reports its status. */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    pid_t p = fork();
    if (p == 0) {
        execv(argv[1], argv + 1);
        _exit(127);
    }
    int st = 0;
    waitpid(p, &st, 0);
    printf("child %d\n", WEXITSTATUS(st));
    return 0;
}
