/*
 * The assembly: kvt_pcache built from its parts (TIER.md) — the RAM LRU, the write-behind
 * queue with its writer thread, the snapshots, and the timer thread that also runs idle
 * demotion. Everything here goes through the ops tables of tier.h, so the whole public
 * kvt_pcache behavior runs the same over the real store (pcache_open.c) and over test doubles.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "tier/ram_lru.h"
#include "threads/write_queue.h"
#include "device/device_parts.h"
#include "tier/tier.h"
#include "threads/timer_thread.h"
#include "tier/snapshots.h"

struct kvt_pcache {
    struct kvt_tier_cfg cfg;
    struct kvt_ram_lru *pc; /* the RAM LRU */
    struct kvt_write_queue *q;
    struct kvt_snapshots *wb;
    _Atomic(struct kvt_timer_thread *) tt;
    int64_t demote_next; /* timer thread only */
    int64_t demote_interval;
};

static int64_t wall_now(const kvt_pcache *t)
{
    return t->cfg.wall_ms ? t->cfg.wall_ms(t->cfg.clock_ud) : kvt_wall_ms();
}

static size_t q_bytes_of(void *ud, const struct kvt_entry *e)
{
    kvt_pcache *t = ud;
    return kvt_ram_lru_entry_bytes(t->pc, e);
}

static int q_store(void *ud, const struct kvt_entry *e)
{
    kvt_pcache *t = ud;
    int rc = t->cfg.cold->put(t->cfg.store, e, t->cfg.run_exclusive, t->cfg.engine);
    if (rc == 0 && t->cfg.remote_ops) /* behind the local write; only queued, never waited on */
        t->cfg.remote_ops->put_async(t->cfg.remote, e);
    return rc;
}

static void q_dispose(void *ud, struct kvt_entry *e)
{
    kvt_pcache *t = ud;
    kvt_ram_lru_entry_free(t->pc, e);
}

static int spill_owned(void *ud, struct kvt_entry *clones)
{
    kvt_pcache *t = ud;
    return kvt_write_queue_enqueue(t->q, clones, NULL, NULL);
}

static void on_put(void *ud, const int32_t *tok, size_t n, const char *ns)
{
    kvt_pcache *t = ud;
    if (t->wb)
        kvt_snapshots_schedule(t->wb, tok, n, ns);
    if (t->cfg.on_put)
        t->cfg.on_put(t->cfg.on_put_ud, tok, n, ns);
}

static void wake_timers(void *ud)
{
    kvt_pcache *t = ud;
    kvt_timer_thread_wake(atomic_load(&t->tt));
}

struct demote_step {
    kvt_pcache *t;
    size_t count;
};

static int demote_step(void *arg)
{
    struct demote_step *d = arg;
    d->count = kvt_ram_lru_demote_idle(d->t->pc, d->t->cfg.demote_idle_ms, wall_now(d->t));
    return 0;
}

/* TIER.md §7: every interval, unless the engine is busy, demote inside the exclusion. */
static int64_t demote_tick(void *ud, int64_t now)
{
    kvt_pcache *t = ud;
    if (now < t->demote_next)
        return t->demote_next;
    t->demote_next = now + t->demote_interval;
    if (t->cfg.busy && t->cfg.busy(t->cfg.engine))
        return t->demote_next;
    struct demote_step d = {t, 0};
    kvt_tier_run_exclusive(t->cfg.run_exclusive, t->cfg.engine, demote_step, &d);
    if (d.count > 0)
        kvt_log_line(t->cfg.log, t->cfg.log_ud, KVT_LOG_INFO,
                     "[ssd-cache] demoted %zu idle entr%s to disk", d.count,
                     d.count == 1 ? "y" : "ies");
    return t->demote_next;
}

static int open_queue(kvt_pcache *t)
{
    const struct kvt_tier_cfg *c = &t->cfg;
    struct kvt_write_queue_ops ops = {
        .bytes_of = q_bytes_of,
        .store = q_store,
        .dispose = q_dispose,
        .ud = t,
    };
    return kvt_write_queue_new(&ops, c->spill_queue_max_bytes, c->pin_threads ? &c->cpus : NULL,
                               &t->q);
}

/* The timer thread runs the snapshots' debounce and idle demotion, when either is on. */
static int start_timers(kvt_pcache *t)
{
    const struct kvt_tier_cfg *c = &t->cfg;
    struct kvt_timer_task tasks[2];
    int n = 0;
    if (c->write_behind)
        tasks[n++] = (struct kvt_timer_task){kvt_snapshots_tick, t->wb};
    if (c->demote_idle_ms > 0) {
        int64_t iv = c->demote_interval_ms;
        if (iv <= 0)
            iv = c->demote_idle_ms / 4 > 30000 ? c->demote_idle_ms / 4 : 30000;
        t->demote_interval = iv;
        t->demote_next = kvt_mono_ms() + iv;
        tasks[n++] = (struct kvt_timer_task){demote_tick, t};
    }
    if (n == 0)
        return 0;
    struct kvt_timer_thread *tt;
    int rc = kvt_timer_thread_start(tasks, n, c->pin_threads ? &c->cpus : NULL, &tt);
    if (rc == 0)
        atomic_store(&t->tt, tt);
    return rc;
}

