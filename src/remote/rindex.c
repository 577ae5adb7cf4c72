/*
 * The remote index of one identity and the local view of it (REMOTE.md "index"). In Redis:
 * a hash uuid -> record, a sorted set uuid -> version of its publication, and a version
 * counter; a Lua script changes all three at once, after the entry's chunks are written, so
 * a reader never sees a record whose bytes are incomplete. Readers poll the counter: when it
 * moved they fetch only the records published since; when it went backwards (a server
 * restarted empty, keys evicted) or records disappeared, they reload the whole list.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "remote/remote.h"
#include "store/index.h"
#include "tier/tier.h"

#define BATCH 256

/* A counter created by a publish starts at the publisher's clock in µs, not at 1, so that a
 * server restarted empty never hands a reader a version it has seen before. */
static const char PUBLISH[] =
    "if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('SET', KEYS[1], ARGV[3]) end "
    "local v = redis.call('INCR', KEYS[1]) "
    "redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) "
    "redis.call('ZADD', KEYS[3], v, ARGV[1]) return v";
static const char UNPUBLISH[] =
    "if redis.call('HDEL', KEYS[2], ARGV[1]) == 1 then "
    "redis.call('ZREM', KEYS[3], ARGV[1]) return redis.call('INCR', KEYS[1]) end return 0";

static int script(struct kvt_rclient *rc, const struct kvt_rkeys *k, const char *body,
                  const char *uuid, const uint8_t *val, size_t vlen)
{
    char base[32];
    snprintf(base, sizeof(base), "%lld", (long long)kvt_tier_wall_ms() * 1000);
    const char *argv[9] = {"EVAL", body, "3", k->ver, k->idx, k->log, uuid, (const char *)val,
                           base};
    size_t len[9] = {
        4,    strlen(body), 1, strlen(k->ver), strlen(k->idx), strlen(k->log), strlen(uuid),
        vlen, strlen(base)};
    int err = 0;
    redisReply *r = kvt_rclient_cmd(rc, k->ver, val ? 9 : 7, argv, len, &err);
    if (!r)
        return err;
    if (r->type == REDIS_REPLY_ERROR)
        err = kvt_fail(-EIO, "redis: index script: %s", r->str);
    freeReplyObject(r);
    return err;
}

int kvt_rindex_publish(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rrec *r)
{
    size_t len;
    uint8_t *val = kvt_rrec_encode(r, &len);
    if (!val)
        return kvt_fail(-ENOMEM, "remote: out of memory");
    int rc_ = script(rc, k, PUBLISH, r->uuid, val, len);
    free(val);
    return rc_;
}

int kvt_rindex_unpublish(struct kvt_rclient *rc, const struct kvt_rkeys *k, const char *uuid)
{
    return script(rc, k, UNPUBLISH, uuid, NULL, 0);
}

int kvt_rindex_get(struct kvt_rclient *rc, const struct kvt_rkeys *k, const char *uuid,
                   uint64_t max_bytes, struct kvt_rrec *out)
{
    const char *argv[3] = {"HGET", k->idx, uuid};
    int err = 0;
    redisReply *r = kvt_rclient_cmd(rc, k->ver, 3, argv, NULL, &err);
    if (!r)
        return err;
    if (r->type == REDIS_REPLY_ERROR)
        err = kvt_fail(-EIO, "redis: HGET: %s", r->str);
    else if (r->type == REDIS_REPLY_STRING)
        err = kvt_rrec_decode((const uint8_t *)r->str, r->len, max_bytes, out) == 0 ? 1 : 2;
    if (err == 2)
        memset(out, 0, sizeof(*out)); /* a failed decode keeps nothing */
    freeReplyObject(r);
    return err;
}

/* ---- the local view ------------------------------------------------------------------ */

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

/* ---- polling ---------------------------------------------------------------------------- */

