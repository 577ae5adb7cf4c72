/*
 * The prefault helper (prefault.h): one thread that takes address ranges from a small FIFO and
 * faults their whole pages in with madvise(MADV_POPULATE_WRITE), a block at a time so that a
 * cancel takes effect quickly. Populating never changes the contents of a page, so a range
 * that is freed (or even reused) while queued is harmless: the work is merely wasted, and the
 * kernel reports an unmapped range as an error that is ignored.
 */
#include "io/prefault.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define QUEUE 64
#define BLOCK ((size_t)2 << 20)

struct range {
    uintptr_t lo, hi;
};

struct kvt_prefault {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct range q[QUEUE];
    unsigned head, n;
    unsigned long gen; /* bumped by cancel: the range in progress is abandoned */
    bool stop;
    pthread_t th;
};

static void *helper(void *arg)
{
    struct kvt_prefault *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->n == 0)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop)
            break;
        struct range r = p->q[p->head];
        p->head = (p->head + 1) % QUEUE;
        p->n--;
        unsigned long gen = p->gen;
        pthread_mutex_unlock(&p->mu);
        for (uintptr_t a = r.lo; a < r.hi;) {
            size_t len = r.hi - a < BLOCK ? r.hi - a : BLOCK;
            if (madvise((void *)a, len, MADV_POPULATE_WRITE) != 0)
                break; /* unmapped or not populatable: leave it to the copy */
            a += len;
            pthread_mutex_lock(&p->mu);
            bool cancelled = p->gen != gen || p->stop;
            pthread_mutex_unlock(&p->mu);
            if (cancelled)
                break;
        }
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Whether this kernel knows MADV_POPULATE_WRITE (Linux 5.14+): try it on one page. */
static bool can_populate(void)
{
    long pg = sysconf(_SC_PAGESIZE);
    void *m = mmap(NULL, (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return false;
    bool ok = madvise(m, (size_t)pg, MADV_POPULATE_WRITE) == 0;
    munmap(m, (size_t)pg);
    return ok;
}

struct kvt_prefault *kvt_prefault_start(void)
{
    static atomic_int supported = -1; /* a racy first call is harmless: both agree */
    if (supported < 0)
        supported = can_populate();
    if (!supported)
        return NULL;
    struct kvt_prefault *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (pthread_create(&p->th, NULL, helper, p) != 0) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return NULL;
    }
    return p;
}

bool kvt_prefault_add(struct kvt_prefault *p, void *addr, size_t len)
{
    if (!p || len == 0)
        return true;
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)addr + pg - 1) & ~(pg - 1);
    uintptr_t hi = ((uintptr_t)addr + len) & ~(pg - 1);
    if (hi <= lo || (uintptr_t)addr + len < (uintptr_t)addr)
        return true;
    pthread_mutex_lock(&p->mu);
    bool room = p->n < QUEUE; /* a full queue only means less help */
    if (room) {
        p->q[(p->head + p->n) % QUEUE] = (struct range){lo, hi};
        p->n++;
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return room;
}

void kvt_prefault_cancel(struct kvt_prefault *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->n = 0;
    p->gen++;
    pthread_mutex_unlock(&p->mu);
}

void kvt_prefault_stop(struct kvt_prefault *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    p->n = 0;
    p->gen++;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
