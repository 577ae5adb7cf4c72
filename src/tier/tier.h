/*
 * The tier layer's internal seams: the ops tables through which the tier policy reaches
 * caches and the cold tier, and the configuration that assembles a prompt cache from them.
 * kvt_pcache_open() binds these to the real kvt_cache / kvt_store (pcache_open.c); the test
 * suites bind counting test doubles, so every policy rule is testable without disk or engine.
 */
#ifndef KVT_TIER_H
#define KVT_TIER_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/clock.h"
#include "kvtier.h"

/* Where the RAM tier's own copies of rows live: the device's page-locked pool when it has
 * one, else (buf NULL, or buf failing) ordinary memory. */
struct kvt_tier_alloc {
    int (*buf)(void *ud, size_t bytes, kvt_buf **out);
    void *ud;
};

/*
 * Cache operations. Entries are library-style `struct kvt_entry` objects whose caches are
 * opaque to the tier: every per-cache question goes through this table.
 */
struct kvt_tier_cache_ops {
    size_t (*bytes)(const kvt_cache *c);
    bool (*is_trimmable)(const kvt_cache *c);
    int (*trim)(kvt_cache *c, int64_t n);
    /* A new entry holding clones of every cache of @p e (tokens and meta copied). On failure
     * the clones built so far are released and *out is NULL. */
    int (*entry_clone)(const struct kvt_entry *e, struct kvt_entry **out);
    /* Release @p e and every cache it holds (NULL allowed). */
    void (*entry_free)(struct kvt_entry *e);
    /* Optional: whether a cache of @p e lies in device memory (the RAM tier refuses those). */
    bool (*entry_on_device)(const struct kvt_entry *e);

    /* Optional, all five or none: prefixes held once (docs/SHARING.md, "The RAM tier").
     * share_chunks: how many 256-token chunks @p e is cut into, 0 when it is held whole.
     * share_chunk: chunk @p k of @p e, an entry of its 256 tokens holding copies of those
     * rows of every cut cache, in order. share_tail: @p e's tokens and meta, its cut caches
     * holding copies of the rows after its last chunk, the others shared with @p e.
     * share_join: the whole entry again (with restore capacity) from a tail and its @p m
     * chunks. share_fit: whether @p chunk (of another entry) has the cut caches of @p e. */
    size_t (*share_chunks)(const struct kvt_entry *e);
    int (*share_chunk)(const struct kvt_entry *e, size_t k, const struct kvt_tier_alloc *a,
                       struct kvt_entry **out);
    int (*share_tail)(const struct kvt_entry *e, const struct kvt_tier_alloc *a,
                      struct kvt_entry **out);
    int (*share_join)(const struct kvt_entry *tail, struct kvt_entry *const *chunks, size_t m,
                      const struct kvt_tier_alloc *a, struct kvt_entry **out);
    bool (*share_fit)(const struct kvt_entry *chunk, const struct kvt_entry *e);
};

/*
 * Cold-tier operations, with the store's own signatures (the real table is the kvt_store_*
 * functions themselves). find is index-only; restore, put and get_stats may do I/O or take
 * the store's own lock, so the tier never calls them under its lock (find and
 * has_durable_prefix excepted: no I/O, never waiting on a write).
 */
struct kvt_tier_cold_ops {
    int (*find)(kvt_store *s, const int32_t *tok, size_t n, const char *ns, struct kvt_hit *hit);
    /* 0 with *out NULL on a miss; the entry owns its bytes (its retain is a no-op). */
    int (*restore)(kvt_store *s, const struct kvt_hit *hit, struct kvt_entry **out);
    /* Optional: restore into caller memory (kvt_pcache_take_into()); without it those takes
     * restore disk hits with restore, as kvt_pcache_take() does. */
    int (*restore_into)(kvt_store *s, const struct kvt_hit *hit, kvt_place_fn place, void *ud,
                        struct kvt_header **out_header);
    /* Persist @p e (borrowed), running each blocking write step inside @p rx (may be NULL). */
    int (*put)(kvt_store *s, const struct kvt_entry *e, kvt_run_exclusive_fn rx, void *engine);
    bool (*has_durable_prefix)(kvt_store *s, const int32_t *tok, size_t n, const char *ns);
    void (*get_stats)(kvt_store *s, struct kvt_store_stats *st);
    void (*close)(kvt_store *s); /* optional: called last by kvt_pcache_close() */
};

/*
 * Remote-tier operations (REMOTE.md), with the kvt_remote signatures: find is index-only
 * (never network I/O) and may run under the tier's lock; restore does network I/O; put_async
 * only queues. The tier consults the remote after RAM and the cold tier, and uploads what the
 * writer has stored locally.
 */
struct kvt_tier_remote_ops {
    int (*find)(kvt_remote *r, const int32_t *tok, size_t n, const char *ns, struct kvt_hit *hit);
    int (*restore)(kvt_remote *r, const struct kvt_hit *hit, struct kvt_entry **out);
    int (*put_async)(kvt_remote *r, const struct kvt_entry *e);
    void (*close)(kvt_remote *r); /* optional: called by kvt_pcache_close() after the writer */
};

