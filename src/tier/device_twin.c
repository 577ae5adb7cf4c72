/*
 * The RAM tier over device entries (kvt_pcache_opts.device): an entry put from device memory
 * is copied into the device's page-locked pool (straight on the device's queue, off the
 * caller's stream) and held there as a host entry, which the write-behind saves like any
 * other; a take copies the taken prefix from the pool into the device memory the caller
 * places, and a disk hit streams its prefix from the file straight into that memory. A disk or
 * remote hit so landed is copied back into the pool after the take, for RAM to keep.
 */
#include "tier/device_twin.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache_parts.h"
#include "common/error.h"
#include "device/device_parts.h"
#include "store/share.h"
#include "tensor/tensor_parts.h"

struct kvt_tier_dev {
    kvt_device *d;
    struct kvt_dpool *pool;
    /* The host copy of the last disk or remote hit taken into device memory, its copies
     * queued on the device's stream with ring slot keep_slot's event after them; NULL when
     * none. */
    pthread_mutex_t keep_mu;
    struct kvt_entry *keep;
    unsigned keep_slot;
    /* A disk hit before the pool exists keeps nothing: pinning it would hold up the take;
     * it is allocated on this thread instead, for the hits after it. */
    pthread_t prep;
    bool prep_started;
};

static void *prepare_pool(void *arg)
{
    struct kvt_tier_dev *t = arg;
    kvt_dpool_prepare(t->pool); /* a failure shows at the next use of the pool */
    return NULL;
}

int kvt_tier_dev_new(kvt_device *d, size_t pool_bytes, struct kvt_tier_dev **out)
{
    *out = NULL;
    struct kvt_tier_dev *t = calloc(1, sizeof(*t));
    if (!t)
        return kvt_fail(-ENOMEM, "out of memory");
    t->d = d;
    pthread_mutex_init(&t->keep_mu, NULL);
    int rc = kvt_dpool_new(d, pool_bytes, &t->pool);
    if (rc) {
        pthread_mutex_destroy(&t->keep_mu);
        free(t);
        return rc;
    }
    *out = t;
    return 0;
}

static struct kvt_entry *kept(void *ud);

static void dev_close(void *ud)
{
    struct kvt_tier_dev *t = ud;
    kvt_entry_free(kept(t)); /* its copies done: the pool's memory is no longer written */
    if (t->prep_started)
        pthread_join(t->prep, NULL);
    pthread_mutex_destroy(&t->keep_mu);
    kvt_dpool_close(t->pool); /* the region goes with the last buffer still held */
    free(t);
}

/* Whether every tensor of @p e in device memory is in this device's, and one is. */
static bool owns(void *ud, const struct kvt_entry *e)
{
    struct kvt_tier_dev *t = ud;
    size_t ours = 0, others = 0;
    for (size_t i = 0; i < e->n_caches; i++) {
        struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
        int nt = kvt_cache_state(e->caches[i], st);
        for (int k = 0; k < nt; k++) {
            kvt_device *d = kvt_buf_device(st[k].buf, NULL);
            ours += d == t->d;
            others += d && d != t->d;
            kvt_tensor_release(&st[k]);
        }
    }
    return ours > 0 && others == 0;
}

/* Cache @p c in host memory of the pool: copies of its tensors queued into @p cp. */
static int twin_cache(struct kvt_tier_dev *t, const kvt_cache *c, struct kvt_dcopy *cp, size_t *ncp,
                      kvt_cache **out)
{
    struct kvt_cache_info info;
    kvt_cache_get_info(c, &info);
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS], ht[KVT_MAX_CACHE_TENSORS];
    int nt = kvt_cache_state(c, st), made = 0, rc = nt < 0 ? nt : 0;
    for (; rc == 0 && made < nt; made++) {
        uint64_t addr = 0;
        bool on_device = kvt_buf_device(st[made].buf, &addr) != NULL;
        size_t n = kvt_tensor_nbytes(&st[made]);
        kvt_buf *b;
        if ((rc = kvt_dpool_buf(t->pool, n, &b)))
            break;
        rc = kvt_tensor_init(&ht[made], b, 0, st[made].dtype, st[made].rank, st[made].shape);
        if (rc == 0 && on_device)
            cp[(*ncp)++] = (struct kvt_dcopy){kvt_buf_data(b), addr + st[made].offset, n, 1, 0, 0};
        else if (rc == 0) /* a tensor of the entry in host memory */
            kvt_tensor_copy_out(&st[made], kvt_buf_data(b));
        kvt_buf_unref(b);
        if (rc)
            break;
    }
    if (rc == 0)
        rc = kvt_cache_from_state(&info, ht, nt, out);
    for (int k = 0; k < made; k++)
        kvt_tensor_release(&ht[k]);
    for (int k = 0; k < nt; k++)
        kvt_tensor_release(&st[k]);
    return rc;
}

