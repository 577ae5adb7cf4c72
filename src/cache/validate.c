/*
 * Validation of what enters a cache: kind parameters, appended tensors (rank, agreeing
 * B/H/L, dtype roles, last dimensions consistent with the parameters and with the rows
 * already held) and restored state (FORMAT.md V18-V20 restated for live tensors).
 */
#include "cache/cache_parts.h"
#include "common/error.h"

#include <errno.h>
#include <stdio.h>

static bool in_set(int64_t v, const int64_t *set, int n)
{
    for (int i = 0; i < n; i++)
        if (v == set[i])
            return true;
    return false;
}

static bool qkv_bits_ok(int64_t b)
{
    static const int64_t s[] = {2, 3, 4, 5, 6, 8};
    return in_set(b, s, 6);
}

static bool qkv_group_ok(int64_t g)
{
    static const int64_t s[] = {32, 64, 128};
    return in_set(g, s, 3);
}

static bool tq_bits_ok(int64_t b)
{
    static const int64_t s[] = {2, 3, 4, 5, 8};
    return in_set(b, s, 5);
}

static bool tq_head_dim_ok(int64_t d)
{
    static const int64_t s[] = {64, 128, 256, 512};
    return in_set(d, s, 4);
}

int kvt_cache_check_params(const struct kvt_cache_info *p)
{
    if (!p)
        return kvt_fail(-EINVAL, "cache: no parameters");
    const char *name = kvt_kind_name(p->kind);
    if (!name)
        return kvt_fail(-EINVAL, "cache: unknown kind %d", p->kind);
    if (kvt_kind_is_ring(p->kind) && p->max_size < 1)
        return kvt_fail(-EINVAL, "%s cache: maxSize %lld < 1", name, (long long)p->max_size);
    if (p->kind == KVT_KIND_QKV || p->kind == KVT_KIND_ROTATING_QKV) {
        if (!qkv_group_ok(p->group_size))
            return kvt_fail(-EINVAL, "%s cache: groupSize %lld not in {32, 64, 128}", name,
                            (long long)p->group_size);
        if (!qkv_bits_ok(p->bits))
            return kvt_fail(-EINVAL, "%s cache: bits %lld not in {2, 3, 4, 5, 6, 8}", name,
                            (long long)p->bits);
    }
    if (p->kind == KVT_KIND_TURBOQUANT && (!tq_bits_ok(p->k_bits) || !tq_bits_ok(p->v_bits)))
        return kvt_fail(-EINVAL, "turboquant cache: kBits %lld / vBits %lld not in {2, 3, 4, 5, 8}",
                        (long long)p->k_bits, (long long)p->v_bits);
    return 0;
}

/* Tensor roles of the kinds, for messages. */
static const char *role(int kind, int i)
{
    static const char *kv[] = {"K", "V"};
    static const char *q[] = {"kPacked", "kScales", "kBiases", "vPacked", "vScales", "vBiases"};
    static const char *tq[] = {"kIdx", "kScales", "kZeros", "vPacked", "vScales"};
    static const char *ssm[] = {"conv", "recurrent"};
    if (i < 0 || i >= kvt_kind_tensor_count(kind))
        return "tensor";
    switch (kind) {
    case KVT_KIND_KV:
    case KVT_KIND_ROTATING: return kv[i];
    case KVT_KIND_QKV:
    case KVT_KIND_ROTATING_QKV: return q[i];
    case KVT_KIND_TURBOQUANT: return tq[i];
    default: return ssm[i];
    }
}

#define BAD(...) kvt_fail(-EINVAL, __VA_ARGS__)

static int want_dtype(const char *what, int kind, const struct kvt_tensor *t, int i, int dtype)
{
    if (t[i].dtype != dtype)
        return BAD("%s: %s dtype %s, expected %s", what, role(kind, i), kvt_dtype_name(t[i].dtype),
                   kvt_dtype_name(dtype));
    return 0;
}

static int want_last(const char *what, int kind, const struct kvt_tensor *t, int i, int64_t d)
{
    if (t[i].shape[t[i].rank - 1] != d)
        return BAD("%s: %s last dimension %lld, expected %lld", what, role(kind, i),
                   (long long)t[i].shape[t[i].rank - 1], (long long)d);
    return 0;
}

