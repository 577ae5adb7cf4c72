/*
 * Restores: the entry's chunks, each checked against the length the index record promised,
 * are written to a scratch file, which is then loaded exactly as a store file is (header hash,
 * strict header checks, the expected identity and namespace, tensor hashes while reading), and must
 * match the record (header hash, tokens). A missing chunk (evicted, deleted, server restarted) is a
 * miss; bytes that fail a check are corrupt: either way the record and its chunks are
 * deleted and counted, and the caller sees a miss. A connection failure is a counted miss
 * that keeps the record.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/error.h"
#include "remote/remote_obj.h"

/* Fetch the chunks of @p rec into the new file @p path. 0, KVT_R_NIL or < 0. */
static int fetch(struct kvt_remote *r, const struct kvt_rrec *rec, const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return kvt_fail(-errno, "remote: %s: create failed", path);
    struct kvt_rentry e = {rec->ns, rec->uuid, rec->bytes, rec->chunk, rec->n_chunks};
    pthread_mutex_lock(&r->get_mu);
    int rc = kvt_rentry_get(&r->get_rc, &r->keys, &e, fd);
    pthread_mutex_unlock(&r->get_mu);
    close(fd);
    return rc;
}

/* Load and check the fetched file against the record. */
static int load(struct kvt_remote *r, const struct kvt_rrec *rec, const char *path,
                struct kvt_entry **out)
{
    struct kvt_expect x = {.model_id = r->model,
                           .config_fingerprint = r->fp,
                           .tokenizer_hash = r->tok,
                           .ns = rec->ns,
                           .no_verify = r->no_verify};
    struct kvt_header *h = NULL;
    int rc = kvt_file_load(path, &x, out, &h);
    if (rc == 0 && (h->header_hash != rec->header_hash || h->n_tokens != rec->n_tokens ||
                    memcmp(h->tokens, rec->tokens, rec->n_tokens * sizeof(int32_t)))) {
        rc = kvt_fail(KVT_E_CORRUPT, "remote entry %s does not match its index record", rec->uuid);
        kvt_entry_free(*out);
        *out = NULL;
    }
    kvt_header_free(h);
    return rc;
}

/* Count the outcome; a miss or bad bytes also remove the entry. */
static void settle(struct kvt_remote *r, const struct kvt_rrec *rec, int rc)
{
    pthread_mutex_lock(&r->mu);
    if (rc == 0) {
        r->st.restores++;
        r->st.restore_bytes += rec->bytes;
    } else if (rc == KVT_R_NIL) {
        r->st.misses++;
    } else if (rc == KVT_E_CORRUPT || rc == KVT_E_FORMAT || rc == KVT_E_UNSUPPORTED ||
               rc == KVT_E_MISMATCH) {
        r->st.corrupt++;
    } else {
        r->st.errors++;
    }
    pthread_mutex_unlock(&r->mu);
    if (rc == 0 || (rc < 0 && rc > -1000 && rc != -ENOMEM)) {
        if (rc < 0) /* a connection fault: the entry itself may be fine */
            kvt_remote_logf(r, KVT_LOG_WARN, "[remote] entry %s unreachable: %s", rec->uuid,
                            kvt_last_error());
        return;
    }
    kvt_remote_logf(r, KVT_LOG_WARN, "[remote] entry %s (%zu tokens) dropped: %s", rec->uuid,
                    rec->n_tokens, rc == KVT_R_NIL ? "a chunk is missing" : kvt_last_error());
    pthread_mutex_lock(&r->get_mu);
    kvt_remote_delete(r, &r->get_rc, rec);
    pthread_mutex_unlock(&r->get_mu);
}

int kvt_remote_restore(kvt_remote *r, const struct kvt_hit *hit, struct kvt_entry **out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_remote_restore: NULL out");
    *out = NULL;
    if (!r || !hit)
        return kvt_fail(-EINVAL, "kvt_remote_restore: NULL argument");
    struct kvt_rrec *rec = kvt_remote_rec_copy(r, hit->id);
    if (!rec)
        return 0; /* dropped since the find */
    char path[4200], name[33];
    kvt_rkeys_uuid(name); /* concurrent restores of one entry each get their own file */
    kvt_remote_scratch_path(r, name, path, sizeof(path));
    int rc = fetch(r, rec, path);
    if (rc == 0)
        rc = load(r, rec, path, out);
    unlink(path);
    settle(r, rec, rc);
    kvt_rrec_free(rec);
    return 0;
}
