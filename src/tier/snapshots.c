/*
 * Write-behind snapshots (TIER.md §5): every put marks its exact key (ns, tokens) dirty and
 * (re)arms a debounce timer; an attempt clones the RAM record inside the engine exclusion
 * and hands the clones to the write queue. Outcomes: stored (the queue wrote it, or the
 * record is gone but a durable prefix exists) and missing clear the key; failed keeps it
 * dirty and re-arms it. flush() forces attempts until a pass clears nothing and reports
 * whether everything is on disk.
 *
 * A key is never freed while an attempt on it runs (`running`, which lasts until the
 * queue settles the snapshot), so the settle callback may touch it. The lock is never held
 * while calling the prompt cache, the queue, the engine or the cold tier.
 */
#include "tier/snapshots.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"

enum outcome { OUT_STORED, OUT_FAILED, OUT_MISSING };

struct key {
    struct key *next;
    int32_t *tok;
    size_t n;
    char *ns;
    uint64_t hash;
    uint64_t gen;  /* bumped by every schedule of this key */
    uint64_t pass; /* the flush pass that last attempted it */
    int64_t due;   /* monotonic ms, while armed */
    bool armed, running;
};

struct kvt_snapshots {
    struct kvt_tier_cfg cfg;
    struct kvt_ram_lru *ram;
    struct kvt_write_queue *q;
    void (*wake)(void *ud);
    void *wake_ud;
    pthread_mutex_t mu;
    pthread_cond_t cond; /* an attempt finished, or a flush ended */
    struct key *keys;
    uint64_t n_keys;
    uint64_t missing_total, cleared_total, pass_seq;
    bool flushing;
    uint64_t flush_seq;
    struct kvt_flush_report last;
    int last_rc;
};

struct clone_step {
    struct kvt_ram_lru *ram;
    const struct key *k;
    struct kvt_entry *out;
    int rc;
    bool ran;
};

struct settle_ctx {
    struct kvt_snapshots *wb;
    struct key *k;
    uint64_t gen;
};

static uint64_t key_hash(const int32_t *tok, size_t n, const char *ns)
{
    return kvt_wyhash(kvt_wyhash(0, ns, strlen(ns)), tok, n * sizeof(*tok));
}

static struct timespec to_ts(int64_t ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    return ts;
}

/* Wait on the condition until @p deadline (monotonic ms; < 0 = none): false on timeout. */
static bool wait_until(struct kvt_snapshots *wb, int64_t deadline)
{
    if (deadline < 0) {
        pthread_cond_wait(&wb->cond, &wb->mu);
        return true;
    }
    struct timespec ts = to_ts(deadline);
    return pthread_cond_timedwait(&wb->cond, &wb->mu, &ts) != ETIMEDOUT;
}

int kvt_snapshots_new(const struct kvt_tier_cfg *cfg, struct kvt_ram_lru *ram,
                      struct kvt_write_queue *q, void (*wake)(void *ud), void *wake_ud,
                      struct kvt_snapshots **out)
{
    *out = NULL;
    if (!cfg || !ram || !q || !cfg->cold)
        return kvt_fail(-EINVAL, "write-behind: bad configuration");
    struct kvt_snapshots *wb = calloc(1, sizeof(*wb));
    if (!wb)
        return kvt_fail(-ENOMEM, "write-behind: out of memory");
    wb->cfg = *cfg;
    wb->ram = ram;
    wb->q = q;
    wb->wake = wake;
    wb->wake_ud = wake_ud;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&wb->mu, NULL);
    pthread_cond_init(&wb->cond, &ca);
    pthread_condattr_destroy(&ca);
    *out = wb;
    return 0;
}

static void key_free(struct key *k)
{
    free(k->tok);
    free(k->ns);
    free(k);
}

void kvt_snapshots_free(struct kvt_snapshots *wb)
{
    if (!wb)
        return;
    while (wb->keys) {
        struct key *k = wb->keys;
        wb->keys = k->next;
        key_free(k);
    }
    pthread_cond_destroy(&wb->cond);
    pthread_mutex_destroy(&wb->mu);
    free(wb);
}

static void wake(struct kvt_snapshots *wb)
{
    if (wb->wake)
        wb->wake(wb->wake_ud);
}

