/*
 * Loading an entry kept as shared chunks plus its tail (docs/SHARING.md §4): the tail is
 * loaded and checked first, then one destination of the whole entry's rows (with restore
 * capacity) per token-axis tensor, then each chunk, loaded and hash-checked like any file,
 * copied into its rows. At most the entry plus one chunk is held at once.
 */
#include "store/share.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "format/format.h"
#include "tensor/tensor.h"

/** The whole entry's token-axis tensors being filled: one set per cut layer. */
struct composed {
    struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
    int nt;
};

static void composed_free(struct composed *c, size_t n)
{
    for (size_t i = 0; c && i < n; i++)
        for (int j = 0; j < c[i].nt; j++)
            kvt_tensor_release(&c[i].t[j]);
    free(c);
}

/* Copy the state of @p src (rows [0, offset)) into rows [a, ...) of @p dst. */
static int place_rows(struct composed *dst, const kvt_cache *src, int64_t a, const char *name)
{
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
    int nt = kvt_cache_state(src, st);
    if (nt != dst->nt) {
        for (int j = 0; j < nt; j++)
            kvt_tensor_release(&st[j]);
        return kvt_fail(KVT_E_CORRUPT, "%s: a layer's tensors do not match the tail's", name);
    }
    int rc = 0;
    for (int j = 0; j < nt; j++) {
        struct kvt_tensor view;
        if (rc == 0)
            rc = kvt_tensor_slice(&view, &dst->t[j], 2, a, a + st[j].shape[2]);
        if (rc == 0) {
            rc = kvt_tensor_copy(&view, &st[j]);
            kvt_tensor_release(&view);
        }
        kvt_tensor_release(&st[j]);
    }
    return rc ? kvt_fail(KVT_E_CORRUPT, "%s: a layer's rows do not fit the tail's", name) : 0;
}

/* Destinations of @p n rows (with restore capacity) shaped like the tail layer @p c. */
static int composed_new(struct composed *d, const kvt_cache *c, int64_t n)
{
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
    int nt = kvt_cache_state(c, st), rc = nt < 0 ? nt : 0;
    for (int j = 0; j < nt; j++) {
        int64_t shape[KVT_MAX_RANK];
        memcpy(shape, st[j].shape, sizeof(shape));
        shape[2] = (int64_t)kvt_restore_cap((uint64_t)n);
        if (rc == 0 && (rc = kvt_tensor_zeros(&d->t[j], st[j].dtype, st[j].rank, shape)) == 0)
            d->nt = j + 1;
        kvt_tensor_release(&st[j]);
    }
    return rc;
}

