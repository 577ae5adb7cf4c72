/*
 * The RAM LRU (TIER.md §2): records of {entry, share, bytes, LRU clocks} in
 * insertion order, non-consuming take with trimmed clones and the cold tier's
 * strictly-longer rule, put with duplicate replacement, trimmable-only ancestor supersession
 * and LRU eviction that spills owned clones. RAM holds few entries, so the index is a
 * plain array scanned linearly.
 *
 * Locking: one mutex guards the records and counters. Records leave the array under the
 * lock and are disposed or spilled after it is dropped, so no engine callback, cold-tier
 * write or hook ever runs under it. Only index-only cold-tier lookups happen under it.
 */
#include "tier/ram_lru.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "tier/ram_share.h"

struct rec {
    struct kvt_entry *e;
    kvt_retain *share;
    size_t bytes;
    uint64_t last_used; /* logical clock */
    int64_t last_used_ms;
    uint64_t id;
    bool on_disk;     /* kept from a disk hit: evicted without a spill */
    struct rec *next; /* detached lists */
    /* Shared (m > 0): e is the tail, rows [0, 256m) of its cut caches are in chunks while
     * the record is held, and in parts (owned clones) once it is detached. */
    struct kvt_ram_chunk **chunks;
    size_t m;
    struct kvt_entry **parts;
};

struct kvt_ram_lru {
    struct kvt_tier_cfg cfg;
    struct kvt_ram_lru_links links;
    pthread_mutex_t mu;
    struct rec **recs;
    size_t n, cap;
    uint64_t total_bytes, clock, next_id;
    uint64_t hits, misses, demotions;
    bool share;                  /* prefixes held once (ram_share.h) */
    struct kvt_tier_alloc alloc; /* where shared rows are copied to */
};

/* A list of detached records, kept in detach order. */
struct rec_list {
    struct rec *head, **tail;
};

static void list_init(struct rec_list *l)
{
    l->head = NULL;
    l->tail = &l->head;
}

static void list_push(struct rec_list *l, struct rec *r)
{
    r->next = NULL;
    *l->tail = r;
    l->tail = &r->next;
}

static int64_t now_ms(const struct kvt_ram_lru *lru)
{
    return lru->cfg.wall_ms ? lru->cfg.wall_ms(lru->cfg.clock_ud) : kvt_wall_ms();
}

static const char *entry_ns(const struct kvt_entry *e)
{
    return kvt_tier_ns(e->meta.ns);
}

size_t kvt_ram_lru_entry_bytes(struct kvt_ram_lru *lru, const struct kvt_entry *e)
{
    size_t sum = 0;
    for (size_t i = 0; i < e->n_caches; i++)
        sum += lru->cfg.cache->bytes(e->caches[i]);
    return sum;
}

static bool entry_trimmable(const struct kvt_ram_lru *lru, const struct kvt_entry *e)
{
    for (size_t i = 0; i < e->n_caches; i++)
        if (!lru->cfg.cache->is_trimmable(e->caches[i]))
            return false;
    return true;
}

static int trim_all(struct kvt_ram_lru *lru, struct kvt_entry *e, int64_t n)
{
    for (size_t i = 0; i < e->n_caches; i++) {
        int rc = lru->cfg.cache->trim(e->caches[i], n);
        if (rc < 0)
            return rc;
    }
    return 0;
}

void kvt_ram_lru_entry_free(struct kvt_ram_lru *lru, struct kvt_entry *e)
{
    if (e)
        lru->cfg.cache->entry_free(e);
}

static bool same_tokens(const struct kvt_entry *e, const int32_t *tok, size_t n)
{
    return e->n_tokens == n && (n == 0 || !memcmp(e->tokens, tok, n * sizeof(*tok)));
}

/* Remove recs[i] keeping insertion order; @p spill: it may be spilled (its chunks cloned). */
static struct rec *detach(struct kvt_ram_lru *lru, size_t i, bool spill)
{
    struct rec *r = lru->recs[i];
    memmove(lru->recs + i, lru->recs + i + 1, (lru->n - i - 1) * sizeof(*lru->recs));
    lru->n--;
    lru->total_bytes -= r->bytes;
    if (r->m) { /* clones of its chunks go with it only for a spill, which joins them */
        r->parts = spill && !r->on_disk ? calloc(r->m, sizeof(*r->parts)) : NULL;
        kvt_ram_chunks_drop(lru->cfg.cache, r->chunks, r->m, r->parts, &lru->total_bytes);
        free(r->chunks);
        r->chunks = NULL;
    }
    return r;
}

