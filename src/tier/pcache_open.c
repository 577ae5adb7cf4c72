/*
 * kvt_pcache_open(): option defaults and checks (TIER.md §8), the store as cold tier, and
 * the binding of the tier's ops tables to the real cache layer and kvt_store. The policy
 * itself lives in assembly.c and its parts, which never call the cache or store layers directly.
 */
#include <errno.h>
#include <string.h>

#include "cache/cache_parts.h"
#include "common/cpus.h"
#include "common/error.h"
#include "io/stream.h"
#include "settings/settings.h"
#include "tier/device_twin.h"
#include "tier/share_rows.h"
#include "tier/tier.h"

/* The real layers plug in as they are: the ops tables take their functions unchanged. */
static const struct kvt_tier_cache_ops real_cache_ops = {
    .bytes = kvt_cache_bytes,
    .is_trimmable = kvt_cache_is_trimmable,
    .trim = kvt_cache_trim,
    .entry_clone = kvt_entry_clone,
    .entry_free = kvt_entry_free,
    .entry_on_device = kvt_entry_on_device,
    .share_chunks = kvt_share_rows_chunks,
    .share_chunk = kvt_share_rows_chunk,
    .share_tail = kvt_share_rows_tail,
    .share_join = kvt_share_rows_join,
    .share_fit = kvt_share_rows_fit,
};

static const struct kvt_tier_cold_ops real_cold_ops = {
    .find = kvt_store_find,
    .restore = kvt_store_restore,
    .restore_into = kvt_store_restore_into,
    .put = kvt_store_put,
    .has_durable_prefix = kvt_store_has_durable_prefix,
    .get_stats = kvt_store_get_stats,
    .close = kvt_store_close,
};

static const struct kvt_tier_remote_ops real_remote_ops = {
    .find = kvt_remote_find,
    .restore = kvt_remote_restore,
    .put_async = kvt_remote_put_async,
    .close = kvt_remote_close,
};

#define GIB (1024.0 * 1024.0 * 1024.0)

void kvt_pcache_opts_init(struct kvt_pcache_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->ram_max_bytes = 8000000000ull;
    o->spill_queue_max_bytes = (int64_t)2 << 30;
    o->write_behind = true;
    o->demote_idle_ms = 300000;
    o->snapshot_debounce_ms = 1000;
    o->snapshot_busy_retry_ms = 5000;
    o->flush_timeout_ms = 120000;
    kvt_store_opts_init(&o->cold);
}

/* Whether a cold-tier option differs from what kvt_pcache_opts_init() set. */
static bool cold_opts_set(const struct kvt_pcache_opts *o)
{
    const struct kvt_store_opts *c = &o->cold;
    struct kvt_store_opts d;
    kvt_store_opts_init(&d);
    return c->model_id || c->config_fingerprint || c->tokenizer_hash ||
           c->max_bytes != d.max_bytes || c->n_layers || c->no_verify || c->quarantine ||
           c->max_header_bytes != d.max_header_bytes || c->tmp_grace_ms != d.tmp_grace_ms ||
           o->demote_idle_ms != 300000 || o->background_cpus;
}

static int check_opts(const struct kvt_pcache_opts *o, struct kvt_tier_cfg *cfg)
{
    if (o->background_cpus) {
        int rc = kvt_cpus_parse(o->background_cpus, &cfg->cpus);
        if (rc < 0)
            return rc;
        cfg->pin_threads = true;
    }
    if (o->spill_queue_max_bytes < 0)
        return kvt_fail(-EINVAL, "spill_queue_max_bytes %lld is negative",
                        (long long)o->spill_queue_max_bytes);
    if (o->demote_idle_ms < 0)
        return kvt_fail(-EINVAL, "demote_idle_ms %lld is negative", (long long)o->demote_idle_ms);
    if (o->snapshot_debounce_ms < 0 || o->snapshot_busy_retry_ms < 0)
        return kvt_fail(-EINVAL, "snapshot_debounce_ms / snapshot_busy_retry_ms is negative");
    if (o->flush_timeout_ms < 0)
        return kvt_fail(-EINVAL, "flush_timeout_ms %lld is negative",
                        (long long)o->flush_timeout_ms);
    if (o->remote && !o->cold_dir)
        return kvt_fail(-EINVAL, "a remote tier requires a cold tier (cold_dir)");
    if (o->cold_dir && o->ram_max_bytes == 0)
        return kvt_fail(-EINVAL, "cold_dir requires the RAM prompt cache (ram_max_bytes is 0)");
    return 0;
}

/* The remote tier, with the cold store's identity unless its options name one; on failure
 * @p store is closed. */
static int open_remote(const struct kvt_pcache_opts *o, struct kvt_tier_cfg *cfg, kvt_store *store)
{
    if (!o->remote)
        return 0;
    struct kvt_remote_opts ro = *o->remote;
    if (!ro.model_id && !ro.config_fingerprint && !ro.tokenizer_hash) {
        ro.model_id = o->cold.model_id;
        ro.config_fingerprint = o->cold.config_fingerprint;
        ro.tokenizer_hash = o->cold.tokenizer_hash;
    }
    ro.share_prefixes =
        ro.share_prefixes || o->cold.share_prefixes || o->share_prefixes; /* as the store puts */
    if (!ro.log) {
        ro.log = o->log;
        ro.log_ud = o->log_ud;
    }
    int rc = kvt_remote_open(&ro, &cfg->remote);
    if (rc == 0)
        cfg->remote_ops = &real_remote_ops;
    else
        kvt_store_close(store);
    return rc;
}

