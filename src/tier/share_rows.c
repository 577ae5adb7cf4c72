/*
 * The real caches' side of the RAM tier's shared prefixes (docs/SHARING.md, "The RAM tier"):
 * an entry's token-axis caches cut into copies of 256-row chunks and a tail, and joined back
 * into one cache per layer with restore capacity. Copies land in the tier's memory (the
 * device's page-locked pool when it has one), so a chunk outlives the entry it came from.
 */
#include "tier/share_rows.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_parts.h"
#include "common/error.h"
#include "format/format.h"
#include "store/share.h"
#include "tensor/tensor_parts.h"

/* Whether @p c, a cache of an entry of @p n tokens, is cut: a token-axis kind holding a row
 * for each token. */
static bool cut_cache(const kvt_cache *c, size_t n)
{
    struct kvt_cache_info info;
    kvt_cache_get_info(c, &info);
    return kvt_share_splits(info.kind) && info.offset == (int64_t)n;
}

size_t kvt_share_rows_chunks(const struct kvt_entry *e)
{
    size_t cut = 0;
    for (size_t i = 0; i < e->n_caches; i++) {
        struct kvt_cache_info info;
        kvt_cache_get_info(e->caches[i], &info);
        if (!kvt_share_splits(info.kind))
            continue;
        if (!cut_cache(e->caches[i], e->n_tokens))
            return 0; /* a token-axis cache off the entry's tokens: kept whole, as on disk */
        cut++;
    }
    return cut && cut <= KVT_SHARE_MAX_CUT ? kvt_share_chunks(e->n_tokens) : 0;
}

static int new_buf(const struct kvt_tier_alloc *a, size_t bytes, kvt_buf **out)
{
    if (a && a->buf && a->buf(a->ud, bytes, out) == 0)
        return 0;
    kvt_clear_error(); /* no room in the pool: ordinary memory serves as well */
    return kvt_buf_new_uninit(bytes, out);
}

/* One buffer carved in order into the tensors of a chunk or a tail: a few large buffers, which
 * the buffer cache recycles, rather than many small ones whose pages fault in afresh. */
struct slab {
    kvt_buf *b;
    size_t off;
};

#define SLAB_ALIGN 64

static size_t tensor_bytes(const struct kvt_tensor *like, int64_t cap)
{
    size_t row = kvt_dtype_size(like->dtype) * (size_t)like->shape[3];
    size_t bytes = (size_t)(like->shape[0] * like->shape[1]) * (size_t)cap * row;
    return (bytes + SLAB_ALIGN - 1) / SLAB_ALIGN * SLAB_ALIGN;
}

/* A contiguous tensor shaped like @p like with @p cap rows, rows [rows, cap) zeroed: the next
 * piece of @p s, or (s NULL) a buffer of its own. */
static int rows_tensor(const struct kvt_tensor *like, int64_t rows, int64_t cap, struct slab *s,
                       const struct kvt_tier_alloc *a, struct kvt_tensor *out)
{
    int64_t shape[KVT_MAX_RANK];
    memcpy(shape, like->shape, sizeof(shape));
    shape[2] = cap;
    size_t row = kvt_dtype_size(like->dtype) * (size_t)shape[3];
    size_t blocks = (size_t)(shape[0] * shape[1]), bytes = tensor_bytes(like, cap), at = 0;
    kvt_buf *b = NULL;
    int rc = 0;
    if (s) {
        b = kvt_buf_ref(s->b);
        at = s->off;
        s->off += bytes;
    } else {
        rc = new_buf(a, bytes ? bytes : 1, &b);
    }
    if (rc)
        return rc;
    uint8_t *p = (uint8_t *)kvt_buf_data(b) + at;
    for (size_t k = 0; k < blocks && cap > rows; k++)
        memset(p + (k * (size_t)cap + (size_t)rows) * row, 0, (size_t)(cap - rows) * row);
    rc = kvt_tensor_init(out, b, at, like->dtype, like->rank, shape);
    kvt_buf_unref(b);
    return rc;
}