static int check_qkv_triple(const char *what, const struct kvt_cache_info *p,
                            const struct kvt_tensor *t, int j)
{
    int rc = want_dtype(what, p->kind, t, j, KVT_UINT32);
    if (rc)
        return rc;
    if (!kvt_dtype_is_activation(t[j + 1].dtype))
        return BAD("%s: %s dtype %s is not an activation dtype", what, role(p->kind, j + 1),
                   kvt_dtype_name(t[j + 1].dtype));
    rc = want_dtype(what, p->kind, t, j + 2, t[j + 1].dtype);
    if (!rc)
        rc = want_last(what, p->kind, t, j + 2, t[j + 1].shape[3]);
    if (rc)
        return rc;
    /* packedLast · 32 = scalesLast · groupSize · bits (FORMAT.md V19) */
    int64_t lhs, rhs;
    if (__builtin_mul_overflow(t[j].shape[3], 32, &lhs) ||
        __builtin_mul_overflow(t[j + 1].shape[3], p->group_size * p->bits, &rhs) || lhs != rhs)
        return BAD("%s: %s last dimension %lld does not match %s %lld at groupSize %lld, bits %lld",
                   what, role(p->kind, j), (long long)t[j].shape[3], role(p->kind, j + 1),
                   (long long)t[j + 1].shape[3], (long long)p->group_size, (long long)p->bits);
    return 0;
}

static int check_turboquant(const char *what, const struct kvt_cache_info *p,
                            const struct kvt_tensor *t)
{
    int64_t hd = p->head_dim ? p->head_dim : t[1].shape[3] > 512 ? -1 : t[1].shape[3] * 32;
    if (!tq_head_dim_ok(hd))
        return BAD("%s: headDim %lld not in {64, 128, 256, 512}", what, (long long)hd);
    int rc = want_dtype(what, p->kind, t, 0, p->k_bits == 8 ? KVT_INT8 : KVT_UINT8);
    if (!rc)
        rc = want_last(what, p->kind, t, 0, hd * p->k_bits / 8);
    for (int i = 1; i <= 4 && !rc; i++) {
        if (i == 3)
            continue;
        rc = want_dtype(what, p->kind, t, i, KVT_FLOAT16);
        if (!rc)
            rc = want_last(what, p->kind, t, i, hd / 32);
    }
    if (!rc)
        rc = want_dtype(what, p->kind, t, 3, KVT_UINT8);
    if (!rc)
        rc = want_last(what, p->kind, t, 3, hd * p->v_bits / 8);
    return rc;
}

/*
 * The roles of one tensor set of kind p->kind: counts, ranks, agreeing B, H and token axis,
 * dtypes, last dimensions. *rows receives the token-axis length (0 for ssm).
 */
static int check_set(const char *what, const struct kvt_cache_info *p, const struct kvt_tensor *t,
                     int nt, int64_t *rows)
{
    int want = kvt_kind_tensor_count(p->kind);
    if (!t || nt != want)
        return BAD("%s: %d tensors, expected %d", what, t ? nt : 0, want);
    for (int i = 0; i < nt; i++) {
        int rc = kvt_tensor_check(&t[i]);
        if (rc)
            return kvt_fail(rc, "%s: %s: %s", what, role(p->kind, i), kvt_last_error());
        int rank = p->kind == KVT_KIND_SSM && i == 0 ? 3 : 4;
        if (t[i].rank != rank)
            return BAD("%s: %s has rank %d, expected %d", what, role(p->kind, i), t[i].rank, rank);
    }
    *rows = 0;
    if (p->kind == KVT_KIND_SSM) {
        for (int i = 0; i < 2; i++)
            if (!kvt_dtype_is_activation(t[i].dtype))
                return BAD("%s: %s dtype %s is not an activation dtype", what, role(p->kind, i),
                           kvt_dtype_name(t[i].dtype));
        if (t[0].shape[0] != t[1].shape[0])
            return BAD("%s: conv batch %lld != recurrent batch %lld", what,
                       (long long)t[0].shape[0], (long long)t[1].shape[0]);
        return 0;
    }
    for (int i = 1; i < nt; i++)
        for (int ax = 0; ax < 3; ax++)
            if (t[i].shape[ax] != t[0].shape[ax])
                return BAD("%s: %s axis %d is %lld, %s has %lld", what, role(p->kind, i), ax,
                           (long long)t[i].shape[ax], role(p->kind, 0), (long long)t[0].shape[ax]);
    *rows = t[0].shape[2];
    switch (p->kind) {
    case KVT_KIND_KV:
    case KVT_KIND_ROTATING:
        if (!kvt_dtype_is_activation(t[0].dtype))
            return BAD("%s: K dtype %s is not an activation dtype", what,
                       kvt_dtype_name(t[0].dtype));
        return want_dtype(what, p->kind, t, 1, t[0].dtype);
    case KVT_KIND_QKV:
    case KVT_KIND_ROTATING_QKV: {
        int rc = check_qkv_triple(what, p, t, 0);
        return rc ? rc : check_qkv_triple(what, p, t, 3);
    }
    default: return check_turboquant(what, p, t);
    }
}

