/*
 * The restore helper (threads/restore_helper.h): one thread that takes address ranges from a small
 * FIFO and faults their whole pages in with madvise(MADV_POPULATE_WRITE), a block at a time. Each
 * block is claimed under the lock before it is populated, by the helper or by a consumer that has
 * caught up with it (kvt_restore_helper_ensure), so no page is populated twice and a copy never
 * takes page faults while the other thread works on the same page tables. Populating never changes
 * the contents of a page, so a range that is freed (or even reused) while queued is harmless: the
 * work is merely wasted, and the kernel reports an unmapped range as an error that is ignored.
 * Deferred pieces come before populating: the copying thread waits for them at the end of each
 * read, while populating a block it needs it can do itself.
 */
#include "threads/restore_helper.h"
#include "settings/settings.h"

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
/* The helper's claim: small enough that a consumer waiting for it waits well under 1 ms. */
#define BLOCK ((uintptr_t)1 << 20)
/* What a consumer takes ahead of the helper instead of waiting for it. */
#define STEAL ((uintptr_t)256 << 10)
/* Deferred pieces waiting at most: the copy may run this many pieces ahead of the hash. */
#define PIECES 64

struct range {
    uintptr_t lo, hi; /* the part not claimed yet; empty once lo == hi */
};

struct piece {
    void (*fn)(void *ud, const void *data, size_t len);
    void *ud;
    const void *data;
    size_t len;
};

struct kvt_restore_helper {
    pthread_mutex_t mu;
    pthread_cond_t work; /* a range or a piece was queued, or stop */
    pthread_cond_t done; /* the helper finished a block or a piece */
    struct range q[QUEUE];
    unsigned head, n;
    struct range busy; /* the block the helper is populating now */
    struct piece pc[PIECES];
    unsigned pc_head, pc_n;
    bool pc_running; /* a thread runs the piece at pc_head; it stays queued until done */
    bool stop;
    pthread_t th;
};

static uintptr_t page_size(void)
{
    return (uintptr_t)sysconf(_SC_PAGESIZE);
}

static struct range *slot(struct kvt_restore_helper *p, unsigned i)
{
    return &p->q[(p->head + i) % QUEUE];
}

/* Drop the used-up ranges at the front of the queue. */
static void pop_empty(struct kvt_restore_helper *p)
{
    while (p->n > 0 && slot(p, 0)->lo >= slot(p, 0)->hi) {
        p->head = (p->head + 1) % QUEUE;
        p->n--;
    }
}

/* Claim up to @p max bytes from the start of queued range @p r (the lock is held). */
static struct range claim(struct kvt_restore_helper *p, struct range *r, uintptr_t max)
{
    struct range b = {r->lo, r->hi - r->lo < max ? r->hi : r->lo + max};
    r->lo = b.hi;
    pop_empty(p);
    return b;
}

static bool overlaps(struct range r, uintptr_t lo, uintptr_t hi)
{
    return r.lo < r.hi && r.lo < hi && lo < r.hi;
}

static void populate(struct range b)
{
    madvise((void *)b.lo, b.hi - b.lo, MADV_POPULATE_WRITE); /* a failure leaves it to the copy */
}

/* Run the piece at the front of the queue (the lock is held, and released while it runs). */
static void run_piece(struct kvt_restore_helper *p)
{
    struct piece c = p->pc[p->pc_head];
    p->pc_running = true;
    pthread_mutex_unlock(&p->mu);
    c.fn(c.ud, c.data, c.len);
    pthread_mutex_lock(&p->mu);
    p->pc_running = false;
    p->pc_head = (p->pc_head + 1) % PIECES;
    p->pc_n--;
    pthread_cond_broadcast(&p->done);
}

/* Make progress on the queued pieces: run the front one, or wait while another thread does. */
static void take_or_wait(struct kvt_restore_helper *p)
{
    if (p->pc_running)
        pthread_cond_wait(&p->done, &p->mu);
    else
        run_piece(p);
}