/* Copy rows [a, b) of @p src's state into rows [at, ...) of @p dst. */
static int place_rows(struct kvt_tensor *dst, int nt, const kvt_cache *src, int64_t a, int64_t b,
                      int64_t at)
{
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
    int ns = kvt_cache_state(src, st), rc = ns == nt ? 0 : -EINVAL;
    for (int j = 0; rc == 0 && j < nt; j++) {
        struct kvt_tensor from = {0}, to = {0};
        rc = kvt_tensor_slice(&from, &st[j], 2, a, b);
        if (rc == 0 && (rc = kvt_tensor_slice(&to, &dst[j], 2, at, at + b - a)) == 0)
            rc = kvt_tensor_copy(&to, &from);
        kvt_tensor_release(&to);
        kvt_tensor_release(&from);
    }
    for (int j = 0; j < ns; j++)
        kvt_tensor_release(&st[j]);
    return rc;
}

/*
 * One cache of the kind of @p parts[0] holding rows [a, b) of the concatenation of the
 * @p np parts' rows, in @p cap rows of the next pieces of @p s (NULL: memory of its own).
 */
static int compose(kvt_cache *const *parts, size_t np, int64_t a, int64_t b, int64_t cap,
                   struct slab *s, const struct kvt_tier_alloc *al, kvt_cache **out)
{
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS], t[KVT_MAX_CACHE_TENSORS];
    int nt = kvt_cache_state(parts[0], st), made = 0, rc = nt < 0 ? nt : 0;
    for (; rc == 0 && made < nt; made++)
        if ((rc = rows_tensor(&st[made], b - a, cap, s, al, &t[made])))
            break;
    for (size_t p = 0, start = 0; rc == 0 && p < np; p++) {
        int64_t rows = kvt_cache_offset(parts[p]), end = (int64_t)start + rows;
        int64_t lo = a > (int64_t)start ? a : (int64_t)start, hi = b < end ? b : end;
        if (lo < hi)
            rc = place_rows(t, nt, parts[p], lo - (int64_t)start, hi - (int64_t)start, lo - a);
        start = (size_t)end;
    }
    struct kvt_cache_info info;
    kvt_cache_get_info(parts[0], &info);
    info.offset = b - a;
    if (rc == 0)
        rc = kvt_cache_from_state(&info, t, nt, out);
    kvt_tensors_release(t, made);
    kvt_tensors_release(st, nt > 0 ? nt : 0);
    return rc;
}

/* A slab for @p rows rows of every cut cache of @p e. */
static int slab_new(const struct kvt_entry *e, int64_t rows, const struct kvt_tier_alloc *a,
                    struct slab *s)
{
    size_t bytes = 0;
    for (size_t i = 0; i < e->n_caches; i++) {
        if (!cut_cache(e->caches[i], e->n_tokens))
            continue;
        struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
        int nt = kvt_cache_state(e->caches[i], st);
        for (int j = 0; j < nt; j++)
            bytes += tensor_bytes(&st[j], rows);
        kvt_tensors_release(st, nt > 0 ? nt : 0);
    }
    s->off = 0;
    return new_buf(a, bytes ? bytes : 1, &s->b);
}

int kvt_share_rows_chunk(const struct kvt_entry *e, size_t k, const struct kvt_tier_alloc *a,
                         struct kvt_entry **out)
{
    *out = NULL;
    kvt_cache *c[KVT_SHARE_MAX_CUT];
    size_t nc = 0;
    int64_t lo = (int64_t)(k * KVT_SHARE_CHUNK), hi = lo + KVT_SHARE_CHUNK;
    struct slab s;
    int rc = slab_new(e, KVT_SHARE_CHUNK, a, &s);
    for (size_t i = 0; rc == 0 && i < e->n_caches; i++) {
        if (!cut_cache(e->caches[i], e->n_tokens))
            continue;
        rc = compose(&e->caches[i], 1, lo, hi, KVT_SHARE_CHUNK, &s, a, &c[nc]);
        nc += rc == 0;
    }
    kvt_buf_unref(s.b);
    if (rc == 0)
        rc = kvt_entry_new(e->tokens + lo, KVT_SHARE_CHUNK, c, nc, e->meta.ns, out);
    if (rc)
        for (size_t i = 0; i < nc; i++)
            kvt_cache_free(c[i]);
    return rc;
}

