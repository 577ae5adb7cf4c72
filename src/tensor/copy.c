/*
 * Row-major traversal of strided views as a short list of contiguous byte runs, and the
 * copies built on it (copy out, copy in, view to view, contiguous copy, hashing). Inner
 * dimensions that are contiguous in every view involved are merged into one memcpy, and
 * outer dimensions that chain are folded, so the per-run overhead stays negligible.
 */
#include "common/error.h"
#include "tensor/tensor_parts.h"

#include <errno.h>
#include <string.h>

#define MAX_VIEWS 2

struct run_plan {
    size_t run;   /* bytes per run */
    size_t nruns; /* 0 for an empty tensor */
    int outer;    /* outer dimensions iterated, outermost first */
    int64_t shape[KVT_MAX_RANK];
    int64_t step[MAX_VIEWS][KVT_MAX_RANK]; /* byte strides per view */
};

/*
 * Plan runs over @p nv views of one shape given by (shape, strides[v]) with item size
 * @p item. Dimensions of extent 1 are dropped; the innermost dimensions merge while every
 * view is contiguous across them.
 */
static void plan_runs(struct run_plan *p, int rank, const int64_t *shape, int nv,
                      const int64_t *const *strides, size_t item)
{
    int64_t sh[KVT_MAX_RANK], st[MAX_VIEWS][KVT_MAX_RANK];
    int n = 0;
    size_t numel = 1;
    for (int i = 0; i < rank; i++) {
        numel *= (size_t)shape[i];
        if (shape[i] == 1)
            continue;
        sh[n] = shape[i];
        for (int v = 0; v < nv; v++)
            st[v][n] = strides[v][i];
        n++;
    }
    memset(p, 0, sizeof(*p));
    if (numel == 0)
        return;
    int64_t inner = 1;
    while (n > 0) {
        bool ok = true;
        for (int v = 0; v < nv; v++)
            ok = ok && st[v][n - 1] == inner;
        if (!ok)
            break;
        inner *= sh[n - 1];
        n--;
    }
    int m = 0;
    for (int i = 0; i < n; i++) {
        p->shape[m] = sh[i];
        for (int v = 0; v < nv; v++)
            p->step[v][m] = st[v][i] * (int64_t)item;
        m++;
    }
    /* fold outer dimension i into the previous one when that one steps exactly over i */
    int w = 0;
    for (int i = 0; i < m; i++) {
        if (w > 0) {
            bool chain = true;
            for (int v = 0; v < nv; v++)
                chain = chain && p->step[v][w - 1] == p->step[v][i] * p->shape[i];
            if (chain) {
                p->shape[w - 1] *= p->shape[i];
                for (int v = 0; v < nv; v++)
                    p->step[v][w - 1] = p->step[v][i];
                continue;
            }
        }
        p->shape[w] = p->shape[i];
        for (int v = 0; v < nv; v++)
            p->step[v][w] = p->step[v][i];
        w++;
    }
    p->outer = w;
    p->run = (size_t)inner * item;
    p->nruns = numel / (size_t)inner;
}

/* Advance the odometer of @p p; off[v] follows the byte offset of each view. */
static inline void plan_next(const struct run_plan *p, int64_t *idx, int nv, int64_t *off)
{
    for (int j = p->outer - 1; j >= 0; j--) {
        for (int v = 0; v < nv; v++)
            off[v] += p->step[v][j];
        if (++idx[j] < p->shape[j])
            return;
        for (int v = 0; v < nv; v++)
            off[v] -= p->step[v][j] * p->shape[j];
        idx[j] = 0;
    }
}

static void plan_one(struct run_plan *p, const struct kvt_tensor *t)
{
    const int64_t *st[1] = {t->strides};
    plan_runs(p, t->rank, t->shape, 1, st, kvt_dtype_size(t->dtype));
}

static int walk(const struct kvt_tensor *t, kvt_run_fn fn, void *ud)
{
    const struct kvt_buf_ext *x = kvt_buf_ext_of(t->buf);
    if (x) /* contiguous (kvt_tensor_check): its bytes in order, a host copy at a time */
        return x->read_out(x->ctx, x->addr + t->offset, kvt_tensor_nbytes(t), fn, ud);
    struct run_plan p;
    plan_one(&p, t);
    const char *base = (const char *)kvt_buf_data(t->buf) + t->offset;
    int64_t idx[KVT_MAX_RANK] = {0}, off[1] = {0};
    for (size_t r = 0; r < p.nruns; r++) {
        int rc = fn(ud, base + off[0], p.run);
        if (rc)
            return rc;
        plan_next(&p, idx, 1, off);
    }
    return 0;
}

int kvt_tensor_for_each_run(const struct kvt_tensor *t, kvt_run_fn fn, void *ud)
{
    if (!t || !t->buf || !fn)
        return 0;
    return walk(t, fn, ud);
}

