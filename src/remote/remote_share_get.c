/*
 * Restores of shared entries (SHARING.md "The remote tier"): the tail, loaded and checked like
 * any entry, gives the whole entry's rows; each prefix object the record names is then fetched
 * from its own keys (its own hash tag: any master, redirections followed per chunk) by a fed
 * load with every check of a file (header hash, identity, namespace, tensor hashes as the
 * bytes land); once its header is in and fits the entry (its tokens, layers and shapes), its
 * bytes land straight in their rows of the entry. Its header hash must be the record's. An object
 * that is missing or fails a check is a fact about bytes every entry needing it shares: it is
 * unlisted (so no new record takes it) and every record of the view that needs it is removed;
 * records of other hosts that need it meet its missing keys at their own restore.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "format/format.h"
#include "threads/restore_helper.h"
#include "remote/remote_obj.h"
#include "remote/robj.h"
#include "store/index.h"
#include "store/share.h"

struct placing {
    struct kvt_share_compose *sc;
    const struct kvt_entry *t;
    size_t k;
    const char *name;
};

/* The object's header is in: it must fit rows [256k, 256(k + 1)) of the entry, where its
 * bytes then land straight from the socket. */
static int place(void *ud, const struct kvt_header *h, struct kvt_slot_dst *d, size_t n)
{
    const struct placing *p = ud;
    return kvt_share_compose_place(p->sc, p->t, p->k, h, d, n, p->name);
}

/* Object @p k of @p rec fetched into its rows, every check of a file on the way, its header
 * checked against the record's entry. 0, KVT_R_NIL or < 0. */
static int fetch_obj(struct kvt_remote *r, struct kvt_rclient *c, const struct kvt_rrec *rec,
                     size_t k, struct kvt_entry *t, struct kvt_share_compose *sc)
{
    const struct kvt_robj *o = &rec->objs[k];
    struct kvt_expect x = {.model_id = r->model,
                           .config_fingerprint = r->fp,
                           .tokenizer_hash = r->tok,
                           .ns = rec->ns,
                           .no_verify = r->no_verify};
    char name[96], tag[KVT_ROBJ_NAME];
    snprintf(name, sizeof(name), "remote shared object %s.%s", o->id, o->gen);
    struct kvt_feed *f;
    int rc = kvt_feed_new(o->bytes, &x, name, &f);
    if (rc)
        return rc;
    struct placing pl = {sc, t, k, name};
    kvt_feed_place(f, place, &pl);
    struct kvt_rentry e = kvt_robj_entry(o, rec->ns, tag);
    struct kvt_rsink sink = kvt_remote_feed_sink(f);
    rc = kvt_rentry_get(c, &r->keys, &e, &sink);
    struct kvt_entry *none = NULL;
    struct kvt_header *h = NULL;
    if (rc == 0)
        rc = kvt_feed_finish(f, &none, &h);
    kvt_feed_free(f);
    if (rc == 0 && h->header_hash != o->header_hash)
        rc = kvt_fail(KVT_E_CORRUPT, "%s does not match its index entry", name);
    kvt_header_free(h);
    return rc;
}

int kvt_remote_get_shared(struct kvt_remote *r, struct kvt_rclient *c, const struct kvt_rrec *rec,
                          struct kvt_entry *t, int *bad)
{
    char name[64];
    snprintf(name, sizeof(name), "remote entry %s", rec->uuid);
    struct kvt_share_compose *sc;
    int rc = kvt_share_compose_new(t, name, &sc);
    if (rc == 0 && kvt_share_chunks(t->n_tokens) != rec->n_objs)
        rc = kvt_fail(KVT_E_CORRUPT, "%s: its tail and its record disagree", name);
    struct kvt_restore_helper *pf = rc == 0 ? kvt_share_compose_prefault(sc) : NULL;
    for (uint32_t k = 0; rc == 0 && k < rec->n_objs; k++) {
        rc = fetch_obj(r, c, rec, k, t, sc);
        if (rc != 0)
            *bad = (int)k;
    }
    kvt_restore_helper_stop(pf); /* before the memory it may touch changes hands */
    if (rc == 0)
        return kvt_share_compose_end(sc, t);
    kvt_share_compose_free(sc);
    return rc;
}

/* Copies of the records of the view that need object @p o of namespace @p ns. */
static struct kvt_rrec **needing(struct kvt_remote *r, const char *ns, const struct kvt_robj *o,
                                 size_t *n)
{
    struct kvt_rec **all = NULL;
    size_t cnt = 0;
    *n = 0;
    pthread_mutex_lock(&r->mu);
    struct kvt_rrec **v = NULL;
    if (kvt_index_records(r->view.ix, &all, &cnt) == 0 && (v = calloc(cnt + 1, sizeof(*v))))
        for (size_t i = 0; i < cnt; i++) {
            const struct kvt_rrec *rr = all[i]->owner;
            bool needs = false;
            for (uint32_t j = 0; !needs && j < rr->n_objs; j++)
                needs = !strcmp(rr->objs[j].id, o->id) && !strcmp(rr->objs[j].gen, o->gen);
            if (needs && !strcmp(rr->ns, ns))
                v[(*n)++] = kvt_remote_rec_copy_locked(rr);
        }
    pthread_mutex_unlock(&r->mu);
    free(all);
    return v;
}

void kvt_remote_condemn(struct kvt_remote *r, const struct kvt_rrec *rec, int k)
{
    struct kvt_robj o = rec->objs[k];
    struct kvt_rclient *c = kvt_remote_client_take(r);
    if (!c)
        return;
    kvt_rclient_arm(c, 0);
    bool unlisted = false;
    if (kvt_rindex_condemn(c, &r->keys, rec->ns, &o, &unlisted) == 0 && unlisted) {
        char tag[KVT_ROBJ_NAME];
        struct kvt_rentry e = kvt_robj_entry(&o, rec->ns, tag);
        kvt_rentry_del(c, &r->keys, &e);
    }
    size_t n = 0;
    struct kvt_rrec **v = needing(r, rec->ns, &o, &n);
    for (size_t i = 0; i < n; i++) {
        if (v[i]) {
            kvt_rclient_arm(c, 0); /* each removal is one call */
            kvt_remote_delete(r, c, v[i]);
        }
        kvt_rrec_free(v[i]);
    }
    free(v);
    kvt_remote_client_give(r, c);
    kvt_remote_logf(r, KVT_LOG_WARN, "[remote] shared object %s.%s failed: %zu entries dropped",
                    o.id, o.gen, n);
}