/* Check the tail @p t and allocate the destinations of its cut layers. */
static int tail_layout(const struct kvt_entry *t, const char *path, struct composed **out)
{
    int64_t n = (int64_t)t->n_tokens,
            own = n - (int64_t)(kvt_share_chunks(t->n_tokens) * KVT_SHARE_CHUNK);
    struct composed *c = calloc(t->n_caches ? t->n_caches : 1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    int rc = kvt_share_chunks(t->n_tokens) ? 0
                                           : kvt_fail(KVT_E_CORRUPT,
                                                      "%s: a tail of %zu tokens "
                                                      "has no chunks",
                                                      path, t->n_tokens);
    for (size_t i = 0; i < t->n_caches && rc == 0; i++) {
        struct kvt_cache_info info;
        kvt_cache_get_info(t->caches[i], &info);
        if (!kvt_share_splits(info.kind))
            continue;
        if (info.offset != own)
            rc = kvt_fail(KVT_E_CORRUPT, "%s: caches[%zu] holds %lld rows, the tail %lld", path, i,
                          (long long)info.offset, (long long)own);
        if (rc == 0)
            rc = composed_new(&c[i], t->caches[i], n);
        if (rc == 0)
            rc = place_rows(&c[i], t->caches[i], n - own, path);
    }
    if (rc < 0) {
        composed_free(c, t->n_caches);
        return rc;
    }
    *out = c;
    return 0;
}

/* Whether chunk @p ch fits rows [256k, 256(k + 1)) of the tail @p t: its tokens, then one
 * cache of the same kind and 256 rows per cut layer of the tail, in order. */
static int chunk_fits(const struct kvt_entry *t, const struct kvt_entry *ch, size_t k,
                      const char *path)
{
    if (ch->n_tokens != KVT_SHARE_CHUNK ||
        memcmp(ch->tokens, t->tokens + k * KVT_SHARE_CHUNK, KVT_SHARE_CHUNK * sizeof(int32_t)))
        return kvt_fail(KVT_E_CORRUPT, "%s: the chunk's tokens are not the entry's", path);
    size_t j = 0;
    for (size_t i = 0; i < t->n_caches; i++) {
        struct kvt_cache_info want, got;
        kvt_cache_get_info(t->caches[i], &want);
        if (!kvt_share_splits(want.kind))
            continue;
        if (j < ch->n_caches)
            kvt_cache_get_info(ch->caches[j], &got);
        if (j >= ch->n_caches || got.kind != want.kind || got.offset != KVT_SHARE_CHUNK ||
            got.bits != want.bits || got.group_size != want.group_size)
            return kvt_fail(KVT_E_CORRUPT, "%s: the chunk's layer %zu does not fit the entry", path,
                            j);
        j++;
    }
    return j == ch->n_caches ? 0
                             : kvt_fail(KVT_E_CORRUPT,
                                        "%s: the chunk has %zu layers, the entry "
                                        "cuts %zu",
                                        path, ch->n_caches, j);
}

struct load_job {
    const struct kvt_entry *t;
    const char *dir;
    const struct kvt_expect *x;
    struct composed *c;
    char **bad;
};

/* Load chunk @p k of the tail and copy its rows into place; j->bad names it on failure. */
static int load_chunk(void *ud, size_t k, const char *id)
{
    struct load_job *j = ud;
    char *path = kvt_share_chunk_path(j->dir, id);
    if (!path)
        return -ENOMEM;
    struct kvt_expect cx = *j->x;
    cx.n_layers = 0; /* a chunk holds only the cut layers */
    struct kvt_entry *ch = NULL;
    int rc = kvt_file_load(path, &cx, &ch, NULL);
    if (rc == 0)
        rc = chunk_fits(j->t, ch, k, path);
    for (size_t i = 0, n = 0; rc == 0 && i < j->t->n_caches; i++)
        if (j->c[i].nt)
            rc = place_rows(&j->c[i], ch->caches[n++], (int64_t)(k * KVT_SHARE_CHUNK), path);
    kvt_entry_free(ch);
    if (rc < 0 && j->bad)
        *j->bad = path;
    else
        free(path);
    return rc;
}

/* Replace the cut layers of @p t with caches of the whole entry over @p c. */
static int compose(struct kvt_entry *t, struct composed *c)
{
    for (size_t i = 0; i < t->n_caches; i++) {
        if (!c[i].nt)
            continue;
        struct kvt_cache_info info;
        kvt_cache_get_info(t->caches[i], &info);
        info.offset = (int64_t)t->n_tokens;
        kvt_cache *whole;
        int rc = kvt_cache_from_state(&info, c[i].t, c[i].nt, &whole);
        if (rc < 0)
            return rc;
        kvt_cache_free(t->caches[i]);
        t->caches[i] = whole;
    }
    return 0;
}

static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
}

int kvt_share_load(const char *tail_path, const struct kvt_expect *x, struct kvt_entry **out,
                   char **bad_chunk)
{
    *out = NULL;
    if (bad_chunk)
        *bad_chunk = NULL;
    struct kvt_entry *t = NULL;
    struct composed *c = NULL;
    char *dir = dir_of(tail_path);
    int rc = dir ? kvt_file_load(tail_path, x, &t, NULL) : -ENOMEM;
    if (rc == 0)
        rc = tail_layout(t, tail_path, &c);
    struct load_job j = {t, dir, x, c, bad_chunk};
    if (rc == 0)
        rc = kvt_share_each_chunk(t->tokens, t->n_tokens, load_chunk, &j);
    if (rc == 0)
        rc = compose(t, c);
    composed_free(c, t ? t->n_caches : 0);
    free(dir);
    if (rc < 0) {
        kvt_entry_free(t);
        return rc;
    }
    *out = t;
    return 0;
}
