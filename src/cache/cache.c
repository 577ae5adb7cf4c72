/*
 * The cache object: creation, restore from state, the append/trim entry points, and the
 * views it hands out (window, state, clone) with the exposure marks that keep those views
 * immune to later writes (cache_parts.h).
 */
#include "cache/cache_parts.h"
#include "common/error.h"
#include "tensor/alloc.h"

#include <errno.h>
#include <string.h>

/* The scalars of @p kind taken from @p p; the others are 0. */
static void copy_info(struct kvt_cache_info *dst, const struct kvt_cache_info *p, bool state)
{
    memset(dst, 0, sizeof(*dst));
    dst->kind = p->kind;
    if (state)
        dst->offset = p->offset;
    if (kvt_kind_is_ring(p->kind)) {
        dst->max_size = p->max_size;
        if (state)
            dst->idx = p->idx;
    }
    if (p->kind == KVT_KIND_QKV || p->kind == KVT_KIND_ROTATING_QKV) {
        dst->group_size = p->group_size;
        dst->bits = p->bits;
    }
    if (p->kind == KVT_KIND_TURBOQUANT) {
        dst->k_bits = p->k_bits;
        dst->v_bits = p->v_bits;
        if (state)
            dst->head_dim = p->head_dim;
    }
}

int kvt_cache_new(const struct kvt_cache_info *params, kvt_cache **out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_cache_new: out is NULL");
    *out = NULL;
    int rc = kvt_cache_check_params(params);
    if (rc)
        return rc;
    kvt_cache *c = kvt_calloc(1, sizeof(*c));
    if (!c)
        return kvt_fail(-ENOMEM, "kvt_cache_new: out of memory");
    copy_info(&c->info, params, false);
    c->nt = kvt_kind_tensor_count(params->kind);
    *out = c;
    return 0;
}

int kvt_cache_from_state(const struct kvt_cache_info *info, const struct kvt_tensor *t, int nt,
                         kvt_cache **out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_cache_from_state: out is NULL");
    *out = NULL;
    int rc = kvt_cache_check_state(info, t, nt);
    if (rc)
        return rc;
    kvt_cache *c = kvt_calloc(1, sizeof(*c));
    if (!c)
        return kvt_fail(-ENOMEM, "kvt_cache_from_state: out of memory");
    copy_info(&c->info, info, true);
    c->nt = nt;
    c->has_buf = true;
    c->cap = info->kind == KVT_KIND_SSM ? 0 : t[0].shape[2];
    for (int i = 0; i < nt; i++) {
        kvt_tensor_share(&c->a[i].t, &t[i]);
        c->a[i].owner = true;
    }
    /* the caller may keep its references to whole tensors */
    kvt_cache_expose(c, KVT_ROWS_ALL);
    *out = c;
    return 0;
}

void kvt_cache_free(kvt_cache *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->nt; i++)
        kvt_tensor_release(&c->a[i].t);
    kvt_free(c);
}

int kvt_cache_append(kvt_cache *c, const struct kvt_tensor *in, int nin)
{
    if (!c)
        return kvt_fail(-EINVAL, "kvt_cache_append: cache is NULL");
    int rc = kvt_cache_check_input(c, in, nin);
    if (rc)
        return rc;
    int64_t l = in[0].shape[2];
    if (kvt_kind_is_ring(c->info.kind))
        return kvt_ring_append(c, in, l);
    rc = kvt_step_append(c, in, l);
    if (rc == 0 && c->info.kind == KVT_KIND_TURBOQUANT && c->info.head_dim == 0)
        c->info.head_dim = in[1].shape[3] * 32; /* checked at this first append */
    return rc;
}

int kvt_cache_trim(kvt_cache *c, int64_t n)
{
    if (!c || n < 0)
        return kvt_fail(-EINVAL, "kvt_cache_trim: bad argument");
    if (n == 0)
        return 0;
    if (c->info.kind == KVT_KIND_SSM)
        return kvt_fail(KVT_E_STATE, "SSMCache is not trimmable");
    if (!kvt_cache_is_trimmable(c))
        return kvt_fail(KVT_E_STATE, "%s cache is not trimmable: offset %lld >= maxSize %lld",
                        kvt_kind_name(c->info.kind), (long long)c->info.offset,
                        (long long)c->info.max_size);
    if (kvt_kind_is_ring(c->info.kind))
        return kvt_ring_trim(c, n);
    c->info.offset = n < c->info.offset ? c->info.offset - n : 0;
    return 0;
}

