/*
 * Uploads of shared entries (SHARING.md "The remote tier"): the entry's whole 256-token chunks
 * are prefix objects, named by the disk chunk id; the index lists each object once with the
 * generation (the uuid of the upload) whose keys hold it. An upload asks the index which of
 * its objects are listed, writes only the others under its own generation (with the time to
 * live of any upload), then its tail, then publishes its record, which takes a reference on
 * every object it names in the same script. A publish that finds an object listed with
 * another generation (another host wrote it meanwhile) or gone (its last record was
 * removed) is refused with nothing changed: the upload takes the listed one, deleting its
 * own copy, or writes the missing one, and publishes again. Its own copies that no record
 * ever listed are deleted on failure; after the publish every object of the record is made
 * permanent, so that a writer that dies right after its publish loses none of them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "format/format.h"
#include "remote/remote_obj.h"
#include "remote/robj.h"
#include "store/share.h"

#define PUBLISH_TRIES 4 /* refusals (objects written or removed meanwhile) before giving up */

struct sput {
    struct kvt_remote *r;
    const struct kvt_entry *e; /* with the remote's identity */
    struct kvt_rrec *rec;
    char (*ids)[33];
    bool *mine;      /* object k is this upload's own copy */
    uint64_t loaded; /* bytes of objects this upload wrote */
    bool sent;       /* a publish went out: the record may be listed, whatever the reply */
};

static int collect_id(void *ud, size_t k, const char *id)
{
    memcpy(((struct sput *)ud)->ids[k], id, 33);
    return 0;
}

/* An object or tail larger than the cap or than readers accept is not uploaded. */
static uint64_t max_file(const struct kvt_remote *r)
{
    return r->max_bytes < r->max_entry_bytes ? r->max_bytes : r->max_entry_bytes;
}

/* Write object @p k under this upload's generation, with the time to live of an upload. */
static int write_obj(struct sput *s, size_t k)
{
    struct kvt_robj *o = &s->rec->objs[k];
    int64_t a = (int64_t)(k * KVT_SHARE_CHUNK);
    struct kvt_share_part p;
    struct kvt_image *im = NULL;
    struct kvt_save_opts so = {.max_file_bytes = max_file(s->r)};
    int rc = kvt_share_part_new(s->e, a, a + KVT_SHARE_CHUNK, false, &p);
    if (rc == 0)
        rc = kvt_image_new(&p.e, &so, &im);
    if (rc == 0) {
        memcpy(o->id, s->ids[k], 33);
        memcpy(o->gen, s->rec->uuid, 33);
        o->bytes = kvt_image_bytes(im);
        o->chunk = s->r->chunk_bytes;
        o->n_chunks = (uint32_t)((o->bytes + o->chunk - 1) / o->chunk);
        o->header_hash = kvt_image_header_hash(im);
        char name[KVT_ROBJ_NAME];
        struct kvt_rentry re = kvt_robj_entry(o, s->rec->ns, name);
        s->mine[k] = true; /* from the first SET on, its keys are this upload's to delete */
        rc =
            kvt_rentry_put(&s->r->put_rc, &s->r->keys, &re, im, kvt_remote_orphan_ttl_ms(o->bytes));
        s->loaded += rc == 0 ? o->bytes : 0;
    }
    kvt_image_free(im);
    kvt_share_part_free(&p);
    return rc;
}

/* Delete this upload's own copy of object @p k (no record ever listed it). */
static void drop_own(struct sput *s, size_t k)
{
    char name[KVT_ROBJ_NAME];
    struct kvt_rentry re = kvt_robj_entry(&s->rec->objs[k], s->rec->ns, name);
    kvt_rentry_del(&s->r->put_rc, &s->r->keys, &re);
    s->mine[k] = false;
}

/* The objects the index lists are taken as they are; the others are written. */
static int write_missing(struct sput *s)
{
    size_t m = s->rec->n_objs;
    bool *have = calloc(m, sizeof(*have));
    int rc = have ? kvt_rindex_objs(&s->r->put_rc, &s->r->keys, s->rec->ns, s->ids, m,
                                    s->r->max_entry_bytes, s->rec->objs, have)
                  : kvt_fail(-ENOMEM, "remote: out of memory");
    /* room for about a chunk per object to write (a chunk and a full tail hold as many rows);
     * the publish then keeps the cap exactly */
    uint64_t need = s->rec->bytes;
    for (size_t k = 0; rc == 0 && k < m; k++)
        need += have[k] ? 0 : s->rec->bytes;
    if (rc == 0)
        rc = kvt_remote_admit(s->r, s->rec, need, s->r->max_bytes, false, NULL);
    for (size_t k = 0; rc == 0 && k < m; k++)
        if (!have[k])
            rc = write_obj(s, k);
    free(have);
    return rc;
}

/* The refusal's clashes applied: listed objects taken (own copies deleted), gone ones written. */
static int resolve(struct sput *s, const struct kvt_rout *o)
{
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < o->n_clash; i++)
        for (size_t k = 0; k < s->rec->n_objs; k++) {
            if (strcmp(s->ids[k], o->clash[i].id))
                continue;
            if (o->clash[i].bytes == 0) {
                rc = write_obj(s, k);
            } else {
                if (s->mine[k])
                    drop_own(s, k);
                s->rec->objs[k] = o->clash[i];
            }
            break;
        }
    return rc;
}