/* The record's parts as a held entry (consumed), to join or free. */
static struct kvt_ram_held rec_held(struct rec *r)
{
    struct kvt_ram_held h = {r->e, r->parts, r->m};
    r->e = NULL;
    r->parts = NULL;
    return h;
}

/* TIER.md §2.3 "dispose": caches, then the share handle. */
static void dispose_rec(struct kvt_ram_lru *lru, struct rec *r)
{
    struct kvt_ram_held h = rec_held(r);
    kvt_ram_held_free(lru->cfg.cache, &h);
    kvt_retain_release(r->share);
    free(r);
}

/* TIER.md §2.4. Eviction never fails: a failed clone or hand-over only skips the spill. */
static void dispose_with_spill(struct kvt_ram_lru *lru, struct kvt_entry *e, kvt_retain *share)
{
    const struct kvt_tier_cfg *c = &lru->cfg;
    if (lru->links.spill) {
        struct kvt_entry *clones = NULL;
        int rc = c->cache->entry_clone(e, &clones);
        if (rc == 0)
            rc = lru->links.spill(lru->links.ud, clones);
        if (rc < 0)
            kvt_log_line(c->log, c->log_ud, KVT_LOG_WARN,
                         "[prompt-cache] spill of %zu tokens skipped: %s", e->n_tokens,
                         kvt_strerror(rc));
    } else if (c->cold) {
        c->cold->put(c->store, e, NULL, NULL);
    }
    kvt_ram_lru_entry_free(lru, e);
    kvt_retain_release(share);
}

/* A detached record's whole entry (consumed), for a spill: its own, or its tail joined with its
 * chunks; NULL when that fails (the spill is skipped). */
static struct kvt_entry *rec_whole(struct kvt_ram_lru *lru, struct rec *r)
{
    struct kvt_ram_held h = rec_held(r);
    size_t n = h.e ? h.e->n_tokens : 0;
    struct kvt_entry *whole = NULL;
    if (kvt_ram_join(lru->cfg.cache, &lru->alloc, &h, &whole) < 0)
        kvt_log_line(lru->cfg.log, lru->cfg.log_ud, KVT_LOG_WARN,
                     "[prompt-cache] spill of %zu tokens skipped: %s", n, kvt_last_error());
    return whole;
}

static void dispose_list(struct kvt_ram_lru *lru, struct rec *r, bool spill)
{
    while (r) {
        struct rec *next = r->next;
        if (spill && !r->on_disk) {
            struct kvt_entry *whole = rec_whole(lru, r);
            if (whole)
                dispose_with_spill(lru, whole, r->share);
            else
                kvt_retain_release(r->share);
            free(r);
        } else {
            dispose_rec(lru, r);
        }
        r = next;
    }
}

/* TIER.md §2.2 step 1; caller holds the lock. */
static struct rec *ram_candidate(const struct kvt_ram_lru *lru, const int32_t *tok, size_t n,
                                 const char *ns, size_t *best_out)
{
    size_t best = 0;
    struct rec *donor = NULL;
    for (size_t i = 0; n > 0 && i < lru->n; i++) {
        struct rec *r = lru->recs[i];
        if (strcmp(entry_ns(r->e), ns) != 0)
            continue;
        size_t p = kvt_tier_lcp(r->e->tokens, r->e->n_tokens, tok, n);
        if (p > n - 1)
            p = n - 1;
        if (p <= best)
            continue;
        if (r->e->n_tokens > p && !entry_trimmable(lru, r->e))
            continue;
        best = p;
        donor = r;
    }
    *best_out = best;
    return donor;
}

static void bump(struct kvt_ram_lru *lru, struct rec *r)
{
    r->last_used = ++lru->clock;
    r->last_used_ms = now_ms(lru);
}

int kvt_ram_lru_new(const struct kvt_tier_cfg *cfg, const struct kvt_ram_lru_links *links,
                    struct kvt_ram_lru **out)
{
    *out = NULL;
    if (!cfg || !cfg->cache)
        return kvt_fail(-EINVAL, "prompt cache: no cache ops");
    struct kvt_ram_lru *lru = calloc(1, sizeof(*lru));
    if (!lru)
        return kvt_fail(-ENOMEM, "prompt cache: out of memory");
    lru->cfg = *cfg;
    if (links)
        lru->links = *links;
    const struct kvt_tier_cache_ops *ops = cfg->cache;
    lru->share = cfg->share_prefixes && ops->share_chunks && ops->share_chunk && ops->share_tail &&
                 ops->share_join && ops->share_fit;
    if (cfg->dev && cfg->dev->host_buf)
        lru->alloc = (struct kvt_tier_alloc){cfg->dev->host_buf, cfg->dev_ud};
    pthread_mutex_init(&lru->mu, NULL);
    *out = lru;
    return 0;
}