static int to_host(void *ud, const struct kvt_entry *e, struct kvt_entry **out)
{
    struct kvt_tier_dev *t = ud;
    *out = NULL;
    struct kvt_entry *h;
    int rc = kvt_entry_clone(e, &h); /* tokens and meta; its caches are replaced below */
    if (rc)
        return rc;
    struct kvt_dcopy *cp = calloc(e->n_caches * KVT_MAX_CACHE_TENSORS + 1, sizeof(*cp));
    size_t ncp = 0;
    rc = cp ? 0 : kvt_fail(-ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < e->n_caches; i++) {
        kvt_cache *c;
        if ((rc = twin_cache(t, e->caches[i], cp, &ncp, &c)) == 0) {
            kvt_cache_free(h->caches[i]);
            h->caches[i] = c;
        }
    }
    if (rc == 0)
        rc = kvt_device_copies(t->d, cp, ncp, false);
    free(cp);
    if (rc) {
        kvt_entry_free(h);
        return rc;
    }
    *out = h;
    return 0;
}

/* The header of host entry @p e as it lands in device memory: each cache's state, contiguous. */
static int describe(const struct kvt_entry *e, struct kvt_header **out)
{
    *out = NULL;
    struct kvt_header *h = calloc(1, sizeof(*h));
    if (!h || !(h->caches = calloc(e->n_caches + 1, sizeof(*h->caches))) ||
        !(h->tokens = malloc(e->n_tokens * sizeof(*h->tokens) + 1))) {
        kvt_header_free(h);
        return kvt_fail(-ENOMEM, "out of memory");
    }
    h->format_version = 3;
    h->created_at = e->created_at;
    memcpy(h->tokens, e->tokens, e->n_tokens * sizeof(*h->tokens));
    h->n_tokens = e->n_tokens;
    h->n_caches = e->n_caches;
    int rc = 0;
    uint64_t off = 0;
    for (size_t i = 0; rc == 0 && i < e->n_caches; i++) {
        struct kvt_cache_header *c = &h->caches[i];
        kvt_cache_get_info(e->caches[i], &c->info);
        struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
        int nt = kvt_cache_state(e->caches[i], st);
        rc = nt < 0 ? nt : 0;
        for (int k = 0; k < nt; k++) {
            struct kvt_slot *sl = &c->slots[k];
            *sl =
                (struct kvt_slot){off, kvt_tensor_nbytes(&st[k]), st[k].dtype, st[k].rank, {0}, 0};
            memcpy(sl->shape, st[k].shape, sizeof(sl->shape));
            off += sl->bytes;
            kvt_tensor_release(&st[k]);
        }
        c->n_slots = nt > 0 ? nt : 0;
    }
    const char *src[4] = {e->meta.model_id, e->meta.config_fingerprint, e->meta.tokenizer_hash,
                          e->meta.ns};
    char **dst[4] = {&h->model_id, &h->config_fingerprint, &h->tokenizer_hash, &h->ns};
    for (int k = 0; rc == 0 && k < 4; k++)
        if (src[k] && !(*dst[k] = strdup(src[k])))
            rc = kvt_fail(-ENOMEM, "out of memory");
    if (rc) {
        kvt_header_free(h);
        return rc;
    }
    *out = h;
    return 0;
}

/* The runs of one tensor, in order, bound for device memory at dev. */
struct runs {
    struct kvt_tier_dev *t;
    struct kvt_dcopy *cp;
    size_t n, cap;
    size_t first; /* the current slot's first copy: none before it is extended (another
                     allocation, which may lie right before this one's) */
    uint64_t dev;
};

/* Whether run @p p (@p n bytes, bound for @p dev) extends copy @p c by a row: the same width,
 * @p dpitch after its last row on the device, and on the host one pitch after it (the second
 * row sets the pitch). A tensor cut to a prefix is so one strided copy, not a copy a row. */
static bool extends(const struct kvt_dcopy *c, const uint8_t *p, size_t n, uint64_t dev,
                    size_t dpitch)
{
    if (c->n != n || c->dpitch != dpitch || c->dev + c->rows * dpitch != dev)
        return false;
    const uint8_t *last = (const uint8_t *)c->host + (c->rows - 1) * c->pitch;
    return p > last && (c->rows == 1 || (size_t)(p - last) == c->pitch);
}

