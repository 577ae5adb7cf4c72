/*
 * Prefixes the RAM tier holds once (docs/SHARING.md, "The RAM tier"): the 256-token chunks
 * that records of one prefix share, counted and freed by the records that need them, and a
 * record's whole entry joined again from its tail and its chunks. All through the cache ops'
 * share_* members; the RAM LRU owns the lock that guards the counts.
 */
#ifndef KVT_RAM_SHARE_H
#define KVT_RAM_SHARE_H

#include "tier/tier.h"

/* Rows [256k, 256(k + 1)) of the cut caches of every record that needs it. */
struct kvt_ram_chunk {
    struct kvt_entry *e;
    size_t bytes;
    size_t refs; /* records holding it; under the RAM LRU's lock */
};

/* An entry cut for holding: its m chunks (those below `from` are another record's, filled in
 * when it is held) and its tail; m = 0 when it is held whole. */
struct kvt_ram_cut {
    struct kvt_ram_chunk **chunks;
    size_t m, from;
    struct kvt_entry *tail;
};

/* What a record held, as owned clones, for a join outside the lock; m = 0: e is whole. */
struct kvt_ram_held {
    struct kvt_entry *e;
    struct kvt_entry **parts; /* m chunk clones; a NULL one (no memory) fails the join */
    size_t m;
};

/** Cut @p e into chunks [from, m) and its tail (no lock held); on failure *out has m = 0. */
void kvt_ram_cut_new(const struct kvt_tier_cache_ops *ops, const struct kvt_tier_alloc *a,
                     const struct kvt_entry *e, size_t from, size_t m, struct kvt_ram_cut *out);
/** Free what a cut that was not held made (its chunks from `from` on, its tail). */
void kvt_ram_cut_free(const struct kvt_tier_cache_ops *ops, struct kvt_ram_cut *c);
/** Under the lock: the record of @p cut takes a hold on each of its chunks; the bytes of those
 * no record held before are added to *@p total. */
void kvt_ram_chunks_take(struct kvt_ram_chunk **c, size_t m, uint64_t *total);
/** Under the lock: clones of @p m chunks into @p parts (when not NULL), then the holds given
 * back; a chunk no record holds any more leaves *@p total and is freed (its bytes live on in
 * the clones). */
void kvt_ram_chunks_drop(const struct kvt_tier_cache_ops *ops, struct kvt_ram_chunk **c, size_t m,
                         struct kvt_entry **parts, uint64_t *total);
/** Under the lock: @p e and clones of its @p m chunks into @p h. */
int kvt_ram_hold(const struct kvt_tier_cache_ops *ops, const struct kvt_entry *e,
                 struct kvt_ram_chunk *const *c, size_t m, struct kvt_ram_held *h);
/** No lock held: the whole entry of @p h (consumed). */
int kvt_ram_join(const struct kvt_tier_cache_ops *ops, const struct kvt_tier_alloc *a,
                 struct kvt_ram_held *h, struct kvt_entry **out);
/** Free @p h (NULL members allowed). */
void kvt_ram_held_free(const struct kvt_tier_cache_ops *ops, struct kvt_ram_held *h);

#endif
