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

#include "format/format.h"
#include "kvtier.h"

#define KVT_SHARE_EXT ".kvshare"
#define KVT_CHUNK_EXT ".kvchunk"
#define KVT_CHUNKS_LOCK "chunks.lock" /* kvt_chunks_lock() */
#define KVT_SHARE_CHUNK 256           /* tokens per chunk: the caches' growth step */
#define KVT_CHUNK_ID_LEN 32           /* hex digits of a chunk id */

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

/** A shared entry opened for a restore (kvt_share_open()). */
struct kvt_share_open {
    /* the whole entry: the tail's header with every cut layer grown to all n rows, its slots
     * contiguous [B, H, n, D] (offsets in order, hashes 0) */
    struct kvt_header *whole;
    size_t nf;     /* files: the tail, then its chunks in order */
    int *fd;       /* the tail's open; a chunk's only while it is read */
    uint64_t *ino; /* a chunk's inode when its header was checked: its read must find it */
    struct kvt_header **h;
    char **path;
    uint64_t own; /* rows of the tail's cut layers: n - 256m */
};

/**
 * Open the entry whose tail is @p tail_path: the tail's header checked as any file's (V1-V20,
 * @p x), then every chunk's (from the tail's directory) against the entry, before any tensor
 * byte is read. A chunk that fails names itself in *@p bad_chunk (malloc'd; may be NULL): the
 * caller treats every entry that needs it as lost.
 * @return 0, or the codes of kvt_file_load() (KVT_E_CORRUPT also for a chunk whose tokens or
 * shape do not fit the tail; -ENOENT for a missing chunk).
 */
int kvt_share_open(const char *tail_path, const struct kvt_expect *x, struct kvt_share_open *so,
                   char **bad_chunk);
/**
 * Read every file of @p so into the whole entry's slot destinations @p d (one per slot of
 * so->whole in order; a cut slot's blocks are its [B, H] rows of n rows each, at the stride
 * d->stride; a NULL dst only checks): each file's rows land at their row offsets, every byte
 * hash-checked unless x->no_verify, the files read as one load (kvt_tensor_read_files()).
 * The slack past row n is the caller's. @return as kvt_share_open().
 */
int kvt_share_read(struct kvt_share_open *so, const struct kvt_slot_dst *d,
                   const struct kvt_expect *x, char **bad_chunk);
void kvt_share_close(struct kvt_share_open *so);
/** The destinations of kvt_share_read() for caller memory: slot k of the whole entry @p w
 * contiguous at @p dst[k] (NULL: only checked). */
void kvt_share_placed_dsts(const struct kvt_header *w, void *const *dst, struct kvt_slot_dst *d);

/**
 * Load the entry whose tail is @p tail_path into new caches of the whole entry with restore
 * capacity (kvt_share_open(), kvt_share_read()). @return as kvt_share_open().
 */
int kvt_share_load(const char *tail_path, const struct kvt_expect *x, struct kvt_entry **out,
                   char **bad_chunk);
/**
 * kvt_file_load_into() of a shared entry through the host placement @p p: it is given the
 * whole entry's header (n tokens, every cut layer's slots [B, H, n, D]) and each file's rows
 * are read into their row offsets of its memory. On success *@p out_header is that header.
 * @return as kvt_share_open(), or @p p's refusal.
 */
int kvt_share_load_into(const char *tail_path, const struct kvt_expect *x,
                        const struct kvt_placement *p, struct kvt_header **out_header,
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