/* Run @p p of @p n bytes to @p dev, a row of a copy whose rows are @p dpitch apart there. */
static int add_seg(struct runs *r, const void *p, size_t n, uint64_t dev, size_t dpitch)
{
    struct kvt_dcopy *c = r->n > r->first ? &r->cp[r->n - 1] : NULL;
    if (!kvt_dpool_owns(r->t->pool, p)) /* not page-locked: through the staging ring */
        return kvt_device_upload(r->t->d, dev, p, n);
    if (c && extends(c, p, n, dev, dpitch)) {
        if (c->rows == 1)
            c->pitch = (size_t)((const uint8_t *)p - (const uint8_t *)c->host);
        c->rows++;
        return 0;
    }
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 256;
        struct kvt_dcopy *m = realloc(r->cp, cap * sizeof(*m));
        if (!m)
            return kvt_fail(-ENOMEM, "out of memory");
        r->cp = m;
        r->cap = cap;
    }
    r->cp[r->n++] = (struct kvt_dcopy){(void *)p, dev, n, 1, 0, dpitch};
    return 0;
}

static int add_run(void *ud, const void *p, size_t n)
{
    struct runs *r = ud;
    uint64_t dev = r->dev;
    r->dev += n;
    return add_seg(r, p, n, dev, n);
}

/* The copies of cache @p c's slots into the memory dst[*k...] names, into @p r; ends[k]: the
 * copies up to slot k's last. */
static int plan_cache(const kvt_cache *c, const uint64_t *dst, struct runs *r, size_t *ends,
                      size_t *k)
{
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
    int nt = kvt_cache_state(c, st), rc = nt < 0 ? nt : 0;
    for (int j = 0; j < nt; j++, (*k)++) {
        r->dev = dst[*k];
        r->first = r->n;
        if (rc == 0 && dst[*k])
            rc = kvt_tensor_for_each_run(&st[j], add_run, r);
        ends[*k] = r->n;
        kvt_tensor_release(&st[j]);
    }
    return rc;
}

/* A record taken into device memory: a whole entry (m 0, tail the entry), or the first n
 * tokens of a shared one, its tail and m chunks (owned: freed once the copies are done). */
struct taken {
    struct kvt_entry *tail;
    struct kvt_entry **parts;
    size_t m, n;
};

static void taken_free(struct taken *s)
{
    kvt_entry_free(s->tail);
    for (size_t k = 0; k < s->m; k++)
        kvt_entry_free(s->parts[k]);
    free(s->parts);
}

/* Whether @p c is a cut cache of a shared record's tail: every token-axis one is. */
static bool cut_cache(const kvt_cache *c)
{
    struct kvt_cache_info info;
    kvt_cache_get_info(c, &info);
    return kvt_share_splits(info.kind);
}

/* Where the rows of a chunk or tail land in a cut slot: each block's at the next @p dpitch,
 * @p width bytes of them, from @p dev on (@p filled of the current block's written). */
struct piece {
    struct runs *r;
    uint64_t dev;
    size_t width, dpitch, filled;
};

static int add_piece_run(void *ud, const void *p, size_t n)
{
    struct piece *q = ud;
    int rc = 0;
    while (rc == 0 && n) {
        size_t k = q->width - q->filled < n ? q->width - q->filled : n;
        rc = add_seg(q->r, p, k, q->dev + q->filled, q->dpitch);
        p = (const uint8_t *)p + k;
        n -= k;
        if ((q->filled += k) == q->width) {
            q->filled = 0;
            q->dev += q->dpitch;
        }
    }
    return rc;
}

/* Rows [start, n) of a cut slot, those that piece @p c's slot @p s holds, to their rows of the
 * slot at @p dst, which holds n rows a block. */
static int plan_piece(const kvt_cache *c, int s, size_t start, size_t n, uint64_t dst,
                      struct runs *r)
{
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS], rows = {0};
    int nt = kvt_cache_state(c, st);
    int rc = nt > s ? 0 : kvt_fail(-EINVAL, "prompt cache take: a chunk lacks tensor %d", s);
    if (rc == 0) {
        size_t have = (size_t)st[s].shape[2], take = n - start < have ? n - start : have;
        size_t row = kvt_dtype_size(st[s].dtype) * (size_t)st[s].shape[3];
        struct piece q = {r, dst + start * row, take * row, n * row, 0};
        if ((rc = kvt_tensor_slice(&rows, &st[s], 2, 0, (int64_t)take)) == 0 && q.width)
            rc = kvt_tensor_for_each_run(&rows, add_piece_run, &q);
        kvt_tensor_release(&rows);
    }
    kvt_tensors_release(st, nt > 0 ? nt : 0);
    return rc;
}