static int open_parts(kvt_pcache *t)
{
    bool cold = t->cfg.cold != NULL;
    struct kvt_ram_lru_links links = {
        .spill = cold ? spill_owned : NULL,
        .on_put = on_put,
        .ud = t,
    };
    int rc = kvt_ram_lru_new(&t->cfg, &links, &t->pc);
    if (rc < 0 || !cold)
        return rc;
    rc = open_queue(t);
    if (rc < 0)
        return rc;
    rc = kvt_snapshots_new(&t->cfg, t->pc, t->q, wake_timers, t, &t->wb);
    if (rc < 0)
        return rc;
    return start_timers(t);
}

void kvt_pcache_close(kvt_pcache *t)
{
    if (!t)
        return;
    /* cleared first: settling the discarded snapshots below would wake the stopped thread */
    kvt_timer_thread_stop(atomic_exchange(&t->tt, NULL));
    kvt_write_queue_free(t->q); /* settles what is left, before the keys go */
    kvt_snapshots_free(t->wb);
    kvt_ram_lru_free(t->pc); /* clear: never spills */
    if (t->cfg.remote_ops && t->cfg.remote_ops->close)
        t->cfg.remote_ops->close(t->cfg.remote); /* the writer, its only producer, is gone */
    if (t->cfg.cold && t->cfg.cold->close)
        t->cfg.cold->close(t->cfg.store);
    if (t->cfg.dev)
        t->cfg.dev->close(t->cfg.dev_ud);
    free(t);
}

