/*
 * The host-memory stand-in for a device: "device" memory is host memory, and copies run on a
 * worker thread in the order they were queued, each taking at least copy_delay_us, as a DMA
 * engine would; waiting for a slot waits for the last copy queued for it. It tests the
 * staging ring and the overlap of reads, hashing and copies without a GPU.
 */
#include "device/device_parts.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"

/* rows runs of n bytes, pitch apart at src and dpitch apart at dst: one queued copy */
struct copy_job {
    uint8_t *dst;
    const uint8_t *src;
    size_t n, rows, pitch, dpitch;
    unsigned slot;
    uint64_t seq;
};

#define QUEUE 1024

struct host_dev {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t worker;
    struct copy_job q[QUEUE];
    unsigned head, count;
    uint64_t queued, done;                    /* copies queued / finished, in order */
    uint64_t slot_last[KVT_DEVICE_MAX_SLOTS]; /* the last copy queued for each slot */
    unsigned delay_us;
    bool stop;
    /* live allocations, so that copies past one's end fail as they do on a GPU */
    struct extent {
        uint64_t base;
        size_t size;
    } * alloc;
    size_t n_alloc, cap_alloc;
};

static void *worker(void *arg)
{
    struct host_dev *h = arg;
    pthread_mutex_lock(&h->lock);
    for (;;) {
        while (!h->stop && h->count == 0)
            pthread_cond_wait(&h->cond, &h->lock);
        if (h->count == 0)
            break;
        struct copy_job j = h->q[h->head];
        pthread_mutex_unlock(&h->lock);
        if (h->delay_us) {
            struct timespec ts = {0, (long)h->delay_us * 1000};
            nanosleep(&ts, NULL);
        }
        for (size_t r = 0; r < j.rows; r++)
            memcpy(j.dst + r * j.dpitch, j.src + r * j.pitch, j.n);
        pthread_mutex_lock(&h->lock);
        h->head = (h->head + 1) % QUEUE;
        h->count--;
        h->done = j.seq;
        pthread_cond_broadcast(&h->cond);
    }
    pthread_mutex_unlock(&h->lock);
    return NULL;
}

static int enqueue(kvt_device *d, const struct copy_job *c, unsigned slot)
{
    struct host_dev *h = d->impl;
    pthread_mutex_lock(&h->lock);
    while (h->count == QUEUE)
        pthread_cond_wait(&h->cond, &h->lock);
    uint64_t seq = ++h->queued;
    struct copy_job *j = &h->q[(h->head + h->count) % QUEUE];
    *j = *c;
    j->slot = slot;
    j->seq = seq;
    h->count++;
    if (slot < KVT_DEVICE_MAX_SLOTS)
        h->slot_last[slot] = seq;
    pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->lock);
    return 0;
}

