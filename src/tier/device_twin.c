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

#include "common/error.h"
#include "device/device.h"
#include "tensor/tensor.h"

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
            cp[(*ncp)++] = (struct kvt_dcopy){kvt_buf_data(b), addr + st[made].offset, n, 1, 0};
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
    uint64_t dev;
};

/* Whether run @p p (@p n bytes, bound for @p dev) extends copy @p c by a row: the same width,
 * next on the device, and on the host one pitch after its last row (the second row sets the
 * pitch). A tensor cut to a prefix is so one strided copy, not a copy a row. */
static bool extends(const struct kvt_dcopy *c, const uint8_t *p, size_t n, uint64_t dev)
{
    if (c->n != n || c->dev + c->rows * c->n != dev)
        return false;
    const uint8_t *last = (const uint8_t *)c->host + (c->rows - 1) * c->pitch;
    return p > last && (c->rows == 1 || (size_t)(p - last) == c->pitch);
}

static int add_run(void *ud, const void *p, size_t n)
{
    struct runs *r = ud;
    struct kvt_dcopy *c = r->n ? &r->cp[r->n - 1] : NULL;
    uint64_t dev = r->dev;
    r->dev += n;
    if (!kvt_dpool_owns(r->t->pool, p)) /* not page-locked: through the staging ring */
        return kvt_device_upload(r->t->d, dev, p, n);
    if (c && extends(c, p, n, dev)) {
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
    r->cp[r->n++] = (struct kvt_dcopy){(void *)p, dev, n, 1, 0};
    return 0;
}

/* The copies of host entry @p e into the memory @p dst names, into @p r; ends[k]: the copies
 * up to slot k's last. */
static int plan_runs(const struct kvt_entry *e, const uint64_t *dst, struct runs *r, size_t *ends)
{
    int rc = 0;
    for (size_t i = 0, k = 0; i < e->n_caches; i++) {
        struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
        int nt = kvt_cache_state(e->caches[i], st);
        for (int j = 0; j < nt; j++, k++) {
            r->dev = dst[k];
            if (rc == 0 && dst[k])
                rc = kvt_tensor_for_each_run(&st[j], add_run, r);
            ends[k] = r->n;
            kvt_tensor_release(&st[j]);
        }
    }
    return rc;
}

/* A pending take of @p n slots over @p src (owned), its copies queued with a mark each. */
static int queue_take(struct kvt_tier_dev *t, struct kvt_entry *src, const struct runs *r,
                      const size_t *ends, size_t n, kvt_dtake **out)
{
    kvt_dtake *p = calloc(1, sizeof(*p));
    void **marks = calloc(n + 1, sizeof(*marks));
    int rc = p && marks ? kvt_device_copies_marked(t->d, r->cp, ends, n, marks)
                        : kvt_fail(-ENOMEM, "out of memory");
    if (rc) {
        free(marks);
        free(p);
        kvt_entry_free(src);
        return rc;
    }
    *p = (kvt_dtake){t->d, marks, n, src};
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
            cp[(*ncp)++] = (struct kvt_dcopy){kvt_buf_data(b), dst[made], sl->bytes, 1, 0};
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

static int to_device(void *ud, struct kvt_entry *e, bool keep, kvt_device_place_fn place, void *pud,
                     struct kvt_header **out, kvt_dtake **pending)
{
    struct kvt_tier_dev *t = ud;
    *out = NULL;
    struct kvt_header *h = NULL;
    int rc = describe(e, &h);
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
        rc = plan_runs(e, dst, &r, ends);
    /* a host entry outside the pool (a remote hit) has landed through the staging ring, none
     * of it left on the side stream: the kept copy, queued after, reads the landed bytes */
    bool landed = rc == 0 && r.n == 0;
    if (rc == 0)
        rc = queue_take(t, e, &r, ends, ns, pending);
    else
        kvt_entry_free(e);
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
                                                     kept, dev_close, host_buf};