void kvt_snapshots_schedule(struct kvt_snapshots *wb, const int32_t *tok, size_t n, const char *ns)
{
    if (!wb->cfg.write_behind || n == 0 || !tok)
        return;
    ns = kvt_tier_ns(ns);
    uint64_t h = key_hash(tok, n, ns);

    pthread_mutex_lock(&wb->mu);
    struct key *k = wb->keys;
    while (k && !(k->hash == h && k->n == n && !strcmp(k->ns, ns) &&
                  !memcmp(k->tok, tok, n * sizeof(*tok))))
        k = k->next;
    if (!k) {
        k = calloc(1, sizeof(*k));
        int32_t *copy = malloc(n * sizeof(*tok));
        char *ns_copy = strdup(ns);
        if (!k || !copy || !ns_copy) {
            pthread_mutex_unlock(&wb->mu);
            free(k);
            free(copy);
            free(ns_copy);
            return; /* out of memory: this snapshot is skipped, the put stands */
        }
        memcpy(copy, tok, n * sizeof(*tok));
        k->tok = copy;
        k->n = n;
        k->ns = ns_copy;
        k->hash = h;
        k->next = wb->keys;
        wb->keys = k;
        wb->n_keys++;
    }
    k->gen++;
    k->armed = true;
    k->due = kvt_mono_ms() + wb->cfg.snapshot_debounce_ms;
    pthread_mutex_unlock(&wb->mu);
    wake(wb);
}

static void unlink_key(struct kvt_snapshots *wb, struct key *k)
{
    struct key **p = &wb->keys;
    while (*p != k)
        p = &(*p)->next;
    *p = k->next;
    wb->n_keys--;
}

/* Record an attempt's outcome. @p gen is the key's generation when the attempt began. */
static void finish(struct kvt_snapshots *wb, struct key *k, uint64_t gen, enum outcome o)
{
    bool rearmed = false;
    pthread_mutex_lock(&wb->mu);
    k->running = false;
    if (o == OUT_FAILED) {
        if (!k->armed) {
            k->armed = true;
            k->due = kvt_mono_ms() + wb->cfg.snapshot_busy_retry_ms;
        }
        rearmed = true;
    } else if (k->gen == gen) {
        if (o == OUT_MISSING)
            wb->missing_total++;
        wb->cleared_total++;
        unlink_key(wb, k);
        key_free(k);
        k = NULL;
    } else {
        rearmed = k->armed; /* put again meanwhile: it stays dirty on its new timer */
    }
    pthread_cond_broadcast(&wb->cond);
    pthread_mutex_unlock(&wb->mu);
    if (rearmed)
        wake(wb);
}

static void settled(void *ud, bool stored)
{
    struct settle_ctx *c = ud;
    finish(c->wb, c->k, c->gen, stored ? OUT_STORED : OUT_FAILED);
    free(c);
}

static int clone_step(void *arg)
{
    struct clone_step *st = arg;
    st->ran = true;
    st->rc = kvt_ram_lru_clone_exact(st->ram, st->k->tok, st->k->n, st->k->ns, &st->out);
    return st->rc < 0 ? st->rc : 0;
}

/* Whether the tokens of @p k are still on their way to the disk though its record left RAM:
 * another dirty key of its namespace extends them (the record that superseded it), or the
 * write queue still holds work (a spill of it). Its outcome then waits for a later attempt. */
static bool on_the_way(struct kvt_snapshots *wb, const struct key *k)
{
    struct kvt_write_queue_stats qs;
    kvt_write_queue_get_stats(wb->q, &qs);
    bool yes = qs.pending_count > 0;
    pthread_mutex_lock(&wb->mu);
    for (const struct key *o = wb->keys; o && !yes; o = o->next)
        yes = o != k && o->n > k->n && !strcmp(o->ns, k->ns) &&
              !memcmp(o->tok, k->tok, k->n * sizeof(*k->tok));
    pthread_mutex_unlock(&wb->mu);
    return yes;
}

/* One attempt on @p k, whose `running` the caller set. The outcome is recorded here, or by
 * the queue's settle callback once the snapshot is written. */
