/*
 * Stubs for the tier suites: counting caches that share refcounted "buffers" (so a test can
 * see when the donor's and the clones' memory is released), an in-memory cold tier with the
 * store's find / supersession / durable-prefix rules and a writer split into N + 1 gated
 * steps, an engine gate (run_exclusive) that can pass, refuse, fail or block, a busy probe,
 * a controllable wall clock and a log recorder.
 */
#ifndef TEST_TIER_STUBS_H
#define TEST_TIER_STUBS_H

#include "support/support.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tier/tier.h"

#define STUB static __attribute__((unused))

/* ---------------------------------------------------------------- caches */

struct sbuf {
    int refs;
    int id;
};

struct scache {
    struct sbuf *buf;
    size_t bytes;
    bool trimmable;
    int64_t offset;
    bool clone;
};

#define MAX_BUF_IDS 4096

struct world {
    pthread_mutex_t mu;
    int next_buf;
    int caches_live, bufs_live;
    int clone_calls, clones_made, disposes, trims, trim_tokens;
    int fail_clone_at; /* fail the Nth cache clone (1-based) from now; 0 = never */
    bool fail_trim;    /* every trim(n > 0) fails */
    unsigned char released[MAX_BUF_IDS];
};

static struct world W = {.mu = PTHREAD_MUTEX_INITIALIZER};

STUB void world_reset(void)
{
    pthread_mutex_lock(&W.mu);
    W.next_buf = 0;
    W.caches_live = W.bufs_live = 0;
    W.clone_calls = W.clones_made = W.disposes = W.trims = W.trim_tokens = 0;
    W.fail_clone_at = 0;
    W.fail_trim = false;
    memset(W.released, 0, sizeof(W.released));
    pthread_mutex_unlock(&W.mu);
}

STUB int world_get(const int *field)
{
    pthread_mutex_lock(&W.mu);
    int v = *field;
    pthread_mutex_unlock(&W.mu);
    return v;
}

STUB bool buf_released(int id)
{
    pthread_mutex_lock(&W.mu);
    bool r = W.released[id];
    pthread_mutex_unlock(&W.mu);
    return r;
}

STUB struct scache *scache_new(size_t bytes, bool trimmable, int64_t offset)
{
    struct scache *c = calloc(1, sizeof(*c));
    struct sbuf *b = calloc(1, sizeof(*b));
    pthread_mutex_lock(&W.mu);
    b->refs = 1;
    b->id = ++W.next_buf;
    W.bufs_live++;
    W.caches_live++;
    pthread_mutex_unlock(&W.mu);
    c->buf = b;
    c->bytes = bytes;
    c->trimmable = trimmable;
    c->offset = offset;
    return c;
}

STUB void scache_dispose(struct scache *c)
{
    pthread_mutex_lock(&W.mu);
    W.disposes++;
    W.caches_live--;
    if (--c->buf->refs == 0) {
        W.bufs_live--;
        if (c->buf->id < MAX_BUF_IDS)
            W.released[c->buf->id] = 1;
        free(c->buf);
    }
    pthread_mutex_unlock(&W.mu);
    free(c);
}

STUB size_t st_bytes(const kvt_cache *c)
{
    return ((const struct scache *)c)->bytes;
}

STUB bool st_trimmable(const kvt_cache *c)
{
    return ((const struct scache *)c)->trimmable;
}

STUB int st_trim(kvt_cache *kc, int64_t n)
{
    struct scache *c = (struct scache *)kc;
    if (n == 0)
        return 0;
    pthread_mutex_lock(&W.mu);
    bool fail = W.fail_trim || !c->trimmable;
    if (!fail) {
        W.trims++;
        W.trim_tokens += (int)n;
    }
    pthread_mutex_unlock(&W.mu);
    if (fail)
        return KVT_E_STATE;
    c->offset = c->offset > n ? c->offset - n : 0;
    return 0;
}

