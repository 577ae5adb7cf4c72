/*
 * Internals of the store (STORE.md): the handle, its per-directory bookkeeping, and the
 * functions shared by the scan (scan.c), the bookkeeping (store_dirs.c) and the public calls
 * (store.c).
 *
 * Locks: `lock` guards the index, the directory table, the pending set and the counters and
 * is never held across file I/O; `scan_lock` serializes scans (startup, refresh) whose I/O
 * runs outside `lock`. Order: scan_lock before lock.
 */
#ifndef KVT_STORE_STORE_H
#define KVT_STORE_STORE_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#include "kvtier.h"
#include "store/hmap.h"
#include "store/index.h"

/** A file left in place and not indexed (STORE.md §12.1 "skipped"). */
struct kvt_skip {
    char *path;
    const char *name; /* inside path */
    uint64_t bytes;
    struct timespec mtime;
    bool transient; /* an OS error: retried at the next scan */
};

/** One namespace directory under the root. */
struct kvt_sdir {
    char *name, *path;
    struct timespec mtime; /* as seen before the last listing, or after this process's put */
    bool scanned, recheck;
    /* The mtime is recent, so a change in the same clock tick may hide behind it: a refresh
     * lists the directory again; a put's scan does so once relist_at (wall ms) has passed. */
    bool settling;
    int64_t relist_at;
    uint64_t seen_gen;     /* the last scan that found it under the root */
    struct kvt_hmap recs;  /* struct kvt_rec * by path hash */
    struct kvt_hmap skips; /* struct kvt_skip * by path hash */
};

struct kvt_store {
    char *root, *model_id, *fingerprint, *tokenizer_hash;
    uint64_t max_bytes;
    size_t n_layers, max_header_bytes;
    bool no_verify, quarantine, read_only, keep_saved_cached;
    int64_t tmp_grace_ms;
    kvt_log_fn log;
    void *log_ud;

    pthread_mutex_t lock;
    pthread_mutex_t scan_lock;
    pthread_mutex_t log_lock; /* log calls one at a time (scans log from worker threads) */
    struct kvt_index *ix;
    struct kvt_hmap dirs; /* struct kvt_sdir * by name hash; kept until close */
    uint64_t scan_gen;
    struct kvt_hmap pending; /* char * paths this process is writing */
    uint64_t restores, spills, store_failures, evictions, corrupt_files, restore_misses;
    uint64_t tmp_reaped;
    double restore_ms_last;
    bool warned_store_failure;
    uint32_t serial; /* kvt_hit.store: which store a hit came from */
    /* Sharing (docs/SHARING.md): the chunks the indexed tails need, counted once. */
    bool share;
    struct kvt_hmap chunks; /* struct kvt_chunk * by path hash */
    uint64_t chunk_bytes;
};

/** A shared chunk some indexed tail needs. */
struct kvt_chunk {
    char *path;
    uint64_t bytes;
    uint64_t refs; /* indexed tails that need it */
};

/** Paths collected under the lock and acted on after it (kvt_store_remove_paths()). */
struct kvt_pathlist {
    char **v;
    size_t n, cap;
};

/* ---- claim.c: removing files a writer may hold, and the clocks ---------------------------- */

int64_t kvt_now_ms(void);
int64_t kvt_timespec_ms(const struct timespec *t);
/**
 * Open and lock @p path if no writer holds it (its lock is free) and it was last modified at
 * or before @p before_ms (wall ms). @return the locked descriptor (close it with the io
 * vtable), or -1 with *@p again set when it is worth another look later.
 */
int kvt_claim_older(const char *path, int64_t before_ms, struct stat *st, bool *again);
/** kvt_claim_older() of an abandoned .tmp (STORE.md §12.4): older than @p grace_ms now. */
int kvt_tmp_claim(const char *path, int64_t grace_ms, struct stat *st, bool *again);
/** Unlink a claimed .tmp if the name still leads to that very file; 0 or -errno. */
int kvt_tmp_unlink_claimed(const char *path, const struct stat *st);
/**
 * Remove the chunk @p path if no writer is touching it and it was last used at or before
 * @p before_ms: the time of a listing of its directory that found every tail needing it, less
 * the grace (a tail published after the listing was committed within the grace of its
 * chunks' last use, docs/SHARING.md §6).
 */
void kvt_chunk_remove(const char *path, int64_t before_ms);

/**
 * Lock the chunks of directory @p dir (docs/SHARING.md §6): shared by a put from its first
 * chunk to its tail's publication (waiting for a remover), exclusive by a remover from its
 * listing to its last unlink (@p remove: waiting at most 100 ms for the puts under way).
 * @return the descriptor holding the lock (close it to release), or -errno (-EWOULDBLOCK: puts
 * kept it).
 */
int kvt_chunks_lock(const char *dir, bool remove);

/* ---- store_dirs.c ---------------------------------------------------------------------- */