/* The copies of the slots of cut cache @p j of @p s (the tail's @p tc): each chunk's rows and
 * the tail's straight to their rows of the slot, no join. */
static int plan_cut(const struct taken *s, const kvt_cache *tc, size_t j, const uint64_t *dst,
                    struct runs *r, size_t *ends, size_t *k)
{
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
    int nt = kvt_cache_state(tc, st), rc = nt < 0 ? nt : 0;
    kvt_tensors_release(st, nt > 0 ? nt : 0);
    for (size_t p = 0; rc == 0 && p < s->m; p++)
        if (j >= s->parts[p]->n_caches)
            rc = kvt_fail(-EINVAL, "prompt cache take: chunk %zu lacks cut cache %zu", p, j);
    for (int sl = 0; rc == 0 && sl < nt; sl++, (*k)++) {
        r->first = r->n;
        for (size_t p = 0; rc == 0 && dst[*k] && p <= s->m && p * KVT_SHARE_CHUNK < s->n; p++)
            rc = plan_piece(p < s->m ? s->parts[p]->caches[j] : tc, sl, p * KVT_SHARE_CHUNK, s->n,
                            dst[*k], r);
        ends[*k] = r->n;
    }
    return rc;
}

/* The copies of @p s into the memory @p dst names, into @p r; ends[k]: the copies up to slot
 * k's last. */
static int plan_runs(const struct taken *s, const uint64_t *dst, struct runs *r, size_t *ends)
{
    int rc = 0;
    for (size_t i = 0, j = 0, k = 0; rc == 0 && i < s->tail->n_caches; i++)
        rc = s->m && cut_cache(s->tail->caches[i])
                 ? plan_cut(s, s->tail->caches[i], j++, dst, r, ends, &k)
                 : plan_cache(s->tail->caches[i], dst, r, ends, &k);
    return rc;
}

/* Header @p h of a shared record's tail (describe()) as its first @p n tokens land: its cut
 * caches' slots hold n rows, every slot after the one before. */
static void cut_header(struct kvt_header *h, size_t n)
{
    uint64_t off = 0;
    for (size_t i = 0; i < h->n_caches; i++) {
        struct kvt_cache_header *c = &h->caches[i];
        bool cut = kvt_share_splits(c->info.kind);
        if (cut)
            c->info.offset = (int64_t)n;
        for (int k = 0; k < c->n_slots; k++) {
            struct kvt_slot *sl = &c->slots[k];
            if (cut) {
                sl->shape[2] = (int64_t)n;
                sl->bytes = kvt_dtype_size(sl->dtype) * (uint64_t)(sl->shape[0] * sl->shape[1]) *
                            n * (uint64_t)sl->shape[3];
            }
            sl->off = off;
            off += sl->bytes;
        }
    }
    h->n_tokens = n;
}

/* A pending take of @p n slots over @p s (owned), its copies queued with a mark each. */
static int queue_take(struct kvt_tier_dev *t, struct taken *s, const struct runs *r,
                      const size_t *ends, size_t n, kvt_dtake **out)
{
    kvt_dtake *p = calloc(1, sizeof(*p));
    void **marks = calloc(n + 1, sizeof(*marks));
    int rc = p && marks ? kvt_device_copies_marked(t->d, r->cp, ends, n, marks)
                        : kvt_fail(-ENOMEM, "out of memory");
    if (rc) {
        free(marks);
        free(p);
        taken_free(s);
        return rc;
    }
    *p = (kvt_dtake){t->d, marks, n, s->tail, s->parts, s->m};
    *out = p;
    return 0;
}

/* A placement that also notes where each slot landed (for the host copy of a cold or remote
 * hit). */
struct noted {
    kvt_device_place_fn place;
    void *ud;
    uint64_t *dst;
    size_t n;
};

static int note_place(void *ud, const struct kvt_header *h, uint64_t *dst)
{
    struct noted *w = ud;
    int rc = w->place(w->ud, h, dst);
    size_t n = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        n += (size_t)h->caches[i].n_slots;
    free(w->dst);
    w->dst = rc == 0 ? malloc((n + 1) * sizeof(*dst)) : NULL;
    w->n = w->dst ? n : 0;
    if (w->dst)
        memcpy(w->dst, dst, n * sizeof(*dst));
    return rc;
}

