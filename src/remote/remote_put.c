/*
 * Uploads: the entry is written as an .mlxkv file in the scratch directory (the format is
 * the wire format, hashes included), its chunks are SET from the mapped file, and only then
 * is its index record published, so no reader ever sees a partial entry. Room is made first
 * by deleting the oldest entries beyond max_bytes; once published, the records the new entry
 * supersedes (same tokens, and shorter prefixes when it is trimmable) are deleted, as the
 * store does on disk.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/error.h"
#include "remote/remote_obj.h"
#include "store/index.h"
#include "tier/tier.h"

/* Copies of the records @p e replaces (@p exact: identical tokens only), under the lock. */
static size_t superseded(struct kvt_remote *r, const struct kvt_entry *e, const char *ns,
                         bool exact, struct kvt_rrec ***out)
{
    struct kvt_rec **v = NULL;
    size_t n = 0, k = 0;
    *out = NULL;
    pthread_mutex_lock(&r->mu);
    bool trim = !exact && kvt_entry_is_trimmable(e);
    if (kvt_index_superseded(r->view.ix, ns, e->tokens, e->n_tokens, trim, &v, &n) == 0 && n &&
        (*out = calloc(n, sizeof(**out))))
        for (size_t i = 0; i < n; i++)
            (*out)[k++] = kvt_remote_rec_copy_locked(v[i]->owner);
    pthread_mutex_unlock(&r->mu);
    free(v);
    return k;
}

/* Free @p v, deleting its entries first unless @p keep is NULL (all but @p keep's uuid). */
static void drop_recs(struct kvt_remote *r, struct kvt_rrec **v, size_t n, const char *keep)
{
    for (size_t i = 0; i < n; i++) {
        if (keep && v[i] && strcmp(v[i]->uuid, keep))
            kvt_remote_delete(r, &r->put_rc, v[i]);
        kvt_rrec_free(v[i]);
    }
    free(v);
}

/* Delete the oldest entries until @p need more bytes fit under max_bytes (put_mu held). */
static void make_room(struct kvt_remote *r, uint64_t need)
{
    for (;;) {
        pthread_mutex_lock(&r->mu);
        struct kvt_rec *old = kvt_index_oldest(r->view.ix);
        bool over = old && kvt_index_total_bytes(r->view.ix) + need > r->max_bytes;
        struct kvt_rrec *victim = over ? kvt_remote_rec_copy_locked(old->owner) : NULL;
        if (over)
            r->st.evictions++;
        pthread_mutex_unlock(&r->mu);
        if (!victim)
            return;
        kvt_remote_delete(r, &r->put_rc, victim);
        kvt_rrec_free(victim);
    }
}

/* The file's bytes, mapped (read-only); the header hash from its header. */
static int map_file(const char *path, uint64_t bytes, uint8_t **map, uint64_t *hash)
{
    struct kvt_header *h;
    int rc = kvt_file_read_header(path, NULL, &h);
    if (rc < 0)
        return rc;
    *hash = h->header_hash;
    kvt_header_free(h);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kvt_fail(-errno, "remote: %s: open failed", path);
    *map = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (*map == MAP_FAILED)
        return kvt_fail(-ENOMEM, "remote: %s: mmap failed", path);
    madvise(*map, bytes, MADV_SEQUENTIAL);
    return 0;
}

/* Chunks, then the record; on failure nothing of the entry is left behind. */
static int upload(struct kvt_remote *r, struct kvt_rrec *rec, const uint8_t *data)
{
    struct kvt_rentry re = {rec->ns, rec->uuid, rec->bytes, rec->chunk, rec->n_chunks};
    pthread_mutex_lock(&r->put_mu);
    make_room(r, rec->bytes);
    int rc = kvt_rentry_put(&r->put_rc, &r->keys, &re, data);
    if (rc == 0)
        rc = kvt_rindex_publish(&r->put_rc, &r->keys, rec);
    if (rc < 0)
        kvt_rentry_del(&r->put_rc, &r->keys, &re);
    pthread_mutex_unlock(&r->put_mu);
    return rc;
}