static int range(kvt_device *d, uint64_t addr, uint64_t *base, size_t *size)
{
    struct host_dev *h = d->impl;
    int rc = 1; /* not ours: host memory handed in as device memory (CPU tensors) */
    pthread_mutex_lock(&h->lock);
    for (size_t i = 0; i < h->n_alloc && rc; i++)
        if (addr >= h->alloc[i].base && addr - h->alloc[i].base < h->alloc[i].size) {
            *base = h->alloc[i].base;
            *size = h->alloc[i].size;
            rc = 0;
        }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

/* A copy that starts in an allocation and runs past its end: CUDA's "invalid argument". */
static int check_span(kvt_device *d, uint64_t addr, size_t n)
{
    uint64_t base;
    size_t size;
    if (range(d, addr, &base, &size) == 0 && n > size - (addr - base))
        return kvt_fail(-EINVAL,
                        "host stand-in: a copy of %zu bytes at 0x%" PRIx64 " runs past "
                        "its allocation of %zu bytes (invalid argument)",
                        n, addr, size);
    return 0;
}

static int h2d_rows(kvt_device *d, uint64_t dst, const void *src, size_t pitch, size_t dpitch,
                    size_t n, size_t rows, unsigned slot)
{
    int rc = rows ? check_span(d, dst, (rows - 1) * dpitch + n) : 0;
    struct copy_job j = {(uint8_t *)(uintptr_t)dst, src, n, rows, pitch, dpitch, 0, 0};
    return rc ? rc : enqueue(d, &j, slot);
}

static int h2d(kvt_device *d, uint64_t dst, const void *src, size_t n, unsigned slot)
{
    return h2d_rows(d, dst, src, n, n, n, 1, slot);
}

static int d2h(kvt_device *d, void *dst, uint64_t src, size_t n, unsigned slot)
{
    int rc = check_span(d, src, n);
    struct copy_job j = {dst, (const uint8_t *)(uintptr_t)src, n, 1, n, n, 0, 0};
    return rc ? rc : enqueue(d, &j, slot);
}

static int wait_slot(kvt_device *d, unsigned slot)
{
    struct host_dev *h = d->impl;
    pthread_mutex_lock(&h->lock);
    while (h->done < h->slot_last[slot])
        pthread_cond_wait(&h->cond, &h->lock);
    pthread_mutex_unlock(&h->lock);
    return 0;
}

/* One queue: the side stream is the same worker, in order. */
static int side(kvt_device *d, bool on)
{
    (void)d, (void)on;
    return 0;
}

static int mark(kvt_device *d, void **ev)
{
    struct host_dev *h = d->impl;
    uint64_t *seq = malloc(sizeof(*seq));
    if (!seq)
        return kvt_fail(-ENOMEM, "out of memory");
    pthread_mutex_lock(&h->lock);
    *seq = h->queued;
    pthread_mutex_unlock(&h->lock);
    *ev = seq;
    return 0;
}

static int mark_sync(kvt_device *d, void *ev)
{
    struct host_dev *h = d->impl;
    pthread_mutex_lock(&h->lock);
    while (h->done < *(uint64_t *)ev)
        pthread_cond_wait(&h->cond, &h->lock);
    pthread_mutex_unlock(&h->lock);
    return 0;
}

static int mark_wait(kvt_device *d, void *ev, uint64_t stream)
{
    (void)stream; /* no streams: the host waits */
    return mark_sync(d, ev);
}

static void mark_free(kvt_device *d, void *ev)
{
    (void)d;
    free(ev);
}

static int alloc(kvt_device *d, size_t bytes, uint64_t *addr)
{
    struct host_dev *h = d->impl;
    void *p = malloc(bytes ? bytes : 1); /* large: mapped, pages made only where written */
    pthread_mutex_lock(&h->lock);
    if (p && h->n_alloc == h->cap_alloc) {
        size_t cap = h->cap_alloc ? 2 * h->cap_alloc : 16;
        struct extent *a = realloc(h->alloc, cap * sizeof(*a));
        if (a)
            h->alloc = a, h->cap_alloc = cap;
    }
    bool ok = p && h->n_alloc < h->cap_alloc;
    if (ok)
        h->alloc[h->n_alloc++] = (struct extent){(uint64_t)(uintptr_t)p, bytes ? bytes : 1};
    pthread_mutex_unlock(&h->lock);
    if (!ok) {
        free(p);
        return kvt_fail(-ENOMEM, "host stand-in: cannot allocate %zu bytes", bytes);
    }
    *addr = (uint64_t)(uintptr_t)p;
    return 0;
}

static void dfree(kvt_device *d, uint64_t addr)
{
    struct host_dev *h = d->impl;
    pthread_mutex_lock(&h->lock);
    for (size_t i = 0; i < h->n_alloc; i++)
        if (h->alloc[i].base == addr) {
            h->alloc[i] = h->alloc[--h->n_alloc];
            break;
        }
    pthread_mutex_unlock(&h->lock);
    free((void *)(uintptr_t)addr);
}

static int host_alloc(kvt_device *d, size_t bytes, void **out)
{
    (void)d;
    if (posix_memalign(out, 4096, bytes))
        return kvt_fail(-ENOMEM, "host stand-in: cannot allocate staging");
    return 0;
}

static void host_free(kvt_device *d, void *p)
{
    (void)d;
    free(p);
}

static void close_dev(kvt_device *d)
{
    struct host_dev *h = d->impl;
    pthread_mutex_lock(&h->lock);
    h->stop = true;
    pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->lock);
    pthread_join(h->worker, NULL);
    pthread_mutex_destroy(&h->lock);
    pthread_cond_destroy(&h->cond);
    free(h->alloc);
    free(h);
}

static const struct kvt_device_ops host_ops = {
    .alloc = alloc,
    .free = dfree,
    .range = range,
    .host_alloc = host_alloc,
    .host_free = host_free,
    .h2d = h2d,
    .d2h = d2h,
    .h2d_rows = h2d_rows,
    .wait = wait_slot,
    .side = side,
    .mark = mark,
    .mark_wait = mark_wait,
    .mark_sync = mark_sync,
    .mark_free = mark_free,
    .close = close_dev,
};

int kvt_device_host_open(const struct kvt_device_opts *o, kvt_device *d)
{
    struct host_dev *h = calloc(1, sizeof(*h));
    if (!h)
        return kvt_fail(-ENOMEM, "out of memory");
    pthread_mutex_init(&h->lock, NULL);
    pthread_cond_init(&h->cond, NULL);
    h->delay_us = o ? o->copy_delay_us : 0;
    if (pthread_create(&h->worker, NULL, worker, h)) {
        free(h);
        return kvt_fail(-EAGAIN, "host stand-in: cannot start its copy thread");
    }
    d->impl = h;
    d->ops = &host_ops;
    snprintf(d->name, sizeof(d->name), "host stand-in");
    return 0;
}