STUB struct kvt_entry *sentry_new(const int32_t *tok, size_t n, const char *ns, size_t n_caches,
                                  size_t bytes_each, bool trimmable)
{
    struct kvt_entry *e = calloc(1, sizeof(*e));
    e->tokens = malloc((n ? n : 1) * sizeof(int32_t));
    if (n)
        memcpy(e->tokens, tok, n * sizeof(int32_t));
    e->n_tokens = n;
    e->caches = calloc(n_caches ? n_caches : 1, sizeof(kvt_cache *));
    e->n_caches = n_caches;
    for (size_t i = 0; i < n_caches; i++)
        e->caches[i] = (kvt_cache *)scache_new(bytes_each, trimmable, (int64_t)n);
    e->meta.ns = ns ? strdup(ns) : NULL;
    e->created_at = -1;
    return e;
}

/* A test entry whose tokens are start, start+1, …, start+n-1. */
STUB struct kvt_entry *sentry_seq(int32_t start, size_t n, const char *ns, size_t n_caches,
                                  size_t bytes_each, bool trimmable)
{
    int32_t *tok = malloc((n ? n : 1) * sizeof(*tok));
    for (size_t i = 0; i < n; i++)
        tok[i] = start + (int32_t)i;
    struct kvt_entry *e = sentry_new(tok, n, ns, n_caches, bytes_each, trimmable);
    free(tok);
    return e;
}

STUB void st_entry_free(struct kvt_entry *e)
{
    if (!e)
        return;
    for (size_t i = 0; i < e->n_caches; i++)
        if (e->caches[i])
            scache_dispose((struct scache *)e->caches[i]);
    free(e->caches);
    free(e->tokens);
    free((char *)e->meta.ns);
    free(e);
}

STUB int st_entry_clone(const struct kvt_entry *e, struct kvt_entry **out)
{
    *out = NULL;
    struct kvt_entry *c = calloc(1, sizeof(*c));
    c->tokens = malloc((e->n_tokens ? e->n_tokens : 1) * sizeof(int32_t));
    if (e->n_tokens)
        memcpy(c->tokens, e->tokens, e->n_tokens * sizeof(int32_t));
    c->n_tokens = e->n_tokens;
    c->caches = calloc(e->n_caches ? e->n_caches : 1, sizeof(kvt_cache *));
    c->meta.ns = e->meta.ns ? strdup(e->meta.ns) : NULL;
    c->created_at = -1;
    for (size_t i = 0; i < e->n_caches; i++) {
        const struct scache *src = (const struct scache *)e->caches[i];
        pthread_mutex_lock(&W.mu);
        bool fail = ++W.clone_calls == W.fail_clone_at;
        if (!fail) {
            W.clones_made++;
            W.caches_live++;
            src->buf->refs++;
        }
        pthread_mutex_unlock(&W.mu);
        if (fail) {
            st_entry_free(c); /* releases the clones built so far */
            return -ENOMEM;
        }
        struct scache *k = calloc(1, sizeof(*k));
        *k = *src;
        k->clone = true;
        c->caches[i] = (kvt_cache *)k;
        c->n_caches = i + 1;
    }
    *out = c;
    return 0;
}

static const struct kvt_tier_cache_ops stub_cache_ops __attribute__((unused)) = {
    .bytes = st_bytes,
    .is_trimmable = st_trimmable,
    .trim = st_trim,
    .entry_clone = st_entry_clone,
    .entry_free = st_entry_free,
};

STUB int cache_buf_id(const struct kvt_entry *e, size_t i)
{
    return ((const struct scache *)e->caches[i])->buf->id;
}

STUB int64_t cache_offset(const struct kvt_entry *e, size_t i)
{
    return ((const struct scache *)e->caches[i])->offset;
}

STUB bool cache_is_clone(const struct kvt_entry *e, size_t i)
{
    return ((const struct scache *)e->caches[i])->clone;
}

/* ---------------------------------------------------------------- engine gate */

struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    pthread_mutex_t engine; /* the engine exclusion the steps run under */
    int calls, ran, refused;
    int refuse_from; /* refuse calls numbered >= this (1-based, counted from now); 0 = never */
    bool blocked;    /* hold every caller until unblocked */
    int waiting;
};

STUB void gate_init(struct gate *g)
{
    memset(g, 0, sizeof(*g));
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cond, NULL);
    pthread_mutex_init(&g->engine, NULL);
}

