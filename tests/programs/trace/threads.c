/* Test program: three threads doing deterministic work. */
#include <pthread.h>
#include <stdio.h>

static long results[3];

static void *worker(void *arg)
{
    long id = (long)arg, s = 0;
    for (long i = 0; i < 20000 * (id + 1); i++) s += i ^ id;
    results[id] = s;
    return NULL;
}

int main(void)
{
    pthread_t t[3];
    for (long i = 0; i < 3; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    printf("%ld %ld %ld\n", results[0], results[1], results[2]);
    return 0;
}