struct mut_call {
    kvt_run_mut_fn fn;
    void *ud;
};

static int call_mut(void *ud, const void *p, size_t n)
{
    struct mut_call *m = ud;
    return m->fn(m->ud, (void *)p, n);
}

int kvt_tensor_for_each_run_mut(const struct kvt_tensor *t, kvt_run_mut_fn fn, void *ud)
{
    if (!t || !t->buf || !fn)
        return 0;
    if (kvt_tensor_on_device(t))
        return kvt_fail(KVT_E_UNSUPPORTED, "tensor: device memory cannot be written in place");
    struct mut_call m = {fn, ud};
    return walk(t, call_mut, &m);
}

size_t kvt_tensor_run_bytes(const struct kvt_tensor *t)
{
    if (!t || !t->buf)
        return 0;
    struct run_plan p;
    plan_one(&p, t);
    return p.nruns ? p.run : 0;
}

/* Append one run to the flat block being filled. */
static int append_run(void *ud, const void *p, size_t n)
{
    char **f = ud;
    memcpy(*f, p, n);
    *f += n;
    return 0;
}

void kvt_tensor_copy_out(const struct kvt_tensor *src, void *dst)
{
    char *f = dst;
    if (src && dst && src->buf)
        walk(src, append_run, &f); /* device memory: downloaded, a staging slot at a time */
}

/* Fill one run from the flat block being read. */
static int fill_run(void *ud, void *p, size_t n)
{
    const char **f = ud;
    memcpy(p, *f, n);
    *f += n;
    return 0;
}

void kvt_tensor_copy_in(const struct kvt_tensor *dst, const void *src)
{
    const char *f = src;
    if (dst && src && dst->buf)
        kvt_tensor_for_each_run_mut(dst, fill_run, &f); /* never into device memory */
}

int kvt_tensor_copy(const struct kvt_tensor *dst, const struct kvt_tensor *src)
{
    if (!dst || !src || !dst->buf || !src->buf)
        return kvt_fail(-EINVAL, "kvt_tensor_copy: NULL tensor");
    if (kvt_tensor_on_device(dst) || kvt_tensor_on_device(src))
        return kvt_fail(KVT_E_UNSUPPORTED, "kvt_tensor_copy: a tensor in device memory");
    size_t item = kvt_dtype_size(src->dtype);
    if (!item || item != kvt_dtype_size(dst->dtype) || dst->rank != src->rank)
        return kvt_fail(-EINVAL, "kvt_tensor_copy: dtype or rank differs");
    for (int i = 0; i < src->rank; i++)
        if (dst->shape[i] != src->shape[i])
            return kvt_fail(-EINVAL, "kvt_tensor_copy: extent %lld != %lld on axis %d",
                            (long long)dst->shape[i], (long long)src->shape[i], i);
    struct run_plan p;
    const int64_t *st[2] = {dst->strides, src->strides};
    plan_runs(&p, src->rank, src->shape, 2, st, item);
    char *d = (char *)kvt_buf_data(dst->buf) + dst->offset;
    const char *s = (const char *)kvt_buf_data(src->buf) + src->offset;
    int64_t idx[KVT_MAX_RANK] = {0}, off[2] = {0, 0};
    for (size_t r = 0; r < p.nruns; r++) {
        memmove(d + off[0], s + off[1], p.run);
        plan_next(&p, idx, 2, off);
    }
    return 0;
}

int kvt_tensor_contiguous(struct kvt_tensor *dst, const struct kvt_tensor *src)
{
    if (!dst)
        return kvt_fail(-EINVAL, "kvt_tensor_contiguous: dst is NULL");
    int rc = kvt_tensor_check(src);
    if (rc) {
        if (dst != src)
            memset(dst, 0, sizeof(*dst));
        return rc;
    }
    kvt_buf *b;
    rc = kvt_buf_new_uninit(kvt_tensor_nbytes(src), &b);
    if (rc) {
        if (dst != src)
            memset(dst, 0, sizeof(*dst));
        return rc;
    }
    kvt_tensor_copy_out(src, kvt_buf_data(b));
    struct kvt_tensor v;
    rc = kvt_tensor_init(&v, b, 0, src->dtype, src->rank, src->shape);
    kvt_buf_unref(b);
    if (rc) {
        if (dst != src)
            memset(dst, 0, sizeof(*dst));
        return rc;
    }
    if (dst == src)
        kvt_tensor_release(dst);
    *dst = v;
    return 0;
}

static int hash_run(void *ud, const void *p, size_t n)
{
    kvt_wyhash_update(ud, p, n);
    return 0;
}

uint64_t kvt_tensor_hash(const struct kvt_tensor *t)
{
    struct kvt_wyhash_state st;
    kvt_wyhash_init(&st, 0);
    kvt_tensor_for_each_run(t, hash_run, &st);
    return kvt_wyhash_final(&st);
}
