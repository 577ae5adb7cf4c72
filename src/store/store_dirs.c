/*
 * Store bookkeeping shared by the scan and the public calls: the namespace-directory table
 * with each directory's records and skipped files, the set of paths this process is writing,
 * record admission and removal (with every shared entry a lost chunk leaves useless),
 * eviction to the cap, disposal of corrupt files and the log callback.
 */
#include "store/store_parts.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/io.h"
#include "store/layout.h"
#include "store/share.h"

void kvt_store_logf(struct kvt_store *s, int level, const char *fmt, ...)
{
    if (!s->log)
        return;
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    char *big = (size_t)n < sizeof(small) ? NULL : malloc((size_t)n + 1);
    if (big) {
        va_start(ap, fmt);
        vsnprintf(big, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_lock(&s->log_lock);
    s->log(s->log_ud, level, big ? big : small); /* truncated beats nothing */
    pthread_mutex_unlock(&s->log_lock);
    free(big);
}

static bool sdir_eq(const void *val, const void *key)
{
    return !strcmp(((const struct kvt_sdir *)val)->name, key);
}

struct kvt_sdir *kvt_sdir_get(struct kvt_store *s, const char *name, bool create)
{
    uint64_t h = kvt_str_hash(name);
    struct kvt_sdir *d = kvt_hmap_get(&s->dirs, h, sdir_eq, name);
    if (d || !create)
        return d;
    d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    d->name = strdup(name);
    d->path = kvt_path_join(s->root, name);
    if (!d->name || !d->path || kvt_hmap_put(&s->dirs, h, d) < 0) {
        kvt_sdir_free(d);
        return NULL;
    }
    return d;
}

static void free_skip(void *val, void *ud)
{
    (void)ud;
    struct kvt_skip *k = val;
    free(k->path);
    free(k);
}

void kvt_sdir_free(struct kvt_sdir *d)
{
    if (!d)
        return;
    kvt_hmap_each(&d->skips, free_skip, NULL);
    kvt_hmap_free(&d->skips);
    kvt_hmap_free(&d->recs);
    free(d->name);
    free(d->path);
    free(d);
}

static bool skip_eq(const void *val, const void *key)
{
    return !strcmp(((const struct kvt_skip *)val)->path, key);
}

struct kvt_skip *kvt_skip_get_locked(struct kvt_sdir *d, const char *path)
{
    return kvt_hmap_get(&d->skips, kvt_str_hash(path), skip_eq, path);
}

void kvt_skip_del_locked(struct kvt_sdir *d, const char *path)
{
    struct kvt_skip *k = kvt_skip_get_locked(d, path);
    if (k) {
        kvt_hmap_del(&d->skips, kvt_str_hash(path), k);
        free_skip(k, NULL);
    }
}

void kvt_skip_set_locked(struct kvt_sdir *d, const char *path, uint64_t bytes,
                         const struct timespec *mtime, bool transient)
{
    struct kvt_skip *k = kvt_skip_get_locked(d, path);
    if (!k) {
        k = calloc(1, sizeof(*k));
        if (!k || !(k->path = strdup(path))) {
            free(k);
            return; /* only bookkeeping: the file is re-read at the next scan */
        }
        if (kvt_hmap_put(&d->skips, kvt_str_hash(path), k) < 0) {
            free_skip(k, NULL);
            return;
        }
        const char *slash = strrchr(k->path, '/');
        k->name = slash ? slash + 1 : k->path;
    }
    k->bytes = bytes;
    k->mtime = *mtime;
    k->transient = transient;
}

static bool str_eq(const void *val, const void *key)
{
    return !strcmp(val, key);
}

bool kvt_pending_has_locked(struct kvt_store *s, const char *path)
{
    return kvt_hmap_get(&s->pending, kvt_str_hash(path), str_eq, path) != NULL;
}

int kvt_pending_add_locked(struct kvt_store *s, const char *path)
{
    char *p = strdup(path);
    if (!p)
        return -ENOMEM;
    int rc = kvt_hmap_put(&s->pending, kvt_str_hash(path), p);
    if (rc < 0)
        free(p);
    return rc;
}

void kvt_pending_del_locked(struct kvt_store *s, const char *path)
{
    uint64_t h = kvt_str_hash(path);
    char *p = kvt_hmap_get(&s->pending, h, str_eq, path);
    if (p) {
        kvt_hmap_del(&s->pending, h, p);
        free(p);
    }
}

int kvt_store_add_locked(struct kvt_store *s, struct kvt_sdir *d, const struct kvt_header *h,
                         const char *path, int64_t mtime_ms, const uint64_t *chunk_sizes)
{
    if (kvt_index_by_path(s->ix, path) || kvt_pending_has_locked(s, path))
        return -EEXIST;
    struct kvt_rec *r;
    int rc = kvt_index_insert(s->ix, h->ns ? h->ns : "", h->tokens, h->n_tokens,
                              kvt_header_is_trimmable(h), h->file_size, mtime_ms, path, &r);
    if (rc < 0)
        return rc;
    r->owner = d;
    rc = kvt_hmap_put(&d->recs, kvt_str_hash(path), r);
    if (rc == 0 && kvt_is_tail(path) && (rc = kvt_chunks_ref_locked(s, r, chunk_sizes)) < 0)
        kvt_hmap_del(&d->recs, kvt_str_hash(path), r);
    if (rc < 0) {
        kvt_index_remove(s->ix, r);
        return rc;
    }
    kvt_skip_del_locked(d, path);
    return 0;
}

void kvt_store_drop_locked(struct kvt_store *s, struct kvt_rec *r, struct kvt_pathlist *pl)
{
    struct kvt_sdir *d = r->owner;
    if (d && r->path)
        kvt_hmap_del(&d->recs, kvt_str_hash(r->path), r);
    /* A path that cannot be queued stays on disk; the next scan re-admits it. */
    if (pl && r->path)
        kvt_pathlist_push(pl, r->path);
    if (kvt_is_tail(r->path) && d)
        kvt_chunks_unref_locked(s, r, pl);
    kvt_index_remove(s->ix, r);
}

struct needs_job {
    const char *dir, *bad;
};

static int is_bad(void *ud, size_t k, const char *id)
{
    (void)k;
    struct needs_job *j = ud;
    char *path = kvt_share_chunk_path(j->dir, id);
    int hit = path && !strcmp(path, j->bad);
    free(path);
    return hit;
}

/* Whether tail @p r needs the chunk @p bad. */
static bool needs(const struct kvt_rec *r, const char *bad)
{
    int32_t *tok = malloc((r->n_tokens ? r->n_tokens : 1) * sizeof(*tok));
    if (!tok)
        return false;
    kvt_rec_tokens(r, tok);
    struct needs_job j = {((const struct kvt_sdir *)r->owner)->path, bad};
    bool yes = kvt_share_each_chunk(tok, r->n_tokens, is_bad, &j) == 1;
    free(tok);
    return yes;
}

void kvt_share_drop_dependents_locked(struct kvt_store *s, const char *bad, struct kvt_pathlist *pl)
{
    struct kvt_rec **recs;
    size_t n;
    if (kvt_index_records(s->ix, &recs, &n) < 0)
        return; /* their restores fail on the chunk one by one instead */
    for (size_t i = 0; i < n; i++)
        if (kvt_is_tail(recs[i]->path) && needs(recs[i], bad))
            kvt_store_drop_locked(s, recs[i], pl);
    free(recs);
}

void kvt_store_evict_locked(struct kvt_store *s, struct kvt_pathlist *pl)
{
    if (s->read_only)
        return;
    while (kvt_index_total_bytes(s->ix) + s->chunk_bytes > s->max_bytes) {
        struct kvt_rec *r = kvt_index_oldest(s->ix);
        if (!r)
            break;
        kvt_store_drop_locked(s, r, pl);
        s->evictions++;
    }
}

bool kvt_store_dispose_corrupt(struct kvt_store *s, const char *path, const char *why)
{
    const struct kvt_io *io = kvt_io();
    if (s->quarantine) {
        char *to = malloc(strlen(path) + sizeof(KVT_CORRUPT_EXT));
        if (to) {
            strcpy(to, path);
            strcat(to, KVT_CORRUPT_EXT);
            int rc = io->renameat(AT_FDCWD, path, AT_FDCWD, to);
            if (rc == 0)
                kvt_store_logf(s, KVT_LOG_WARN, "[ssd-cache] corrupt entry quarantined as %s: %s",
                               to, why);
            else
                kvt_store_logf(s, KVT_LOG_WARN,
                               "[ssd-cache] corrupt entry %s left in place (rename: %s): %s", path,
                               kvt_strerror(rc), why);
            free(to);
            if (rc == 0) {
                pthread_mutex_lock(&s->lock);
                s->corrupt_files++;
                pthread_mutex_unlock(&s->lock);
            }
            return rc == 0 || rc == -ENOENT;
        }
    }
    int rc = io->unlinkat(AT_FDCWD, path, 0);
    if (rc == 0 || rc == -ENOENT)
        kvt_store_logf(s, KVT_LOG_WARN, "[ssd-cache] corrupt entry removed: %s: %s", path, why);
    if (rc == 0) {
        pthread_mutex_lock(&s->lock);
        s->corrupt_files++;
        pthread_mutex_unlock(&s->lock);
    }
    return rc == 0 || rc == -ENOENT;
}
