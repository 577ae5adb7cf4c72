/*
 * The records of the store index and the per-namespace radix tree that holds them (STORE.md
 * §12.5; trie.c). A record's tokens are the labels on the path from the root to its node, so
 * common prefixes are stored once; each node keeps its subtree's aggregates for find() (see
 * index.h).
 *
 * Not thread-safe: the store serializes every call with its lock.
 */
#ifndef KVT_STORE_TRIE_H
#define KVT_STORE_TRIE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/pheap.h"

struct kvt_tnode;
struct kvt_ns;

/** One indexed file. Fields are read-only outside the index. */
struct kvt_rec {
    uint64_t seq; /* insertion order; unique, never reused; the store's hit id */
    uint64_t bytes;
    int64_t mtime_ms;
    size_t n_tokens;
    bool trimmable;
    char *path; /* owned copy; NULL when inserted without one */
    struct kvt_ns *ns;
    struct kvt_tnode *node;      /* where its tokens end */
    struct kvt_rec *prev, *next; /* records ending at the same node, ascending seq */
    size_t evict_pos, len_pos;   /* positions in the index's two heaps */
    void *owner;                 /* the caller's (the store: the record's directory) */
};

/** A child link: the first token of the child's label, kept here so lookups skip the child. */
struct kvt_kid {
    int32_t first;
    struct kvt_tnode *node;
};

#define KVT_INLINE_LABEL 8

/**
 * A radix-tree node: the edge label from its parent, its records, subtree aggregates. The
 * first cache line holds what find() reads at every node; short labels live inline.
 */
struct kvt_tnode {
    int32_t *label;       /* inl, or a heap array when longer than KVT_INLINE_LABEL */
    struct kvt_kid *kids; /* sorted by first token */
    size_t label_len;
    size_t n_kids;
    size_t own_n, own_trim;
    uint64_t sub_trim;            /* trimmable records in the subtree, own included */
    struct kvt_rec *sub_min_trim; /* trimmable record of smallest seq in the subtree */
    int32_t inl[KVT_INLINE_LABEL];
    size_t depth; /* tokens from the root to the end of this node */
    struct kvt_rec *head, *tail;
    uint64_t sub_n; /* records in the subtree, own included */
    struct kvt_tnode *parent;
    size_t cap_kids;
    struct kvt_pheap kid_heap; /* the kids again, by their sub_min_trim seq (none = last) */
    size_t heap_pos;           /* position in the parent's kid_heap */
};

/** A namespace: its name and the root of its tree. */
struct kvt_ns {
    char *name;
    uint64_t hash;
    struct kvt_tnode root;
};

/** Link @p r (seq, n_tokens and trimmable set) under @p tok in @p ns. 0 or -ENOMEM. */
int kvt_trie_insert(struct kvt_ns *ns, const int32_t *tok, size_t n, struct kvt_rec *r);
/** Unlink @p r from its tree and restore the tree's invariants. */
void kvt_trie_remove(struct kvt_ns *ns, struct kvt_rec *r);
/** STORE.md §7 over one namespace: the record and *plen, or NULL (a miss). */
struct kvt_rec *kvt_trie_find(const struct kvt_ns *ns, const int32_t *tok, size_t n, size_t *plen);
/** Some record starts with @p tok and is exactly that long or trimmable (STORE.md §4). */
bool kvt_trie_has_durable_prefix(const struct kvt_ns *ns, const int32_t *tok, size_t n);
/** Records on the path of @p tok: exact duplicates, and with @p ancestors strict prefixes. */
int kvt_trie_on_path(const struct kvt_ns *ns, const int32_t *tok, size_t n, bool ancestors,
                     struct kvt_rec ***out, size_t *n_out, size_t *cap_out);
/** Free every node below the root (the records are the caller's). */
void kvt_trie_clear(struct kvt_ns *ns);
/** Verify structure and aggregates from scratch: 0, or -EINVAL naming the fault. */
int kvt_trie_check(const struct kvt_ns *ns, uint64_t *n_records);

#endif
