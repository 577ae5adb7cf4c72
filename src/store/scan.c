/*
 * Directory scans (STORE.md §6, §12.1, §12.4): the startup recovery and every refresh. Only
 * headers are read. Each namespace directory is rescanned when it is new, when its mtime
 * changed, or when the last scan left something to retry (an OS error, a young .tmp, or an
 * mtime so recent that a later change could share its timestamp). Files are classified by
 * the error category of FORMAT.md §11.1:
 *   valid and compatible          indexed
 *   FORMAT, UNSUPPORTED, MISMATCH skipped and left in place (foreign model, tokenizer or
 *                                 fingerprint, newer version, V21), never re-read unless
 *                                 their size or mtime changes
 *   CORRUPT                       deleted, or renamed to <name>.mlxkv.corrupt when the store
 *                                 quarantines (read-only stores count them and leave them)
 *   -errno                        skipped this time, retried at the next refresh
 * A `.tmp` is reaped only when a non-blocking exclusive flock on it succeeds (its writer is
 * gone) and it is older than tmp_grace_ms. Records whose files vanished are dropped, except
 * those added after the listing began. All file I/O runs outside the store lock. Headers of a
 * large directory are read on several threads, batch by batch, and indexed in name order.
 */
#include "store/store_parts.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "io/io.h"
#include "store/layout.h"
#include "store/share.h"
#include "settings/settings.h"

/* Changes within this many ms of a directory's mtime may share its timestamp. */
#define MTIME_SETTLE_MS 2000
/* Header reads run on up to this many threads, per batch of files, for big directories. */
#define SCAN_MAX_THREADS 8
#define SCAN_MIN_PARALLEL 16
#define SCAN_BATCH 128

