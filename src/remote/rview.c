/*
 * The local view of the remote index (REMOTE.md "Cross-host find"): the store's radix index
 * with one record per remote entry, kept up to date by deltas. A sync reads, in one atomic
 * script, the version and the uuids published and removed since the view's version; records
 * never change once published, so only uuids the view lacks are fetched (HMGET, in batches)
 * and a removal costs a reader its uuid, not a new listing. A full listing (the counter went
 * back or vanished, or removals the view missed were trimmed) is uuids only, too.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "remote/remote_parts.h"
#include "store/index.h"

#define BATCH 256

int kvt_rview_init(struct kvt_rview *v)
{
    v->ver = -1;
    return kvt_index_new(&v->ix);
}

void kvt_rview_drop(struct kvt_rview *v, const char *uuid)
{
    struct kvt_rec *r = kvt_index_by_path(v->ix, uuid);
    if (!r)
        return;
    kvt_rrec_free(r->owner);
    kvt_index_remove(v->ix, r);
}

void kvt_rview_free(struct kvt_rview *v)
{
    if (!v->ix)
        return;
    struct kvt_rec **all = NULL;
    size_t n = 0;
    if (kvt_index_records(v->ix, &all, &n) == 0)
        for (size_t i = 0; i < n; i++)
            kvt_rrec_free(all[i]->owner);
    free(all);
    kvt_index_free(v->ix);
    v->ix = NULL;
}

int kvt_rview_add(struct kvt_rview *v, struct kvt_rrec *r)
{
    kvt_rview_drop(v, r->uuid);
    struct kvt_rec *rec;
    int rc = kvt_index_insert(v->ix, r->ns, r->tokens, r->n_tokens, r->trimmable, r->bytes,
                              r->created_ms, r->uuid, &rec);
    if (rc < 0) {
        kvt_rrec_free(r);
        return rc;
    }
    rec->owner = r;
    return 0;
}

static bool is_uuid(const redisReply *e)
{
    return e->type == REDIS_REPLY_STRING && e->len == 32;
}

/* HMGET the records of @p ids (n <= BATCH) and add the ones that decode (under @p mu). */
static int fetch_batch(struct kvt_rview *v, pthread_mutex_t *mu, struct kvt_rclient *rc,
                       const struct kvt_rkeys *k, const char **ids, size_t n, uint64_t max_bytes)
{
    const char *argv[BATCH + 2] = {"HMGET", k->idx};
    size_t len[BATCH + 2] = {5, strlen(k->idx)};
    for (size_t i = 0; i < n; i++) {
        argv[2 + i] = ids[i];
        len[2 + i] = 32;
    }
    int err = 0;
    redisReply *r = kvt_rclient_cmd(rc, k->ver, (int)n + 2, argv, len, &err);
    if (!r)
        return err;
    if (r->type != REDIS_REPLY_ARRAY) { /* the index key holds another type, or no access */
        err = kvt_fail(-EIO, "redis: HMGET %s: %s", k->idx,
                       r->type == REDIS_REPLY_ERROR ? r->str : "not a list of records");
        freeReplyObject(r);
        return err;
    }
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        struct kvt_rrec *rec = calloc(1, sizeof(*rec));
        if (!rec || e->type != REDIS_REPLY_STRING ||
            kvt_rrec_decode((const uint8_t *)e->str, e->len, max_bytes, rec) < 0) {
            free(rec); /* deleted meanwhile, or a record we cannot trust: not indexed */
            continue;
        }
        pthread_mutex_lock(mu);
        kvt_rview_add(v, rec);
        pthread_mutex_unlock(mu);
    }
    freeReplyObject(r);
    return 0;
}

