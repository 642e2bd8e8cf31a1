/* Test program: three threads doing deterministic work. They wait for
 * each other at a barrier before they end, so that all three are alive
 * at once: Valgrind reuses the slot (thread id) of a thread that has
 * ended, and a worker that finished before the next was created made
 * tests/e2e/trace.rs see two thread ids instead of three or four. */
#include <pthread.h>
#include <stdio.h>

static long results[3];
static pthread_barrier_t all_alive;

static void *worker(void *arg)
{
    long id = (long)arg, s = 0;
    for (long i = 0; i < 20000 * (id + 1); i++) s += i ^ id;
    results[id] = s;
    pthread_barrier_wait(&all_alive);
    return NULL;
}

int main(void)
{
    pthread_t t[3];
    pthread_barrier_init(&all_alive, NULL, 3);
    for (long i = 0; i < 3; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    printf("%ld %ld %ld\n", results[0], results[1], results[2]);
    return 0;
}