static void *helper(void *arg)
{
    struct kvt_restore_helper *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        pop_empty(p);
        while (!p->stop && p->n == 0 && (p->pc_n == 0 || p->pc_running))
            pthread_cond_wait(&p->work, &p->mu);
        if (p->stop)
            break;
        if (p->pc_n > 0 && !p->pc_running) {
            run_piece(p);
            continue;
        }
        p->busy = claim(p, slot(p, 0), BLOCK);
        pthread_mutex_unlock(&p->mu);
        populate(p->busy);
        pthread_mutex_lock(&p->mu);
        p->busy = (struct range){0, 0};
        pthread_cond_broadcast(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Whether this kernel knows MADV_POPULATE_WRITE (Linux 5.14+): try it on one page. */
static bool can_populate(void)
{
    size_t pg = (size_t)page_size();
    void *m = mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return false;
    bool ok = madvise(m, pg, MADV_POPULATE_WRITE) == 0;
    munmap(m, pg);
    return ok;
}

bool kvt_restore_helper_wanted(const void *addr, size_t len)
{
    uintptr_t pg = page_size();
    uintptr_t lo = (uintptr_t)addr & ~(pg - 1), hi = (uintptr_t)addr + len;
    if (len == 0)
        return false;
    if (hi < lo)
        return true;
    unsigned char vec[1024];
    while (lo < hi) {
        size_t pages = (hi - lo + pg - 1) / pg;
        pages = pages < sizeof(vec) ? pages : sizeof(vec);
        if (mincore((void *)lo, pages * pg, vec) != 0)
            return true;
        for (size_t k = 0; k < pages; k++)
            if (!(vec[k] & 1))
                return true;
        lo += pages * pg;
    }
    return false;
}

struct kvt_restore_helper *kvt_restore_helper_start(void)
{
    static atomic_int supported = -1; /* a racy first call is harmless: both agree */
    if (supported < 0)
        supported = can_populate();
    if (!supported)
        return NULL;
    struct kvt_restore_helper *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    if (kvt_mem_thread_start(&p->th, "kvt-helper", helper, p) != 0) {
        pthread_cond_destroy(&p->done);
        pthread_cond_destroy(&p->work);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return NULL;
    }
    return p;
}

bool kvt_restore_helper_add(struct kvt_restore_helper *p, void *addr, size_t len)
{
    if (!p || len == 0)
        return true;
    uintptr_t pg = page_size();
    uintptr_t lo = ((uintptr_t)addr + pg - 1) & ~(pg - 1);
    uintptr_t hi = ((uintptr_t)addr + len) & ~(pg - 1);
    if (hi <= lo || (uintptr_t)addr + len < (uintptr_t)addr)
        return true;
    pthread_mutex_lock(&p->mu);
    bool room = p->n < QUEUE; /* a full queue only means less help */
    if (room) {
        *slot(p, p->n) = (struct range){lo, hi};
        p->n++;
        pthread_cond_signal(&p->work);
    }
    pthread_mutex_unlock(&p->mu);
    return room;
}

void kvt_restore_helper_ensure(struct kvt_restore_helper *p, void *addr, size_t len)
{
    if (!p || len == 0)
        return;
    uintptr_t pg = page_size();
    uintptr_t lo = (uintptr_t)addr & ~(pg - 1), hi = (uintptr_t)addr + len;
    if (hi < lo)
        return;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        struct range b;
        if (overlaps(p->busy, lo, hi)) {
            pop_empty(p);
            if (p->n == 0) {
                pthread_cond_wait(&p->done, &p->mu);
                continue;
            }
            b = claim(p, slot(p, 0), STEAL); /* rather than wait, the block after the helper's */
        } else {
            struct range *r = NULL;
            for (unsigned i = 0; i < p->n && !r; i++)
                if (overlaps(*slot(p, i), lo, hi))
                    r = slot(p, i);
            if (!r)
                break; /* populated, or never queued: the copy faults what is missing */
            if (r->lo < lo)
                r->lo = lo; /* consumed in order: the part before the caller is not needed */
            uintptr_t need = (hi + pg - 1) & ~(pg - 1); /* > r->lo, as r overlaps the piece */
            b = claim(p, r, need - r->lo);
        }
        pthread_mutex_unlock(&p->mu);
        populate(b);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
}

bool kvt_restore_helper_defer(struct kvt_restore_helper *p,
                              void (*fn)(void *ud, const void *data, size_t len), void *ud,
                              const void *data, size_t len)
{
    if (!p)
        return false;
    pthread_mutex_lock(&p->mu);
    while (p->pc_n == PIECES) /* the helper is behind: take its oldest piece */
        take_or_wait(p);
    p->pc[(p->pc_head + p->pc_n) % PIECES] = (struct piece){fn, ud, data, len};
    p->pc_n++;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
    return true;
}

void kvt_restore_helper_drain(struct kvt_restore_helper *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    while (p->pc_n > 0)
        take_or_wait(p);
    pthread_mutex_unlock(&p->mu);
}

void kvt_restore_helper_cancel(struct kvt_restore_helper *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->n = 0;
    pthread_mutex_unlock(&p->mu);
}

void kvt_restore_helper_stop(struct kvt_restore_helper *p)
{
    if (!p)
        return;
    kvt_restore_helper_drain(p);
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    p->n = 0;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