static bool timespec_eq(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/** Reap an abandoned .tmp; true when it should be looked at again later (locked, young). */
static bool reap_tmp(struct kvt_store *s, const char *path)
{
    struct stat st;
    bool again;
    int fd = kvt_tmp_claim(path, s->tmp_grace_ms, &st, &again);
    if (fd < 0)
        return again;
    if (kvt_tmp_unlink_claimed(path, &st) == 0) {
        pthread_mutex_lock(&s->lock);
        s->tmp_reaped++;
        pthread_mutex_unlock(&s->lock);
        kvt_store_logf(s, KVT_LOG_INFO, "[ssd-cache] removed abandoned %s", path);
    }
    kvt_io()->close(fd);
    return false;
}

static bool streq(const char *a, const char *b)
{
    return a && b && !strcmp(a, b);
}

/** The store's compatibility checks on a valid header (STORE.md §6, §12.2; FORMAT.md V21). */
static int check_identity(const struct kvt_store *s, const char *path, const struct kvt_header *h)
{
    static const char *const keys[] = {"modelId", "configFingerprint", "tokenizerHash"};
    const char *got[] = {h->model_id, h->config_fingerprint, h->tokenizer_hash};
    const char *want[] = {s->model_id, s->fingerprint, s->tokenizer_hash};
    for (int i = 0; i < 3; i++)
        if (!streq(got[i], want[i]))
            return kvt_fail(KVT_E_MISMATCH, "%s: %s mismatch (file %s, expected %s)", path, keys[i],
                            got[i] ? got[i] : "(absent)", want[i]);
    if (kvt_is_tail(path)) /* its token-axis layers hold only its own rows */
        return kvt_share_chunks(h->n_tokens)
                   ? 0
                   : kvt_fail(KVT_E_FORMAT, "%s: a tail of %zu tokens, too short for a chunk", path,
                              h->n_tokens);
    if (!kvt_header_is_indexable(h))
        return kvt_fail(KVT_E_MISMATCH,
                        "%s: V21: a cache's offset differs from the %zu tokens; not indexed", path,
                        h->n_tokens);
    return 0;
}

/** One .mlxkv file of a directory being scanned. */
struct scan_item {
    char *path;
    struct kvt_header *h;  /* compatible: to be indexed, in name order */
    uint64_t *chunk_sizes; /* a tail's: the sizes of the chunks it needs */
    int64_t mtime_ms;
    bool again; /* retry at the next refresh */
};

/**
 * Classify one .mlxkv file (thread-safe, runs on scan workers): a compatible header is left in
 * it->h; skipped and corrupt files are dealt with here.
 */
static void classify(struct kvt_store *s, struct kvt_sdir *d, struct scan_item *it)
{
    const char *path = it->path;
    pthread_mutex_lock(&s->lock);
    bool known = kvt_index_by_path(s->ix, path) || kvt_pending_has_locked(s, path);
    struct kvt_skip *k = known ? NULL : kvt_skip_get_locked(d, path);
    struct kvt_skip seen = k ? *k : (struct kvt_skip){0};
    pthread_mutex_unlock(&s->lock);
    if (known)
        return;

    struct stat st;
    int src = kvt_io()->stat(path, &st, 0);
    if (src != 0) {
        if (src == -ENOENT)
            return;
        pthread_mutex_lock(&s->lock);
        kvt_skip_set_locked(d, path, 0, &seen.mtime, true);
        pthread_mutex_unlock(&s->lock);
        it->again = true;
        return;
    }
    if (k && !seen.transient && seen.bytes == (uint64_t)st.st_size &&
        timespec_eq(&seen.mtime, &st.st_mtim))
        return; /* unchanged since it was skipped */

    struct kvt_read_opts ro = {.max_header_bytes = s->max_header_bytes};
    struct kvt_header *h = NULL;
    int rc = kvt_file_read_header(path, &ro, &h);
    if (rc == 0)
        rc = check_identity(s, path, h);
    if (rc == 0 && kvt_is_tail(path))
        rc = kvt_chunks_size(d->path, h->tokens, h->n_tokens, &it->chunk_sizes);
    if (rc == 0) {
        it->h = h;
        it->mtime_ms = kvt_timespec_ms(&st.st_mtim);
        return;
    }
    kvt_header_free(h);
    if (rc == -ENOENT)
        return;

    bool transient = rc != KVT_E_FORMAT && rc != KVT_E_UNSUPPORTED && rc != KVT_E_MISMATCH &&
                     rc != KVT_E_CORRUPT;
    if (rc == KVT_E_CORRUPT && !s->read_only) {
        char *why = strdup(kvt_last_error());
        bool gone = kvt_store_dispose_corrupt(s, path, why ? why : kvt_strerror(rc));
        free(why);
        if (gone)
            return;
    } else {
        kvt_store_logf(s, KVT_LOG_INFO, "[ssd-cache] not indexed, left in place: %s",
                       kvt_last_error());
    }
    pthread_mutex_lock(&s->lock);
    if (rc == KVT_E_CORRUPT && s->read_only)
        s->corrupt_files++;
    kvt_skip_set_locked(d, path, (uint64_t)st.st_size, &st.st_mtim, transient);
    pthread_mutex_unlock(&s->lock);
    it->again = transient;
}

/** Index a classified file (in name order, so index order does not depend on threads). */
static void commit(struct kvt_store *s, struct kvt_sdir *d, struct scan_item *it)
{
    if (!it->h)
        return;
    pthread_mutex_lock(&s->lock);
    int rc = kvt_store_add_locked(s, d, it->h, it->path, it->mtime_ms, it->chunk_sizes);
    pthread_mutex_unlock(&s->lock);
    kvt_header_free(it->h);
    free(it->chunk_sizes);
    it->h = NULL;
    it->chunk_sizes = NULL;
    if (rc < 0 && rc != -EEXIST)
        it->again = true; /* out of memory: the next refresh tries again */
}

struct batch {
    struct kvt_store *s;
    struct kvt_sdir *d;
    struct scan_item *items;
    size_t n;
    atomic_size_t next;
};

static void *batch_worker(void *arg)
{
    struct batch *b = arg;
    size_t i;
    while ((i = atomic_fetch_add(&b->next, 1)) < b->n)
        classify(b->s, b->d, &b->items[i]);
    return NULL;
}

static size_t scan_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > SCAN_MAX_THREADS ? SCAN_MAX_THREADS : (size_t)n;
}

/**
 * Classify @p n files, on several threads when there are enough of them (header parsing
 * dominates a scan and files are independent), then index them in order and free the
 * items' paths. @return true when some file should be retried later.
 */
