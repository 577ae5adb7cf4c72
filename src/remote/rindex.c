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
#include "remote/robj.h"

#define KVT_STR2(x) #x
#define KVT_STR(x) KVT_STR2(x)
#define KVT_GONE_KEEP 10000 /* removals a reader can catch up on without a full listing */

/* KEYS: ver idx log gone bytes floor objs refs. A counter created here starts at the caller's
 * clock in µs (ARGV[1]), not at 1, so that a server restarted empty never hands a reader a
 * version it has seen before. A record's byte size is its head's little-endian u64 at offset
 * 44, an object's at 64 of its entry (sizes from 4 PiB on, which no reader accepts, count as
 * 0: Lua numbers are doubles). A shared entry's record (KVR2) lists its objects after the
 * head (rrec.c); objs holds one entry per object, refs how many records need it, and the byte
 * total counts each object once. A record's removal releases its objects that are still the
 * generation it names; those no record needs leave the index and are reported ("KVO1", entry,
 * namespace) so that their keys get deleted. */
#define LUA_COMMON                                                                                 \
    "local dead = {} "                                                                             \
    "local function u64(s, at) local lo, hi = struct.unpack('<I4I4', s, at) "                      \
    "if hi >= 1048576 then return 0 end return lo + hi * 4294967296 end "                          \
    "local function size(rec) if #rec < 52 then return 0 end return u64(rec, 45) end "             \
    "local function osize(e) return u64(e, 65) end "                                               \
    "local function gen(e) return string.sub(e, 33, 64) end "                                      \
    "local function objs(rec) local o = {} "                                                       \
    "if #rec < 83 or string.sub(rec, 1, 4) ~= 'KVR2' then return o, '' end "                       \
    "local nl = string.byte(rec, 78) if #rec < 82 + nl then return o, '' end "                     \
    "local nsh = string.sub(rec, 79, 78 + nl) local n = struct.unpack('<I4', rec, 79 + nl) "       \
    "local at = 83 + nl if #rec < at + 88 * n - 1 then return o, '' end "                          \
    "for i = 1, n do local e = string.sub(rec, at, at + 87) "                                      \
    "o[i] = {nsh .. ':' .. string.sub(e, 1, 32), e} at = at + 88 end "                             \
    "return o, string.sub(rec, at, at + struct.unpack('<I4', rec, 37) - 1) end "                   \
    "local function int(n) return string.format('%.0f', n) end "                                   \
    "local function total() local t = redis.call('GET', KEYS[5]) "                                 \
    "if t then return tonumber(t) end local s = 0 "                                                \
    "for _, r in ipairs(redis.call('HVALS', KEYS[2])) do s = s + size(r) end "                     \
    "for _, e in ipairs(redis.call('HVALS', KEYS[7])) do s = s + osize(e) end "                    \
    "redis.call('SET', KEYS[5], int(s)) return s end "                                             \
    "local function bump() if redis.call('EXISTS', KEYS[1]) == 0 then "                            \
    "redis.call('SET', KEYS[1], ARGV[1]) end return redis.call('INCR', KEYS[1]) end "              \
    "local function unlist(f, e) redis.call('HDEL', KEYS[7], f) redis.call('HDEL', KEYS[8], f) "   \
    "redis.call('DECRBY', KEYS[5], int(osize(e))) end "                                            \
    "local function release(rec) local os, ns = objs(rec) for _, o in ipairs(os) do "              \
    "local cur = redis.call('HGET', KEYS[7], o[1]) "                                               \
    "if cur and gen(cur) == gen(o[2]) and redis.call('HINCRBY', KEYS[8], o[1], -1) <= 0 then "     \
    "unlist(o[1], cur) dead[#dead + 1] = 'KVO1' .. cur .. ns end end end "                         \
    "local function remove(u) local rec = redis.call('HGET', KEYS[2], u) "                         \
    "redis.call('ZREM', KEYS[3], u) if not rec then return false end "                             \
    "redis.call('HDEL', KEYS[2], u) redis.call('ZADD', KEYS[4], bump(), u) "                       \
    "redis.call('DECRBY', KEYS[5], int(size(rec))) release(rec) return rec end "                   \
    "local function finish(out) for _, d in ipairs(dead) do out[#out + 1] = d end return out end " \
    "local function trim() local n = redis.call('ZCARD', KEYS[4]) - " KVT_STR(                     \
        KVT_GONE_KEEP) " "                                                                         \
                       "if n > 0 then local o = redis.call('ZRANGE', KEYS[4], n - 1, n - 1, "      \
                       "'WITHSCORES') "                                                            \
                       "redis.call('SET', KEYS[6], o[2]) redis.call('ZREMRANGEBYRANK', KEYS[4], "  \
                       "0, n - 1) end end "

/* ARGV: base, uuid ("" = none), record, bytes needed besides it, cap (0 = none). Returns
 * {version, 0 or -1 when refused, removed records..., freed objects...}. A record's objects
 * are checked first (a clash refuses the publish, nothing changed: "KVC1", id, the object
 * listed now if any), then taken, so that the room made for it never frees one of them. */