STUB void gate_destroy(struct gate *g)
{
    pthread_cond_destroy(&g->cond);
    pthread_mutex_destroy(&g->mu);
    pthread_mutex_destroy(&g->engine);
}

STUB void gate_block(struct gate *g, bool on)
{
    pthread_mutex_lock(&g->mu);
    g->blocked = on;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->mu);
}

STUB void gate_refuse_from(struct gate *g, int k)
{
    pthread_mutex_lock(&g->mu);
    g->refuse_from = k ? g->calls + k : 0;
    pthread_mutex_unlock(&g->mu);
}

STUB int gate_get(struct gate *g, const int *field)
{
    pthread_mutex_lock(&g->mu);
    int v = *field;
    pthread_mutex_unlock(&g->mu);
    return v;
}

/* Wait until at least @p n callers are held by a blocked gate. */
STUB void gate_wait_held(struct gate *g, int n)
{
    pthread_mutex_lock(&g->mu);
    while (g->waiting < n)
        pthread_cond_wait(&g->cond, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

STUB int gate_run(void *engine, kvt_step_fn step, void *arg)
{
    struct gate *g = engine;
    pthread_mutex_lock(&g->mu);
    int call = ++g->calls;
    g->waiting++;
    pthread_cond_broadcast(&g->cond);
    while (g->blocked)
        pthread_cond_wait(&g->cond, &g->mu);
    g->waiting--;
    bool refuse = g->refuse_from && call >= g->refuse_from;
    if (refuse)
        g->refused++;
    else
        g->ran++;
    pthread_mutex_unlock(&g->mu);
    if (refuse)
        return KVT_E_REFUSED;
    pthread_mutex_lock(&g->engine);
    int rc = step(arg);
    pthread_mutex_unlock(&g->engine);
    return rc;
}

/* ---------------------------------------------------------------- cold tier */

/* The tier sees its cold tier only as an opaque kvt_store and the ops table, so the stub is
 * this suite's own struct kvt_store. */

struct crec {
    int32_t *tok;
    size_t n;
    char *ns;
    bool trimmable;
    size_t n_caches, bytes;
};

#define COLD_MAX 256

struct kvt_store {
    pthread_mutex_t mu;
    struct crec recs[COLD_MAX];
    size_t n;
    int puts, put_ok, put_fail, finds, restores, closes;
    int fail_puts;                 /* fail this many upcoming puts (after their steps); < 0 = all */
    int fail_step;                 /* fail write step k (1-based) of every put; 0 = never */
    bool restore_miss;             /* restore returns no entry */
    bool restore_live_untrimmable; /* restored caches say untrimmable (header said trimmable) */
    int open_tmp;                  /* "files" a put has open right now */
    int steps;                     /* write steps run */
    int refused_puts;              /* puts aborted by a refusing gate */
};

STUB void cold_init(struct kvt_store *c)
{
    memset(c, 0, sizeof(*c));
    pthread_mutex_init(&c->mu, NULL);
}

STUB void cold_destroy(struct kvt_store *c)
{
    for (size_t i = 0; i < c->n; i++) {
        free(c->recs[i].tok);
        free(c->recs[i].ns);
    }
    c->n = 0;
    pthread_mutex_destroy(&c->mu);
}

STUB int cold_get(struct kvt_store *c, const int *field)
{
    pthread_mutex_lock(&c->mu);
    int v = *field;
    pthread_mutex_unlock(&c->mu);
    return v;
}

STUB size_t cold_count(struct kvt_store *c)
{
    pthread_mutex_lock(&c->mu);
    size_t n = c->n;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* Whether the cold tier holds exactly these tokens. */
STUB bool cold_has(struct kvt_store *c, const int32_t *tok, size_t n, const char *ns)
{
    bool found = false;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n && !found; i++)
        found = c->recs[i].n == n && !strcmp(c->recs[i].ns, ns) &&
                !memcmp(c->recs[i].tok, tok, n * sizeof(*tok));
    pthread_mutex_unlock(&c->mu);
    return found;
}

STUB void cold_remove_locked(struct kvt_store *c, size_t i)
{
    free(c->recs[i].tok);
    free(c->recs[i].ns);
    memmove(c->recs + i, c->recs + i + 1, (c->n - i - 1) * sizeof(c->recs[0]));
    c->n--;
}

/* Insert with the store's rules: exact duplicates go, trimmable entries supersede ancestors. */
STUB void cold_insert(struct kvt_store *c, const int32_t *tok, size_t n, const char *ns,
                      bool trimmable, size_t n_caches, size_t bytes)
{
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n;) {
        struct crec *r = &c->recs[i];
        bool same_ns = !strcmp(r->ns, ns);
        bool dup = same_ns && r->n == n && !memcmp(r->tok, tok, n * sizeof(*tok));
        bool anc = same_ns && trimmable && r->n < n && !memcmp(r->tok, tok, r->n * sizeof(*tok));
        if (dup || anc)
            cold_remove_locked(c, i);
        else
            i++;
    }
    if (c->n < COLD_MAX) {
        struct crec *r = &c->recs[c->n++];
        r->tok = malloc((n ? n : 1) * sizeof(*tok));
        memcpy(r->tok, tok, n * sizeof(*tok));
        r->n = n;
        r->ns = strdup(ns);
        r->trimmable = trimmable;
        r->n_caches = n_caches;
        r->bytes = bytes;
    }
    pthread_mutex_unlock(&c->mu);
}

STUB int cs_find(kvt_store *c, const int32_t *tok, size_t n, const char *ns, struct kvt_hit *hit)
{
    memset(hit, 0, sizeof(*hit));
    pthread_mutex_lock(&c->mu);
    c->finds++;
    size_t best = 0;
    for (size_t i = 0; n > 0 && i < c->n; i++) {
        struct crec *r = &c->recs[i];
        if (strcmp(r->ns, ns))
            continue;
        size_t p = kvt_tier_lcp(r->tok, r->n, tok, n);
        if (p > n - 1)
            p = n - 1;
        if (p == 0 || p <= best)
            continue;
        if (r->n > p && !r->trimmable)
            continue;
        best = p;
        hit->prefix_len = p;
        hit->n_tokens = r->n;
        hit->id = i;
        hit->trimmable = r->trimmable;
    }
    pthread_mutex_unlock(&c->mu);
    return 0;
}

STUB int cs_restore(kvt_store *c, const struct kvt_hit *hit, struct kvt_entry **out)
{
    *out = NULL;
    pthread_mutex_lock(&c->mu);
    c->restores++;
    bool miss = c->restore_miss || hit->id >= c->n;
    struct crec r = miss ? (struct crec){0} : c->recs[hit->id];
    bool untrim = c->restore_live_untrimmable;
    struct kvt_entry *e = NULL;
    if (!miss)
        e = sentry_new(r.tok, r.n, r.ns, r.n_caches, r.n_caches ? r.bytes / r.n_caches : 0,
                       r.trimmable && !untrim);
    pthread_mutex_unlock(&c->mu);
    *out = e;
    return 0;
}

struct put_ctx {
    struct kvt_store *c;
    int step;
    int fail_step;
    bool open;
};

STUB int put_step(void *arg)
{
    struct put_ctx *p = arg;
    p->step++;
    pthread_mutex_lock(&p->c->mu);
    p->c->steps++;
    if (!p->open) {
        p->open = true;
        p->c->open_tmp++;
    }
    pthread_mutex_unlock(&p->c->mu);
    return p->fail_step == p->step ? -EIO : 0;
}

/* N tensors (two per cache) = N + 1 gated steps; cleanup on every failure path. */
STUB int cs_put(kvt_store *c, const struct kvt_entry *e, kvt_run_exclusive_fn rx, void *engine)
{
    pthread_mutex_lock(&c->mu);
    c->puts++;
    bool fail = c->fail_puts != 0;
    if (c->fail_puts > 0)
        c->fail_puts--;
    struct put_ctx p = {.c = c, .fail_step = c->fail_step};
    pthread_mutex_unlock(&c->mu);

    int rc = 0;
    int steps = 2 * (int)e->n_caches + 1;
    for (int i = 0; i < steps && rc == 0; i++)
        rc = kvt_tier_run_exclusive(rx, engine, put_step, &p);
    bool trimmable = true;
    size_t bytes = 0;
    for (size_t i = 0; i < e->n_caches; i++) {
        trimmable = trimmable && st_trimmable(e->caches[i]);
        bytes += st_bytes(e->caches[i]);
    }
    pthread_mutex_lock(&c->mu);
    if (p.open)
        c->open_tmp--; /* closed and unlinked on failure, renamed on success */
    if (rc == KVT_E_REFUSED)
        c->refused_puts++;
    if (rc == 0 && fail)
        rc = -ENOSPC;
    if (rc < 0)
        c->put_fail++;
    else
        c->put_ok++;
    pthread_mutex_unlock(&c->mu);
    if (rc == 0)
        cold_insert(c, e->tokens, e->n_tokens, kvt_tier_ns(e->meta.ns), trimmable, e->n_caches,
                    bytes);
    return rc;
}

STUB bool cs_has_durable_prefix(kvt_store *c, const int32_t *tok, size_t n, const char *ns)
{
    bool found = false;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n && !found; i++) {
        struct crec *r = &c->recs[i];
        found = !strcmp(r->ns, ns) && r->n >= n && !memcmp(r->tok, tok, n * sizeof(*tok)) &&
                (r->n == n || r->trimmable);
    }
    pthread_mutex_unlock(&c->mu);
    return found;
}