/*
 * Device entries (kvt_pcache_opts.device): the RAM tier holds host copies of them in
 * page-locked memory, and takes land in device memory. The real table is device_twin.c's.
 */
struct kvt_tier_device_ops {
    /* Whether @p e lies in this tier's device's memory (and in no other device's). */
    bool (*owns)(void *ud, const struct kvt_entry *e);
    /* A host copy of device entry @p e in page-locked memory, its copies done; -ENOSPC when
     * the page-locked memory has no room for it. */
    int (*to_host)(void *ud, const struct kvt_entry *e, struct kvt_entry **out);
    /* Host entry @p e (owned: freed once its copies are done) into device memory: its header
     * to @p place, then its bytes copied layer-wise (*@p pending tracks them). @p keep (a
     * remote hit, not in RAM): its host copy is kept as a cold hit's is (kept()). */
    int (*to_device)(void *ud, struct kvt_entry *e, bool keep, kvt_device_place_fn place, void *pud,
                     struct kvt_header **out, kvt_dtake **pending);
    /* A cold-tier hit's prefix, streamed from its file straight into device memory (0 with
     * *out NULL on a miss; KVT_E_UNSUPPORTED when its caches cannot be cut so). */
    int (*cold_to_device)(void *ud, kvt_store *s, const struct kvt_hit *hit,
                          kvt_device_place_fn place, void *pud, struct kvt_header **out);
    /* The host copy of the last such hit or kept remote hit (its copies from device memory
     * queued when it landed, off the caller's path), once they are done, or NULL: the RAM
     * tier keeps it, as a copy of what the cold tier holds or has queued (a remote hit is
     * promoted to it whole). */
    struct kvt_entry *(*kept)(void *ud);
    void (*close)(void *ud);
    /* Optional: a buffer of @p bytes in the page-locked pool (-ENOSPC when it has no room),
     * where the RAM tier puts the rows it copies for shared prefixes. */
    int (*host_buf)(void *ud, size_t bytes, kvt_buf **out);
    /* Optional: to_device() of the first @p n tokens of a shared record, from its tail @p tail
     * and the @p m chunks in @p parts (all owned, the array too): each copied from where it
     * lies straight to its rows in device memory, with no join. Without it, a join. */
    int (*shared_to_device)(void *ud, struct kvt_entry *tail, struct kvt_entry **parts, size_t m,
                            size_t n, kvt_device_place_fn place, void *pud, struct kvt_header **out,
                            kvt_dtake **pending);
};

/*
 * Everything a prompt cache is assembled from (TIER.md §8 options, already validated): the
 * one configuration every part of the tier reads.
 */
struct kvt_tier_cfg {
    const struct kvt_tier_cache_ops *cache;
    const struct kvt_tier_cold_ops *cold; /* NULL = no cold tier (no queue, no snapshots) */
    kvt_store *store; /* the cold tier every cold op is called on; kvt_pcache_store() */

    uint64_t ram_max_bytes;
    bool share_prefixes; /* RAM holds shared prefixes once (needs the cache ops' share_*) */
    int64_t spill_queue_max_bytes; /* >= 0 */
    bool write_behind;
    int64_t demote_idle_ms;     /* 0 = off */
    int64_t demote_interval_ms; /* 0 = max(30000, demote_idle_ms / 4) */
    int64_t snapshot_debounce_ms;
    int64_t snapshot_busy_retry_ms;
    int64_t flush_timeout_ms;
    bool pin_threads; /* run the writer and timer threads on @p cpus */
    cpu_set_t cpus;

    kvt_run_exclusive_fn run_exclusive;
    bool (*busy)(void *engine);
    void *engine;
    void (*on_put)(void *ud, const int32_t *tok, size_t n, const char *ns);
    void *on_put_ud;
    int64_t (*wall_ms)(void *ud); /* NULL = the real wall clock */
    void *clock_ud;
    kvt_log_fn log;
    void *log_ud;
    const struct kvt_tier_remote_ops *remote_ops; /* NULL = no remote tier (needs cold) */
    kvt_remote *remote;
    const struct kvt_tier_device_ops *dev; /* NULL = host entries only */
    void *dev_ud;
};

/** Assemble a prompt cache; on failure cfg->cold->close(), cfg->remote_ops->close() and
 * cfg->dev->close() have been called (if set). */
int kvt_tier_open(const struct kvt_tier_cfg *cfg, kvt_pcache **out);

/* Small helpers shared by the tier files (tier_util.c). */
size_t kvt_tier_lcp(const int32_t *a, size_t na, const int32_t *b, size_t nb);
/** @p ns, or "" for NULL. */
const char *kvt_tier_ns(const char *ns);
/** Run @p step inside @p rx, or directly when @p rx is NULL; returns what @p rx returns. */
int kvt_tier_run_exclusive(kvt_run_exclusive_fn rx, void *engine, kvt_step_fn step, void *arg);

#endif
