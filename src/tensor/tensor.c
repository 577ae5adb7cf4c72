/*
 * Strided tensor views over refcounted buffers: construction, validation, slicing and the
 * size queries. Every size computation is overflow-checked so a view built here always lies
 * inside its buffer.
 */
#include "common/error.h"
#include "tensor/tensor_parts.h"

#include <errno.h>
#include <string.h>

/* C-contiguous element strides of @p shape and the element count, or -EINVAL on overflow. */
static int contiguous_strides(int rank, const int64_t *shape, int64_t *strides, size_t *numel)
{
    int64_t n = 1;
    for (int i = rank - 1; i >= 0; i--) {
        strides[i] = n;
        if (shape[i] < 0)
            return kvt_fail(-EINVAL, "tensor: negative extent %lld on axis %d", (long long)shape[i],
                            i);
        if (__builtin_mul_overflow(n, shape[i], &n))
            return kvt_fail(-EINVAL, "tensor: element count overflows");
    }
    *numel = (size_t)n;
    return 0;
}

int kvt_tensor_check(const struct kvt_tensor *t)
{
    if (!t || !t->buf)
        return kvt_fail(-EINVAL, "tensor: no buffer");
    size_t item = kvt_dtype_size(t->dtype);
    if (!item)
        return kvt_fail(-EINVAL, "tensor: unknown dtype %d", t->dtype);
    if (t->rank < 0 || t->rank > KVT_MAX_RANK)
        return kvt_fail(-EINVAL, "tensor: rank %d outside 0..%d", t->rank, KVT_MAX_RANK);
    int64_t numel = 1, lo = 0, hi = 0;
    for (int i = 0; i < t->rank; i++) {
        if (t->shape[i] < 0)
            return kvt_fail(-EINVAL, "tensor: negative extent %lld on axis %d",
                            (long long)t->shape[i], i);
        if (__builtin_mul_overflow(numel, t->shape[i], &numel))
            return kvt_fail(-EINVAL, "tensor: element count overflows");
    }
    int64_t total;
    if (__builtin_mul_overflow(numel, (int64_t)item, &total))
        return kvt_fail(-EINVAL, "tensor: byte size overflows");
    size_t size = kvt_buf_size(t->buf);
    if (numel == 0) {
        if (t->offset > size)
            return kvt_fail(-EINVAL, "tensor: offset %zu past the buffer (%zu bytes)", t->offset,
                            size);
        return 0;
    }
    for (int i = 0; i < t->rank; i++) {
        int64_t span;
        if (__builtin_mul_overflow(t->shape[i] - 1, t->strides[i], &span))
            return kvt_fail(-EINVAL, "tensor: stride span overflows on axis %d", i);
        if (span >= 0 ? __builtin_add_overflow(hi, span, &hi)
                      : __builtin_add_overflow(lo, span, &lo))
            return kvt_fail(-EINVAL, "tensor: stride span overflows on axis %d", i);
    }
    /* bytes [offset + lo·item, offset + (hi + 1)·item) must lie in the buffer */
    int64_t blo, bhi, hi1;
    if (__builtin_mul_overflow(lo, (int64_t)item, &blo) || __builtin_add_overflow(hi, 1, &hi1) ||
        __builtin_mul_overflow(hi1, (int64_t)item, &bhi))
        return kvt_fail(-EINVAL, "tensor: byte span overflows");
    if (t->offset > (size_t)INT64_MAX)
        return kvt_fail(-EINVAL, "tensor: offset %zu too large", t->offset);
    int64_t off = (int64_t)t->offset, start = 0, end = 0;
    if (__builtin_add_overflow(off, blo, &start) || __builtin_add_overflow(off, bhi, &end))
        return kvt_fail(-EINVAL, "tensor: byte span overflows");
    if (start < 0 || (uint64_t)end > size)
        return kvt_fail(-EINVAL, "tensor: view [%lld, %lld) outside the buffer (%zu bytes)",
                        (long long)start, (long long)end, size);
    if (kvt_tensor_on_device(t) && !kvt_tensor_is_contiguous(t))
        return kvt_fail(-EINVAL, "tensor: a view of device memory must be contiguous");
    return 0;
}

void kvt_tensor_extent(const struct kvt_tensor *t, size_t *lo, size_t *hi)
{
    size_t item = kvt_dtype_size(t->dtype);
    int64_t l = 0, h = 0;
    if (kvt_tensor_numel(t) == 0) {
        *lo = *hi = t->offset;
        return;
    }
    for (int i = 0; i < t->rank; i++) {
        int64_t span = (t->shape[i] - 1) * t->strides[i];
        if (span >= 0)
            h += span;
        else
            l += span;
    }
    *lo = (size_t)((int64_t)t->offset + l * (int64_t)item);
    *hi = (size_t)((int64_t)t->offset + (h + 1) * (int64_t)item);
}