void kvt_ram_lru_clear(struct kvt_ram_lru *lru)
{
    struct rec_list all;
    list_init(&all);
    pthread_mutex_lock(&lru->mu);
    while (lru->n)
        list_push(&all, detach(lru, lru->n - 1, false));
    pthread_mutex_unlock(&lru->mu);
    dispose_list(lru, all.head, false);
}

void kvt_ram_lru_free(struct kvt_ram_lru *lru)
{
    if (!lru)
        return;
    kvt_ram_lru_clear(lru);
    pthread_mutex_destroy(&lru->mu);
    free(lru->recs);
    free(lru);
}

/* A shared donor's clones handed to a take into device memory unjoined (true), when the
 * device copies their rows straight to theirs. */
static bool hand_over(struct kvt_ram_lru *lru, struct kvt_ram_held *held, size_t best,
                      struct kvt_dev_dest *dest)
{
    const struct kvt_tier_device_ops *d = lru->cfg.dev;
    if (!held->m || !dest || dest->host || !d || !d->shared_to_device)
        return false;
    dest->tail = held->e;
    dest->parts = held->parts;
    dest->m = held->m;
    dest->n = best;
    *held = (struct kvt_ram_held){0};
    return true;
}

/* Step 3 after the lock: the donor's clones (joined when it is shared) trimmed to @p best
 * tokens, or handed over unjoined to @p dest. */
static int finish_ram_hit(struct kvt_ram_lru *lru, struct kvt_ram_held *held, int clone_rc,
                          kvt_retain *share, size_t donor_len, size_t best,
                          struct kvt_dev_dest *dest, struct kvt_take *out)
{
    if (clone_rc == 0 && hand_over(lru, held, best, dest)) {
        kvt_retain_release(share); /* the clones' buffers hold the donor's bytes */
        return 0;
    }
    struct kvt_entry *clones = NULL;
    int rc = clone_rc;
    if (rc == 0)
        rc = kvt_ram_join(lru->cfg.cache, &lru->alloc, held, &clones);
    if (rc == 0)
        rc = trim_all(lru, clones, (int64_t)(donor_len - best));
    if (rc < 0) {
        kvt_ram_lru_entry_free(lru, clones);
        kvt_retain_release(share);
        return rc;
    }
    clones->n_tokens = best;
    out->entry = clones;
    out->retain = share;
    out->from_disk = false;
    return 0;
}

