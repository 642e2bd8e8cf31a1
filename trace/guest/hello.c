/* The CGI program of seed 001's Fig. 3, verbatim: the request the paper
 * traced from accept to close (trace/guest/build.sh puts it in the guest). */
#include <stdio.h>

int main(int argc, char **argv)
{
    puts("Content-type: text/html\n\n"
        "Hello World.");
    return(0);
}