/* Cache @p ch of a header in pool memory, a copy from device memory at @p dst queued into
 * @p cp for each of its slots. */
static int keep_cache(struct kvt_tier_dev *t, const struct kvt_cache_header *ch,
                      const uint64_t *dst, struct kvt_dcopy *cp, size_t *ncp, kvt_cache **out)
{
    struct kvt_tensor ht[KVT_MAX_CACHE_TENSORS];
    memset(ht, 0, sizeof(ht));
    int made = 0, rc = ch->n_slots > KVT_MAX_CACHE_TENSORS ? -EINVAL : 0;
    for (; rc == 0 && made < ch->n_slots; made++) {
        const struct kvt_slot *sl = &ch->slots[made];
        kvt_buf *b = NULL; /* a slot the caller did not take: nothing to copy, nothing kept */
        rc = dst[made] ? kvt_dpool_buf(t->pool, sl->bytes, &b) : -ENOSPC;
        if (rc == 0)
            rc = kvt_tensor_init(&ht[made], b, 0, sl->dtype, sl->rank, sl->shape);
        if (rc == 0)
            cp[(*ncp)++] = (struct kvt_dcopy){kvt_buf_data(b), dst[made], sl->bytes, 1, 0, 0};
        kvt_buf_unref(b);
        if (rc)
            break;
    }
    if (rc == 0)
        rc = kvt_cache_from_state(&ch->info, ht, ch->n_slots, out);
    for (int k = 0; k < made; k++)
        kvt_tensor_release(&ht[k]);
    return rc;
}

/* The entry of header @p h in pool memory, its copies from @p dst queued into @p cp. */
static int keep_entry(struct kvt_tier_dev *t, const struct kvt_header *h, const uint64_t *dst,
                      struct kvt_dcopy *cp, size_t *ncp, struct kvt_entry **out)
{
    kvt_cache **c = calloc(h->n_caches + 1, sizeof(*c));
    size_t made = 0, at = 0;
    int rc = c ? 0 : -ENOMEM;
    for (; rc == 0 && made < h->n_caches; at += (size_t)h->caches[made++].n_slots)
        if ((rc = keep_cache(t, &h->caches[made], dst + at, cp, ncp, &c[made])))
            break;
    if (rc == 0 && (rc = kvt_entry_new(h->tokens, h->n_tokens, c, made, h->ns, out)) == 0) {
        const char *src[3] = {h->model_id, h->config_fingerprint, h->tokenizer_hash};
        const char **meta[3] = {&(*out)->meta.model_id, &(*out)->meta.config_fingerprint,
                                &(*out)->meta.tokenizer_hash};
        for (int k = 0; k < 3; k++)
            *meta[k] = src[k] ? strdup(src[k]) : NULL;
        (*out)->created_at = h->created_at;
        made = 0; /* the entry owns them */
    }
    for (size_t i = 0; c && i < made; i++)
        kvt_cache_free(c[i]);
    free(c);
    return rc;
}

/* Keep a host copy of the disk or remote hit that landed at @p w's addresses (header @p h):
 * copies down into pool memory queued on the device's stream, not waited for (kept() collects
 * it). Best effort: no room in the pool, or any failure, keeps nothing. */
static void keep_hit(struct kvt_tier_dev *t, const struct kvt_header *h, const struct noted *w)
{
    kvt_entry_free(kept(t)); /* one at a time: the previous one holds a ring slot */
    if (!kvt_dpool_ready(t->pool)) {
        pthread_mutex_lock(&t->keep_mu);
        if (!t->prep_started)
            t->prep_started = pthread_create(&t->prep, NULL, prepare_pool, t) == 0;
        pthread_mutex_unlock(&t->keep_mu);
        return;
    }
    struct kvt_dcopy *cp = calloc(w->n + 1, sizeof(*cp));
    size_t ncp = 0;
    struct kvt_entry *e = NULL;
    unsigned slot = KVT_DEVICE_UNTRACKED;
    if (!cp || keep_entry(t, h, w->dst, cp, &ncp, &e) ||
        kvt_device_copies_queue(t->d, cp, ncp, false, &slot)) {
        kvt_entry_free(e);
        kvt_clear_error();
    } else {
        pthread_mutex_lock(&t->keep_mu);
        t->keep = e;
        t->keep_slot = slot;
        pthread_mutex_unlock(&t->keep_mu);
    }
    free(cp);
}