/* The cold store's options: the pcache's log unless they name one, sharing when it shares. */
static void log_recovered(const struct kvt_pcache_opts *o, kvt_store *store)
{
    struct kvt_store_stats st;
    kvt_store_get_stats(store, &st);
    kvt_log_line(o->log, o->log_ud, KVT_LOG_INFO,
                 "[ssd-cache] %s — %llu entr%s recovered, %.2f GiB of %g GiB cap", o->cold_dir,
                 (unsigned long long)st.entries, st.entries == 1 ? "y" : "ies",
                 (double)st.total_bytes / GIB, (double)st.max_bytes / GIB);
}

/* The cold store, its memory settings checked but not applied: they change the process only
 * once the whole prompt cache is open (apply_to_process()). */
static int open_cold(const struct kvt_pcache_opts *o, kvt_store **out)
{
    struct kvt_store_opts so = o->cold;
    so.share_prefixes = so.share_prefixes || o->share_prefixes;
    if (!so.log) {
        so.log = o->log;
        so.log_ud = o->log_ud;
    }
    so.mem = NULL;
    int rc = kvt_mem_check(o->cold.mem);
    if (rc == 0)
        rc = kvt_store_open(o->cold_dir, &so, out);
    if (rc == 0)
        log_recovered(o, *out);
    return rc;
}

/* What an open changes in the process, once nothing can fail: the memory settings, then the
 * streams' staging memory, faulted in now rather than during the first write-behind while the
 * engine decodes (populating fresh memory holds the process's mmap lock) or during the first
 * restore, which the user waits on. */
static void apply_to_process(const struct kvt_pcache_opts *o)
{
    if (o->cold.mem)
        kvt_mem_configure(o->cold.mem);
    kvt_wstream_warm(NULL);
    kvt_rstream_warm();
}

/* The device binding (kvt_pcache_opts.device), then the tier, which closes every part on
 * failure. The pool holds the RAM tier and the spills queued from it. */
static int open_tier(const struct kvt_pcache_opts *o, struct kvt_tier_cfg *cfg, kvt_pcache **out)
{
    if (o->device) {
        struct kvt_tier_dev *td;
        uint64_t pool = o->ram_max_bytes + (uint64_t)o->spill_queue_max_bytes;
        int rc = kvt_tier_dev_new(o->device, (size_t)pool, &td);
        if (rc < 0) {
            if (cfg->remote_ops && cfg->remote_ops->close)
                cfg->remote_ops->close(cfg->remote);
            if (cfg->cold && cfg->cold->close)
                cfg->cold->close(cfg->store);
            return rc;
        }
        cfg->dev = &kvt_tier_dev_ops;
        cfg->dev_ud = td;
    }
    return kvt_tier_open(cfg, out);
}

int kvt_pcache_open(const struct kvt_pcache_opts *o, kvt_pcache **out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_pcache_open: NULL out");
    *out = NULL;
    if (!o)
        return kvt_fail(-EINVAL, "kvt_pcache_open: NULL options");
    struct kvt_tier_cfg cfg = {
        .cache = &real_cache_ops,
        .ram_max_bytes = o->ram_max_bytes,
        .share_prefixes = o->share_prefixes || o->cold.share_prefixes, /* either turns both on */
        .spill_queue_max_bytes = o->spill_queue_max_bytes,
        .write_behind = o->write_behind,
        .snapshot_debounce_ms = o->snapshot_debounce_ms,
        .snapshot_busy_retry_ms = o->snapshot_busy_retry_ms,
        .flush_timeout_ms = o->flush_timeout_ms,
        .run_exclusive = o->run_exclusive,
        .busy = o->busy,
        .engine = o->engine,
        .on_put = o->on_put,
        .on_put_ud = o->on_put_ud,
        .log = o->log,
        .log_ud = o->log_ud,
    };
    int rc = check_opts(o, &cfg);
    if (rc < 0)
        return rc;

    if (!o->cold_dir) {
        if (cold_opts_set(o))
            kvt_log_line(o->log, o->log_ud, KVT_LOG_WARN,
                         "[ssd-cache] cold-tier options ignored: no cold_dir given");
        return open_tier(o, &cfg, out);
    }

    kvt_store *store;
    rc = open_cold(o, &store);
    if (rc < 0)
        return rc;
    rc = open_remote(o, &cfg, store);
    if (rc < 0)
        return rc;
    cfg.cold = &real_cold_ops;
    cfg.store = store;
    cfg.demote_idle_ms = o->demote_idle_ms;
    rc = open_tier(o, &cfg, out); /* closes the store on failure */
    if (rc == 0)
        apply_to_process(o);
    return rc;
}