static void attempt(struct kvt_snapshots *wb, struct key *k, uint64_t gen, bool forced)
{
    const struct kvt_tier_cfg *c = &wb->cfg;
    if (!forced && c->busy && c->busy(c->engine)) {
        finish(wb, k, gen, OUT_FAILED); /* would stall admission; a late snapshot is as good */
        return;
    }
    struct clone_step st = {.ram = wb->ram, .k = k};
    kvt_tier_run_exclusive(c->run_exclusive, c->engine, clone_step, &st);
    if (!st.ran || st.rc < 0) {
        kvt_ram_lru_entry_free(wb->ram, st.out);
        finish(wb, k, gen, OUT_FAILED);
        return;
    }
    if (st.rc == 1) {
        struct settle_ctx *ctx = malloc(sizeof(*ctx));
        if (!ctx) {
            kvt_ram_lru_entry_free(wb->ram, st.out);
            finish(wb, k, gen, OUT_FAILED);
            return;
        }
        *ctx = (struct settle_ctx){wb, k, gen};
        if (kvt_write_queue_enqueue(wb->q, st.out, settled, ctx) < 0) {
            free(ctx);
            finish(wb, k, gen, OUT_FAILED);
        }
        return;
    }
    /* Evicted or superseded: fine if the disk already holds it (or a longer trimmable one). */
    bool durable = c->cold->has_durable_prefix(c->store, k->tok, k->n, k->ns);
    finish(wb, k, gen, durable ? OUT_STORED : on_the_way(wb, k) ? OUT_FAILED : OUT_MISSING);
}

int64_t kvt_snapshots_tick(void *arg, int64_t now)
{
    struct kvt_snapshots *wb = arg;
    pthread_mutex_lock(&wb->mu);
    for (;;) {
        struct key *due = NULL;
        int64_t next = INT64_MAX;
        for (struct key *k = wb->keys; k; k = k->next) {
            if (!k->armed || k->running)
                continue;
            if (k->due <= now) {
                due = k;
                break;
            }
            if (k->due < next)
                next = k->due;
        }
        if (!due) {
            pthread_mutex_unlock(&wb->mu);
            return next;
        }
        due->armed = false;
        due->running = true;
        uint64_t gen = due->gen;
        pthread_mutex_unlock(&wb->mu);
        attempt(wb, due, gen, false);
        now = kvt_mono_ms();
        pthread_mutex_lock(&wb->mu);
    }
}

uint64_t kvt_snapshots_pending(struct kvt_snapshots *wb)
{
    pthread_mutex_lock(&wb->mu);
    uint64_t n = wb->n_keys;
    pthread_mutex_unlock(&wb->mu);
    return n;
}

static uint64_t wb_missing(struct kvt_snapshots *wb)
{
    pthread_mutex_lock(&wb->mu);
    uint64_t n = wb->missing_total;
    pthread_mutex_unlock(&wb->mu);
    return n;
}

static bool any_running(const struct kvt_snapshots *wb)
{
    for (const struct key *k = wb->keys; k; k = k->next)
        if (k->running)
            return true;
    return false;
}

/* One pass: a forced attempt per key not yet visited, one at a time, draining after each.
 * @return 0 or KVT_E_TIMEOUT. */
static int flush_pass(struct kvt_snapshots *wb, uint64_t pass, int64_t deadline)
{
    for (;;) {
        pthread_mutex_lock(&wb->mu);
        struct key *pick = NULL;
        bool busy_key = false;
        for (struct key *k = wb->keys; k; k = k->next) {
            if (k->pass == pass)
                continue;
            if (!k->running) {
                pick = k;
                break;
            }
            busy_key = true;
        }
        if (!pick) {
            bool timed_out = busy_key && !wait_until(wb, deadline);
            pthread_mutex_unlock(&wb->mu);
            if (!busy_key)
                return 0;
            if (timed_out)
                return kvt_fail(KVT_E_TIMEOUT, "flush: timed out waiting for a snapshot");
            continue; /* a running attempt finished: look again */
        }
        pick->pass = pass;
        pick->running = true;
        pick->armed = false;
        uint64_t gen = pick->gen;
        pthread_mutex_unlock(&wb->mu);

        attempt(wb, pick, gen, true);
        int rc = kvt_write_queue_drain(wb->q, deadline);
        if (rc < 0)
            return rc;
    }
}

