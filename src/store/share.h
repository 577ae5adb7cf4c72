/*
 * Shared prefixes stored once (docs/SHARING.md). With sharing on, an entry of n tokens whose
 * token-axis layers (kv, qkv) can be cut along the token axis is kept as m = (n - 1) / 256
 * chunk files of 256 rows each, named by a 128-bit hash of every token up to the chunk's end
 * (so two entries with the same first 256k tokens name the same chunks), plus one file of its
 * own, the tail: all n tokens, the rows [256m, n) of the token-axis layers and every other
 * layer whole. Both are .mlxkv v3 images under names mlx-bun neither reads nor removes.
 */
#ifndef KVT_STORE_SHARE_H
#define KVT_STORE_SHARE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

#define KVT_SHARE_EXT ".kvshare"
#define KVT_CHUNK_EXT ".kvchunk"
#define KVT_SHARE_CHUNK 256 /* tokens per chunk: the caches' growth step */
#define KVT_CHUNK_ID_LEN 32 /* hex digits of a chunk id */

/** Whether a cache of @p kind is cut into chunks (kv, qkv); other kinds stay whole. */
bool kvt_share_splits(int kind);
/** Chunks of an entry of @p n tokens: (n - 1) / 256, so that its tail keeps a row. */
size_t kvt_share_chunks(size_t n);
/** Whether @p e is kept as chunks plus a tail: at least one chunk and one layer to cut. */
bool kvt_share_applies(const struct kvt_entry *e);
/**
 * Call @p fn for each chunk of an entry of tokens @p tok (n of them), in order, with its index
 * and id: the hash of tok[0, 256 (k + 1)) in lowercase hex. O(n) for all of them. Stops at the
 * first non-zero result and returns it.
 */
typedef int (*kvt_chunk_fn)(void *ud, size_t k, const char *id);
int kvt_share_each_chunk(const int32_t *tok, size_t n, kvt_chunk_fn fn, void *ud);
/** "<dir>/<id>.kvchunk" (malloc'd), or NULL. */
char *kvt_share_chunk_path(const char *dir, const char *id);
/** The path of chunk @p k of tokens @p tok in @p dir (malloc'd), or NULL. */
char *kvt_share_chunk_path_of(const char *dir, const int32_t *tok, size_t k);

/** The entry of rows [a, b) of an entry, on the entry's own memory. */
struct kvt_share_part {
    struct kvt_entry e;
    kvt_cache **v;
    bool *owned;
};

/**
 * Rows [a, b) of @p e as an entry: a chunk (its cut layers only, tokens [a, b)) or, with
 * @p whole, a tail (every other layer borrowed whole, all the tokens). 0 or < 0.
 */
int kvt_share_part_new(const struct kvt_entry *e, int64_t a, int64_t b, bool whole,
                       struct kvt_share_part *p);
void kvt_share_part_free(struct kvt_share_part *p);

/** What a shared save wrote. */
struct kvt_share_saved {
    uint64_t tail_bytes;   /* the tail file's size */
    uint64_t chunk_bytes;  /* bytes of the chunks written by this save */
    size_t chunks_written; /* chunks this save wrote */
    size_t chunks_reused;  /* chunks that were there already */
};

/**
 * Save @p e (kvt_share_applies()) as chunks in @p dir plus the tail @p tail_path: every chunk
 * that is missing is written (crash-safely, as kvt_file_save()) and every present one touched
 * (its mtime is its last use), then the tail is written last: once it exists, so do its
 * chunks. @return 0, or an error of kvt_file_save() (-EEXIST: a chunk being written by
 * another writer).
 */
int kvt_share_save(const char *dir, const char *tail_path, const struct kvt_entry *e,
                   const struct kvt_save_opts *o, struct kvt_share_saved *out);

/**
 * Load the entry whose tail is @p tail_path: the tail and its chunks (from the tail's
 * directory), every byte hash-checked unless x->no_verify, composed into caches of the whole
 * entry with restore capacity. A chunk that fails names itself in *@p bad_chunk (malloc'd;
 * may be NULL): the caller treats every entry that needs it as lost.
 * @return 0, or the codes of kvt_file_load() (KVT_E_CORRUPT also for a chunk whose tokens or
 * shape do not fit the tail; -ENOENT for a missing chunk).
 */
int kvt_share_load(const char *tail_path, const struct kvt_expect *x, struct kvt_entry **out,
                   char **bad_chunk);

/*
 * Composing a shared entry from chunks held in memory (the remote tier's objects): the tail
 * @p t loaded and checked, the whole entry's rows of its cut layers allocated with the tail's
 * rows in place; each chunk k then checked against the entry (its header) and its bytes
 * placed in its rows; the end replaces the cut layers of @p t by the whole ones.
 */
struct kvt_share_compose;
int kvt_share_compose_new(const struct kvt_entry *t, const char *name,
                          struct kvt_share_compose **out);
/** For a chunk k arriving as bytes (a fed load): check its header @p h against the entry and
 * give the destinations of its @p n slots, rows [256k, 256(k + 1)) of the whole entry's. */
struct kvt_slot_dst;
int kvt_share_compose_place(struct kvt_share_compose *sc, const struct kvt_entry *t, size_t k,
                            const struct kvt_header *h, struct kvt_slot_dst *d, size_t n,
                            const char *name);
/** A helper faulting the whole entry's fresh rows in on another core while chunks arrive
 * (stop it with kvt_restore_helper_stop() before the end), or NULL when none is needed. */
struct kvt_restore_helper *kvt_share_compose_prefault(struct kvt_share_compose *sc);
/** Frees @p sc. */
int kvt_share_compose_end(struct kvt_share_compose *sc, struct kvt_entry *t);
void kvt_share_compose_free(struct kvt_share_compose *sc);

#endif
