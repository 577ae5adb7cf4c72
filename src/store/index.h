/*
 * The store's in-memory prefix index (STORE.md §4, §7, §10, §12.5).
 *
 * One record per indexed file. Per namespace, a radix tree (compressed trie) over token
 * sequences: each node lists the records whose tokens end there (in seq order) and keeps,
 * for its subtree, the record count, the trimmable-record count and the trimmable record of
 * smallest seq. A node's children sit in an array sorted by first token (lookup) and in a
 * heap by that smallest seq, so removal keeps the aggregates in O(log k) per node and find()
 * gets "the earliest trimmable record below this node outside one child" in O(1).
 * find() walks the prompt once and returns the same record and prefix length as the linear
 * rules of STORE.md §7, earliest seq on ties. An eviction heap orders records by
 * (mtime_ms, seq), a second heap by length (longest record). Tokens are not kept per
 * record: a record's tokens are the labels on the path from the root to its node, so common
 * prefixes are stored once.
 *
 * Not thread-safe: the store serializes every call with its lock.
 */
#ifndef KVT_STORE_INDEX_H
#define KVT_STORE_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/hmap.h"
#include "store/pheap.h"
#include "store/trie.h"

struct kvt_index {
    struct kvt_hmap ns_map, seq_map, path_map;
    struct kvt_pheap evict, longest;
    uint64_t next_seq;
    uint64_t count, total_bytes;
};

/* ---- the index (index.c) ---------------------------------------------------------------- */

int kvt_index_new(struct kvt_index **out);
void kvt_index_free(struct kvt_index *ix);

/**
 * Add a record with the next seq. @p path (may be NULL) is copied and must not be indexed
 * already (-EEXIST). @return 0 with *out set (may be NULL), -ENOMEM or -EEXIST.
 */
int kvt_index_insert(struct kvt_index *ix, const char *ns, const int32_t *tok, size_t n,
                     bool trimmable, uint64_t bytes, int64_t mtime_ms, const char *path,
                     struct kvt_rec **out);
/** Drop @p r and free it. */
void kvt_index_remove(struct kvt_index *ix, struct kvt_rec *r);

/** STORE.md §7 in namespace @p ns (NULL = ""): the record and *plen, or NULL with *plen 0. */
struct kvt_rec *kvt_index_find(const struct kvt_index *ix, const char *ns, const int32_t *tok,
                               size_t n, size_t *plen);
bool kvt_index_has_durable_prefix(const struct kvt_index *ix, const char *ns, const int32_t *tok,
                                  size_t n);
/**
 * The records a new entry @p tok in @p ns replaces (STORE.md §9 steps 3-4): identical tokens,
 * and when @p trimmable also strict prefixes. *out (caller frees) lists them in path order.
 */
int kvt_index_superseded(const struct kvt_index *ix, const char *ns, const int32_t *tok, size_t n,
                         bool trimmable, struct kvt_rec ***out, size_t *n_out);

struct kvt_rec *kvt_index_by_seq(const struct kvt_index *ix, uint64_t seq);
struct kvt_rec *kvt_index_by_path(const struct kvt_index *ix, const char *path);
/** The record eviction takes next: smallest (mtime_ms, seq); NULL when empty. */
struct kvt_rec *kvt_index_oldest(const struct kvt_index *ix);
/** Set r->mtime_ms (the LRU bump) and keep the eviction order. */
void kvt_index_touch(struct kvt_index *ix, struct kvt_rec *r, int64_t mtime_ms);

uint64_t kvt_index_count(const struct kvt_index *ix);
uint64_t kvt_index_total_bytes(const struct kvt_index *ix);
/** max n_tokens over all records (0 when empty). */
size_t kvt_index_longest(const struct kvt_index *ix);

/** The namespace of @p r. */
const char *kvt_rec_ns(const struct kvt_rec *r);
/** Write the r->n_tokens tokens of @p r into @p out. */
void kvt_rec_tokens(const struct kvt_rec *r, int32_t *out);
/** Every record in ascending seq; *out (caller frees) may be NULL when *n is 0. */
int kvt_index_records(const struct kvt_index *ix, struct kvt_rec ***out, size_t *n);
/** Check every invariant from scratch (tests): 0 or -EINVAL with a message. */
int kvt_index_check(const struct kvt_index *ix);

#endif
