/*
 * The remote index of one identity in Redis (REMOTE.md "index"): a hash uuid -> record, a
 * sorted set uuid -> version of its publication (the change log), a sorted set uuid ->
 * version of its removal (the removal log, its oldest part trimmed past a mark), the byte
 * total of the records, and a version counter. Lua scripts change them all at once, so a
 * reader never sees a record whose chunks are incomplete, and room is made against the shared
 * state: an upload removes the oldest records until it fits under the cap, whatever any
 * host's view says.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/error.h"
#include "remote/remote_parts.h"

#define KVT_STR2(x) #x
#define KVT_STR(x) KVT_STR2(x)
#define KVT_GONE_KEEP 10000 /* removals a reader can catch up on without a full listing */

/* KEYS: ver idx log gone bytes floor. A counter created here starts at the caller's clock in
 * µs (ARGV[1]), not at 1, so that a server restarted empty never hands a reader a version it
 * has seen before. A record's byte size is its head's little-endian u64 at offset 44 (sizes
 * from 4 PiB on, which no reader accepts, count as 0: Lua numbers are doubles). */
#define LUA_COMMON                                                                                 \
    "local function size(rec) if #rec < 52 then return 0 end "                                     \
    "local lo, hi = struct.unpack('<I4I4', rec, 45) "                                              \
    "if hi >= 1048576 then return 0 end return lo + hi * 4294967296 end "                          \
    "local function int(n) return string.format('%.0f', n) end "                                   \
    "local function total() local t = redis.call('GET', KEYS[5]) "                                 \
    "if t then return tonumber(t) end local s = 0 "                                                \
    "for _, r in ipairs(redis.call('HVALS', KEYS[2])) do s = s + size(r) end "                     \
    "redis.call('SET', KEYS[5], int(s)) return s end "                                             \
    "local function bump() if redis.call('EXISTS', KEYS[1]) == 0 then "                            \
    "redis.call('SET', KEYS[1], ARGV[1]) end return redis.call('INCR', KEYS[1]) end "              \
    "local function remove(u) local rec = redis.call('HGET', KEYS[2], u) "                         \
    "redis.call('ZREM', KEYS[3], u) if not rec then return false end "                             \
    "redis.call('HDEL', KEYS[2], u) redis.call('ZADD', KEYS[4], bump(), u) "                       \
    "redis.call('DECRBY', KEYS[5], int(size(rec))) return rec end "                                \
    "local function trim() local n = redis.call('ZCARD', KEYS[4]) - " KVT_STR(                     \
        KVT_GONE_KEEP) " "                                                                         \
                       "if n > 0 then local o = redis.call('ZRANGE', KEYS[4], n - 1, n - 1, "      \
                       "'WITHSCORES') "                                                            \
                       "redis.call('SET', KEYS[6], o[2]) redis.call('ZREMRANGEBYRANK', KEYS[4], "  \
                       "0, n - 1) end end "

/* ARGV: base, uuid ("" = none), record, bytes needed besides it, cap (0 = none). Returns
 * {version or 0, removed records...}. */
static const char ADMIT[] = LUA_COMMON
    "local out = {0} local t = total() local max = tonumber(ARGV[5]) "
    "local need = tonumber(ARGV[4]) + size(ARGV[3]) "
    "while max > 0 and t + need > max do "
    "local o = redis.call('ZRANGE', KEYS[3], 0, 0) if #o == 0 then break end "
    "local rec = remove(o[1]) if rec then out[#out + 1] = rec t = t - size(rec) end end "
    "if ARGV[2] ~= '' then local v = bump() redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) "
    "redis.call('ZADD', KEYS[3], v, ARGV[2]) redis.call('INCRBY', KEYS[5], int(size(ARGV[3]))) "
    "out[1] = v end trim() return out";
/* ARGV: base, uuid. Returns 1 when it was listed. */
static const char UNPUBLISH[] = LUA_COMMON "total() if remove(ARGV[2]) then trim() return 1 end "
                                           "return 0";

/* ARGV: base, the reader's last version (-1: none). Returns {version, full, uuids published
 * since (all when full), uuids removed since}: full when the reader has none, the counter
 * went back or vanished, or removals it missed were trimmed from the log. Read-only. */
static const char CHANGES[] =
    "local v = tonumber(redis.call('GET', KEYS[1]) or '0') "
    "local fl = tonumber(redis.call('GET', KEYS[6]) or '0') local last = tonumber(ARGV[2]) "
    "if v == last and v > 0 then return {v, 0, {}, {}} end "
    "if last < 0 or v <= last or fl > last then "
    "return {v, 1, redis.call('ZRANGE', KEYS[3], 0, -1), {}} end "
    "return {v, 0, redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[2], '+inf'), "
    "redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. ARGV[2], '+inf')}";

