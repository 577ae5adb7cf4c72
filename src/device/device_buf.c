/*
 * Buffers in device memory (kvt_buf_wrap_device): the tensors of an entry saved straight from
 * the device. Their bytes come out through the device's staging ring, copies to the host
 * queued a ring ahead of the writer, so the bus and the disk work at the same time.
 */
#include "device/device_parts.h"

#include <errno.h>
#include <inttypes.h>

#include "common/error.h"
#include "tensor/tensor_parts.h"

/* One queued download: which staging slot, and how many bytes. */
struct pending {
    unsigned slot;
    uint8_t *mem;
    size_t k;
};

/* Give back every slot still queued (their copies may run on: drained before return). */
static int give_all(kvt_device *d, struct pending *q, unsigned head, unsigned count, int rc)
{
    for (unsigned i = 0; i < count; i++)
        kvt_dstage_give(d, q[(head + i) % KVT_DEVICE_MAX_SLOTS].slot, true);
    int rd = kvt_dstage_drain(d);
    return rc ? rc : rd;
}

static int read_out_locked(kvt_device *d, uint64_t addr, uint64_t n, kvt_run_fn fn, void *ud)
{
    int rc = kvt_dstage_ready(d);
    struct pending q[KVT_DEVICE_MAX_SLOTS];
    unsigned head = 0, count = 0;
    uint64_t queued = 0;
    while (rc == 0 && (queued < n || count > 0)) {
        if (queued < n && count < d->depth) {
            struct pending *p = &q[(head + count) % KVT_DEVICE_MAX_SLOTS];
            p->k = n - queued < d->chunk ? (size_t)(n - queued) : d->chunk;
            if ((rc = kvt_dstage_take(d, &p->mem, &p->slot)))
                break;
            if ((rc = d->ops->d2h(d, p->mem, addr + queued, p->k, p->slot))) {
                kvt_dstage_give(d, p->slot, false);
                break;
            }
            count++;
            queued += p->k;
            continue;
        }
        struct pending *p = &q[head]; /* the oldest: wait for it, hand it on */
        rc = d->ops->wait(d, p->slot);
        if (rc == 0)
            rc = fn(ud, p->mem, p->k);
        kvt_dstage_give(d, p->slot, false);
        head = (head + 1) % KVT_DEVICE_MAX_SLOTS;
        count--;
    }
    return give_all(d, q, head, count, rc);
}

static int read_out(void *ctx, uint64_t addr, uint64_t n, kvt_run_fn fn, void *ud)
{
    kvt_device *d = ctx;
    pthread_mutex_lock(&d->op_lock);
    int rc = read_out_locked(d, addr, n, fn, ud);
    pthread_mutex_unlock(&d->op_lock);
    return rc;
}

/* The wrap is refused: the memory goes back to its owner, as on every path. */
static int refuse(kvt_release_fn release, void *ud, int rc)
{
    if (release)
        release(ud, NULL);
    return rc;
}

int kvt_buf_wrap_device(kvt_device *d, uint64_t addr, size_t bytes, kvt_release_fn release,
                        void *ud, kvt_buf **out)
{
    if (out)
        *out = NULL;
    if (!out || !d || (!addr && bytes))
        return refuse(release, ud,
                      kvt_fail(-EINVAL, "kvt_buf_wrap_device: no device, address or output"));
    uint64_t base;
    size_t size;
    int rc = bytes ? d->ops->range(d, addr, &base, &size) : 1;
    if (rc < 0)
        return refuse(release, ud, rc);
    if (rc == 0 && bytes > size - (addr - base)) /* a copy out would fail half-way */
        return refuse(release, ud,
                      kvt_fail(-EINVAL,
                               "kvt_buf_wrap_device: %zu bytes at 0x%" PRIx64 " run past the end "
                               "of their device allocation (%zu bytes at 0x%" PRIx64 ")",
                               bytes, addr, size, base));
    struct kvt_buf_ext x = {read_out, d, addr};
    return kvt_buf_wrap_ext(&x, bytes, release, ud, out);
}

kvt_device *kvt_buf_device(const kvt_buf *b, uint64_t *addr)
{
    const struct kvt_buf_ext *x = kvt_buf_ext_of(b);
    if (!x || x->read_out != read_out)
        return NULL;
    if (addr)
        *addr = x->addr;
    return x->ctx;
}