/* Fetch the records of the uuids in @p ids that the view lacks. */
static int fetch_new(struct kvt_rview *v, pthread_mutex_t *mu, struct kvt_rclient *rc,
                     const struct kvt_rkeys *k, const redisReply *ids, uint64_t max_bytes)
{
    const char *want[BATCH];
    size_t n = 0;
    int err = 0;
    for (size_t i = 0; err == 0 && i < ids->elements; i++) {
        const redisReply *e = ids->element[i];
        pthread_mutex_lock(mu);
        bool have = is_uuid(e) && kvt_index_by_path(v->ix, e->str);
        pthread_mutex_unlock(mu);
        if (is_uuid(e) && !have)
            want[n++] = e->str;
        if (n == BATCH || (n && i + 1 == ids->elements)) {
            err = fetch_batch(v, mu, rc, k, want, n, max_bytes);
            n = 0;
        }
    }
    return err;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* After a full listing: drop what the server no longer lists (caller holds the lock). */
static void drop_unlisted(struct kvt_rview *v, const redisReply *ids)
{
    char **have = calloc(ids->elements + 1, sizeof(*have));
    struct kvt_rec **all = NULL;
    size_t n = 0;
    if (!have || kvt_index_records(v->ix, &all, &n) < 0) {
        free(have);
        return;
    }
    for (size_t i = 0; i < ids->elements; i++)
        have[i] = is_uuid(ids->element[i]) ? ids->element[i]->str : "";
    qsort(have, ids->elements, sizeof(*have), cmp_str);
    for (size_t i = 0; i < n; i++) {
        const char *u = all[i]->path;
        if (!bsearch(&u, have, ids->elements, sizeof(*have), cmp_str))
            kvt_rview_drop(v, u);
    }
    free(all);
    free(have);
}

int kvt_rview_sync(struct kvt_rview *v, pthread_mutex_t *mu, struct kvt_rclient *rc,
                   const struct kvt_rkeys *k, uint64_t max_bytes)
{
    pthread_mutex_lock(mu);
    int64_t last = v->ver;
    pthread_mutex_unlock(mu);
    int err = 0;
    redisReply *r = kvt_rindex_changes(rc, k, last, &err);
    if (!r)
        return err;
    int64_t cur = r->element[0]->integer;
    bool full = r->element[1]->integer != 0;
    const redisReply *added = r->element[2], *gone = r->element[3];
    if (cur < 0)
        err = kvt_fail(KVT_E_CORRUPT, "redis: negative index version");
    if (err == 0 && (cur != last || full)) {
        pthread_mutex_lock(mu);
        for (size_t i = 0; i < gone->elements; i++)
            if (is_uuid(gone->element[i]))
                kvt_rview_drop(v, gone->element[i]->str);
        pthread_mutex_unlock(mu);
        err = fetch_new(v, mu, rc, k, added, max_bytes);
    }
    if (err == 0 && (cur != last || full)) {
        pthread_mutex_lock(mu);
        if (full)
            drop_unlisted(v, added);
        v->ver = cur;
        pthread_mutex_unlock(mu);
    }
    freeReplyObject(r);
    return err;
}

static int by_name(const void *a, const void *b)
{
    const struct kvt_robj *x = *(const struct kvt_robj *const *)a;
    const struct kvt_robj *y = *(const struct kvt_robj *const *)b;
    int c = strcmp(x->id, y->id);
    return c ? c : strcmp(x->gen, y->gen);
}

void kvt_rview_objs(const struct kvt_rview *vw, uint64_t *n, uint64_t *bytes)
{
    struct kvt_rec **all = NULL;
    size_t cnt = 0, m = 0;
    *n = *bytes = 0;
    if (kvt_index_records(vw->ix, &all, &cnt) < 0)
        return;
    for (size_t i = 0; i < cnt; i++)
        m += ((const struct kvt_rrec *)all[i]->owner)->n_objs;
    const struct kvt_robj **v = malloc((m ? m : 1) * sizeof(*v));
    for (size_t i = 0, j = 0; v && i < cnt; i++) {
        const struct kvt_rrec *rr = all[i]->owner;
        for (uint32_t k = 0; k < rr->n_objs; k++)
            v[j++] = &rr->objs[k];
    }
    if (v)
        qsort(v, m, sizeof(*v), by_name);
    for (size_t i = 0; v && i < m; i++)
        if (i == 0 || by_name(&v[i - 1], &v[i])) {
            (*n)++;
            *bytes += v[i]->bytes;
        }
    free(v);
    free(all);
}