static bool scan_batch(struct kvt_store *s, struct kvt_sdir *d, struct scan_item *items, size_t n)
{
    struct batch b = {s, d, items, n, 0};
    pthread_t th[SCAN_MAX_THREADS];
    size_t started = 0, want = n >= SCAN_MIN_PARALLEL ? scan_threads() - 1 : 0;
    while (started < want && kvt_mem_thread_start(&th[started], "kvt-scan", batch_worker, &b) == 0)
        started++;
    batch_worker(&b);
    for (size_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    bool again = false;
    for (size_t i = 0; i < n; i++) {
        commit(s, d, &items[i]);
        again |= items[i].again;
        free(items[i].path);
    }
    return again;
}

static bool name_eq(const void *val, const void *key)
{
    return !strcmp(val, key);
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

struct gather {
    void **v;
    size_t n;
};

static void gather_one(void *val, void *ud)
{
    struct gather *g = ud;
    g->v[g->n++] = val;
}

/** Forget records (added before @p start_seq) and skipped files that are not in @p names. */
static void forget_missing(struct kvt_store *s, struct kvt_sdir *d, const struct kvt_hmap *names,
                           uint64_t start_seq)
{
    struct gather g = {malloc((d->recs.n + d->skips.n + 1) * sizeof(void *)), 0};
    if (!g.v)
        return; /* kept until a later scan manages */
    kvt_hmap_each(&d->recs, gather_one, &g);
    for (size_t i = 0; i < g.n; i++) {
        struct kvt_rec *r = g.v[i];
        const char *name = base_name(r->path);
        if (r->seq <= start_seq && !kvt_hmap_get(names, kvt_str_hash(name), name_eq, name))
            kvt_store_drop_locked(s, r, NULL); /* removed by another process: a clean miss */
    }
    g.n = 0;
    kvt_hmap_each(&d->skips, gather_one, &g);
    for (size_t i = 0; i < g.n; i++) {
        struct kvt_skip *k = g.v[i];
        if (!kvt_hmap_get(names, kvt_str_hash(k->name), name_eq, k->name))
            kvt_skip_del_locked(d, k->path);
    }
    free(g.v);
}

/* Remove the chunks among @p names that no indexed tail needs, nor a tail published since
 * (kvt_share_reap_dir()). */
static void reap_chunks(struct kvt_store *s, struct kvt_sdir *d, char **names, size_t n)
{
    char **cands = malloc((n ? n : 1) * sizeof(*cands));
    size_t nc = 0;
    for (size_t i = 0; cands && i < n; i++) {
        if (!kvt_layout_has_suffix(names[i], KVT_CHUNK_EXT))
            continue;
        char *path = kvt_path_join(d->path, names[i]);
        if (!path)
            continue;
        pthread_mutex_lock(&s->lock);
        bool needed = kvt_chunk_needed_locked(s, path);
        pthread_mutex_unlock(&s->lock);
        if (needed)
            free(path);
        else
            cands[nc++] = path;
    }
    if (nc)
        kvt_share_reap_dir(s, d->path, cands, nc);
    for (size_t i = 0; i < nc; i++)
        free(cands[i]);
    free(cands);
}

/* Reap the abandoned .tmp files among @p names and index the entries, in batches; true
 * when some file wants another look later. */
static bool scan_names(struct kvt_store *s, struct kvt_sdir *d, char **names, size_t n)
{
    bool again = false;
    struct scan_item *items = calloc(SCAN_BATCH, sizeof(*items));
    size_t n_items = 0;
    if (!items)
        again = true;
    for (size_t i = 0; i < n && items; i++) {
        bool tmp = kvt_layout_has_suffix(names[i], KVT_TMP_EXT);
        if (!tmp && !kvt_layout_has_suffix(names[i], KVT_ENTRY_EXT) &&
            !kvt_layout_has_suffix(names[i], KVT_SHARE_EXT))
            continue;
        char *path = kvt_path_join(d->path, names[i]);
        if (!path) {
            again = true;
            continue;
        }
        if (tmp) {
            again |= !s->read_only && reap_tmp(s, path);
            free(path);
            continue;
        }
        items[n_items++] = (struct scan_item){.path = path};
        if (n_items == SCAN_BATCH) {
            again |= scan_batch(s, d, items, n_items);
            n_items = 0;
        }
    }
    if (n_items)
        again |= scan_batch(s, d, items, n_items);
    free(items);
    if (!again && !s->read_only) /* every tail here is indexed: the rest need no chunk */
        reap_chunks(s, d, names, n);
    return again;
}

/** Rescan one namespace directory; @p present is false when the root no longer lists it. */
static void scan_dir(struct kvt_store *s, struct kvt_sdir *d, bool present)
{
    pthread_mutex_lock(&s->lock);
    uint64_t start_seq = s->ix->next_seq;
    pthread_mutex_unlock(&s->lock);

    struct stat dst = {0};
    char **names = NULL;
    size_t n = 0;
    int rc = present ? kvt_io()->stat(d->path, &dst, 0) : -ENOENT;
    if (rc == 0)
        rc = kvt_store_names(d->path, false, &names, &n);
    if (rc < 0 && rc != -ENOENT) { /* unknown, not gone: keep the records, look again */
        pthread_mutex_lock(&s->lock);
        d->recheck = true;
        pthread_mutex_unlock(&s->lock);
        return;
    }
    struct kvt_hmap set = {0};
    bool complete = true;
    for (size_t i = 0; i < n; i++)
        if (kvt_hmap_put(&set, kvt_str_hash(names[i]), names[i]) < 0)
            complete = false;

    bool again = scan_names(s, d, names, n);
    pthread_mutex_lock(&s->lock);
    if (complete)
        forget_missing(s, d, &set, start_seq);
    d->mtime = dst.st_mtim;
    d->scanned = true;
    d->recheck = again || !complete;
    d->settling = kvt_now_ms() - kvt_timespec_ms(&dst.st_mtim) < MTIME_SETTLE_MS;
    d->relist_at = d->settling ? kvt_now_ms() + MTIME_SETTLE_MS : 0;
    pthread_mutex_unlock(&s->lock);
    kvt_hmap_free(&set);
    kvt_store_free_names(names, n);
}

struct stale {
    struct kvt_sdir **v;
    size_t n;
    uint64_t gen;
};

static void gather_stale(void *val, void *ud)
{
    struct stale *st = ud;
    struct kvt_sdir *d = val;
    if (d->seen_gen != st->gen && (d->recs.n || d->skips.n))
        st->v[st->n++] = d;
}

void kvt_store_note_own_change(struct kvt_store *s, struct kvt_sdir *d)
{
    struct stat st;
    if (kvt_io()->stat(d->path, &st, 0) != 0)
        return; /* the next scan lists it */
    pthread_mutex_lock(&s->lock);
    d->mtime = st.st_mtim;
    if (!d->settling) { /* another process's change in the same tick: found by then */
        d->settling = true;
        d->relist_at = kvt_now_ms() + MTIME_SETTLE_MS;
    }
    pthread_mutex_unlock(&s->lock);
}

/* Whether @p d must be listed again, its mtime now being @p mtime (the lock held). */
static bool needs_listing(const struct kvt_sdir *d, const struct timespec *mtime, bool strict)
{
    if (!d->scanned || d->recheck || !timespec_eq(mtime, &d->mtime))
        return true;
    return d->settling && (strict || kvt_now_ms() >= d->relist_at);
}

int kvt_store_scan(struct kvt_store *s, bool strict)
{
    pthread_mutex_lock(&s->scan_lock);
    char **names = NULL;
    size_t n = 0;
    int rc = kvt_store_names(s->root, true, &names, &n);
    if (rc == -ENOENT)
        rc = 0; /* no root: every directory is gone */
    if (rc < 0) {
        kvt_fail(rc, "%s: cannot list the store directory", s->root);
        goto out;
    }
    pthread_mutex_lock(&s->lock);
    uint64_t gen = ++s->scan_gen;
    pthread_mutex_unlock(&s->lock);

    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(&s->lock);
        struct kvt_sdir *d = kvt_sdir_get(s, names[i], true);
        if (d)
            d->seen_gen = gen;
        pthread_mutex_unlock(&s->lock);
        if (!d)
            continue;
        struct stat st;
        int src = kvt_io()->stat(d->path, &st, 0);
        if (src == -ENOENT) {
            scan_dir(s, d, false);
            continue;
        }
        if (src < 0) { /* unknown, not gone: look again next time */
            pthread_mutex_lock(&s->lock);
            d->recheck = true;
            pthread_mutex_unlock(&s->lock);
            continue;
        }
        pthread_mutex_lock(&s->lock);
        bool need = needs_listing(d, &st.st_mtim, strict);
        pthread_mutex_unlock(&s->lock);
        if (need)
            scan_dir(s, d, true);
    }

    /* Directories the root no longer lists: their records and skipped files go. */
    pthread_mutex_lock(&s->lock);
    struct stale st = {malloc((s->dirs.n + 1) * sizeof(*st.v)), 0, gen};
    if (st.v)
        kvt_hmap_each(&s->dirs, gather_stale, &st);
    pthread_mutex_unlock(&s->lock);
    for (size_t i = 0; i < st.n; i++)
        scan_dir(s, st.v[i], false);
    free(st.v);
    kvt_store_free_names(names, n);
out:
    pthread_mutex_unlock(&s->scan_lock);
    return rc;
}