int kvt_cache_check_host(const char *what, const kvt_cache *c, const struct kvt_tensor *in, int nin)
{
    for (int i = 0; i < nin; i++)
        if (kvt_tensor_on_device(&in[i]))
            return kvt_fail(KVT_E_UNSUPPORTED, "%s: the input is in device memory", what);
    for (int i = 0; c && c->has_buf && i < c->nt; i++)
        if (kvt_tensor_on_device(&c->a[i].t))
            return kvt_fail(KVT_E_UNSUPPORTED,
                            "%s: the cache is in device memory (it can be "
                            "saved, not changed)",
                            what);
    return 0;
}

int kvt_cache_check_input(const kvt_cache *c, const struct kvt_tensor *in, int nin)
{
    const char *name = kvt_kind_name(c->info.kind);
    char what[64];
    snprintf(what, sizeof(what), "%s append", name);
    if (c->info.kind == KVT_KIND_SSM)
        return BAD("ssm append: use kvt_cache_ssm_update()");
    int64_t l;
    int rc = check_set(what, &c->info, in, nin, &l);
    if (rc == 0)
        rc = kvt_cache_check_host(what, c, in, nin);
    if (rc)
        return rc;
    if (l < 1)
        return BAD("%s: no tokens (L = %lld)", what, (long long)l);
    if (!c->has_buf)
        return 0;
    for (int i = 0; i < nin; i++) {
        const struct kvt_tensor *h = &c->a[i].t;
        if (in[i].dtype != h->dtype)
            return BAD("%s: %s dtype %s, the cache holds %s", what, role(c->info.kind, i),
                       kvt_dtype_name(in[i].dtype), kvt_dtype_name(h->dtype));
        static const int axes[] = {0, 1, 3};
        for (int k = 0; k < 3; k++)
            if (in[i].shape[axes[k]] != h->shape[axes[k]])
                return BAD("%s: %s axis %d is %lld, the cache holds %lld", what,
                           role(c->info.kind, i), axes[k], (long long)in[i].shape[axes[k]],
                           (long long)h->shape[axes[k]]);
    }
    return 0;
}

/* Tensors of one cache must not overlap: each is written independently. */
static int check_disjoint(const char *what, int kind, const struct kvt_tensor *t, int nt)
{
    for (int i = 0; i < nt; i++) {
        size_t lo_i, hi_i;
        kvt_tensor_extent(&t[i], &lo_i, &hi_i);
        for (int j = i + 1; j < nt; j++) {
            size_t lo_j, hi_j;
            if (t[i].buf != t[j].buf)
                continue;
            kvt_tensor_extent(&t[j], &lo_j, &hi_j);
            if (lo_i < hi_i && lo_j < hi_j && lo_i < hi_j && lo_j < hi_i)
                return BAD("%s: %s and %s overlap in one buffer", what, role(kind, i),
                           role(kind, j));
        }
    }
    return 0;
}

int kvt_cache_check_tensors(const char *what, const struct kvt_cache_info *info,
                            const struct kvt_tensor *t, int nt)
{
    int64_t rows;
    int rc = check_set(what, info, t, nt, &rows);
    return rc ? rc : check_disjoint(what, info->kind, t, nt);
}

int kvt_cache_check_state(const struct kvt_cache_info *info, const struct kvt_tensor *t, int nt)
{
    int rc = kvt_cache_check_params(info);
    if (rc)
        return rc;
    char what[64];
    snprintf(what, sizeof(what), "%s cache from tensors", kvt_kind_name(info->kind));
    if (info->offset < 0)
        return BAD("%s: offset %lld < 0", what, (long long)info->offset);
    if (info->kind == KVT_KIND_TURBOQUANT && !tq_head_dim_ok(info->head_dim))
        return BAD("%s: headDim %lld not in {64, 128, 256, 512}", what, (long long)info->head_dim);
    int64_t rows;
    rc = check_set(what, info, t, nt, &rows);
    if (rc)
        return rc;
    if (kvt_kind_is_step(info->kind) && rows < info->offset)
        return BAD("%s: %lld rows hold fewer than offset %lld tokens", what, (long long)rows,
                   (long long)info->offset);
    if (kvt_kind_is_ring(info->kind)) {
        if (rows < 1)
            return BAD("%s: ring of %lld rows", what, (long long)rows);
        if (info->idx < 0 || info->idx > rows)
            return BAD("%s: idx %lld outside [0, %lld]", what, (long long)info->idx,
                       (long long)rows);
        if (info->offset < info->max_size && rows < info->offset)
            return BAD("%s: ring of %lld rows before wrapping at offset %lld", what,
                       (long long)rows, (long long)info->offset);
    }
    return check_disjoint(what, info->kind, t, nt);
}