static redisReply *cmd(struct kvt_rclient *rc, const struct kvt_rkeys *k, int argc,
                       const char **argv, int *err)
{
    redisReply *r = kvt_rclient_cmd(rc, k->ver, argc, argv, NULL, err);
    if (r && r->type == REDIS_REPLY_ERROR) {
        *err = kvt_fail(-EIO, "redis: %s: %s", argv[0], r->str);
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

/* The version counter; 0 when absent (nothing published, or the server lost it). */
static int get_version(struct kvt_rclient *rc, const struct kvt_rkeys *k, int64_t *out)
{
    const char *argv[2] = {"GET", k->ver};
    int err = 0;
    redisReply *r = cmd(rc, k, 2, argv, &err);
    if (!r)
        return err;
    *out = r->type == REDIS_REPLY_STRING ? strtoll(r->str, NULL, 10) : 0;
    freeReplyObject(r);
    return *out < 0 ? kvt_fail(KVT_E_CORRUPT, "redis: negative index version") : 0;
}

/* The uuids published after version @p after (all of them when @p after < 0). */
static redisReply *list_since(struct kvt_rclient *rc, const struct kvt_rkeys *k, int64_t after,
                              int *err)
{
    char from[32];
    snprintf(from, sizeof(from), "(%lld", (long long)after);
    const char *argv[4] = {"ZRANGEBYSCORE", k->log, after < 0 ? "-inf" : from, "+inf"};
    redisReply *r = cmd(rc, k, 4, argv, err);
    if (r && r->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(r);
        *err = kvt_fail(KVT_E_CORRUPT, "redis: change log is not a list");
        return NULL;
    }
    return r;
}

static bool is_uuid(const redisReply *e)
{
    return e->type == REDIS_REPLY_STRING && e->len == 32;
}

/* HMGET the records of @p ids[from, to) and add the ones that decode (under @p mu). */
static int fetch_batch(struct kvt_rview *v, pthread_mutex_t *mu, struct kvt_rclient *rc,
                       const struct kvt_rkeys *k, const redisReply *ids, size_t from, size_t to,
                       uint64_t max_bytes)
{
    const char *argv[BATCH + 2] = {"HMGET", k->idx};
    size_t len[BATCH + 2] = {5, strlen(k->idx)};
    int argc = 2;
    for (size_t i = from; i < to; i++)
        if (is_uuid(ids->element[i])) {
            argv[argc] = ids->element[i]->str;
            len[argc++] = 32;
        }
    if (argc == 2)
        return 0;
    int err = 0;
    redisReply *r = kvt_rclient_cmd(rc, k->ver, argc, argv, len, &err);
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

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* After a full reload: drop what the server no longer lists (caller holds the lock). */
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

static int zcard(struct kvt_rclient *rc, const struct kvt_rkeys *k, int64_t *out)
{
    const char *argv[2] = {"ZCARD", k->log};
    int err = 0;
    redisReply *r = cmd(rc, k, 2, argv, &err);
    if (!r)
        return err;
    *out = r->type == REDIS_REPLY_INTEGER ? r->integer : 0;
    freeReplyObject(r);
    return 0;
}

static int apply(struct kvt_rview *v, pthread_mutex_t *mu, struct kvt_rclient *rc,
                 const struct kvt_rkeys *k, int64_t after, int64_t cur, uint64_t max_bytes)
{
    int err = 0;
    redisReply *ids = list_since(rc, k, after, &err);
    if (!ids)
        return err;
    for (size_t i = 0; err == 0 && i < ids->elements; i += BATCH)
        err = fetch_batch(v, mu, rc, k, ids, i,
                          i + BATCH < ids->elements ? i + BATCH : ids->elements, max_bytes);
    if (err == 0) {
        pthread_mutex_lock(mu);
        if (after < 0)
            drop_unlisted(v, ids);
        v->ver = cur;
        pthread_mutex_unlock(mu);
    }
    freeReplyObject(ids);
    return err;
}

int kvt_rview_sync(struct kvt_rview *v, pthread_mutex_t *mu, struct kvt_rclient *rc,
                   const struct kvt_rkeys *k, uint64_t max_bytes)
{
    int64_t cur = 0;
    int rc_ = get_version(rc, k, &cur);
    if (rc_ < 0)
        return rc_;
    pthread_mutex_lock(mu);
    int64_t last = v->ver;
    bool empty = kvt_index_count(v->ix) == 0;
    pthread_mutex_unlock(mu);
    if (cur == last && (cur > 0 || empty))
        return 0;
    bool full = last < 0 || cur <= last; /* went back, or vanished under our own records */
    rc_ = apply(v, mu, rc, k, full ? -1 : last, cur, max_bytes);
    if (rc_ < 0 || full)
        return rc_;
    int64_t listed = 0;
    rc_ = zcard(rc, k, &listed);
    pthread_mutex_lock(mu);
    bool removed = rc_ == 0 && (uint64_t)listed < kvt_index_count(v->ix);
    pthread_mutex_unlock(mu);
    return removed ? apply(v, mu, rc, k, -1, cur, max_bytes) : rc_;
}