/* A restored entry the take cannot use: say why, release it, fall back (returns 0). */
static int unusable(struct kvt_ram_lru *lru, struct kvt_entry *loaded, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int unusable(struct kvt_ram_lru *lru, struct kvt_entry *loaded, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    kvt_log_line(lru->cfg.log, lru->cfg.log_ud, KVT_LOG_WARN,
                 "[prompt-cache] cold entry unusable: %s", why);
    kvt_ram_lru_entry_free(lru, loaded);
    return 0;
}

/* An entry restored from the remote goes to the local store through the write queue, whole
 * (before the take trims it); the remote's own upload of it is skipped as a duplicate. */
static void promote(struct kvt_ram_lru *lru, const struct kvt_entry *loaded)
{
    struct kvt_entry *copy = NULL;
    if (lru->links.spill && lru->cfg.cache->entry_clone(loaded, &copy) == 0)
        lru->links.spill(lru->links.ud, copy);
}

/* Step 2's restore of a disk hit into the caller's memory (no lock held): 1 = delivered,
 * into->header set and the entry usable for the prefix; 0 = fall back to RAM (never to the
 * disk again). */
static int take_disk_into(struct kvt_ram_lru *lru, const int32_t *tok, const struct kvt_hit *hit,
                          struct kvt_take_into *into, struct kvt_take *out)
{
    const struct kvt_tier_cfg *c = &lru->cfg;
    struct kvt_header *h = NULL;
    int rc = c->cold->restore_into(c->store, hit, into->place, into->ud, &h);
    if (rc < 0 || !h)
        return 0;
    size_t plen = hit->prefix_len, n = h->n_tokens;
    const char *why = NULL;
    if (n < plen || memcmp(h->tokens, tok, plen * sizeof(*tok)) != 0)
        why = "do not hold the prefix found";
    else if (n > plen && !kvt_header_is_trimmable(h))
        why = "need a trim but are untrimmable (wrapped ring/SSM)";
    if (why) {
        kvt_header_free(h);
        return unusable(lru, NULL, "%zu tokens %s (%zu-token prefix) — re-prefilling", n, why,
                        plen);
    }
    into->header = h;
    into->prefix_len = plen;
    out->from_disk = true;
    return 1;
}

/* A cold hit's prefix straight into device memory: 1 = landed, 0 = fall back, < 0 = the
 * placement's refusal (or another error it raised). */
static int cold_to_device(struct kvt_ram_lru *lru, const struct kvt_hit *hit,
                          struct kvt_dev_dest *dest, struct kvt_take *out)
{
    const struct kvt_tier_cfg *c = &lru->cfg;
    int rc = c->dev->cold_to_device(c->dev_ud, c->store, hit, dest->place, dest->ud, &dest->header);
    if (rc == KVT_E_UNSUPPORTED || (rc == 0 && !dest->header))
        return 0; /* another kind of cache (restored to the host, then copied), or a miss */
    if (rc < 0)
        return rc;
    out->from_disk = true;
    return 1;
}

/* Step 2's restore (no lock held): 1 = *out is the trimmed entry (or, with @p dest, the
 * bytes landed in device memory), 0 = fall back, < 0 = a device placement's refusal. */
static int take_cold(struct kvt_ram_lru *lru, const int32_t *tok, const struct kvt_hit *hit,
                     bool remote, struct kvt_dev_dest *dest, struct kvt_take *out)
{
    const struct kvt_tier_cfg *c = &lru->cfg;
    if (dest && dest->host && !remote && c->cold->restore_into)
        return take_disk_into(lru, tok, hit, dest->host, out);
    if (dest && !dest->host && !remote) {
        int rd = cold_to_device(lru, hit, dest, out);
        if (rd != 0)
            return rd;
    }
    struct kvt_entry *loaded = NULL;
    int rc = remote ? c->remote_ops->restore(c->remote, hit, &loaded)
                    : c->cold->restore(c->store, hit, &loaded);
    if (rc < 0 || !loaded)
        return 0;
    size_t plen = hit->prefix_len;
    if (loaded->n_tokens < plen || memcmp(loaded->tokens, tok, plen * sizeof(*tok)) != 0)
        return unusable(lru, loaded,
                        "%zu tokens do not hold the %zu-token prefix found — re-prefilling",
                        loaded->n_tokens, plen);
    size_t t = loaded->n_tokens - plen;
    if (t > 0 && !entry_trimmable(lru, loaded))
        return unusable(lru, loaded,
                        "%zu tokens, needs trim %zu but untrimmable (wrapped ring/SSM) — "
                        "re-prefilling",
                        loaded->n_tokens, t);
    if (remote)
        promote(lru, loaded);
    rc = trim_all(lru, loaded, (int64_t)t);
    if (rc < 0)
        return unusable(lru, loaded, "%zu tokens, trim %zu failed: %s — re-prefilling",
                        loaded->n_tokens, t, kvt_strerror(rc));
    loaded->n_tokens = plen;
    out->entry = loaded;
    out->retain = NULL; /* restored bytes are owned: the retain is a no-op */
    out->from_disk = true;
    out->from_remote = remote;
    return 1;
}

/* The tiers below RAM: their hits, and which of them beat RAM's @p best. */
struct lower {
    struct kvt_hit cold, remote;
    bool try_cold, try_remote;
};

/* Step 2's lookups (index-only, under the lock): each tier must be strictly longer than the
 * nearer ones, so ties go to the nearer tier. */
static void find_lower(struct kvt_ram_lru *lru, const int32_t *tok, size_t n, const char *ns,
                       size_t best, struct lower *lo)
{
    const struct kvt_tier_cfg *c = &lru->cfg;
    memset(lo, 0, sizeof(*lo));
    if (n == 0)
        return;
    if (c->cold && c->cold->find(c->store, tok, n, ns, &lo->cold) == 0 &&
        lo->cold.prefix_len > best) {
        lo->try_cold = true;
        best = lo->cold.prefix_len;
    }
    if (c->remote_ops && c->remote_ops->find(c->remote, tok, n, ns, &lo->remote) == 0)
        lo->try_remote = lo->remote.prefix_len > best;
}

/* Step 2's restores (no lock held), the longest first: 1 = *out set, 0 = fall back to RAM. */
static int take_lower(struct kvt_ram_lru *lru, const int32_t *tok, const struct lower *lo,
                      struct kvt_dev_dest *dest, struct kvt_take *out)
{
    int rc = lo->try_remote ? take_cold(lru, tok, &lo->remote, true, dest, out) : 0;
    if (rc == 0 && lo->try_cold)
        rc = take_cold(lru, tok, &lo->cold, false, dest, out);
    return rc;
}

int kvt_ram_lru_take(struct kvt_ram_lru *lru, const int32_t *tok, size_t n, const char *ns,
                     struct kvt_take *out)
{
    return kvt_ram_lru_take_to(lru, tok, n, ns, NULL, out);
}

int kvt_ram_lru_take_to(struct kvt_ram_lru *lru, const int32_t *tok, size_t n, const char *ns,
                        struct kvt_dev_dest *dest, struct kvt_take *out)
{
    memset(out, 0, sizeof(*out));
    if (!tok && n)
        return kvt_fail(-EINVAL, "prompt cache take: NULL tokens");
    ns = kvt_tier_ns(ns);

    pthread_mutex_lock(&lru->mu);
    size_t best;
    struct rec *donor = ram_candidate(lru, tok, n, ns, &best);
    if (donor)
        lru->hits++;
    else
        lru->misses++;

    struct lower lo;
    find_lower(lru, tok, n, ns, best, &lo); /* strictly longer: ties go to RAM */
    bool try_cold = lo.try_cold || lo.try_remote;

    struct kvt_ram_held held = {0};
    kvt_retain *share = NULL;
    int clone_rc = 0;
    size_t donor_len = 0;
    uint64_t donor_id = 0;
    bool have_donor = donor != NULL;
    if (donor) {
        /* Without a cold attempt this is step 3; with one, the clone is taken now so the
         * fallback is exact even if the donor leaves RAM while the lock is dropped. */
        if (!try_cold)
            bump(lru, donor);
        clone_rc = kvt_ram_hold(lru->cfg.cache, donor->e, donor->chunks, donor->m, &held);
        share = kvt_retain_acquire(donor->share);
        donor_len = donor->e->n_tokens;
        donor_id = donor->id;
    }
    pthread_mutex_unlock(&lru->mu);

    if (try_cold) {
        int rc = take_lower(lru, tok, &lo, dest, out);
        if (rc != 0) {
            kvt_ram_held_free(lru->cfg.cache, &held);
            kvt_retain_release(share);
            return rc < 0 ? rc : 0;
        }
        if (have_donor) {
            pthread_mutex_lock(&lru->mu);
            for (size_t i = 0; i < lru->n; i++)
                if (lru->recs[i]->id == donor_id)
                    bump(lru, lru->recs[i]);
            pthread_mutex_unlock(&lru->mu);
        }
    }
    if (!have_donor)
        return 0;
    return finish_ram_hit(lru, &held, clone_rc, share, donor_len, best, dest, out);
}

static int grow(struct kvt_ram_lru *lru)
{
    if (lru->n < lru->cap)
        return 0;
    size_t cap = lru->cap ? lru->cap * 2 : 16;
    struct rec **r = realloc(lru->recs, cap * sizeof(*r));
    if (!r)
        return -ENOMEM;
    lru->recs = r;
    lru->cap = cap;
    return 0;
}

/* Copies of the tokens and ns for the hook, which runs after the record may be gone. */
static bool copy_key(const struct kvt_entry *e, int32_t **tok, char **ns)
{
    *tok = malloc(e->n_tokens ? e->n_tokens * sizeof(**tok) : 1);
    *ns = strdup(entry_ns(e));
    if (!*tok || !*ns) {
        free(*tok);
        free(*ns);
        *tok = NULL;
        *ns = NULL;
        return false;
    }
    if (e->n_tokens)
        memcpy(*tok, e->tokens, e->n_tokens * sizeof(**tok));
    return true;
}

/* TIER.md §2.3: duplicates of the fresh record @p r and, when it is trimmable, its strict
 * prefix ancestors leave RAM. Caller holds the lock. */
static void detach_superseded(struct kvt_ram_lru *lru, const struct rec *r, struct rec_list *out)
{
    const struct kvt_entry *e = r->e;
    const char *ns = entry_ns(e);
    bool trimmable = entry_trimmable(lru, e);
    list_init(out);
    for (size_t i = 0; i < lru->n;) {
        struct rec *o = lru->recs[i];
        bool gone = false;
        if (o != r && !strcmp(entry_ns(o->e), ns)) {
            if (same_tokens(o->e, e->tokens, e->n_tokens))
                gone = true; /* duplicate */
            else if (trimmable && o->e->n_tokens < e->n_tokens &&
                     same_tokens(o->e, e->tokens, o->e->n_tokens))
                gone = true; /* strict prefix ancestor, superseded */
        }
        if (gone)
            list_push(out, detach(lru, i, false));
        else
            i++;
    }
}

/* TIER.md §2.4: least recently used records leave while over the cap, never the fresh insert
 * (it has the largest clock). Caller holds the lock. */
static void detach_over_cap(struct kvt_ram_lru *lru, struct rec_list *out)
{
    list_init(out);
    while (lru->total_bytes > lru->cfg.ram_max_bytes && lru->n > 1) {
        size_t oldest = 0;
        for (size_t i = 1; i < lru->n; i++)
            if (lru->recs[i]->last_used < lru->recs[oldest]->last_used)
                oldest = i;
        list_push(out, detach(lru, oldest, true));
    }
}

/* Why @p e cannot be put (0: it can); a refused entry and its retain are released. */
static int put_refused(struct kvt_ram_lru *lru, struct kvt_entry *e, kvt_retain *retain)
{
    const struct kvt_tier_cache_ops *ops = lru->cfg.cache;
    int rc = 0;
    if (!e)
        rc = kvt_fail(-EINVAL, "prompt cache put: NULL entry");
    else if (!e->tokens && e->n_tokens)
        rc = kvt_fail(-EINVAL, "prompt cache put: NULL tokens");
    else if (ops->entry_on_device && ops->entry_on_device(e)) /* the RAM tier holds host memory */
        rc = kvt_fail(KVT_E_UNSUPPORTED, "prompt cache put: the entry is in device memory (save "
                                         "it with kvt_store_put or kvt_file_save)");
    if (rc && e)
        kvt_ram_lru_entry_free(lru, e);
    if (rc)
        kvt_retain_release(retain);
    return rc;
}

/* A device entry of this tier's device: 1 with *@p e replaced by its host copy in page-locked
 * memory, 0 when it was saved from the device instead (no room), < 0 on failure (released). */
static int device_to_host(struct kvt_ram_lru *lru, struct kvt_entry **e, kvt_retain *retain)
{
    const struct kvt_tier_cfg *c = &lru->cfg;
    struct kvt_entry *h = NULL;
    int rc = kvt_ram_lru_entry_bytes(lru, *e) > c->ram_max_bytes
                 ? -ENOSPC
                 : c->dev->to_host(c->dev_ud, *e, &h);
    if (rc == -ENOSPC) { /* over the cap, as a host entry would be: straight to the cold tier */
        dispose_with_spill(lru, *e, retain);
        return 0;
    }
    kvt_ram_lru_entry_free(lru, *e);
    if (rc < 0) {
        kvt_retain_release(retain);
        return rc;
    }
    *e = h;
    return 1;
}

static bool ours_on_device(const struct kvt_ram_lru *lru, const struct kvt_entry *e)
{
    const struct kvt_tier_cfg *c = &lru->cfg;
    return e && c->dev && c->cache->entry_on_device && c->cache->entry_on_device(e) &&
           c->dev->owns(c->dev_ud, e);
}

static int insert(struct kvt_ram_lru *lru, struct kvt_entry *e, kvt_retain *retain, bool on_disk);

int kvt_ram_lru_put(struct kvt_ram_lru *lru, struct kvt_entry *e, kvt_retain *retain)
{
    int rc = ours_on_device(lru, e) ? device_to_host(lru, &e, retain) : 1;
    if (rc <= 0)
        return rc;
    rc = put_refused(lru, e, retain);
    if (rc)
        return rc;
    size_t bytes = kvt_ram_lru_entry_bytes(lru, e);
    if (bytes > lru->cfg.ram_max_bytes) {
        dispose_with_spill(lru, e, retain);
        return 0;
    }
    return insert(lru, e, retain, false);
}

void kvt_ram_lru_keep(struct kvt_ram_lru *lru, struct kvt_entry *e)
{
    size_t bytes = e ? kvt_ram_lru_entry_bytes(lru, e) : 0;
    if (e && bytes > lru->cfg.ram_max_bytes)
        kvt_ram_lru_entry_free(lru, e);
    else if (e)
        insert(lru, e, NULL, true);
}

static bool same_str(const char *a, const char *b)
{
    return a == b || (a && b && !strcmp(a, b));
}

/* Whether chunks of @p a may stand for rows of @p b: the same model and namespace. */
static bool same_source(const struct kvt_entry *a, const struct kvt_entry *b)
{
    return !strcmp(entry_ns(a), entry_ns(b)) && same_str(a->meta.model_id, b->meta.model_id) &&
           same_str(a->meta.config_fingerprint, b->meta.config_fingerprint) &&
           same_str(a->meta.tokenizer_hash, b->meta.tokenizer_hash);
}

/* How many of the first @p m chunks of @p e a held record already has, and which record
 * (docs/SHARING.md, "The RAM tier": records with equal tokens up to a chunk's end hold the
 * same chunk). Caller holds the lock. */
static size_t shared_with(struct kvt_ram_lru *lru, const struct kvt_entry *e, size_t m,
                          struct rec **from)
{
    size_t best = 0;
    *from = NULL;
    for (size_t i = 0; i < lru->n && best < m; i++) {
        struct rec *r = lru->recs[i];
        if (!r->m || !same_source(r->e, e))
            continue;
        size_t k = kvt_tier_lcp(r->e->tokens, r->e->n_tokens, e->tokens, e->n_tokens) /
                   r->chunks[0]->e->n_tokens;
        k = k < r->m ? k : r->m;
        k = k < m ? k : m;
        if (k > best && lru->cfg.cache->share_fit(r->chunks[0]->e, e)) {
            best = k;
            *from = r;
        }
    }
    return best;
}

/* Cut @p e for holding, copying only the chunks no record has yet (no lock held on entry). */
static void cut_entry(struct kvt_ram_lru *lru, const struct kvt_entry *e, struct kvt_ram_cut *cut)
{
    *cut = (struct kvt_ram_cut){0};
    size_t m = lru->share ? lru->cfg.cache->share_chunks(e) : 0;
    if (!m)
        return;
    struct rec *from;
    pthread_mutex_lock(&lru->mu);
    size_t k = shared_with(lru, e, m, &from);
    pthread_mutex_unlock(&lru->mu);
    kvt_ram_cut_new(lru->cfg.cache, &lru->alloc, e, k, m, cut);
}

/* The new record @p r holds @p e, or its cut when the chunks it was cut against are still
 * held (else whole); returns what to free once the lock is dropped. Caller holds the lock. */
static struct kvt_entry *hold_cut(struct kvt_ram_lru *lru, struct rec *r, struct kvt_entry *e,
                                  struct kvt_ram_cut *cut)
{
    r->e = e;
    struct rec *from;
    if (!cut->m || shared_with(lru, e, cut->from, &from) < cut->from)
        return NULL;
    for (size_t k = 0; k < cut->from; k++)
        cut->chunks[k] = from->chunks[k];
    kvt_ram_chunks_take(cut->chunks, cut->m, &lru->total_bytes);
    r->chunks = cut->chunks;
    r->m = cut->m;
    r->e = cut->tail;
    *cut = (struct kvt_ram_cut){0};
    return e;
}

/* A record for @p e with room for it in the array: returned with the lock held, or NULL. */
static struct rec *new_rec(struct kvt_ram_lru *lru)
{
    struct rec *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    pthread_mutex_lock(&lru->mu);
    if (grow(lru) == 0)
        return r;
    pthread_mutex_unlock(&lru->mu);
    free(r);
    return NULL;
}

/* Put's step 2: @p e becomes a record (@p on_disk: a copy of what the cold tier holds, never
 * spilled nor announced to on_put). */
static int insert(struct kvt_ram_lru *lru, struct kvt_entry *e, kvt_retain *retain, bool on_disk)
{
    int32_t *hook_tok = NULL;
    char *hook_ns = NULL;
    size_t hook_n = e->n_tokens;
    bool hook = !on_disk && lru->links.on_put && copy_key(e, &hook_tok, &hook_ns);
    struct kvt_ram_cut cut;
    cut_entry(lru, e, &cut);
    struct rec *r = new_rec(lru);
    if (!r) {
        free(hook_tok);
        free(hook_ns);
        kvt_ram_cut_free(lru->cfg.cache, &cut);
        kvt_ram_lru_entry_free(lru, e);
        kvt_retain_release(retain);
        return kvt_fail(-ENOMEM, "prompt cache put: out of memory");
    }

    struct kvt_entry *cut_from = hold_cut(lru, r, e, &cut);
    r->share = retain;
    r->bytes = kvt_ram_lru_entry_bytes(lru, r->e);
    r->id = ++lru->next_id;
    r->on_disk = on_disk;
    bump(lru, r);
    lru->recs[lru->n++] = r;
    lru->total_bytes += r->bytes;

    struct rec_list drop, spill;
    detach_superseded(lru, r, &drop);
    detach_over_cap(lru, &spill);
    pthread_mutex_unlock(&lru->mu);

    kvt_ram_lru_entry_free(lru, cut_from);
    kvt_ram_cut_free(lru->cfg.cache, &cut);
    dispose_list(lru, drop.head, false);
    dispose_list(lru, spill.head, true);
    if (hook)
        lru->links.on_put(lru->links.ud, hook_tok, hook_n, hook_ns);
    free(hook_tok);
    free(hook_ns);
    return 0;
}

size_t kvt_ram_lru_peek_prefix_len(struct kvt_ram_lru *lru, const int32_t *tok, size_t n,
                                   const char *ns)
{
    if (!tok && n)
        return 0;
    size_t best;
    pthread_mutex_lock(&lru->mu);
    ram_candidate(lru, tok, n, kvt_tier_ns(ns), &best);
    pthread_mutex_unlock(&lru->mu);
    return best;
}

size_t kvt_ram_lru_peek_longest(struct kvt_ram_lru *lru, const int32_t *tok, size_t n,
                                const char *ns)
{
    if (!tok && n)
        return 0;
    ns = kvt_tier_ns(ns);
    size_t best;
    struct lower lo;
    pthread_mutex_lock(&lru->mu);
    ram_candidate(lru, tok, n, ns, &best);
    find_lower(lru, tok, n, ns, best, &lo); /* the take's own choice, without its restores */
    pthread_mutex_unlock(&lru->mu);
    if (lo.try_cold)
        best = lo.cold.prefix_len;
    if (lo.try_remote)
        best = lo.remote.prefix_len;
    return best;
}

/* Caller holds the lock. */
static struct rec *find_exact(struct kvt_ram_lru *lru, const int32_t *tok, size_t n, const char *ns)
{
    for (size_t i = 0; i < lru->n; i++) {
        struct rec *r = lru->recs[i];
        if (!strcmp(entry_ns(r->e), ns) && same_tokens(r->e, tok, n))
            return r;
    }
    return NULL;
}

bool kvt_ram_lru_find_exact(struct kvt_ram_lru *lru, const int32_t *tok, size_t n, const char *ns)
{
    if (!tok && n)
        return false;
    pthread_mutex_lock(&lru->mu);
    bool found = find_exact(lru, tok, n, kvt_tier_ns(ns)) != NULL;
    pthread_mutex_unlock(&lru->mu);
    return found;
}

int kvt_ram_lru_clone_exact(struct kvt_ram_lru *lru, const int32_t *tok, size_t n, const char *ns,
                            struct kvt_entry **out)
{
    *out = NULL;
    if (!tok && n)
        return kvt_fail(-EINVAL, "prompt cache: NULL tokens");
    int rc = 0;
    struct kvt_ram_held held = {0};
    pthread_mutex_lock(&lru->mu);
    struct rec *r = find_exact(lru, tok, n, kvt_tier_ns(ns));
    if (r)
        rc = kvt_ram_hold(lru->cfg.cache, r->e, r->chunks, r->m, &held);
    pthread_mutex_unlock(&lru->mu);
    if (r && rc == 0)
        rc = kvt_ram_join(lru->cfg.cache, &lru->alloc, &held, out);
    return r && rc == 0 ? 1 : rc;
}

size_t kvt_ram_lru_demote_idle(struct kvt_ram_lru *lru, int64_t idle_ms, int64_t now)
{
    if (!lru->cfg.cold)
        return 0; /* nowhere to go: demoting would lose data */
    struct rec_list idle;
    list_init(&idle);
    size_t count = 0;
    pthread_mutex_lock(&lru->mu);
    for (size_t i = 0; i < lru->n;) {
        if (now - lru->recs[i]->last_used_ms >= idle_ms) {
            list_push(&idle, detach(lru, i, true));
            count++;
        } else {
            i++;
        }
    }
    lru->demotions += count;
    pthread_mutex_unlock(&lru->mu);
    dispose_list(lru, idle.head, true);
    return count;
}

void kvt_ram_lru_get_stats(struct kvt_ram_lru *lru, struct kvt_pcache_stats *st)
{
    pthread_mutex_lock(&lru->mu);
    st->records = lru->n;
    st->total_bytes = lru->total_bytes;
    st->hits = lru->hits;
    st->misses = lru->misses;
    st->demotions = lru->demotions;
    pthread_mutex_unlock(&lru->mu);
}
