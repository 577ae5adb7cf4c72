/*
 * Restores: the entry's chunks, each checked against the length the index record promised,
 * are fed as they come off the socket to a fed load (format.h), which checks them exactly as
 * a store file is checked (header hash, strict header checks, the expected identity and
 * namespace, tensor hashes as the bytes land) and writes them straight into the new entry's
 * buffers; the entry must then match the record (header hash, tokens). A missing chunk
 * (evicted, deleted, server restarted) is a miss; bytes that fail a check are corrupt: either
 * way the record is read again and, still the same, deleted with its chunks; the caller sees a
 * miss. A failure of this host's own (memory, the deadline, a connection, a redirection it
 * could not follow) is a counted miss that keeps the entry for every other host.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "cache/cache_parts.h"
#include "format/format.h"
#include "remote/remote_obj.h"

/* Fetch and load the bytes of @p rec on @p c, and check them against the record. 0, KVT_R_NIL
 * or < 0. */
static int fetch_file(struct kvt_remote *r, struct kvt_rclient *c, const struct kvt_rrec *rec,
                      struct kvt_entry **out)
{
    struct kvt_expect x = {.model_id = r->model,
                           .config_fingerprint = r->fp,
                           .tokenizer_hash = r->tok,
                           .ns = rec->ns,
                           .no_verify = r->no_verify};
    char name[64];
    snprintf(name, sizeof(name), "remote entry %s", rec->uuid);
    struct kvt_feed *f;
    int rc = kvt_feed_new(rec->bytes, &x, name, &f);
    if (rc)
        return rc;
    struct kvt_rentry e = {rec->ns, rec->uuid, rec->bytes, rec->chunk, rec->n_chunks};
    struct kvt_rsink sink = kvt_remote_feed_sink(f);
    rc = kvt_rentry_get(c, &r->keys, &e, &sink);
    struct kvt_header *h = NULL;
    if (rc == 0)
        rc = kvt_feed_finish(f, out, &h);
    kvt_feed_free(f);
    if (rc == 0 && (h->header_hash != rec->header_hash || h->n_tokens != rec->n_tokens ||
                    memcmp(h->tokens, rec->tokens, rec->n_tokens * sizeof(int32_t)))) {
        rc = kvt_fail(KVT_E_CORRUPT, "remote entry %s does not match its index record", rec->uuid);
        kvt_entry_free(*out);
        *out = NULL;
    }
    kvt_header_free(h);
    return rc;
}

/* Bytes a restore of @p rec moves: its own and its objects'. */
static uint64_t rec_moves(const struct kvt_rrec *rec)
{
    uint64_t n = rec->bytes;
    for (uint32_t i = 0; i < rec->n_objs; i++)
        n += rec->objs[i].bytes;
    return n;
}

/* The entry of @p rec: its file, then for a shared entry its objects composed into it. 0,
 * KVT_R_NIL or < 0; *@p bad names the object at fault (-1: none). */
static int fetch(struct kvt_remote *r, const struct kvt_rrec *rec, struct kvt_entry **out, int *bad)
{
    *bad = -1;
    struct kvt_rclient *c = kvt_remote_client_take(r);
    if (!c)
        return kvt_fail(-ENOMEM, "remote: out of memory");
    kvt_rclient_arm(c, rec_moves(rec));
    int rc = fetch_file(r, c, rec, out);
    if (rc == 0 && rec->n_objs)
        rc = kvt_remote_get_shared(r, c, rec, *out, bad);
    if (rc == 0 && kvt_entry_uncovered(*out) >= 0) /* a tail listed as whole, say */
        rc =
            kvt_fail(KVT_E_CORRUPT, "remote entry %s: V21: cache %ld does not cover its %zu tokens",
                     rec->uuid, kvt_entry_uncovered(*out), (*out)->n_tokens);
    kvt_remote_client_give(r, c);
    if (rc != 0) {
        kvt_entry_free(*out);
        *out = NULL;
    }
    return rc;
}

/* Whether @p rc is a fact about the entry's shared bytes (a chunk missing, bytes that fail a
 * check), not about this host's call (memory, the deadline, a connection, a redirection). */
static bool entry_fault(int rc)
{
    return rc == KVT_R_NIL || rc == KVT_E_CORRUPT || rc == KVT_E_FORMAT ||
           rc == KVT_E_UNSUPPORTED || rc == KVT_E_MISMATCH;
}

/* Remove the entry of @p rec once its record, read again, is still the one the restore used
 * (its chunks were not being replaced under it); one that is gone only leaves the view. */
static void drop_checked(struct kvt_remote *r, const struct kvt_rrec *rec)
{
    struct kvt_rclient *c = kvt_remote_client_take(r);
    if (!c)
        return;
    kvt_rclient_arm(c, 0);
    struct kvt_rrec now = {0};
    int found = kvt_rindex_get(c, &r->keys, rec->uuid, r->max_entry_bytes, &now);
    if (found == 1 && kvt_rrec_same(&now, rec))
        kvt_remote_delete(r, c, rec);
    kvt_remote_client_give(r, c);
    kvt_rrec_free_fields(&now);
    if (found == 0) {
        pthread_mutex_lock(&r->mu);
        kvt_rview_drop(&r->view, rec->uuid);
        pthread_mutex_unlock(&r->mu);
    }
}

/* Count the outcome; a miss or bad bytes also remove the entry (drop_checked()), or, when
 * shared object @p bad is at fault, every entry that needs it (kvt_remote_condemn()). */
static void settle(struct kvt_remote *r, const struct kvt_rrec *rec, int rc, int bad)
{
    pthread_mutex_lock(&r->mu);
    if (rc == 0) {
        r->st.restores++;
        r->st.restore_bytes += rec_moves(rec);
    } else if (rc == KVT_R_NIL) {
        r->st.misses++;
    } else if (entry_fault(rc)) {
        r->st.corrupt++;
    } else {
        r->st.errors++;
    }
    pthread_mutex_unlock(&r->mu);
    if (rc == 0)
        return;
    const char *why = rc == KVT_R_NIL ? "a chunk is missing" : kvt_last_error();
    if (!entry_fault(rc)) { /* this host's trouble: the entry itself may be fine */
        kvt_remote_logf(r, KVT_LOG_WARN, "[remote] entry %s not restored (kept): %s", rec->uuid,
                        why);
        return;
    }
    kvt_remote_logf(r, KVT_LOG_WARN, "[remote] entry %s (%zu tokens) dropped: %s", rec->uuid,
                    rec->n_tokens, why);
    if (bad >= 0)
        kvt_remote_condemn(r, rec, bad);
    else
        drop_checked(r, rec);
}

int kvt_remote_restore(kvt_remote *r, const struct kvt_hit *hit, struct kvt_entry **out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_remote_restore: NULL out");
    *out = NULL;
    if (!r || !hit)
        return kvt_fail(-EINVAL, "kvt_remote_restore: NULL argument");
    if (hit->prefix_len == 0)
        return 0;
    if (hit->store != r->serial) /* its id names a record of another index */
        return kvt_fail(-EINVAL,
                        "kvt_remote_restore: the hit is of another index (found by %u, "
                        "restored by remote %u)",
                        hit->store, r->serial);
    struct kvt_rrec *rec = kvt_remote_rec_copy(r, hit->id);
    if (!rec)
        return 0; /* dropped since the find */
    int bad;
    int rc = fetch(r, rec, out, &bad);
    settle(r, rec, rc, bad);
    kvt_rrec_free(rec);
    return 0;
}
