/*
 * The public device calls (kvtier.h, "Devices") over the backend table, and the staging ring
 * that restores into device memory use.
 */
#include "device/device_parts.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

#define DEFAULT_CHUNK ((size_t)8 << 20)
#define DEFAULT_DEPTH 8u

static void device_free(kvt_device *d)
{
    pthread_mutex_destroy(&d->op_lock);
    pthread_mutex_destroy(&d->stage_lock);
    pthread_cond_destroy(&d->stage_free);
    free(d);
}

static int opened(kvt_device *d, int rc, kvt_device **out)
{
    if (rc) {
        device_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

static kvt_device *device_new(const struct kvt_device_opts *o)
{
    kvt_device *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    d->chunk = o && o->staging_chunk ? (o->staging_chunk + 4095) / 4096 * 4096 : DEFAULT_CHUNK;
    d->depth = o && o->staging_depth ? o->staging_depth : DEFAULT_DEPTH;
    if (d->depth > KVT_DEVICE_MAX_SLOTS)
        d->depth = KVT_DEVICE_MAX_SLOTS;
    pthread_mutex_init(&d->op_lock, NULL);
    pthread_mutex_init(&d->stage_lock, NULL);
    pthread_cond_init(&d->stage_free, NULL);
    return d;
}

int kvt_device_open_cuda(int ordinal, const struct kvt_device_opts *o, kvt_device **out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_device_open_cuda: no output");
    *out = NULL;
    kvt_device *d = device_new(o);
    if (!d)
        return kvt_fail(-ENOMEM, "out of memory");
    d->ordinal = ordinal;
    return opened(d, kvt_device_cuda_open(ordinal, d), out);
}

int kvt_device_open_host(const struct kvt_device_opts *o, kvt_device **out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_device_open_host: no output");
    *out = NULL;
    kvt_device *d = device_new(o);
    if (!d)
        return kvt_fail(-ENOMEM, "out of memory");
    d->ordinal = -1;
    return opened(d, kvt_device_host_open(o, d), out);
}

void kvt_device_close(kvt_device *d)
{
    if (!d)
        return;
    kvt_dstage_drain(d);
    for (unsigned k = 0; k < d->depth; k++)
        if (d->slot[k])
            d->ops->host_free(d, d->slot[k]);
    d->ops->close(d);
    device_free(d);
}

int kvt_device_ordinal(const kvt_device *d)
{
    return d ? d->ordinal : -1;
}

const char *kvt_device_name(const kvt_device *d)
{
    return d ? d->name : "";
}

int kvt_device_alloc(kvt_device *d, size_t bytes, uint64_t *addr)
{
    if (!d || !addr)
        return kvt_fail(-EINVAL, "kvt_device_alloc: no device or output");
    return d->ops->alloc(d, bytes, addr);
}

void kvt_device_free(kvt_device *d, uint64_t addr)
{
    if (d && addr)
        d->ops->free(d, addr);
}

/* A synchronous copy through one staging slot at a time. */
static int copy_sync(kvt_device *d, void *host, uint64_t dev, size_t n, bool up)
{
    pthread_mutex_lock(&d->op_lock);
    int rc = kvt_dstage_ready(d);
    for (size_t at = 0; rc == 0 && at < n;) {
        size_t k = n - at < d->chunk ? n - at : d->chunk;
        uint8_t *mem;
        unsigned slot;
        if ((rc = kvt_dstage_take(d, &mem, &slot)))
            break;
        if (up) {
            memcpy(mem, (uint8_t *)host + at, k);
            rc = d->ops->h2d(d, dev + at, mem, k, slot);
        } else if ((rc = d->ops->d2h(d, mem, dev + at, k, slot)) == 0 &&
                   (rc = d->ops->wait(d, slot)) == 0) {
            memcpy((uint8_t *)host + at, mem, k);
        }
        kvt_dstage_give(d, slot, rc == 0 && up);
        at += k;
    }
    int rd = kvt_dstage_drain(d);
    pthread_mutex_unlock(&d->op_lock);
    return rc ? rc : rd;
}

int kvt_device_upload(kvt_device *d, uint64_t dst, const void *src, size_t n)
{
    if (!d || (!src && n))
        return kvt_fail(-EINVAL, "kvt_device_upload: no device or source");
    return copy_sync(d, (void *)src, dst, n, true);
}

int kvt_device_download(kvt_device *d, void *dst, uint64_t src, size_t n)
{
    if (!d || (!dst && n))
        return kvt_fail(-EINVAL, "kvt_device_download: no device or destination");
    return copy_sync(d, dst, src, n, false);
}

static int queue_copy(kvt_device *d, const struct kvt_dcopy *c, bool up, unsigned slot)
{
    if (c->rows > 1) /* strided runs: host to device only */
        return d->ops->h2d_rows(d, c->dev, c->host, c->pitch, c->dpitch ? c->dpitch : c->n, c->n,
                                c->rows, slot);
    return up ? d->ops->h2d(d, c->dev, c->host, c->n, slot)
              : d->ops->d2h(d, c->host, c->dev, c->n, slot);
}

int kvt_device_copies_queue(kvt_device *d, const struct kvt_dcopy *c, size_t n, bool up,
                            unsigned *slot)
{
    *slot = KVT_DEVICE_UNTRACKED;
    pthread_mutex_lock(&d->op_lock);
    int rc = kvt_dstage_ready(d);
    uint8_t *mem;
    unsigned k; /* one slot: its event follows the copies queued after it */
    if (rc == 0 && (rc = kvt_dstage_take(d, &mem, &k)) == 0) {
        size_t i = 0;
        for (; i < n && rc == 0; i++) /* one event, after the last: the queue runs in order */
            rc = queue_copy(d, &c[i], up, i + 1 == n ? k : KVT_DEVICE_UNTRACKED);
        /* track the ones queued before a failure: the last of them again (the same bytes to
         * the same place), now with the event */
        if (rc && i > 1 && queue_copy(d, &c[i - 2], up, k) != 0)
            i = 0;                    /* nothing to wait on: the queue has failed */
        bool held = rc == 0 && n > 0; /* else nothing is left to wait for after this */
        if (rc && i > 1)
            d->ops->wait(d, k);
        if (!held)
            kvt_dstage_give(d, k, false);
        *slot = held ? k : KVT_DEVICE_UNTRACKED;
    }
    pthread_mutex_unlock(&d->op_lock);
    return rc;
}

int kvt_device_copies_wait(kvt_device *d, unsigned slot)
{
    if (slot >= KVT_DEVICE_MAX_SLOTS)
        return 0;
    int rc = d->ops->wait(d, slot);
    kvt_dstage_give(d, slot, false);
    return rc;
}

/* After a failure: the copies queued before it finish (their sources are freed next), and the
 * @p made marks go. */
static void finish_queued(kvt_device *d, void **marks, size_t made)
{
    void *ev = NULL;
    if (d->ops->mark(d, &ev) == 0) {
        d->ops->mark_sync(d, ev);
        d->ops->mark_free(d, ev);
    } else if (made > 0) {
        d->ops->mark_sync(d, marks[made - 1]);
    }
    for (size_t k = 0; k < made; k++)
        d->ops->mark_free(d, marks[k]);
}

int kvt_device_copies_marked(kvt_device *d, const struct kvt_dcopy *c, const size_t *ends,
                             size_t n_marks, void **marks)
{
    pthread_mutex_lock(&d->op_lock);
    int rc = d->ops->side(d, true);
    size_t made = 0;
    for (size_t i = 0; rc == 0 && made < n_marks;) {
        for (; rc == 0 && i < ends[made]; i++)
            rc = queue_copy(d, &c[i], true, KVT_DEVICE_UNTRACKED);
        if (rc == 0 && (rc = d->ops->mark(d, &marks[made])) == 0)
            made++;
    }
    if (rc)
        finish_queued(d, marks, made);
    int rs = d->ops->side(d, false);
    pthread_mutex_unlock(&d->op_lock);
    return rc ? rc : rs;
}

int kvt_device_copies(kvt_device *d, const struct kvt_dcopy *c, size_t n, bool up)
{
    unsigned k;
    int rc = kvt_device_copies_queue(d, c, n, up, &k);
    return rc ? rc : kvt_device_copies_wait(d, k);
}

/* ---- the staging ring --------------------------------------------------------------------- */

int kvt_dstage_ready(kvt_device *d)
{
    for (unsigned k = 0; k < d->depth; k++)
        if (!d->slot[k]) {
            int rc = d->ops->host_alloc(d, d->chunk, (void **)&d->slot[k]);
            if (rc)
                return rc;
        }
    return 0;
}

int kvt_dstage_take(kvt_device *d, uint8_t **mem, unsigned *k)
{
    pthread_mutex_lock(&d->stage_lock);
    unsigned slot = d->depth;
    while (slot == d->depth) {
        for (unsigned i = 0; i < d->depth && slot == d->depth; i++) {
            unsigned c = (d->next + i) % d->depth;
            if (!d->held[c])
                slot = c;
        }
        if (slot == d->depth)
            pthread_cond_wait(&d->stage_free, &d->stage_lock);
    }
    d->held[slot] = true;
    d->next = (slot + 1) % d->depth;
    pthread_mutex_unlock(&d->stage_lock);
    if (d->busy[slot]) { /* only the holder touches busy[slot] */
        int rc = d->ops->wait(d, slot);
        if (rc) {
            kvt_dstage_give(d, slot, true);
            return rc;
        }
        d->busy[slot] = false;
    }
    *mem = d->slot[slot];
    *k = slot;
    return 0;
}

void kvt_dstage_give(kvt_device *d, unsigned k, bool queued)
{
    pthread_mutex_lock(&d->stage_lock);
    d->busy[k] = queued;
    d->held[k] = false;
    pthread_cond_signal(&d->stage_free);
    pthread_mutex_unlock(&d->stage_lock);
}

int kvt_dstage_drain(kvt_device *d)
{
    int first = 0;
    for (unsigned k = 0; k < d->depth; k++)
        if (d->busy[k]) {
            int rc = d->ops->wait(d, k);
            if (rc && !first)
                first = rc;
            d->busy[k] = false;
        }
    return first;
}