STUB void cs_get_stats(kvt_store *c, struct kvt_store_stats *st)
{
    memset(st, 0, sizeof(*st));
    pthread_mutex_lock(&c->mu);
    st->entries = c->n;
    for (size_t i = 0; i < c->n; i++) {
        st->total_bytes += c->recs[i].bytes;
        if (c->recs[i].n > st->longest_durable_prefix_tokens)
            st->longest_durable_prefix_tokens = c->recs[i].n;
    }
    st->spills = (uint64_t)c->put_ok;
    st->store_failures = (uint64_t)c->put_fail;
    st->restores = (uint64_t)c->restores;
    pthread_mutex_unlock(&c->mu);
}

STUB void cs_close(kvt_store *c)
{
    pthread_mutex_lock(&c->mu);
    c->closes++;
    pthread_mutex_unlock(&c->mu);
}

static const struct kvt_tier_cold_ops stub_cold_ops __attribute__((unused)) = {
    .find = cs_find,
    .restore = cs_restore,
    .put = cs_put,
    .has_durable_prefix = cs_has_durable_prefix,
    .get_stats = cs_get_stats,
    .close = cs_close,
};

/* ---------------------------------------------------------------- busy, clock, log, hooks */

static atomic_bool stub_busy_flag;
static atomic_int stub_busy_calls;

