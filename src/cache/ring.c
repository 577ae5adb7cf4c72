/*
 * The sliding-window ring shared by rotating and rotating-qkv (CACHES.md §4): single-token
 * appends write in place (growing by up to 256 zero rows before the first wrap, dropping the
 * excess after a prefill chunk), multi-token appends rebuild the ring in temporal order.
 * Ring clones share every row, so a write through either side copies unless it holds the
 * buffer alone.
 */
#include "cache/cache_parts.h"
#include "common/error.h"

#include <errno.h>
#include <string.h>

static const char *name_of(const kvt_cache *c)
{
    return kvt_kind_name(c->info.kind);
}

static int alloc_all(kvt_cache *c, struct kvt_tensor *fresh, const struct kvt_tensor *in,
                     int64_t rows, bool zero)
{
    for (int i = 0; i < c->nt; i++) {
        const struct kvt_tensor *like = c->has_buf ? &c->a[i].t : &in[i];
        int rc = kvt_arr_alloc(&fresh[i], like, rows, zero);
        if (rc) {
            kvt_tensors_release(fresh, c->nt);
            return kvt_fail(rc, "%s append: cannot allocate a ring of %lld rows", name_of(c),
                            (long long)rows);
        }
    }
    return 0;
}

/* Arrays the ring cannot write at @p idx (shared with a clone) are copied, rows [drop,
 * drop + news), into fresh[] and marked in move[]; on failure every fresh array goes. */
static int copy_shared(kvt_cache *c, struct kvt_tensor *fresh, bool *move, int64_t idx,
                       int64_t drop, int64_t news)
{
    for (int i = 0; i < c->nt; i++) {
        if (move[i] || kvt_arr_writable(c, i, idx))
            continue;
        struct kvt_tensor cur = c->a[i].t; /* borrowed */
        kvt_tensor_slice(&cur, &cur, 2, drop, drop + news);
        int rc = kvt_arr_alloc(&fresh[i], &cur, news, false);
        if (rc) {
            kvt_tensors_release(fresh, c->nt);
            return kvt_fail(rc, "%s append: cannot copy a ring of %lld rows", name_of(c),
                            (long long)news);
        }
        kvt_rows_copy(&fresh[i], 0, &cur, 0, news);
        move[i] = true;
    }
    return 0;
}

static int ring_one(kvt_cache *c, const struct kvt_tensor *in)
{
    int64_t s = c->has_buf ? c->cap : 0, max = c->info.max_size;
    int64_t off = c->info.offset, idx = c->info.idx, news = s, drop = 0;
    struct kvt_tensor fresh[KVT_MAX_CACHE_TENSORS];
    bool move[KVT_MAX_CACHE_TENSORS] = {false};
    memset(fresh, 0, sizeof(fresh));
    int rc;

    if (!c->has_buf || (off >= s && s < max)) {
        int64_t g = max - off < KVT_STEP ? max - off : KVT_STEP;
        if (g <= 0)
            return kvt_fail(KVT_E_STATE,
                            "%s append: ring of %lld rows at offset %lld cannot "
                            "grow toward maxSize %lld",
                            name_of(c), (long long)s, (long long)off, (long long)max);
        news = s + g;
        rc = alloc_all(c, fresh, in, news, true);
        if (rc)
            return rc;
        for (int i = 0; i < c->nt; i++) {
            if (c->has_buf)
                kvt_rows_copy(&fresh[i], 0, &c->a[i].t, 0, s);
            move[i] = true;
        }
        idx = off;
    } else if (s > max) {
        /* drop the first s - max rows: a narrower view, no copy */
        drop = s - max;
        news = max;
        idx = max;
    }
    if (idx == max)
        idx = 0;
    if (idx < 0 || idx >= news) {
        kvt_tensors_release(fresh, c->nt);
        return kvt_fail(KVT_E_STATE, "%s append: idx %lld outside the ring of %lld rows",
                        name_of(c), (long long)idx, (long long)news);
    }
    rc = copy_shared(c, fresh, move, idx, drop, news);
    if (rc)
        return rc;
    for (int i = 0; i < c->nt; i++)
        if (!move[i] && drop)
            kvt_tensor_slice(&c->a[i].t, &c->a[i].t, 2, drop, drop + news);
    for (int i = 0; i < c->nt; i++)
        if (move[i])
            kvt_arr_replace(c, i, &fresh[i]);
    c->has_buf = true;
    c->cap = news;
    for (int i = 0; i < c->nt; i++)
        kvt_rows_copy(&c->a[i].t, idx, &in[i], 0, 1);
    c->info.offset = off + 1;
    c->info.idx = idx + 1;
    c->last_multi = false;
    return 0;
}

static int ring_many(kvt_cache *c, const struct kvt_tensor *in, int64_t l)
{
    struct kvt_tensor fresh[KVT_MAX_CACHE_TENSORS];
    memset(fresh, 0, sizeof(fresh));
    int64_t s = c->has_buf ? c->cap : 0, idx = c->info.idx, off = c->info.offset;
    int64_t seg[2][2], nseg = 0, len = 0, drop = 0, news;
    if (c->has_buf) {
        /* temporal order of the rows held */
        if (idx == s) {
            seg[nseg][0] = 0, seg[nseg++][1] = s;
        } else if (idx < off) {
            seg[nseg][0] = idx, seg[nseg++][1] = s;
            seg[nseg][0] = 0, seg[nseg++][1] = idx;
        } else {
            seg[nseg][0] = 0, seg[nseg++][1] = idx;
        }
        for (int k = 0; k < nseg; k++)
            len += seg[k][1] - seg[k][0];
        drop = len - c->info.max_size + 1;
        if (drop < 0)
            drop = 0;
    }
    if (__builtin_add_overflow(len - drop, l, &news))
        return kvt_fail(-EINVAL, "%s append: ring length overflows", name_of(c));
    int rc = alloc_all(c, fresh, in, news, false);
    if (rc)
        return rc;
    for (int i = 0; i < c->nt; i++) {
        int64_t pos = 0, skip = drop;
        for (int k = 0; k < nseg; k++) {
            int64_t n = seg[k][1] - seg[k][0];
            if (skip >= n) {
                skip -= n;
                continue;
            }
            kvt_rows_copy(&fresh[i], pos, &c->a[i].t, seg[k][0] + skip, n - skip);
            pos += n - skip;
            skip = 0;
        }
        kvt_rows_copy(&fresh[i], pos, &in[i], 0, l);
    }
    for (int i = 0; i < c->nt; i++)
        kvt_arr_replace(c, i, &fresh[i]);
    c->has_buf = true;
    c->cap = news;
    c->info.offset = off + l;
    c->info.idx = news;
    c->last_multi = true;
    return 0;
}

int kvt_ring_append(kvt_cache *c, const struct kvt_tensor *in, int64_t l)
{
    int64_t end;
    if (__builtin_add_overflow(c->info.offset, l, &end) || end > INT64_MAX / 2)
        return kvt_fail(-EINVAL, "%s append: offset %lld + %lld overflows", name_of(c),
                        (long long)c->info.offset, (long long)l);
    return l == 1 ? ring_one(c, in) : ring_many(c, in, l);
}

int kvt_ring_trim(kvt_cache *c, int64_t n)
{
    int64_t k = n < c->info.offset ? n : c->info.offset;
    if (c->info.idx < k)
        return kvt_fail(KVT_E_STATE, "%s trim: idx %lld would fall below 0 trimming %lld",
                        name_of(c), (long long)c->info.idx, (long long)k);
    c->info.offset -= k;
    c->info.idx -= k;
    return 0;
}