static struct kvt_rrec *new_rec(struct kvt_remote *r, const struct kvt_entry *e, const char *ns,
                                uint64_t bytes)
{
    struct kvt_rrec *rec = calloc(1, sizeof(*rec));
    if (!rec)
        return NULL;
    kvt_rkeys_uuid(rec->uuid);
    rec->ns = strdup(ns);
    rec->tokens = malloc(e->n_tokens ? e->n_tokens * sizeof(int32_t) : 1);
    if (!rec->ns || !rec->tokens) {
        kvt_rrec_free(rec);
        return NULL;
    }
    memcpy(rec->tokens, e->tokens, e->n_tokens * sizeof(int32_t));
    rec->n_tokens = e->n_tokens;
    rec->bytes = bytes;
    rec->chunk = r->chunk_bytes;
    rec->n_chunks = (uint32_t)((bytes + r->chunk_bytes - 1) / r->chunk_bytes);
    rec->created_ms = kvt_tier_wall_ms();
    rec->trimmable = kvt_entry_is_trimmable(e);
    return rec;
}

/* Stage @p e as a file with the remote's identity, then upload it. */
static int put_staged(struct kvt_remote *r, const struct kvt_entry *e, struct kvt_rrec *rec)
{
    char path[4200];
    kvt_remote_scratch_path(r, rec->uuid, path, sizeof(path));
    struct kvt_entry copy = *e;
    copy.meta = (struct kvt_meta){r->model, r->fp, r->tok, rec->ns};
    struct kvt_save_opts so = {.no_sync = true, .max_file_bytes = r->max_bytes};
    uint64_t bytes = 0;
    int rc = kvt_file_save(path, &copy, &so, &bytes);
    if (rc < 0)
        return rc;
    uint8_t *map = NULL;
    rc = bytes > r->max_entry_bytes ? kvt_fail(KVT_E_TOO_LARGE, "remote: entry too large")
                                    : map_file(path, bytes, &map, &rec->header_hash);
    if (rc == 0) {
        rec->bytes = bytes;
        rec->n_chunks = (uint32_t)((bytes + rec->chunk - 1) / rec->chunk);
        rc = upload(r, rec, map);
        munmap(map, bytes);
    }
    unlink(path);
    return rc;
}

int kvt_remote_put(kvt_remote *r, const struct kvt_entry *e)
{
    if (!r || !e || (!e->tokens && e->n_tokens))
        return kvt_fail(-EINVAL, "kvt_remote_put: NULL argument");
    const char *ns = kvt_tier_ns(e->meta.ns);
    struct kvt_rrec **dup;
    size_t n_dup = superseded(r, e, ns, true, &dup);
    drop_recs(r, dup, n_dup, NULL);
    if (n_dup) {
        KVT_RSTAT(r, put_skipped, 1);
        return 0; /* the index holds these very tokens already */
    }
    struct kvt_rrec *rec = new_rec(r, e, ns, 0);
    int rc = rec ? put_staged(r, e, rec) : kvt_fail(-ENOMEM, "remote: out of memory");
    if (rc < 0) {
        KVT_RSTAT(r, put_failures, 1);
        kvt_remote_logf(r, KVT_LOG_WARN, "[remote] upload of %zu tokens failed: %s", e->n_tokens,
                        kvt_last_error());
        kvt_rrec_free(rec);
        return rc;
    }
    pthread_mutex_lock(&r->mu);
    r->st.puts++;
    r->st.put_bytes += rec->bytes;
    char uuid[33];
    memcpy(uuid, rec->uuid, sizeof(uuid));
    kvt_rview_add(&r->view, rec);
    pthread_mutex_unlock(&r->mu);
    struct kvt_rrec **old;
    size_t n_old = superseded(r, e, ns, false, &old);
    pthread_mutex_lock(&r->put_mu);
    drop_recs(r, old, n_old, uuid);
    pthread_mutex_unlock(&r->put_mu);
    return 0;
}