static void fill_report(struct kvt_snapshots *wb, struct kvt_flush_report *r, uint64_t missing0,
                        const struct kvt_write_queue_stats *s0, bool timed_out)
{
    struct kvt_write_queue_stats s;
    struct kvt_store_stats cs;
    memset(&cs, 0, sizeof(cs));
    kvt_write_queue_get_stats(wb->q, &s);
    wb->cfg.cold->get_stats(wb->cfg.store, &cs);

    memset(r, 0, sizeof(*r));
    pthread_mutex_lock(&wb->mu);
    r->pending_snapshots = wb->n_keys;
    r->missing = wb->missing_total - missing0;
    pthread_mutex_unlock(&wb->mu);
    r->pending_spills = s.pending_count;
    r->pending_spill_bytes = s.pending_bytes;
    r->dropped = s.dropped - s0->dropped;
    r->failed = s.failed - s0->failed;
    r->entries = cs.entries;
    r->longest_durable_prefix_tokens = cs.longest_durable_prefix_tokens;
    r->durable = !timed_out && !r->pending_snapshots && !r->pending_spills && !r->dropped &&
                 !r->failed && !r->missing;
}

/* Passes over every dirty key until one clears nothing; 0 or the error of a pass. */
static int flush_passes(struct kvt_snapshots *wb, int64_t deadline)
{
    for (;;) {
        pthread_mutex_lock(&wb->mu);
        uint64_t cleared0 = wb->cleared_total;
        uint64_t pass = ++wb->pass_seq;
        pthread_mutex_unlock(&wb->mu);
        int rc = flush_pass(wb, pass, deadline);
        pthread_mutex_lock(&wb->mu);
        bool progress = wb->cleared_total != cleared0;
        pthread_mutex_unlock(&wb->mu);
        if (rc || !progress)
            return rc;
    }
}

/* Keys a flush left dirty go back on the retry timer (the lock held); true if any did. */
static bool rearm_dirty(struct kvt_snapshots *wb)
{
    bool rearmed = false;
    for (struct key *k = wb->keys; k; k = k->next) {
        if (!k->armed && !k->running) {
            k->armed = true;
            k->due = kvt_mono_ms() + wb->cfg.snapshot_busy_retry_ms;
            rearmed = true;
        }
    }
    return rearmed;
}

int kvt_snapshots_flush(struct kvt_snapshots *wb, int64_t timeout_ms, struct kvt_flush_report *r)
{
    int64_t now = kvt_mono_ms();
    int64_t deadline = timeout_ms > INT64_MAX / 4 ? -1 : now + timeout_ms;
    struct kvt_write_queue_stats s0;
    int rc = 0;

    kvt_write_queue_get_stats(wb->q, &s0); /* drops and failures count from here */
    pthread_mutex_lock(&wb->mu);
    if (wb->flushing) { /* single flight: share the running flush's report */
        uint64_t seq = wb->flush_seq;
        while (wb->flush_seq == seq && wait_until(wb, deadline))
            ;
        if (wb->flush_seq != seq) {
            *r = wb->last;
            rc = wb->last_rc;
            pthread_mutex_unlock(&wb->mu);
            return rc;
        }
        pthread_mutex_unlock(&wb->mu);
        fill_report(wb, r, wb_missing(wb), &s0, true);
        return kvt_fail(KVT_E_TIMEOUT, "flush: timed out waiting for the running flush");
    }
    wb->flushing = true;
    uint64_t missing0 = wb->missing_total;
    for (struct key *k = wb->keys; k; k = k->next)
        k->armed = false; /* cancel armed timers: this flush attempts every key */
    while (!rc && any_running(wb))
        if (!wait_until(wb, deadline) && any_running(wb))
            rc = kvt_fail(KVT_E_TIMEOUT, "flush: timed out waiting for a snapshot");
    pthread_mutex_unlock(&wb->mu);

    if (!rc)
        rc = kvt_write_queue_drain(wb->q, deadline);
    if (!rc)
        rc = flush_passes(wb, deadline);

    fill_report(wb, r, missing0, &s0, rc != 0);

    pthread_mutex_lock(&wb->mu);
    bool rearmed = rearm_dirty(wb);
    wb->flushing = false;
    wb->flush_seq++;
    wb->last = *r;
    wb->last_rc = rc;
    pthread_cond_broadcast(&wb->cond);
    pthread_mutex_unlock(&wb->mu);
    if (rearmed)
        wake(wb);
    return rc;
}