bool kvt_cache_is_trimmable(const kvt_cache *c)
{
    return c && kvt_kind_is_trimmable(c->info.kind, c->info.offset, c->info.max_size);
}

void kvt_cache_get_info(const kvt_cache *c, struct kvt_cache_info *info)
{
    if (!info)
        return;
    if (!c) {
        memset(info, 0, sizeof(*info));
        return;
    }
    *info = c->info;
}

int64_t kvt_cache_offset(const kvt_cache *c)
{
    return c ? c->info.offset : 0;
}

size_t kvt_cache_bytes(const kvt_cache *c)
{
    if (!c || !c->has_buf)
        return 0;
    size_t sum = 0;
    for (int i = 0; i < c->nt; i++) {
        struct kvt_tensor v = c->a[i].t; /* borrowed */
        if (kvt_kind_is_step(c->info.kind))
            v.shape[2] = c->cap;
        sum += kvt_tensor_nbytes(&v);
    }
    return sum;
}

int64_t kvt_cache_capacity(const kvt_cache *c)
{
    if (!c || !c->has_buf || c->info.kind == KVT_KIND_SSM)
        return 0;
    return c->cap;
}

/* Owned views of every array, rows [0, rows) on axis 2, or whole when rows < 0. */
static int views(const kvt_cache *c, struct kvt_tensor *out, int64_t rows)
{
    for (int i = 0; i < c->nt; i++) {
        if (rows < 0)
            kvt_tensor_share(&out[i], &c->a[i].t);
        else
            kvt_tensor_slice(&out[i], &c->a[i].t, 2, 0, rows);
    }
    kvt_cache_expose(c, rows < 0 ? KVT_ROWS_ALL : rows);
    return c->nt;
}

int kvt_cache_window(const kvt_cache *c, struct kvt_tensor *out)
{
    if (!c || !out)
        return kvt_fail(-EINVAL, "kvt_cache_window: bad argument");
    if (!c->has_buf)
        return kvt_fail(KVT_E_STATE, "an empty %s cache has no window",
                        kvt_kind_name(c->info.kind));
    if (kvt_kind_is_step(c->info.kind))
        return views(c, out, c->info.offset);
    if (kvt_kind_is_ring(c->info.kind) && !c->last_multi && c->info.offset < c->info.max_size &&
        c->info.offset <= c->cap) {
        int n = views(c, out, c->info.offset);
        kvt_cache_expose(c, KVT_ROWS_ALL); /* ring marks cover every row */
        return n;
    }
    return views(c, out, -1);
}

int kvt_cache_state(const kvt_cache *c, struct kvt_tensor *out)
{
    if (!c || !out)
        return kvt_fail(-EINVAL, "kvt_cache_state: bad argument");
    if (!c->has_buf)
        return kvt_fail(KVT_E_STATE, "cannot persist an empty cache");
    return views(c, out, kvt_kind_is_step(c->info.kind) ? c->info.offset : -1);
}

int kvt_cache_clone(const kvt_cache *c, kvt_cache **out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_cache_clone: out is NULL");
    *out = NULL;
    if (!c)
        return kvt_fail(-EINVAL, "kvt_cache_clone: cache is NULL");
    if (!c->has_buf)
        return kvt_fail(KVT_E_STATE, "cannot clone an empty cache");
    kvt_cache *k = kvt_calloc(1, sizeof(*k));
    if (!k)
        return kvt_fail(-ENOMEM, "kvt_cache_clone: out of memory");
    *k = *c;
    for (int i = 0; i < c->nt; i++) {
        kvt_buf_ref(k->a[i].t.buf);
        k->a[i].owner = false;
    }
    if (kvt_kind_is_step(c->info.kind)) {
        /* references rows [0, offset); the spare rows stay reachable for sole-owner appends */
        k->cap = c->info.offset;
        k->exact_cap = true;
        kvt_cache_expose(c, c->info.offset);
    } else {
        kvt_cache_expose(c, KVT_ROWS_ALL);
    }
    *out = k;
    return 0;
}
