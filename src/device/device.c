/*
 * The public device calls (kvtier.h, "Devices") over the backend table, and the staging ring
 * that restores into device memory use.
 */
#include "device/device.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

#define DEFAULT_CHUNK ((size_t)8 << 20)
#define DEFAULT_DEPTH 4u

static int opened(kvt_device *d, int rc, kvt_device **out)
{
    if (rc) {
        free(d);
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
    return opened(d, kvt_device_host_open(o, d), out);
}

void kvt_device_close(kvt_device *d)
{
    if (!d)
        return;
    d->ops->close(d);
    free(d);
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
    struct kvt_dstage st;
    int rc = kvt_dstage_open(d, &st);
    for (size_t at = 0; rc == 0 && at < n;) {
        size_t k = n - at < d->chunk ? n - at : d->chunk;
        uint8_t *mem;
        unsigned slot;
        rc = kvt_dstage_take(&st, &mem, &slot);
        if (rc == 0 && up) {
            memcpy(mem, (uint8_t *)host + at, k);
            rc = d->ops->h2d(d, dev + at, mem, k, slot);
        } else if (rc == 0) {
            rc = d->ops->d2h(d, mem, dev + at, k, slot);
            if (rc == 0)
                rc = d->ops->wait(d, slot);
            if (rc == 0)
                memcpy((uint8_t *)host + at, mem, k);
        }
        st.busy[slot] = rc == 0;
        at += k;
    }
    int rd = kvt_dstage_drain(&st);
    kvt_dstage_close(&st);
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

/* ---- the staging ring --------------------------------------------------------------------- */

int kvt_dstage_open(kvt_device *d, struct kvt_dstage *st)
{
    memset(st, 0, sizeof(*st));
    st->d = d;
    for (unsigned k = 0; k < d->depth; k++) {
        int rc = d->ops->host_alloc(d, d->chunk, (void **)&st->slot[k]);
        if (rc) {
            kvt_dstage_close(st);
            return rc;
        }
    }
    return 0;
}

int kvt_dstage_take(struct kvt_dstage *st, uint8_t **mem, unsigned *k)
{
    unsigned slot = st->next;
    st->next = (slot + 1) % st->d->depth;
    if (st->busy[slot]) {
        int rc = st->d->ops->wait(st->d, slot);
        if (rc)
            return rc;
        st->busy[slot] = false;
    }
    *mem = st->slot[slot];
    *k = slot;
    return 0;
}

int kvt_dstage_drain(struct kvt_dstage *st)
{
    int first = 0;
    for (unsigned k = 0; st->d && k < st->d->depth; k++)
        if (st->busy[k]) {
            int rc = st->d->ops->wait(st->d, k);
            if (rc && !first)
                first = rc;
            st->busy[k] = false;
        }
    return first;
}

void kvt_dstage_close(struct kvt_dstage *st)
{
    kvt_dstage_drain(st);
    for (unsigned k = 0; st->d && k < st->d->depth; k++)
        if (st->slot[k])
            st->d->ops->host_free(st->d, st->slot[k]);
    memset(st, 0, sizeof(*st));
}
