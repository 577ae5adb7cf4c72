/*
 * What the files of the kvt_remote object share (remote_obj.h): its log, copies of the records
 * of its local view, and the removal of an entry everywhere (its shared objects that no record
 * needs any more with it).
 */
#include "remote/remote_obj.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "remote/robj.h"
#include "store/index.h"

void kvt_remote_logf(struct kvt_remote *r, int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvt_log_vline(r->log, r->log_ud, level, fmt, ap);
    va_end(ap);
}

struct kvt_rrec *kvt_remote_rec_copy_locked(const struct kvt_rrec *s)
{
    struct kvt_rrec *d = malloc(sizeof(*d));
    if (!d)
        return NULL;
    *d = *s;
    d->ns = strdup(s->ns);
    d->tokens = malloc(s->n_tokens ? s->n_tokens * sizeof(*s->tokens) : 1);
    d->objs = s->n_objs ? malloc(s->n_objs * sizeof(*s->objs)) : NULL;
    if (!d->ns || !d->tokens || (s->n_objs && !d->objs)) {
        kvt_rrec_free(d);
        return NULL;
    }
    if (s->n_objs)
        memcpy(d->objs, s->objs, s->n_objs * sizeof(*s->objs));
    memcpy(d->tokens, s->tokens, s->n_tokens * sizeof(*s->tokens));
    return d;
}

struct kvt_rrec *kvt_remote_rec_copy(struct kvt_remote *r, uint64_t id)
{
    pthread_mutex_lock(&r->mu);
    struct kvt_rec *rec = kvt_index_by_seq(r->view.ix, id);
    struct kvt_rrec *d = rec ? kvt_remote_rec_copy_locked(rec->owner) : NULL;
    pthread_mutex_unlock(&r->mu);
    return d;
}

void kvt_remote_free_objs(struct kvt_remote *r, struct kvt_rclient *rc, const struct kvt_rout *o)
{
    for (size_t i = 0; i < o->n_dead; i++) {
        char name[KVT_ROBJ_NAME];
        struct kvt_rentry e = kvt_robj_entry(&o->dead[i].o, o->dead[i].ns, name);
        kvt_rentry_del(rc, &r->keys, &e);
    }
}

void kvt_remote_delete(struct kvt_remote *r, struct kvt_rclient *rc, const struct kvt_rrec *rec)
{
    struct kvt_rentry e = {rec->ns, rec->uuid, rec->bytes, rec->chunk, rec->n_chunks};
    struct kvt_rout o;
    if (kvt_rindex_unpublish_ex(rc, &r->keys, rec->uuid, r->max_entry_bytes, &o) == 0) {
        kvt_remote_free_objs(r, rc, &o);
        kvt_rout_free(&o);
    }
    kvt_rentry_del(rc, &r->keys, &e);
    pthread_mutex_lock(&r->mu);
    kvt_rview_drop(&r->view, rec->uuid);
    pthread_mutex_unlock(&r->mu);
}
