/*
 * The index's side of shared prefix objects (SHARING.md "The remote tier"): what an index
 * script reports (records it removed, objects it freed, objects that refused a publish),
 * decoded with the same bounds as any record, and the lookup of the objects listed under a
 * set of chunk ids. Replies come from the network: anything undecodable is skipped.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "remote/robj.h"

void kvt_rout_free(struct kvt_rout *o)
{
    kvt_rrecs_free(o->gone, o->n_gone);
    for (size_t i = 0; i < o->n_dead; i++)
        free(o->dead[i].ns);
    free(o->dead);
    free(o->clash);
    memset(o, 0, sizeof(*o));
}

/* One string element of a script's reply into @p o (the arrays have room for it). */
static void take(const redisReply *e, uint64_t max_rec, struct kvt_rout *o)
{
    const uint8_t *p = (const uint8_t *)e->str;
    size_t len = e->len;
    if (len >= 4 + KVT_ROBJ_WIRE && !memcmp(p, "KVO1", 4)) {
        struct kvt_rdead *d = &o->dead[o->n_dead];
        if (kvt_robj_decode(p + 4, KVT_ROBJ_WIRE, max_rec, &d->o) == 0 &&
            (d->ns = strndup((const char *)p + 4 + KVT_ROBJ_WIRE, len - 4 - KVT_ROBJ_WIRE)))
            o->n_dead++;
    } else if ((len == 36 || len == 36 + KVT_ROBJ_WIRE) && !memcmp(p, "KVC1", 4)) {
        struct kvt_robj *c = &o->clash[o->n_clash];
        memset(c, 0, sizeof(*c));
        memcpy(c->id, p + 4, 32);
        if (len == 36 || kvt_robj_decode(p + 36, KVT_ROBJ_WIRE, max_rec, c) == 0)
            o->n_clash++;
    } else if (kvt_rrec_decode(p, len, max_rec, &o->gone[o->n_gone]) == 0) {
        o->n_gone++;
    }
}

/* Decode an index script's reply {version or -1 (refused), strings...} into @p o. */
static int parse(const redisReply *r, uint64_t max_rec, struct kvt_rout *o)
{
    memset(o, 0, sizeof(*o));
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_INTEGER)
        return kvt_fail(KVT_E_CORRUPT, "redis: unexpected index script reply");
    o->refused = r->element[0]->integer < 0;
    size_t n = r->elements - 1;
    if (!n)
        return 0;
    o->gone = calloc(n, sizeof(*o->gone));
    o->dead = calloc(n, sizeof(*o->dead));
    o->clash = calloc(n, sizeof(*o->clash));
    if (!o->gone || !o->dead || !o->clash) {
        kvt_rout_free(o);
        return kvt_fail(-ENOMEM, "remote: out of memory");
    }
    for (size_t i = 1; i < r->elements; i++)
        if (r->element[i]->type == REDIS_REPLY_STRING)
            take(r->element[i], max_rec ? max_rec : UINT64_MAX, o);
    return 0;
}

int kvt_rout_take(struct redisReply *r, uint64_t max_rec, struct kvt_rout *out)
{
    struct kvt_rout o;
    int rc = parse(r, max_rec, &o);
    freeReplyObject(r);
    if (out)
        *out = o;
    else
        kvt_rout_free(&o);
    return rc;
}

int kvt_rindex_objs(struct kvt_rclient *rc, const struct kvt_rkeys *k, const char *ns,
                    char (*ids)[33], size_t n, uint64_t max_bytes, struct kvt_robj *out, bool *have)
{
    const char **argv = calloc(n + 2, sizeof(*argv));
    char(*fields)[KVT_ROBJ_FIELD] = calloc(n ? n : 1, sizeof(*fields));
    int err = argv && fields ? 0 : kvt_fail(-ENOMEM, "remote: out of memory");
    redisReply *r = NULL;
    if (err == 0) {
        argv[0] = "HMGET";
        argv[1] = k->objs;
        for (size_t i = 0; i < n; i++)
            kvt_robj_field(ns, ids[i], fields[i]), argv[2 + i] = fields[i];
        r = kvt_rclient_cmd(rc, k->ver, (int)n + 2, argv, NULL, &err);
    }
    if (r && (r->type != REDIS_REPLY_ARRAY || r->elements != n))
        err = kvt_fail(-EIO, "redis: HMGET of the shared objects: %s",
                       r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
    for (size_t i = 0; r && err == 0 && i < n; i++) {
        const redisReply *e = r->element[i];
        have[i] = e->type == REDIS_REPLY_STRING &&
                  kvt_robj_decode((const uint8_t *)e->str, e->len, max_bytes, &out[i]) == 0 &&
                  !strcmp(out[i].id, ids[i]);
    }
    freeReplyObject(r);
    free(argv);
    free(fields);
    return err;
}
