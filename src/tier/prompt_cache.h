/*
 * The RAM prompt cache (TIER.md §2) over the ops tables of tier.h.
 */
#ifndef KVT_PROMPT_CACHE_H
#define KVT_PROMPT_CACHE_H

#include "tier/tier.h"

struct kvt_pc;

struct kvt_pc_cfg {
    uint64_t max_bytes;
    const struct kvt_tier_cache_ops *cache;
    void *cache_ud;
    const struct kvt_tier_cold_ops *cold; /* NULL = no cold tier */
    void *cold_ud;
    /* Owned spill sink (the spill queue): takes @p clones on every path; 0 or negative. */
    int (*spill_owned)(void *ud, struct kvt_entry *clones);
    /* Synchronous sink, used when there is no owned sink; @p live stays the caller's. */
    void (*spill_sync)(void *ud, const struct kvt_entry *live);
    void *spill_ud;
    /* Called after every stored put, outside the lock, with copies of the tokens and ns. */
    void (*on_put)(void *ud, const int32_t *tok, size_t n, const char *ns);
    void *on_put_ud;
    int64_t (*wall_ms)(void *ud); /* NULL = the real wall clock */
    void *clock_ud;
    kvt_log_fn log;
    void *log_ud;
};

struct kvt_pc_stats {
    uint64_t records, total_bytes, hits, misses, demotions;
};

int kvt_pc_new(const struct kvt_pc_cfg *cfg, struct kvt_pc **out);
/** Dispose every record without spilling, then free. NULL allowed. */
void kvt_pc_free(struct kvt_pc *pc);

/** TIER.md §2.2. On a miss out->entry is NULL. */
int kvt_pc_take(struct kvt_pc *pc, const int32_t *tok, size_t n, const char *ns,
                struct kvt_take *out);
/** TIER.md §2.3: takes @p e and @p retain on every path. */
int kvt_pc_put(struct kvt_pc *pc, struct kvt_entry *e, kvt_retain *retain);
size_t kvt_pc_peek_prefix_len(struct kvt_pc *pc, const int32_t *tok, size_t n, const char *ns);
bool kvt_pc_find_exact(struct kvt_pc *pc, const int32_t *tok, size_t n, const char *ns);
/** Clone the record with exactly these tokens: 1 (found, *out set), 0 (none), or negative. */
int kvt_pc_clone_exact(struct kvt_pc *pc, const int32_t *tok, size_t n, const char *ns,
                       struct kvt_entry **out);
/** TIER.md §2.5: 0 and nothing done without a cold tier. */
size_t kvt_pc_demote_idle(struct kvt_pc *pc, int64_t idle_ms, int64_t now_ms);
/** Dispose every record without spilling. */
void kvt_pc_clear(struct kvt_pc *pc);
void kvt_pc_get_stats(struct kvt_pc *pc, struct kvt_pc_stats *st);
/** Release an entry through the cache ops (NULL allowed). */
void kvt_pc_entry_free(struct kvt_pc *pc, struct kvt_entry *e);
/** Sum of the cache ops' bytes over @p e's caches. */
size_t kvt_pc_entry_bytes(struct kvt_pc *pc, const struct kvt_entry *e);

#endif
