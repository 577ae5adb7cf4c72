/*
 * Composing a shared entry from chunks held in memory (the remote tier's objects,
 * docs/SHARING.md): the tail, loaded and checked, gives the layout; one destination of the
 * whole entry's rows (with restore capacity) per token-axis tensor is allocated with the
 * tail's rows copied to its end; each chunk that arrives is checked against the entry and
 * given its rows; the end replaces the tail's cut layers by the whole ones. A restore from
 * files goes through share_load.c instead, all its files read as one load.
 */
#include "store/share.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "format/format.h"
#include "io/stream.h"
#include "tensor/tensor_parts.h"
#include "threads/restore_helper.h"

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

/* Destinations of @p n rows (with restore capacity) shaped like the tail layer @p c: every
 * row below n is filled by the tail and the chunks, the capacity slack must read zero. */
static int composed_new(struct composed *d, const kvt_cache *c, int64_t n)
{
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
    int nt = kvt_cache_state(c, st), rc = nt < 0 ? nt : 0;
    for (int j = 0; j < nt; j++) {
        int64_t shape[KVT_MAX_RANK], cap = (int64_t)kvt_restore_cap((uint64_t)n);
        memcpy(shape, st[j].shape, sizeof(shape));
        shape[2] = cap;
        size_t row = kvt_dtype_size(st[j].dtype) * (size_t)shape[3], bytes;
        size_t blocks = (size_t)(shape[0] * shape[1]);
        kvt_buf *b = NULL;
        /* the tail's header sets n: a size past memory is that file's fault */
        if (rc == 0 && (__builtin_mul_overflow(blocks, (size_t)cap, &bytes) ||
                        __builtin_mul_overflow(bytes, row, &bytes)))
            rc = kvt_fail(KVT_E_CORRUPT, "a tail of %lld tokens does not fit in memory",
                          (long long)n);
        if (rc == 0)
            rc = kvt_buf_new_for_fill(bytes, &b);
        if (rc == 0 && (rc = kvt_tensor_init(&d->t[j], b, 0, st[j].dtype, 4, shape)) == 0)
            d->nt = j + 1;
        for (size_t k = 0; rc == 0 && !kvt_buf_zeroed(b) && k < blocks; k++)
            memset((uint8_t *)kvt_buf_data(b) + (k * (size_t)cap + (size_t)n) * row, 0,
                   (size_t)(cap - n) * row);
        kvt_buf_unref(b);
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

/* Whether slot @p sj of chunk cache @p ch (256 rows) fits the destination @p t. */
static bool slot_fits(const struct kvt_cache_header *ch, int sj, const struct kvt_tensor *t)
{
    const struct kvt_slot *sl = &ch->slots[sj];
    return sl->dtype == t->dtype && sl->rank == 4 && sl->shape[0] == t->shape[0] &&
           sl->shape[1] == t->shape[1] && sl->shape[2] == KVT_SHARE_CHUNK &&
           sl->shape[3] == t->shape[3];
}

/* Whether the chunk of header @p h fits rows [256k, 256(k + 1)) of the tail @p t: its tokens,
 * then one cache of the same kind, 256 rows and tensor shapes per cut layer, in order. */
static int chunk_fits(const struct kvt_entry *t, const struct composed *c,
                      const struct kvt_header *h, size_t k, const char *path)
{
    if (h->n_tokens != KVT_SHARE_CHUNK ||
        memcmp(h->tokens, t->tokens + k * KVT_SHARE_CHUNK, KVT_SHARE_CHUNK * sizeof(int32_t)))
        return kvt_fail(KVT_E_CORRUPT, "%s: the chunk's tokens are not the entry's", path);
    size_t j = 0;
    for (size_t i = 0; i < t->n_caches; i++) {
        if (!c[i].nt)
            continue;
        struct kvt_cache_info want;
        kvt_cache_get_info(t->caches[i], &want);
        const struct kvt_cache_header *ch = j < h->n_caches ? &h->caches[j] : NULL;
        bool ok = ch && ch->info.kind == want.kind && ch->info.offset == KVT_SHARE_CHUNK &&
                  ch->info.bits == want.bits && ch->info.group_size == want.group_size &&
                  ch->n_slots == c[i].nt;
        for (int sj = 0; ok && sj < ch->n_slots; sj++)
            ok = slot_fits(ch, sj, &c[i].t[sj]);
        if (!ok)
            return kvt_fail(KVT_E_CORRUPT, "%s: the chunk's layer %zu does not fit the entry", path,
                            j);
        j++;
    }
    return j == h->n_caches ? 0
                            : kvt_fail(KVT_E_CORRUPT,
                                       "%s: the chunk has %zu layers, the entry "
                                       "cuts %zu",
                                       path, h->n_caches, j);
}

/* Where each slot of a fitting chunk goes: rows [256k, 256(k + 1)) of every [B, H] block of
 * its destination, the rows around them left as they are (zeroed: untouched slack). */
static void chunk_dsts(const struct kvt_entry *t, const struct composed *c, size_t k,
                       struct kvt_slot_dst *d)
{
    size_t o = 0;
    for (size_t i = 0; i < t->n_caches; i++)
        for (int sj = 0; sj < c[i].nt; sj++) {
            const struct kvt_tensor *dt = &c[i].t[sj];
            size_t row = kvt_dtype_size(dt->dtype) * (size_t)dt->shape[3];
            size_t at = k * KVT_SHARE_CHUNK * row, tail = kvt_buf_small_tail(dt->buf);
            d[o++] = (struct kvt_slot_dst){
                .dst = (uint8_t *)kvt_buf_data(dt->buf) + at,
                .blocks = (uint64_t)(dt->shape[0] * dt->shape[1]),
                .stride = (uint64_t)dt->shape[2] * row,
                .small_tail = tail == SIZE_MAX ? UINT64_MAX
                              : tail > at      ? tail - at
                                               : 0,
                .zeroed = true,
            };
        }
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

struct kvt_share_compose {
    struct composed *c;
    size_t n;
};

int kvt_share_compose_new(const struct kvt_entry *t, const char *name,
                          struct kvt_share_compose **out)
{
    *out = calloc(1, sizeof(**out));
    if (!*out)
        return -ENOMEM;
    int rc = tail_layout(t, name, &(*out)->c);
    (*out)->n = t->n_caches;
    if (rc < 0) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

int kvt_share_compose_place(struct kvt_share_compose *sc, const struct kvt_entry *t, size_t k,
                            const struct kvt_header *h, struct kvt_slot_dst *d, size_t n,
                            const char *name)
{
    size_t slots = 0;
    for (size_t i = 0; i < t->n_caches; i++)
        slots += (size_t)sc->c[i].nt;
    int rc = chunk_fits(t, sc->c, h, k, name);
    if (rc == 0 && n != slots)
        rc = kvt_fail(KVT_E_CORRUPT, "%s: %zu tensors where the entry cuts %zu", name, n, slots);
    if (rc == 0)
        chunk_dsts(t, sc->c, k, d);
    return rc;
}

struct kvt_restore_helper *kvt_share_compose_prefault(struct kvt_share_compose *sc)
{
    struct kvt_restore_helper *pf = NULL;
    for (size_t i = 0; i < sc->n; i++)
        for (int j = 0; j < sc->c[i].nt; j++) {
            void *p = kvt_buf_data(sc->c[i].t[j].buf);
            size_t len = kvt_tensor_nbytes(&sc->c[i].t[j]);
            if (len < KVT_PREFAULT_MIN || !kvt_restore_helper_wanted(p, len))
                continue;
            if (!pf && !(pf = kvt_restore_helper_start()))
                return NULL;
            kvt_restore_helper_add(pf, p, len);
        }
    return pf;
}

int kvt_share_compose_end(struct kvt_share_compose *sc, struct kvt_entry *t)
{
    int rc = compose(t, sc->c);
    kvt_share_compose_free(sc);
    return rc;
}

void kvt_share_compose_free(struct kvt_share_compose *sc)
{
    if (!sc)
        return;
    composed_free(sc->c, sc->n);
    free(sc);
}