STUB bool stub_busy(void *engine)
{
    (void)engine;
    atomic_fetch_add(&stub_busy_calls, 1);
    return atomic_load(&stub_busy_flag);
}

static _Atomic int64_t stub_now = 1000000;

STUB int64_t stub_wall(void *ud)
{
    (void)ud;
    return atomic_load(&stub_now);
}

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[16384];

STUB void stub_log(void *ud, int level, const char *msg)
{
    (void)ud;
    (void)level;
    pthread_mutex_lock(&log_mu);
    size_t len = strlen(log_text);
    snprintf(log_text + len, sizeof(log_text) - len, "%s\n", msg);
    pthread_mutex_unlock(&log_mu);
}

STUB void log_reset(void)
{
    pthread_mutex_lock(&log_mu);
    log_text[0] = 0;
    pthread_mutex_unlock(&log_mu);
}

STUB bool log_has(const char *needle)
{
    pthread_mutex_lock(&log_mu);
    bool r = strstr(log_text, needle) != NULL;
    pthread_mutex_unlock(&log_mu);
    return r;
}

/* Poll @p pred until it holds; fails the test after 20 s (a hang, not a timing check). */
#define WAIT_FOR(pred)                                                                             \
    do {                                                                                           \
        int waited_ms_ = 0;                                                                        \
        while (!(pred)) {                                                                          \
            if (waited_ms_ >= 20000)                                                               \
                fail_msg("condition never became true: %s", #pred);                                \
            usleep(1000);                                                                          \
            waited_ms_++;                                                                          \
        }                                                                                          \
    } while (0)

#endif
