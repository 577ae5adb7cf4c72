/*
 * The real caches' side of the RAM tier's shared prefixes (docs/SHARING.md, "The RAM tier"),
 * bound into its cache ops by kvt_pcache_open(): the functions of the share_* members of
 * struct kvt_tier_cache_ops. Cut caches are the token-axis ones (kv, qkv); an entry with one
 * that does not hold a row per token is not cut at all.
 */
#ifndef KVT_TIER_SHARE_ROWS_H
#define KVT_TIER_SHARE_ROWS_H

#include "tier/tier.h"

#define KVT_SHARE_MAX_CUT 256 /* cut layers of an entry that is shared */

size_t kvt_share_rows_chunks(const struct kvt_entry *e);
int kvt_share_rows_chunk(const struct kvt_entry *e, size_t k, const struct kvt_tier_alloc *a,
                         struct kvt_entry **out);
int kvt_share_rows_tail(const struct kvt_entry *e, const struct kvt_tier_alloc *a,
                        struct kvt_entry **out);
int kvt_share_rows_join(const struct kvt_entry *tail, struct kvt_entry *const *chunks, size_t m,
                        const struct kvt_tier_alloc *a, struct kvt_entry **out);
bool kvt_share_rows_fit(const struct kvt_entry *chunk, const struct kvt_entry *e);

#endif