int kvt_share_rows_tail(const struct kvt_entry *e, const struct kvt_tier_alloc *a,
                        struct kvt_entry **out)
{
    int64_t n = (int64_t)e->n_tokens,
            lo = (int64_t)(kvt_share_chunks(e->n_tokens) * KVT_SHARE_CHUNK);
    struct slab s = {NULL, 0};
    int rc = kvt_entry_clone(e, out); /* tokens, meta and the caches kept whole */
    if (rc == 0)
        rc = slab_new(e, n - lo, a, &s);
    for (size_t i = 0; rc == 0 && i < e->n_caches; i++) {
        if (!cut_cache(e->caches[i], e->n_tokens))
            continue;
        kvt_cache *t;
        if ((rc = compose(&e->caches[i], 1, lo, n, n - lo, &s, a, &t)) == 0) {
            kvt_cache_free((*out)->caches[i]);
            (*out)->caches[i] = t;
        }
    }
    kvt_buf_unref(s.b);
    if (rc && *out) {
        kvt_entry_free(*out);
        *out = NULL;
    }
    return rc;
}

/* Whether @p c is a cut cache of a tail: every token-axis cache of a shared entry is cut. */
static bool tail_cache(const kvt_cache *c)
{
    struct kvt_cache_info info;
    kvt_cache_get_info(c, &info);
    return kvt_share_splits(info.kind);
}

int kvt_share_rows_join(const struct kvt_entry *tail, struct kvt_entry *const *chunks, size_t m,
                        const struct kvt_tier_alloc *a, struct kvt_entry **out)
{
    int64_t n = (int64_t)tail->n_tokens;
    kvt_cache **parts = malloc((m + 1) * sizeof(*parts));
    if (!parts)
        return kvt_fail(-ENOMEM, "out of memory");
    int rc = kvt_entry_clone(tail, out);
    for (size_t i = 0, j = 0; rc == 0 && i < tail->n_caches; i++) {
        if (!tail_cache(tail->caches[i]))
            continue;
        for (size_t k = 0; k < m; k++)
            parts[k] = chunks[k]->caches[j];
        parts[m] = tail->caches[i];
        kvt_cache *w;
        int64_t cap = (int64_t)kvt_restore_cap((uint64_t)n);
        if ((rc = compose(parts, m + 1, 0, n, cap, NULL, a, &w)) == 0) {
            kvt_cache_free((*out)->caches[i]);
            (*out)->caches[i] = w;
        }
        j++;
    }
    free(parts);
    if (rc && *out) {
        kvt_entry_free(*out);
        *out = NULL;
    }
    return rc;
}

/* Whether two caches hold rows of the same kind, parameters and tensor shapes. */
static bool rows_fit(const kvt_cache *x, const kvt_cache *y)
{
    struct kvt_cache_info a, b;
    kvt_cache_get_info(x, &a);
    kvt_cache_get_info(y, &b);
    struct kvt_tensor s[KVT_MAX_CACHE_TENSORS], t[KVT_MAX_CACHE_TENSORS];
    int ns = kvt_cache_state(x, s), nt = kvt_cache_state(y, t);
    bool ok =
        a.kind == b.kind && a.bits == b.bits && a.group_size == b.group_size && ns == nt && ns > 0;
    for (int j = 0; ok && j < ns; j++)
        ok = s[j].dtype == t[j].dtype && s[j].rank == 4 && t[j].rank == 4 &&
             s[j].shape[0] == t[j].shape[0] && s[j].shape[1] == t[j].shape[1] &&
             s[j].shape[3] == t[j].shape[3];
    kvt_tensors_release(s, ns > 0 ? ns : 0);
    kvt_tensors_release(t, nt > 0 ? nt : 0);
    return ok;
}

bool kvt_share_rows_fit(const struct kvt_entry *chunk, const struct kvt_entry *e)
{
    size_t j = 0;
    for (size_t i = 0; i < e->n_caches; i++) {
        if (!cut_cache(e->caches[i], e->n_tokens))
            continue;
        if (j >= chunk->n_caches || !rows_fit(chunk->caches[j], e->caches[i]))
            return false;
        j++;
    }
    return j == chunk->n_caches;
}
