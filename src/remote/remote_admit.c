/*
 * Room and publication through the index script, for every upload and gc: the records the
 * script removed to make room lose their chunks and leave the view, and the shared prefix
 * objects it freed (no record needs them any more) lose their keys.
 */
#include <stdlib.h>

#include "remote/remote_obj.h"
#include "remote/robj.h"

/* The entries the index script removed to make room: their chunks and the objects no record
 * needs any more deleted, out of the view, counted (put_mu held). */
static void evicted(struct kvt_remote *r, struct kvt_rout *o)
{
    for (size_t i = 0; i < o->n_gone; i++) {
        struct kvt_rrec *v = &o->gone[i];
        struct kvt_rentry e = {v->ns, v->uuid, v->bytes, v->chunk, v->n_chunks};
        kvt_rentry_del(&r->put_rc, &r->keys, &e);
        pthread_mutex_lock(&r->mu);
        kvt_rview_drop(&r->view, v->uuid);
        r->st.evictions++;
        pthread_mutex_unlock(&r->mu);
    }
    kvt_remote_free_objs(r, &r->put_rc, o);
}

int kvt_remote_admit(struct kvt_remote *r, const struct kvt_rrec *rec, uint64_t need, uint64_t cap,
                     bool publish, struct kvt_rout *out)
{
    struct kvt_rout o;
    int rc = kvt_rindex_admit_ex(&r->put_rc, &r->keys, publish ? rec : NULL, publish ? 0 : need,
                                 cap, r->max_entry_bytes, &o);
    if (rc < 0)
        return rc;
    evicted(r, &o);
    if (out)
        *out = o;
    else
        kvt_rout_free(&o);
    return 0;
}

uint64_t kvt_remote_orphan_ttl_ms(uint64_t bytes)
{
    return 600000 + bytes / 1000000 * 1000;
}