int kvt_tensor_init(struct kvt_tensor *t, kvt_buf *buf, size_t offset, int dtype, int rank,
                    const int64_t *shape)
{
    if (!t)
        return kvt_fail(-EINVAL, "kvt_tensor_init: tensor is NULL");
    memset(t, 0, sizeof(*t));
    if (!buf)
        return kvt_fail(-EINVAL, "kvt_tensor_init: buffer is NULL");
    size_t item = kvt_dtype_size(dtype);
    if (!item)
        return kvt_fail(-EINVAL, "kvt_tensor_init: unknown dtype %d", dtype);
    if (rank < 0 || rank > KVT_MAX_RANK || (rank > 0 && !shape))
        return kvt_fail(-EINVAL, "kvt_tensor_init: bad rank %d", rank);
    struct kvt_tensor v = {.buf = buf, .offset = offset, .dtype = dtype, .rank = rank};
    size_t numel, bytes, end;
    for (int i = 0; i < rank; i++)
        v.shape[i] = shape[i];
    int rc = contiguous_strides(rank, v.shape, v.strides, &numel);
    if (rc)
        return rc;
    if (__builtin_mul_overflow(numel, item, &bytes) || __builtin_add_overflow(offset, bytes, &end))
        return kvt_fail(-EINVAL, "kvt_tensor_init: byte size overflows");
    if (end > kvt_buf_size(buf))
        return kvt_fail(-EINVAL, "kvt_tensor_init: %zu bytes at offset %zu do not fit in %zu",
                        bytes, offset, kvt_buf_size(buf));
    *t = v;
    kvt_buf_ref(buf);
    return 0;
}

int kvt_tensor_zeros(struct kvt_tensor *t, int dtype, int rank, const int64_t *shape)
{
    if (!t)
        return kvt_fail(-EINVAL, "kvt_tensor_zeros: tensor is NULL");
    memset(t, 0, sizeof(*t));
    size_t item = kvt_dtype_size(dtype), numel, bytes;
    int64_t strides[KVT_MAX_RANK];
    if (!item)
        return kvt_fail(-EINVAL, "kvt_tensor_zeros: unknown dtype %d", dtype);
    if (rank < 0 || rank > KVT_MAX_RANK || (rank > 0 && !shape))
        return kvt_fail(-EINVAL, "kvt_tensor_zeros: bad rank %d", rank);
    int rc = contiguous_strides(rank, shape, strides, &numel);
    if (rc)
        return rc;
    if (__builtin_mul_overflow(numel, item, &bytes))
        return kvt_fail(-EINVAL, "kvt_tensor_zeros: byte size overflows");
    kvt_buf *b;
    rc = kvt_buf_new(bytes, &b);
    if (rc)
        return rc;
    rc = kvt_tensor_init(t, b, 0, dtype, rank, shape);
    kvt_buf_unref(b);
    return rc;
}

void kvt_tensor_release(struct kvt_tensor *t)
{
    if (!t)
        return;
    kvt_buf_unref(t->buf);
    memset(t, 0, sizeof(*t));
}

void kvt_tensor_share(struct kvt_tensor *dst, const struct kvt_tensor *src)
{
    if (!dst)
        return;
    if (!src) {
        memset(dst, 0, sizeof(*dst));
        return;
    }
    if (dst != src) {
        *dst = *src;
        kvt_buf_ref(dst->buf);
    }
}

size_t kvt_tensor_numel(const struct kvt_tensor *t)
{
    if (!t)
        return 0;
    size_t n = 1;
    for (int i = 0; i < t->rank && i < KVT_MAX_RANK; i++)
        n *= (size_t)t->shape[i];
    return n;
}

size_t kvt_tensor_nbytes(const struct kvt_tensor *t)
{
    return t ? kvt_tensor_numel(t) * kvt_dtype_size(t->dtype) : 0;
}

bool kvt_tensor_is_contiguous(const struct kvt_tensor *t)
{
    if (!t)
        return false;
    int64_t expect = 1;
    for (int i = t->rank - 1; i >= 0; i--) {
        if (t->shape[i] == 0)
            return true;
        if (t->shape[i] != 1 && t->strides[i] != expect)
            return false;
        expect *= t->shape[i];
    }
    return true;
}

int kvt_tensor_slice(struct kvt_tensor *dst, const struct kvt_tensor *src, int axis, int64_t start,
                     int64_t end)
{
    if (!dst || !src)
        return kvt_fail(-EINVAL, "kvt_tensor_slice: NULL tensor");
    struct kvt_tensor v = *src;
    int rc = 0;
    if (!src->buf || axis < 0 || axis >= src->rank) {
        rc = kvt_fail(-EINVAL, "kvt_tensor_slice: axis %d outside rank %d", axis, src->rank);
        goto out_fail;
    }
    if (start < 0 || end < start || end > src->shape[axis]) {
        rc = kvt_fail(-EINVAL, "kvt_tensor_slice: rows [%lld, %lld) outside [0, %lld)",
                      (long long)start, (long long)end, (long long)src->shape[axis]);
        goto out_fail;
    }
    /* an empty slice at the end keeps the source offset so it never points past the buffer */
    if (start < src->shape[axis] && kvt_tensor_numel(src) > 0) {
        int64_t delta = start * src->strides[axis] * (int64_t)kvt_dtype_size(src->dtype);
        v.offset = (size_t)((int64_t)src->offset + delta);
    }
    v.shape[axis] = end - start;
    if (dst != src)
        kvt_buf_ref(v.buf);
    *dst = v;
    return 0;

out_fail:
    if (dst != src)
        memset(dst, 0, sizeof(*dst));
    return rc;
}