/* The kept host copy, once its copies are done (waiting for them), or NULL. */
static struct kvt_entry *kept(void *ud)
{
    struct kvt_tier_dev *t = ud;
    pthread_mutex_lock(&t->keep_mu);
    struct kvt_entry *e = t->keep;
    unsigned slot = t->keep_slot;
    t->keep = NULL;
    pthread_mutex_unlock(&t->keep_mu);
    if (e && kvt_device_copies_wait(t->d, slot) != 0) {
        kvt_entry_free(e);
        e = NULL;
    }
    return e;
}

/* The record of @p s (owned) into device memory: to_device(), or shared_to_device(). */
static int take_to(struct kvt_tier_dev *t, struct taken *s, bool keep, kvt_device_place_fn place,
                   void *pud, struct kvt_header **out, kvt_dtake **pending)
{
    *out = NULL;
    struct kvt_header *h = NULL;
    int rc = describe(s->tail, &h);
    if (rc == 0 && s->m)
        cut_header(h, s->n);
    size_t ns = 0;
    for (size_t i = 0; h && i < h->n_caches; i++)
        ns += (size_t)h->caches[i].n_slots;
    uint64_t *dst = calloc(ns + 1, sizeof(*dst));
    size_t *ends = calloc(ns + 1, sizeof(*ends));
    rc = rc ? rc : dst && ends ? 0 : kvt_fail(-ENOMEM, "out of memory");
    struct noted w = {place, pud, NULL, 0};
    if (rc == 0) {
        kvt_clear_error();
        if ((rc = keep ? note_place(&w, h, dst) : place(pud, h, dst)) && !kvt_last_error()[0])
            kvt_fail(rc, "prompt cache take: the destination was refused: %s", kvt_strerror(rc));
    }
    struct runs r = {.t = t};
    if (rc == 0)
        rc = plan_runs(s, dst, &r, ends);
    /* a host entry outside the pool (a remote hit) has landed through the staging ring, none
     * of it left on the side stream: the kept copy, queued after, reads the landed bytes */
    bool landed = rc == 0 && r.n == 0;
    if (rc == 0)
        rc = queue_take(t, s, &r, ends, ns, pending);
    else
        taken_free(s);
    if (rc == 0 && keep && landed && w.dst)
        keep_hit(t, h, &w);
    free(w.dst);
    free(r.cp);
    free(dst);
    free(ends);
    if (rc) {
        kvt_header_free(h);
        return rc;
    }
    *out = h;
    return 0;
}

static int to_device(void *ud, struct kvt_entry *e, bool keep, kvt_device_place_fn place, void *pud,
                     struct kvt_header **out, kvt_dtake **pending)
{
    struct taken s = {e, NULL, 0, e->n_tokens};
    return take_to(ud, &s, keep, place, pud, out, pending);
}

static int shared_to_device(void *ud, struct kvt_entry *tail, struct kvt_entry **parts, size_t m,
                            size_t n, kvt_device_place_fn place, void *pud, struct kvt_header **out,
                            kvt_dtake **pending)
{
    struct taken s = {tail, parts, m, n};
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < tail->n_caches; i++) /* the cut ones are read up to n */
        if (!cut_cache(tail->caches[i]))
            rc = kvt_cache_trim(tail->caches[i], (int64_t)(tail->n_tokens - n));
    if (rc == 0)
        return take_to(ud, &s, false, place, pud, out, pending);
    *out = NULL;
    taken_free(&s);
    return rc;
}

static int cold_to_device(void *ud, kvt_store *s, const struct kvt_hit *hit,
                          kvt_device_place_fn place, void *pud, struct kvt_header **out)
{
    struct kvt_tier_dev *t = ud;
    struct noted w = {place, pud, NULL, 0};
    int rc = kvt_store_restore_prefix_to_device(s, hit, t->d, note_place, &w, out);
    if (rc == 0 && *out && w.dst)
        keep_hit(t, *out, &w);
    free(w.dst);
    return rc;
}

/* Only once a device entry has made the pool: pinning it on a host put would stall it. */
static int host_buf(void *ud, size_t bytes, kvt_buf **out)
{
    struct kvt_tier_dev *t = ud;
    return kvt_dpool_ready(t->pool) ? kvt_dpool_buf(t->pool, bytes, out) : -ENOSPC;
}

const struct kvt_tier_device_ops kvt_tier_dev_ops = {owns, to_host,   to_device, cold_to_device,
                                                     kept, dev_close, host_buf,  shared_to_device};