/* Publish, resolving refusals; then every object of the record made permanent. */
static int publish(struct sput *s)
{
    int rc = 0;
    bool done = false;
    for (int t = 0; rc == 0 && !done && t < PUBLISH_TRIES; t++) {
        struct kvt_rout o;
        s->sent = true;
        rc = kvt_remote_admit(s->r, s->rec, 0, s->r->max_bytes, true, &o);
        if (rc < 0)
            break;
        done = !o.refused;
        if (!done)
            rc = resolve(s, &o);
        kvt_rout_free(&o);
    }
    if (rc == 0 && !done)
        return kvt_fail(-EAGAIN, "remote: the shared objects kept changing during the publish");
    for (size_t k = 0; rc == 0 && k < s->rec->n_objs; k++) {
        char name[KVT_ROBJ_NAME];
        struct kvt_rentry re = kvt_robj_entry(&s->rec->objs[k], s->rec->ns, name);
        rc = kvt_rentry_persist(&s->r->put_rc, &s->r->keys, &re);
        s->mine[k] = false; /* listed now: removed only with the last record needing it */
    }
    return rc;
}

/* The tail's image, its chunks written, the objects written or taken, the record published
 * and made permanent; on failure before the publish nothing of it is left. After a publish
 * went out the record may be listed, and its objects with it (other records may have taken
 * them since): it is removed as any record is, its objects with the last record that needs
 * them, and its own copies that were never listed expire. put_mu held. */
static int upload(struct sput *s, const struct kvt_image *tail)
{
    struct kvt_rrec *rec = s->rec;
    struct kvt_rentry te = {rec->ns, rec->uuid, rec->bytes, rec->chunk, rec->n_chunks};
    kvt_rclient_arm(&s->r->put_rc, rec->bytes * (rec->n_objs + 1));
    int rc = write_missing(s);
    if (rc == 0)
        rc = kvt_rentry_put(&s->r->put_rc, &s->r->keys, &te, tail,
                            kvt_remote_orphan_ttl_ms(rec->bytes));
    if (rc == 0)
        rc = publish(s);
    if (rc == 0)
        rc = kvt_rentry_persist(&s->r->put_rc, &s->r->keys, &te);
    if (rc < 0) {
        char why[512]; /* the failure, not the cleanup's own, is what the caller hears */
        snprintf(why, sizeof(why), "%s", kvt_last_error());
        if (s->sent) {
            kvt_remote_delete(s->r, &s->r->put_rc, rec);
        } else {
            for (size_t k = 0; k < rec->n_objs; k++)
                if (s->mine[k])
                    drop_own(s, k);
            kvt_rentry_del(&s->r->put_rc, &s->r->keys, &te);
        }
        kvt_fail(rc, "%s", why);
    }
    return rc;
}

/* The tail's image and the record's sizes; then the upload under put_mu. */
static int put_tail(struct sput *s)
{
    size_t m = s->rec->n_objs;
    struct kvt_share_part p;
    struct kvt_image *im = NULL;
    struct kvt_save_opts so = {.max_file_bytes = max_file(s->r)};
    int rc =
        kvt_share_part_new(s->e, (int64_t)(m * KVT_SHARE_CHUNK), (int64_t)s->e->n_tokens, true, &p);
    if (rc == 0)
        rc = kvt_image_new(&p.e, &so, &im);
    if (rc == 0) {
        s->rec->bytes = kvt_image_bytes(im);
        s->rec->n_chunks = (uint32_t)((s->rec->bytes + s->rec->chunk - 1) / s->rec->chunk);
        s->rec->header_hash = kvt_image_header_hash(im);
        pthread_mutex_lock(&s->r->put_mu);
        rc = upload(s, im);
        pthread_mutex_unlock(&s->r->put_mu);
    }
    kvt_image_free(im);
    kvt_share_part_free(&p);
    return rc;
}

int kvt_remote_put_shared(struct kvt_remote *r, const struct kvt_entry *e, struct kvt_rrec *rec)
{
    struct kvt_entry copy = *e;
    copy.meta = (struct kvt_meta){r->model, r->fp, r->tok, rec->ns};
    size_t m = kvt_share_chunks(e->n_tokens);
    struct sput s = {r, &copy, rec, calloc(m, sizeof(*s.ids)), calloc(m, sizeof(bool)), 0, false};
    rec->objs = calloc(m, sizeof(*rec->objs));
    int rc = s.ids && s.mine && rec->objs ? 0 : kvt_fail(-ENOMEM, "remote: out of memory");
    if (rc == 0) {
        rec->n_objs = (uint32_t)m;
        kvt_share_each_chunk(e->tokens, e->n_tokens, collect_id, &s);
        rc = put_tail(&s);
    }
    if (rc == 0)
        KVT_RSTAT(r, put_bytes, s.loaded);
    free(s.ids);
    free(s.mine);
    return rc;
}