void kvt_store_logf(struct kvt_store *s, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/** The directory named @p name (locked), creating its entry when @p create. */
struct kvt_sdir *kvt_sdir_get(struct kvt_store *s, const char *name, bool create);
void kvt_sdir_free(struct kvt_sdir *d);

/** Index a file (locked), a tail with the sizes of its chunks (kvt_chunks_size()). -EEXIST
 * when it is indexed or being written here already. */
int kvt_store_add_locked(struct kvt_store *s, struct kvt_sdir *d, const struct kvt_header *h,
                         const char *path, int64_t mtime_ms, const uint64_t *chunk_sizes);
/** Drop a record (locked); when @p pl is not NULL its path goes there for unlinking. */
void kvt_store_drop_locked(struct kvt_store *s, struct kvt_rec *r, struct kvt_pathlist *pl);
/** Remember a skipped file (locked); replaces an older entry for the same path. */
void kvt_skip_set_locked(struct kvt_sdir *d, const char *path, uint64_t bytes,
                         const struct timespec *mtime, bool transient);
void kvt_skip_del_locked(struct kvt_sdir *d, const char *path);
struct kvt_skip *kvt_skip_get_locked(struct kvt_sdir *d, const char *path);

bool kvt_pending_has_locked(struct kvt_store *s, const char *path);
int kvt_pending_add_locked(struct kvt_store *s, const char *path);
void kvt_pending_del_locked(struct kvt_store *s, const char *path);

/** Evict (locked) while over the cap (STORE.md §10); victims' paths go to @p pl. */
void kvt_store_evict_locked(struct kvt_store *s, struct kvt_pathlist *pl);
/**
 * Delete a corrupt file, or rename it to <path>.corrupt when quarantining (not locked).
 * @return false when the file stayed where it was.
 */
bool kvt_store_dispose_corrupt(struct kvt_store *s, const char *path, const char *why);
/** Drop every tail that needs the chunk @p bad (locked); their paths go to @p pl. */
void kvt_share_drop_dependents_locked(struct kvt_store *s, const char *bad,
                                      struct kvt_pathlist *pl);

/* ---- pathlist.c ----------------------------------------------------------------------- */

int kvt_pathlist_push(struct kvt_pathlist *pl, const char *path);
/** Unlink every path but the chunks' (ENOENT and other errors ignored), which stay listed. */
void kvt_pathlist_unlink_files(struct kvt_pathlist *pl);
void kvt_pathlist_free(struct kvt_pathlist *pl);

/* ---- share_reap.c --------------------------------------------------------------------- */

/**
 * Remove what @p pl lists (not locked): entries' files at once, then each chunk that no tail
 * on disk needs (docs/SHARING.md §6): under its directory's chunks lock (kvt_chunks_lock())
 * the directory is listed, the tails this process has not indexed are read, and a chunk goes
 * only if none of them needs it, no indexed tail does, and it was last used a grace before
 * the listing. Frees the list.
 */
void kvt_store_remove_paths(struct kvt_store *s, struct kvt_pathlist *pl);
/** Remove the chunks @p cands of directory @p dir that no tail needs, as
 * kvt_store_remove_paths() does. */
void kvt_share_reap_dir(struct kvt_store *s, const char *dir, char *const *cands, size_t n);

/* ---- share_index.c: the chunks of shared entries (docs/SHARING.md) ------------------- */

/** Whether @p path names a tail (an entry kept as chunks plus a tail). */
bool kvt_is_tail(const char *path);
/** The total size of the chunks the tail @p tok needs in @p dir (no lock held): 0, or
 * KVT_E_CORRUPT naming a missing chunk (its entry is lost), or -errno. */
int kvt_chunks_size(const char *dir, const int32_t *tok, size_t n, uint64_t **sizes);
/** Count a reference of the tail @p r on each of its chunks (locked), with @p sizes from
 * kvt_chunks_size(). -ENOMEM leaves nothing counted. */
int kvt_chunks_ref_locked(struct kvt_store *s, const struct kvt_rec *r, const uint64_t *sizes);
/** Drop the tail @p r's references (locked); chunks no tail needs any more go to @p pl. */
void kvt_chunks_unref_locked(struct kvt_store *s, const struct kvt_rec *r, struct kvt_pathlist *pl);
/** Whether the chunk @p path is needed by an indexed tail (locked). */
bool kvt_chunk_needed_locked(struct kvt_store *s, const char *path);
void kvt_chunks_free(struct kvt_store *s);

/* ---- scan.c --------------------------------------------------------------------------- */

/**
 * Bring the index up to date with the directory (STORE.md §6, §12.4): list the root, rescan
 * namespace directories that are new, changed or due for a re-check, add new files, drop
 * records whose files are gone, reap abandoned .tmp files, classify and act on bad files.
 * Does not evict. @return 0, or -errno when the root cannot be listed (a missing root is 0).
 */
int kvt_store_scan(struct kvt_store *s, bool strict);
/** This process has just changed @p d (a put, its evictions): take its new mtime as seen. */
void kvt_store_note_own_change(struct kvt_store *s, struct kvt_sdir *d);

/**
 * A restore's load step into memory the caller owns: load @p path under expectations @p x,
 * *@p h receiving the header; set *@p refused when a failure is the caller's (a refused
 * placement), so that the file is not treated as bad. A tail (kvt_is_tail()) is a shared
 * entry: its chunk that failed goes to *@p bad_chunk (kvt_share_open()).
 */
typedef int (*kvt_restore_load_fn)(void *ud, const char *path, const struct kvt_expect *x,
                                   struct kvt_header **h, bool *refused, char **bad_chunk);
/** kvt_store_restore() with @p load as the load step (kvt_store_restore_into() and the
 * device layer's restores): 0 with *@p out_header set, 0 with it NULL on a miss, or the
 * loader's refusal. */
int kvt_store_restore_with(kvt_store *s, const struct kvt_hit *hit, kvt_restore_load_fn load,
                           void *ud, struct kvt_header **out_header);

#endif
