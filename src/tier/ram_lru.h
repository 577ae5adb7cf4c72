/*
 * The RAM LRU (TIER.md §2): the prompt cache's records in RAM, read through the cache ops
 * of struct kvt_tier_cfg and consulting its cold tier.
 */
#ifndef KVT_RAM_LRU_H
#define KVT_RAM_LRU_H

#include "tier/tier.h"

struct kvt_ram_lru;

/*
 * How the LRU reaches the rest of the tier (wiring, not configuration). Both may be NULL.
 * spill: owned sink for evicted records (the write queue); it takes @p clones on every path
 *        and returns 0 or negative. Without it an evicted record is put into the cold tier
 *        synchronously.
 * on_put: called after every stored put, outside the lock, with copies of the tokens and ns.
 */
struct kvt_ram_lru_links {
    int (*spill)(void *ud, struct kvt_entry *clones);
    void (*on_put)(void *ud, const int32_t *tok, size_t n, const char *ns);
    void *ud;
};

/** Uses cfg->cache, cold, store, ram_max_bytes, wall_ms, clock_ud and log; copies both. */
int kvt_ram_lru_new(const struct kvt_tier_cfg *cfg, const struct kvt_ram_lru_links *links,
                    struct kvt_ram_lru **out);
/** Dispose every record without spilling, then free. NULL allowed. */
void kvt_ram_lru_free(struct kvt_ram_lru *lru);

/** TIER.md §2.2. On a miss out->entry is NULL. */
int kvt_ram_lru_take(struct kvt_ram_lru *lru, const int32_t *tok, size_t n, const char *ns,
                     struct kvt_take *out);
/* A take into device memory: a cold hit streams there through cfg->dev (header set). */
struct kvt_dev_dest {
    kvt_device_place_fn place;
    void *ud;
    struct kvt_header *header; /* set when the bytes have landed */
    /* Or, when set, a disk hit goes into the caller's host memory instead
     * (kvt_pcache_take_into(), through cfg->cold->restore_into; place unused). */
    struct kvt_take_into *host;
    /* Out: a shared RAM hit handed over unjoined (its tail and chunk clones, owned by the
     * caller) when the device can take it so (cfg->dev->shared_to_device); n: its tokens
     * taken. out->entry is then NULL. */
    struct kvt_entry *tail, **parts;
    size_t m, n;
};

/** kvt_ram_lru_take() that lands a cold hit in device memory through @p dest (the RAM and
 * remote hits come back as host entries in out->entry, for the caller to copy; a shared RAM
 * hit, where the device can take it so, as dest's tail and parts). */
int kvt_ram_lru_take_to(struct kvt_ram_lru *lru, const int32_t *tok, size_t n, const char *ns,
                        struct kvt_dev_dest *dest, struct kvt_take *out);
/** TIER.md §2.3: takes @p e and @p retain on every path. With cfg->dev, an entry in its
 * device's memory is copied into page-locked host memory and held so. */
int kvt_ram_lru_put(struct kvt_ram_lru *lru, struct kvt_entry *e, kvt_retain *retain);
/** Hold host entry @p e, a copy of bytes the cold tier already holds: evicted without a spill,
 * no on_put; over the RAM cap it is freed. */
void kvt_ram_lru_keep(struct kvt_ram_lru *lru, struct kvt_entry *e);
size_t kvt_ram_lru_peek_prefix_len(struct kvt_ram_lru *lru, const int32_t *tok, size_t n,
                                   const char *ns);
/** The prefix length a take would be offered over RAM, the cold tier and the remote (index
 * lookups only; changes nothing). */
size_t kvt_ram_lru_peek_longest(struct kvt_ram_lru *lru, const int32_t *tok, size_t n,
                                const char *ns);
bool kvt_ram_lru_find_exact(struct kvt_ram_lru *lru, const int32_t *tok, size_t n, const char *ns);
/** Clone the record with exactly these tokens: 1 (found, *out set), 0 (none), or negative. */
int kvt_ram_lru_clone_exact(struct kvt_ram_lru *lru, const int32_t *tok, size_t n, const char *ns,
                            struct kvt_entry **out);
/** TIER.md §2.5: 0 and nothing done without a cold tier. */
size_t kvt_ram_lru_demote_idle(struct kvt_ram_lru *lru, int64_t idle_ms, int64_t now_ms);
/** Dispose every record without spilling. */
void kvt_ram_lru_clear(struct kvt_ram_lru *lru);
/** Fill the RAM tier's fields of @p st: records, total_bytes, hits, misses, demotions. */
void kvt_ram_lru_get_stats(struct kvt_ram_lru *lru, struct kvt_pcache_stats *st);
/** Release an entry through the cache ops (NULL allowed). */
void kvt_ram_lru_entry_free(struct kvt_ram_lru *lru, struct kvt_entry *e);
/** Sum of the cache ops' bytes over @p e's caches. */
size_t kvt_ram_lru_entry_bytes(struct kvt_ram_lru *lru, const struct kvt_entry *e);

#endif
