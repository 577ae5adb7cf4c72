/*
 * Page-locked host memory for the RAM tier of device entries (kvt_pcache_opts.device): one
 * region of the pool's cap, allocated at the first use (pinning is slow: once, never per
 * entry) and released when the pool is closed and its last buffer is gone. Buffers are handed
 * out first-fit in 4 KiB units; each is a kvt_buf whose release returns its bytes. Copies
 * between the region and the device need no staging: they run straight on the device's queue.
 */
#include "device/device_parts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

#define UNIT ((size_t)4096)

struct used {
    size_t off, n;
};

struct kvt_dpool {
    kvt_device *d;
    size_t cap;
    uint8_t *base; /* NULL until the first buffer */
    pthread_mutex_t mu;
    struct used *u; /* by offset */
    size_t n_used, cap_used, bytes_used;
    bool closed;
};

int kvt_dpool_new(kvt_device *d, size_t cap, struct kvt_dpool **out)
{
    *out = NULL;
    struct kvt_dpool *p = calloc(1, sizeof(*p));
    if (!p)
        return kvt_fail(-ENOMEM, "out of memory");
    p->d = d;
    p->cap = cap / UNIT * UNIT;
    pthread_mutex_init(&p->mu, NULL);
    *out = p;
    return 0;
}

static void destroy(struct kvt_dpool *p)
{
    if (p->base)
        p->d->ops->host_free(p->d, p->base);
    pthread_mutex_destroy(&p->mu);
    free(p->u);
    free(p);
}

void kvt_dpool_close(struct kvt_dpool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->closed = true;
    bool last = p->n_used == 0;
    pthread_mutex_unlock(&p->mu);
    if (last)
        destroy(p);
}

/* The first gap of @p n bytes (caller holds mu): its index in u and its offset, or false. */
static bool first_fit(const struct kvt_dpool *p, size_t n, size_t *at, size_t *off)
{
    size_t prev_end = 0;
    for (size_t i = 0; i <= p->n_used; i++) {
        size_t next = i < p->n_used ? p->u[i].off : p->cap;
        if (next - prev_end >= n) {
            *at = i;
            *off = prev_end;
            return true;
        }
        if (i < p->n_used)
            prev_end = p->u[i].off + p->u[i].n;
    }
    return false;
}

static void give_back(void *ud, void *data)
{
    struct kvt_dpool *p = ud;
    size_t off = (size_t)((uint8_t *)data - p->base);
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n_used; i++)
        if (p->u[i].off == off) {
            p->bytes_used -= p->u[i].n;
            memmove(p->u + i, p->u + i + 1, (p->n_used - i - 1) * sizeof(*p->u));
            p->n_used--;
            break;
        }
    bool last = p->closed && p->n_used == 0;
    pthread_mutex_unlock(&p->mu);
    if (last)
        destroy(p);
}

/* Reserve @p n bytes (caller holds mu): 0 and *mem, or -ENOSPC when no gap is large enough. */
bool kvt_dpool_ready(struct kvt_dpool *p)
{
    if (pthread_mutex_trylock(&p->mu) != 0)
        return false; /* busy, maybe pinning the region: not to be waited for */
    bool ready = p->base != NULL;
    pthread_mutex_unlock(&p->mu);
    return ready;
}

int kvt_dpool_prepare(struct kvt_dpool *p)
{
    pthread_mutex_lock(&p->mu);
    int rc = p->base ? 0 : p->d->ops->host_alloc(p->d, p->cap, (void **)&p->base);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

static int reserve(struct kvt_dpool *p, size_t n, uint8_t **mem)
{
    if (!p->base) {
        int rc = p->d->ops->host_alloc(p->d, p->cap, (void **)&p->base);
        if (rc)
            return rc;
    }
    size_t at, off;
    if (!first_fit(p, n, &at, &off))
        return -ENOSPC;
    if (p->n_used == p->cap_used) {
        size_t c = p->cap_used ? 2 * p->cap_used : 64;
        struct used *u = realloc(p->u, c * sizeof(*u));
        if (!u)
            return -ENOMEM;
        p->u = u;
        p->cap_used = c;
    }
    memmove(p->u + at + 1, p->u + at, (p->n_used - at) * sizeof(*p->u));
    p->u[at] = (struct used){off, n};
    p->n_used++;
    p->bytes_used += n;
    *mem = p->base + off;
    return 0;
}

int kvt_dpool_buf(struct kvt_dpool *p, size_t bytes, kvt_buf **out)
{
    *out = NULL;
    size_t n = bytes ? (bytes + UNIT - 1) / UNIT * UNIT : UNIT;
    if (n > p->cap)
        return kvt_fail(-ENOSPC, "page-locked pool: %zu bytes exceed its %zu", bytes, p->cap);
    uint8_t *mem = NULL;
    pthread_mutex_lock(&p->mu);
    int rc = reserve(p, n, &mem);
    pthread_mutex_unlock(&p->mu);
    if (rc == -ENOSPC)
        return kvt_fail(rc, "page-locked pool: no room for %zu bytes", bytes);
    if (rc)
        return rc;
    return kvt_buf_wrap(mem, bytes, give_back, p, out);
}

bool kvt_dpool_owns(const struct kvt_dpool *p, const void *mem)
{
    const uint8_t *m = mem;
    return p && p->base && m >= p->base && m < p->base + p->cap;
}

size_t kvt_dpool_used(struct kvt_dpool *p)
{
    pthread_mutex_lock(&p->mu);
    size_t n = p->bytes_used;
    pthread_mutex_unlock(&p->mu);
    return n;
}