static const char ADMIT[] = LUA_COMMON
    "local out = {0} local os = {} if ARGV[2] ~= '' then os = objs(ARGV[3]) end "
    "for _, o in ipairs(os) do local cur = redis.call('HGET', KEYS[7], o[1]) "
    "if (cur and gen(cur) ~= gen(o[2])) or (not cur and gen(o[2]) ~= ARGV[2]) then "
    "out[#out + 1] = 'KVC1' .. string.sub(o[2], 1, 32) .. (cur or '') end end "
    "if #out > 1 then out[1] = -1 return out end local t = total() "
    "for _, o in ipairs(os) do if redis.call('HINCRBY', KEYS[8], o[1], 1) == 1 then "
    "redis.call('HSET', KEYS[7], o[1], o[2]) redis.call('INCRBY', KEYS[5], int(osize(o[2]))) "
    "t = t + osize(o[2]) end end "
    "local max = tonumber(ARGV[5]) local need = tonumber(ARGV[4]) + size(ARGV[3]) "
    "while max > 0 and t + need > max do "
    "local o = redis.call('ZRANGE', KEYS[3], 0, 0) if #o == 0 then break end "
    "local rec = remove(o[1]) if rec then out[#out + 1] = rec end t = total() end "
    "if ARGV[2] ~= '' then local v = bump() redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) "
    "redis.call('ZADD', KEYS[3], v, ARGV[2]) redis.call('INCRBY', KEYS[5], int(size(ARGV[3]))) "
    "out[1] = v end trim() return finish(out)";
/* ARGV: base, uuid. Returns {1 when it was listed, its record, freed objects...}. */
static const char UNPUBLISH[] =
    LUA_COMMON "total() local rec = remove(ARGV[2]) if rec then trim() return finish({1, rec}) end "
               "return {0}";
/* ARGV: base, field, generation. Unlists the object when it is that generation; 1 if so. */
static const char CONDEMN[] =
    LUA_COMMON "total() local cur = redis.call('HGET', KEYS[7], ARGV[2]) "
               "if cur and gen(cur) == ARGV[3] then unlist(ARGV[2], cur) return 1 end return 0";

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
    const char *keys[8] = {k->ver, k->idx, k->log, k->gone, k->bytes, k->floor, k->objs, k->refs};
    const char *argv[16] = {"EVAL", body, "8"};
    size_t len[16] = {4, strlen(body), 1};
    for (int i = 0; i < 8; i++) {
        argv[3 + i] = keys[i];
        len[3 + i] = strlen(keys[i]);
    }
    argv[11] = base;
    len[11] = strlen(base);
    for (int i = 0; i < nargs; i++) {
        argv[12 + i] = args[i];
        len[12 + i] = alen[i];
    }
    redisReply *r = kvt_rclient_cmd(rc, k->ver, 12 + nargs, argv, len, err);
    if (r && r->type == REDIS_REPLY_ERROR) {
        *err = kvt_fail(-EIO, "redis: index script: %s", r->str);
        freeReplyObject(r);
        return NULL;
    }
    return r;
}

int kvt_rindex_admit_ex(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rrec *r,
                        uint64_t need, uint64_t cap, uint64_t max_rec, struct kvt_rout *out)
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
    return rep ? kvt_rout_take(rep, max_rec, out) : err;
}

int kvt_rindex_admit(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rrec *r,
                     uint64_t need, uint64_t cap, uint64_t max_rec, struct kvt_rrec **gone,
                     size_t *n_gone)
{
    struct kvt_rout o;
    int err = kvt_rindex_admit_ex(rc, k, r, need, cap, max_rec, &o);
    if (err < 0)
        return err;
    if (gone) {
        *gone = o.gone;
        *n_gone = o.n_gone;
        o.gone = NULL;
        o.n_gone = 0;
    }
    kvt_rout_free(&o);
    return err;
}

int kvt_rindex_publish(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rrec *r)
{
    return kvt_rindex_admit(rc, k, r, 0, 0, 0, NULL, NULL);
}

int kvt_rindex_unpublish_ex(struct kvt_rclient *rc, const struct kvt_rkeys *k, const char *uuid,
                            uint64_t max_rec, struct kvt_rout *out)
{
    const char *args[1] = {uuid};
    size_t alen[1] = {strlen(uuid)};
    int err = 0;
    redisReply *r = script(rc, k, UNPUBLISH, 1, args, alen, &err);
    return r ? kvt_rout_take(r, max_rec, out) : err;
}

int kvt_rindex_unpublish(struct kvt_rclient *rc, const struct kvt_rkeys *k, const char *uuid)
{
    return kvt_rindex_unpublish_ex(rc, k, uuid, 0, NULL);
}

int kvt_rindex_condemn(struct kvt_rclient *rc, const struct kvt_rkeys *k, const char *ns,
                       const struct kvt_robj *o, bool *unlisted)
{
    char field[KVT_ROBJ_FIELD];
    kvt_robj_field(ns, o->id, field);
    const char *args[2] = {field, o->gen};
    size_t alen[2] = {strlen(field), strlen(o->gen)};
    int err = 0;
    redisReply *r = script(rc, k, CONDEMN, 2, args, alen, &err);
    *unlisted = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
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