int kvt_tier_open(const struct kvt_tier_cfg *cfg, kvt_pcache **out)
{
    *out = NULL;
    kvt_pcache *t = calloc(1, sizeof(*t));
    if (!t) {
        if (cfg->remote_ops && cfg->remote_ops->close)
            cfg->remote_ops->close(cfg->remote);
        if (cfg->cold && cfg->cold->close)
            cfg->cold->close(cfg->store);
        if (cfg->dev)
            cfg->dev->close(cfg->dev_ud);
        return kvt_fail(-ENOMEM, "prompt cache: out of memory");
    }
    t->cfg = *cfg;
    atomic_init(&t->tt, NULL);
    int rc = open_parts(t);
    if (rc < 0) {
        kvt_pcache_close(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* The host copy of a disk or remote hit taken into device memory joins RAM once its copies
 * are done. */
static void collect_kept(kvt_pcache *t)
{
    if (t->cfg.dev)
        kvt_ram_lru_keep(t->pc, t->cfg.dev->kept(t->cfg.dev_ud));
}

int kvt_pcache_take(kvt_pcache *t, const int32_t *tok, size_t n, const char *ns,
                    struct kvt_take *out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_pcache_take: NULL out");
    if (!t) {
        memset(out, 0, sizeof(*out));
        return kvt_fail(-EINVAL, "kvt_pcache_take: NULL cache");
    }
    collect_kept(t);
    return kvt_ram_lru_take(t->pc, tok, n, ns, out);
}

int kvt_pcache_take_to_device_async(kvt_pcache *t, const int32_t *tok, size_t n, const char *ns,
                                    kvt_device_place_fn place, void *ud, struct kvt_take *out,
                                    struct kvt_header **out_header, kvt_dtake **pending)
{
    if (out_header)
        *out_header = NULL;
    if (pending)
        *pending = NULL;
    if (out)
        memset(out, 0, sizeof(*out));
    if (!t || !out || !out_header || !place || !pending)
        return kvt_fail(-EINVAL, "kvt_pcache_take_to_device: NULL argument");
    if (!t->cfg.dev)
        return kvt_fail(-EINVAL, "kvt_pcache_take_to_device: the prompt cache has no device");
    collect_kept(t);
    struct kvt_dev_dest dest = {.place = place, .ud = ud};
    int rc = kvt_ram_lru_take_to(t->pc, tok, n, ns, &dest, out);
    *out_header = dest.header;
    if (rc == 0 && dest.header && !(*pending = calloc(1, sizeof(**pending)))) {
        kvt_header_free(dest.header); /* landed already: a take with nothing to wait for */
        *out_header = NULL;
        rc = kvt_fail(-ENOMEM, "out of memory");
    }
    if (rc == 0 && dest.m)
        return t->cfg.dev->shared_to_device(t->cfg.dev_ud, dest.tail, dest.parts, dest.m, dest.n,
                                            place, ud, out_header, pending);
    if (rc < 0 || !out->entry)
        return rc;
    kvt_retain_release(out->retain); /* the clone's buffers hold the donor's bytes */
    out->retain = NULL;
    struct kvt_entry *clone = out->entry; /* the donor stays in RAM; the take owns this */
    out->entry = NULL;
    return t->cfg.dev->to_device(t->cfg.dev_ud, clone, out->from_remote, place, ud, out_header,
                                 pending);
}

int kvt_pcache_take_to_device(kvt_pcache *t, const int32_t *tok, size_t n, const char *ns,
                              kvt_device_place_fn place, void *ud, struct kvt_take *out,
                              struct kvt_header **out_header)
{
    kvt_dtake *p = NULL;
    int rc = kvt_pcache_take_to_device_async(t, tok, n, ns, place, ud, out, out_header, &p);
    int re = kvt_dtake_end(p);
    if (rc == 0 && re) {
        kvt_header_free(*out_header);
        *out_header = NULL;
    }
    return rc ? rc : re;
}

int kvt_pcache_take_into(kvt_pcache *t, const int32_t *tok, size_t n, const char *ns,
                         struct kvt_take_into *into, struct kvt_take *out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_pcache_take_into: NULL out");
    memset(out, 0, sizeof(*out));
    if (!t || !into || !into->place)
        return kvt_fail(-EINVAL, "kvt_pcache_take_into: NULL cache or placement");
    into->header = NULL;
    into->prefix_len = 0;
    struct kvt_dev_dest dest = {.host = into};
    return kvt_ram_lru_take_to(t->pc, tok, n, ns, &dest, out);
}

int kvt_pcache_put(kvt_pcache *t, struct kvt_entry *e, kvt_retain *retain)
{
    if (!t) {
        kvt_retain_release(retain);
        return kvt_fail(-EINVAL, "kvt_pcache_put: NULL cache");
    }
    collect_kept(t);
    return kvt_ram_lru_put(t->pc, e, retain);
}

size_t kvt_pcache_peek_prefix_len(kvt_pcache *t, const int32_t *tok, size_t n, const char *ns)
{
    return t ? kvt_ram_lru_peek_prefix_len(t->pc, tok, n, ns) : 0;
}

size_t kvt_pcache_peek_longest(kvt_pcache *t, const int32_t *tok, size_t n, const char *ns)
{
    return t ? kvt_ram_lru_peek_longest(t->pc, tok, n, ns) : 0;
}

bool kvt_pcache_find_exact(kvt_pcache *t, const int32_t *tok, size_t n, const char *ns)
{
    return t && kvt_ram_lru_find_exact(t->pc, tok, n, ns);
}

size_t kvt_pcache_demote_idle(kvt_pcache *t, int64_t idle_ms, int64_t now_ms)
{
    if (!t)
        return 0;
    return kvt_ram_lru_demote_idle(t->pc, idle_ms, now_ms > 0 ? now_ms : wall_now(t));
}

void kvt_pcache_clear(kvt_pcache *t)
{
    if (!t)
        return;
    collect_kept(t); /* a host copy still in flight is cleared too */
    kvt_ram_lru_clear(t->pc);
}

int kvt_pcache_flush(kvt_pcache *t, int64_t timeout_ms, struct kvt_flush_report *r)
{
    if (!t || !r)
        return kvt_fail(-EINVAL, "kvt_pcache_flush: NULL argument");
    if (!t->wb) { /* no cold tier: nothing is ever written */
        memset(r, 0, sizeof(*r));
        r->durable = true;
        return 0;
    }
    return kvt_snapshots_flush(t->wb, timeout_ms < 0 ? t->cfg.flush_timeout_ms : timeout_ms, r);
}

void kvt_pcache_get_stats(kvt_pcache *t, struct kvt_pcache_stats *st)
{
    memset(st, 0, sizeof(*st));
    if (!t)
        return;
    kvt_ram_lru_get_stats(t->pc, st);
    if (!t->cfg.cold)
        return;
    struct kvt_write_queue_stats qs;
    kvt_write_queue_get_stats(t->q, &qs);
    st->pending_spills = qs.pending_count;
    st->pending_spill_bytes = qs.pending_bytes;
    st->dropped_spills = qs.dropped;
    st->failed_spills = qs.failed;
    st->pending_snapshots = kvt_snapshots_pending(t->wb);
    st->has_cold = true;
    t->cfg.cold->get_stats(t->cfg.store, &st->cold);
}

kvt_store *kvt_pcache_store(kvt_pcache *t)
{
    return t ? t->cfg.store : NULL;
}

kvt_remote *kvt_pcache_remote(kvt_pcache *t)
{
    return t ? t->cfg.remote : NULL;
}
