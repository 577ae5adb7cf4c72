/*
 * Copy-on-write for cache arrays (CACHES.md §13): who may write which rows in place, the
 * exposed-rows mark views raise, and the row copies used when a cache must move to a new
 * buffer. See cache_parts.h for the model.
 */
#include "cache/cache_parts.h"
#include "common/error.h"

#include <errno.h>
#include <string.h>

/* Every reference of the buffer is one of this cache's arrays. */
bool kvt_arr_sole(const kvt_cache *c, int i)
{
    kvt_buf *b = c->a[i].t.buf;
    int own = 0;
    for (int j = 0; j < c->nt; j++)
        own += c->a[j].t.buf == b;
    return kvt_buf_refcount(b) == own;
}

bool kvt_arr_writable(kvt_cache *c, int i, int64_t row0)
{
    struct kvt_arr *a = &c->a[i];
    if (kvt_buf_is_wrapped(a->t.buf))
        return false;
    if (kvt_arr_sole(c, i)) {
        /* nobody else can read it, and nobody can start to without going through us */
        a->owner = true;
        kvt_buf_unexpose(a->t.buf);
        return true;
    }
    return a->owner && row0 >= kvt_buf_exposed(a->t.buf);
}

void kvt_cache_expose(const kvt_cache *c, int64_t rows)
{
    for (int i = 0; i < c->nt; i++)
        kvt_buf_expose(c->a[i].t.buf, rows);
}

int kvt_arr_alloc(struct kvt_tensor *t, const struct kvt_tensor *like, int64_t rows, bool zero)
{
    int64_t shape[KVT_MAX_RANK];
    memcpy(shape, like->shape, sizeof(shape));
    shape[2] = rows;
    if (zero)
        return kvt_tensor_zeros(t, like->dtype, like->rank, shape);
    /* uninitialized: every row is written before it is read */
    size_t bytes = kvt_dtype_size(like->dtype);
    for (int i = 0; i < like->rank; i++)
        if (__builtin_mul_overflow(bytes, (size_t)shape[i], &bytes))
            return kvt_fail(-ENOMEM, "cache: %lld rows overflow the buffer size", (long long)rows);
    kvt_buf *b;
    int rc = kvt_buf_new_uninit(bytes, &b);
    if (rc) {
        memset(t, 0, sizeof(*t));
        return rc;
    }
    rc = kvt_tensor_init(t, b, 0, like->dtype, like->rank, shape);
    kvt_buf_unref(b);
    return rc;
}

void kvt_rows_copy(const struct kvt_tensor *dst, int64_t d0, const struct kvt_tensor *src,
                   int64_t s0, int64_t n)
{
    if (n <= 0)
        return;
    struct kvt_tensor d = *dst, s = *src;
    /* borrowed sub-views: no references taken, so no release */
    kvt_tensor_slice(&d, &d, 2, d0, d0 + n);
    kvt_tensor_slice(&s, &s, 2, s0, s0 + n);
    kvt_tensor_copy(&d, &s);
}

void kvt_arr_replace(kvt_cache *c, int i, struct kvt_tensor *t)
{
    kvt_tensor_release(&c->a[i].t);
    c->a[i].t = *t;
    c->a[i].owner = true;
    memset(t, 0, sizeof(*t));
}

void kvt_tensors_release(struct kvt_tensor *t, int n)
{
    for (int i = 0; i < n; i++)
        kvt_tensor_release(&t[i]);
}