static redisReply *script(struct kvt_rclient *rc, const struct kvt_rkeys *k, const char *body,
                          int nargs, const char **args, const size_t *alen, int *err)
{
    char base[32];
    snprintf(base, sizeof(base), "%lld", (long long)kvt_wall_ms() * 1000);
    const char *argv[14] = {"EVAL", body,    "6",      k->ver,   k->idx,
                            k->log, k->gone, k->bytes, k->floor, base};
    size_t len[14] = {4,
                      strlen(body),
                      1,
                      strlen(k->ver),
                      strlen(k->idx),
                      strlen(k->log),
                      strlen(k->gone),
                      strlen(k->bytes),
                      strlen(k->floor),
                      strlen(base)};
    for (int i = 0; i < nargs; i++) {
        argv[10 + i] = args[i];
        len[10 + i] = alen[i];
    }
    redisReply *r = kvt_rclient_cmd(rc, k->ver, 10 + nargs, argv, len, err);
    if (r && r->type == REDIS_REPLY_ERROR) {
        *err = kvt_fail(-EIO, "redis: index script: %s", r->str);
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

/* The removed records of an ADMIT reply, decoded (undecodable ones are skipped). */
static int removed(const redisReply *r, uint64_t max_rec, struct kvt_rrec **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1)
        return kvt_fail(KVT_E_CORRUPT, "redis: unexpected index script reply");
    if (r->elements == 1)
        return 0;
    if (!(*out = calloc(r->elements - 1, sizeof(**out))))
        return kvt_fail(-ENOMEM, "remote: out of memory");
    for (size_t i = 1; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        if (e->type == REDIS_REPLY_STRING &&
            kvt_rrec_decode((const uint8_t *)e->str, e->len, max_rec, &(*out)[*n]) == 0)
            (*n)++;
    }
    return 0;
}

int kvt_rindex_admit(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rrec *r,
                     uint64_t need, uint64_t cap, uint64_t max_rec, struct kvt_rrec **gone,
                     size_t *n_gone)
{
    size_t vlen = 0;
    uint8_t *val = r ? kvt_rrec_encode(r, &vlen) : NULL;
    if (r && !val)
        return kvt_fail(-ENOMEM, "remote: out of memory");
    char needs[24], caps[24];
    snprintf(needs, sizeof(needs), "%llu", (unsigned long long)need);
    snprintf(caps, sizeof(caps), "%llu", (unsigned long long)(cap == UINT64_MAX ? 0 : cap));
    const char *args[4] = {r ? r->uuid : "", val ? (const char *)val : "", needs, caps};
    size_t alen[4] = {strlen(args[0]), vlen, strlen(needs), strlen(caps)};
    int err = 0;
    redisReply *rep = script(rc, k, ADMIT, 4, args, alen, &err);
    free(val);
    if (!rep)
        return err;
    struct kvt_rrec *v = NULL;
    size_t n = 0;
    err = removed(rep, max_rec, &v, &n);
    freeReplyObject(rep);
    if (gone) {
        *gone = v;
        *n_gone = n;
    } else {
        kvt_rrecs_free(v, n);
    }
    return err;
}

int kvt_rindex_publish(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rrec *r)
{
    return kvt_rindex_admit(rc, k, r, 0, 0, 0, NULL, NULL);
}

int kvt_rindex_unpublish(struct kvt_rclient *rc, const struct kvt_rkeys *k, const char *uuid)
{
    const char *args[1] = {uuid};
    size_t alen[1] = {strlen(uuid)};
    int err = 0;
    redisReply *r = script(rc, k, UNPUBLISH, 1, args, alen, &err);
    freeReplyObject(r);
    return err;
}

redisReply *kvt_rindex_changes(struct kvt_rclient *rc, const struct kvt_rkeys *k, int64_t last,
                               int *err)
{
    char lasts[24];
    snprintf(lasts, sizeof(lasts), "%lld", (long long)last);
    const char *args[1] = {lasts};
    size_t alen[1] = {strlen(lasts)};
    redisReply *r = script(rc, k, CHANGES, 1, args, alen, err);
    if (r &&
        (r->type != REDIS_REPLY_ARRAY || r->elements != 4 ||
         r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER ||
         r->element[2]->type != REDIS_REPLY_ARRAY || r->element[3]->type != REDIS_REPLY_ARRAY)) {
        freeReplyObject(r);
        *err = kvt_fail(KVT_E_CORRUPT, "redis: unexpected index changes reply");
        return NULL;
    }
    return r;
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
