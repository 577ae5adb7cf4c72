/*
 * The parallel job runner (threads/par_for.h): an atomic counter hands out job indices to the
 * calling thread and its helpers.
 */
#include "threads/par_for.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "common/cpus.h"
#include "settings/settings.h"

#define MAX_HELPERS 15

static atomic_ulong helpers_started;

struct par {
    bool (*fn)(void *ud, size_t i);
    void *ud;
    size_t n;
    atomic_size_t next;
    atomic_bool stop;
};

static void *work(void *arg)
{
    struct par *p = arg;
    while (!atomic_load(&p->stop)) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n)
            break;
        if (!p->fn(p->ud, i))
            atomic_store(&p->stop, true);
    }
    return NULL;
}

void kvt_par_for(size_t n, unsigned threads, bool (*fn)(void *ud, size_t i), void *ud)
{
    struct par p = {.fn = fn, .ud = ud, .n = n};
    pthread_t th[MAX_HELPERS];
    unsigned helpers = 0, want = threads > 1 ? threads - 1 : 0;
    if (want > MAX_HELPERS)
        want = MAX_HELPERS;
    if (want > n - (n > 0))
        want = (unsigned)(n - (n > 0)); /* one job each at most */
    atomic_init(&p.next, 0);
    atomic_init(&p.stop, false);
    while (helpers < want && kvt_mem_thread_start(&th[helpers], "kvt-par", work, &p) == 0)
        helpers++;
    atomic_fetch_add(&helpers_started, helpers);
    work(&p);
    for (unsigned k = 0; k < helpers; k++)
        pthread_join(th[k], NULL);
}

unsigned long kvt_par_helpers_started(void)
{
    return atomic_load(&helpers_started);
}

unsigned kvt_par_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0)
        return 1;
    int c = CPU_COUNT(&set);
    return c > 0 ? (unsigned)c : 1;
}
