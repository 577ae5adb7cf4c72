/*
 * Uploads: the entry's .mlxkv bytes (the format is the wire format, hashes included) are
 * laid out in memory as an image of the file (format.h: its tensors hashed once, the header
 * rendered), its chunks are SET straight from the entry's memory with a time to live, and only
 * then is its index record published (no reader ever sees a partial entry) and the chunks'
 * time to live lifted: the chunks of an upload whose writer dies before publishing expire. Room is
 * made by the index script itself, before the chunks and again with the publish: it removes the
 * oldest records while the server's byte total (all hosts' uploads) would exceed max_bytes;
 * once published, the records the new entry supersedes (same tokens, and shorter prefixes when
 * it is trimmable) are deleted, as the store does on disk.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/error.h"
#include "format/format.h"
#include "remote/remote_obj.h"
#include "store/index.h"
#include "store/share.h"

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

/* Make room for @p rec (the oldest entries removed against the server's own total, not this
 * host's view), then, with @p publish, publish it under the cap in the same script. */
static int admit(struct kvt_remote *r, const struct kvt_rrec *rec, bool publish)
{
    return kvt_remote_admit(r, rec, rec->bytes, r->max_bytes, publish, NULL);
}

/* Chunks, then the record, then the chunks made permanent; on failure nothing of the entry is
 * left behind (or only what expires). */
static int upload(struct kvt_remote *r, struct kvt_rrec *rec, const struct kvt_image *im)
{
    struct kvt_rentry re = {rec->ns, rec->uuid, rec->bytes, rec->chunk, rec->n_chunks};
    pthread_mutex_lock(&r->put_mu);
    kvt_rclient_arm(&r->put_rc, rec->bytes);
    int rc = admit(r, rec, false);
    if (rc == 0)
        rc = kvt_rentry_put(&r->put_rc, &r->keys, &re, im, kvt_remote_orphan_ttl_ms(rec->bytes));
    if (rc == 0)
        rc = admit(r, rec, true);
    if (rc == 0)
        rc = kvt_rentry_persist(&r->put_rc, &r->keys, &re);
    if (rc < 0) { /* a record published without its PERSISTs is a miss once its chunks expire */
        char why[512]; /* the failure, not the cleanup's own, is what the caller hears */
        snprintf(why, sizeof(why), "%s", kvt_last_error());
        kvt_rentry_del(&r->put_rc, &r->keys, &re);
        kvt_fail(rc, "%s", why);
    }
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
    rec->created_ms = kvt_wall_ms();
    rec->trimmable = kvt_entry_is_trimmable(e);
    return rec;
}

/* The image of @p e with the remote's identity, uploaded. */
static int put_image(struct kvt_remote *r, const struct kvt_entry *e, struct kvt_rrec *rec)
{
    struct kvt_entry copy = *e;
    copy.meta = (struct kvt_meta){r->model, r->fp, r->tok, rec->ns};
    struct kvt_save_opts so = {.max_file_bytes = r->max_bytes};
    struct kvt_image *im;
    int rc = kvt_image_new(&copy, &so, &im);
    if (rc < 0)
        return rc;
    uint64_t bytes = kvt_image_bytes(im);
    rc = bytes > r->max_entry_bytes ? kvt_fail(KVT_E_TOO_LARGE, "remote: entry too large") : 0;
    if (rc == 0) {
        rec->bytes = bytes;
        rec->n_chunks = (uint32_t)((bytes + rec->chunk - 1) / rec->chunk);
        rec->header_hash = kvt_image_header_hash(im);
        rc = upload(r, rec, im);
    }
    kvt_image_free(im);
    return rc;
}

int kvt_remote_put(kvt_remote *r, const struct kvt_entry *e)
{
    if (!r || !e || (!e->tokens && e->n_tokens))
        return kvt_fail(-EINVAL, "kvt_remote_put: NULL argument");
    const char *ns = e->meta.ns ? e->meta.ns : "";
    struct kvt_rrec **dup;
    size_t n_dup = superseded(r, e, ns, true, &dup);
    drop_recs(r, dup, n_dup, NULL);
    if (n_dup) {
        KVT_RSTAT(r, put_skipped, 1);
        return 0; /* the index holds these very tokens already */
    }
    struct kvt_rrec *rec = new_rec(r, e, ns, 0);
    int rc = !rec                               ? kvt_fail(-ENOMEM, "remote: out of memory")
             : r->share && kvt_share_applies(e) ? kvt_remote_put_shared(r, e, rec)
                                                : put_image(r, e, rec);
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
    kvt_rclient_arm(&r->put_rc, 0);
    drop_recs(r, old, n_old, uuid);
    pthread_mutex_unlock(&r->put_mu);
    return 0;
}
