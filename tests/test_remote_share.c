/*
 * Shared prefixes on the remote tier against a real redis-server started here: branches off
 * one prompt upload the prompt once and restore byte for byte on another handle (one that does
 * not share as well); the server's object table, reference counts and byte total agree with
 * the records after every step; eviction under a cap never leaves a published record without
 * its objects; a corrupt or missing object is a miss for every record that needs it and is
 * uploaded again by the next branch; two writers putting one prompt at once list it once and
 * leave no copy behind; writers killed mid-upload leave nothing served wrong, and their
 * unpublished copies expire; hostile records of shared entries are neither indexed nor able to
 * break the scripts.
 */
#include "support/redis_srv.h"
#include "support/support.h"
#include "support/synth.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "remote/robj.h"
#include "store/share.h"

static char *base;
static struct redis_srv S;

static int group_setup(void **state)
{
    (void)state;
    return redis_suite_start(&S, "rshare", &base);
}

static int group_teardown(void **state)
{
    (void)state;
    return redis_suite_stop(&S, &base);
}

static kvt_remote *open_share(const char *prefix, bool share, uint64_t cap)
{
    struct kvt_remote_opts o;
    remote_opts(&o, redis_url(&S, prefix), 4096, 2000, 100);
    o.share_prefixes = share;
    if (cap)
        o.max_bytes = cap;
    kvt_remote *r = NULL;
    return kvt_remote_open(&o, &r) == 0 ? r : NULL;
}

static int put_branch(kvt_remote *r, int p, int b)
{
    return remote_put_branch(r, p, b);
}

static int restore_branch(kvt_remote *r, int p, int b)
{
    return remote_restore_branch(r, p, b);
}

static redisContext *cli(void)
{
    redisContext *c = redisConnect("127.0.0.1", S.port);
    assert_non_null(c);
    assert_int_equal(c->err, 0);
    return c;
}

static redisReply *cmd(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    assert_non_null(r);
    return r;
}

/* The keys of object @p o (namespace ""): "<prefix>:<ident>:<nsHash>:{<id>.<gen>}:<i>". */
static void obj_key(const struct kvt_rkeys *k, const struct kvt_robj *o, uint32_t i, char *key)
{
    char tag[KVT_ROBJ_NAME];
    snprintf(tag, sizeof(tag), "%s.%s", o->id, o->gen);
    kvt_rkeys_chunk(k, "", tag, i, key, 256);
}

struct server_state {
    size_t records, objects;
    struct kvt_rrec recs[256];
    struct kvt_robj objs[256];
};

/* The object listed under field @p f, decoded, or asserts. */
static void listed(redisContext *c, const struct kvt_rkeys *k, const char *f, struct kvt_robj *o)
{
    redisReply *e = cmd(c, "HGET %s %s", k->objs, f);
    assert_int_equal(e->type, REDIS_REPLY_STRING);
    assert_int_equal(kvt_robj_decode((const uint8_t *)e->str, e->len, UINT64_MAX, o), 0);
    freeReplyObject(e);
}

/*
 * Read the index of @p prefix and check its invariants: every object a record names is listed
 * with that generation, its reference count is the number of records naming it, no other
 * object is listed, its keys exist (with @p settled: without a time to live), and the byte
 * total is the records' bytes plus each object's once.
 */
static void check_server(const char *prefix, bool settled, struct server_state *st)
{
    struct kvt_rkeys k;
    assert_int_equal(kvt_rkeys_init(&k, prefix, REMOTE_MODEL, REMOTE_FP, REMOTE_TOK), 0);
    redisContext *c = cli();
    redisReply *idx = cmd(c, "HVALS %s", k.idx);
    assert_true(idx->elements <= 256);
    memset(st, 0, sizeof(*st));
    uint64_t want_total = 0;
    for (size_t i = 0; i < idx->elements; i++) {
        struct kvt_rrec *r = &st->recs[st->records++];
        assert_int_equal(kvt_rrec_decode((const uint8_t *)idx->element[i]->str,
                                         idx->element[i]->len, UINT64_MAX, r),
                         0);
        want_total += r->bytes;
        for (uint32_t j = 0; j < r->n_objs; j++) {
            char f[KVT_ROBJ_FIELD];
            kvt_robj_field("", r->objs[j].id, f);
            struct kvt_robj o;
            listed(c, &k, f, &o);
            assert_string_equal(o.gen, r->objs[j].gen);
            size_t s = 0;
            while (s < st->objects && strcmp(st->objs[s].id, o.id))
                s++;
            if (s == st->objects) {
                st->objs[st->objects++] = o;
                want_total += o.bytes;
            }
        }
    }
    freeReplyObject(idx);
    redisReply *n = cmd(c, "HLEN %s", k.objs);
    assert_int_equal(n->integer, st->objects);
    freeReplyObject(n);
    for (size_t s = 0; s < st->objects; s++) {
        long long users = 0;
        for (size_t i = 0; i < st->records; i++)
            for (uint32_t j = 0; j < st->recs[i].n_objs; j++)
                users += !strcmp(st->recs[i].objs[j].id, st->objs[s].id);
        char f[KVT_ROBJ_FIELD];
        kvt_robj_field("", st->objs[s].id, f);
        redisReply *refs = cmd(c, "HGET %s %s", k.refs, f);
        assert_int_equal(refs->type, REDIS_REPLY_STRING);
        assert_int_equal(atoll(refs->str), users);
        freeReplyObject(refs);
        for (uint32_t i = 0; i < st->objs[s].n_chunks; i++) {
            char key[256];
            obj_key(&k, &st->objs[s], i, key);
            redisReply *ttl = cmd(c, "PTTL %s", key);
            assert_true(ttl->integer == -1 || (!settled && ttl->integer > 0));
            freeReplyObject(ttl);
        }
    }
    redisReply *tot = cmd(c, "GET %s", k.bytes);
    if (st->records)
        assert_int_equal(strtoull(tot->str, NULL, 10), want_total);
    freeReplyObject(tot);
    redisFree(c);
    kvt_rkeys_free(&k);
}

static void state_free(struct server_state *st)
{
    for (size_t i = 0; i < st->records; i++)
        kvt_rrec_free_fields(&st->recs[i]);
}

static void wait_synced(kvt_remote *r, uint64_t entries)
{
    struct kvt_remote_stats st;
    for (int i = 0; i < 100; i++) {
        assert_int_equal(kvt_remote_refresh(r), 0);
        kvt_remote_get_stats(r, &st);
        if (st.entries == entries)
            return;
        msleep(20);
    }
    fail_msg("the view holds %llu entries, not %llu", (unsigned long long)st.entries,
             (unsigned long long)entries);
}

static struct kvt_remote_stats stats(kvt_remote *r)
{
    struct kvt_remote_stats st;
    kvt_remote_get_stats(r, &st);
    return st;
}

static void test_branches_share(void **state)
{
    (void)state;
    kvt_remote *w = open_share("br", true, 0), *rd = open_share("br", false, 0);
    assert_non_null(w);
    assert_non_null(rd);
    assert_int_equal(put_branch(w, 0, 0), 0);
    uint64_t first = stats(w).put_bytes;
    for (int b = 1; b <= 4; b++)
        assert_int_equal(put_branch(w, 0, b), 0);
    uint64_t later = (stats(w).put_bytes - first) / 4;
    struct server_state st;
    check_server("br", true, &st);
    assert_int_equal(st.records, 5);
    assert_int_equal(st.objects, 2); /* the prompt's two chunks, once */
    for (size_t i = 0; i < st.records; i++)
        assert_int_equal(st.recs[i].n_objs, 2);
    /* a branch sends its tail; the first sent the prompt's objects as well */
    assert_int_equal(later, st.recs[0].bytes);
    assert_int_equal(first, st.recs[0].bytes + st.objs[0].bytes + st.objs[1].bytes);
    uint64_t obj_bytes = st.objs[0].bytes + st.objs[1].bytes;
    state_free(&st);
    /* another host, which does not share itself, restores every branch byte for byte */
    wait_synced(rd, 5);
    for (int b = 0; b <= 4; b++)
        assert_int_equal(restore_branch(rd, 0, b), 1);
    struct kvt_remote_stats rs = stats(rd);
    assert_int_equal(rs.shared_objects, 2);
    assert_int_equal(rs.shared_bytes, obj_bytes);
    assert_int_equal(rs.restores, 5);
    /* another prompt: objects of its own */
    assert_int_equal(put_branch(w, 1, 0), 0);
    check_server("br", true, &st);
    assert_int_equal(st.objects, 4);
    state_free(&st);
    char *args = strf("stats --redis %s --model-id %s --config-fingerprint %s "
                      "--tokenizer-hash %s",
                      redis_url(&S, "br"), REMOTE_MODEL, REMOTE_FP, REMOTE_TOK);
    char *out = NULL;
    assert_int_equal(run_cli(args, true, &out), 0);
    print_message("%s", out);
    assert_non_null(strstr(out, "6 entries"));
    assert_non_null(strstr(out, "shared prefix objects: 4"));
    free(out);
    free(args);
    kvt_remote_close(w);
    kvt_remote_close(rd);
}

/* Every record of the server restores byte for byte on a fresh reader. */
static void all_restore(const char *prefix, const struct server_state *st, int prompts,
                        int branches)
{
    kvt_remote *rd = open_share(prefix, false, 0);
    assert_non_null(rd);
    wait_synced(rd, st->records);
    size_t ok = 0;
    for (int p = 0; p < prompts; p++)
        for (int b = 0; b < branches; b++) {
            int rc = restore_branch(rd, p, b);
            assert_true(rc == 1 || rc == -1); /* restored, or not listed: never a miss */
            ok += rc == 1;
        }
    assert_int_equal(ok, st->records);
    assert_int_equal(stats(rd).misses + stats(rd).corrupt, 0);
    kvt_remote_close(rd);
}

static void test_eviction_keeps_records_whole(void **state)
{
    (void)state;
    /* sizes: one prompt of two branches, measured */
    kvt_remote *probe = open_share("evp", true, 0);
    assert_int_equal(put_branch(probe, 0, 0), 0);
    assert_int_equal(put_branch(probe, 0, 1), 0);
    struct server_state st;
    check_server("evp", true, &st);
    uint64_t tail = st.recs[0].bytes, prompt = st.objs[0].bytes + st.objs[1].bytes;
    state_free(&st);
    kvt_remote_close(probe);
    /* room for about two prompts with two branches each: evictions free tails first, then
     * a prompt's objects with its last branch */
    uint64_t cap = 2 * (prompt + 2 * tail) + tail / 2;
    kvt_remote *w = open_share("ev", true, cap);
    for (int p = 0; p < 6; p++)
        for (int b = 0; b < 2; b++) {
            assert_int_equal(put_branch(w, p, b), 0);
            check_server("ev", true, &st);
            uint64_t total = 0;
            for (size_t i = 0; i < st.records; i++)
                total += st.recs[i].bytes;
            for (size_t i = 0; i < st.objects; i++)
                total += st.objs[i].bytes;
            assert_true(total <= cap);
            assert_true(st.records >= (p || b ? 2u : 1u));
            all_restore("ev", &st, p + 1, 2);
            state_free(&st);
        }
    assert_true(stats(w).evictions >= 6);
    /* nothing unlisted is left on the server: only listed objects' keys remain */
    redisContext *c = cli();
    redisReply *keys = cmd(c, "KEYS ev:*.*");
    check_server("ev", true, &st);
    size_t listed_keys = 0;
    for (size_t i = 0; i < st.objects; i++)
        listed_keys += st.objs[i].n_chunks;
    assert_int_equal(keys->elements, listed_keys);
    state_free(&st);
    freeReplyObject(keys);
    redisFree(c);
    kvt_remote_close(w);
}

/* Overwrite the last byte (tensor data) of object @p which of the server's first record, or
 * delete its last key. */
static void damage_object(const char *prefix, int which, bool remove)
{
    struct server_state st;
    check_server(prefix, true, &st);
    assert_true(st.records > 0);
    struct kvt_rkeys k;
    kvt_rkeys_init(&k, prefix, REMOTE_MODEL, REMOTE_FP, REMOTE_TOK);
    char key[256];
    const struct kvt_robj *o = &st.recs[0].objs[which];
    obj_key(&k, o, o->n_chunks - 1, key);
    long long at = (long long)((o->bytes - 1) % o->chunk);
    redisContext *c = cli();
    redisReply *r = remove ? cmd(c, "DEL %s", key) : cmd(c, "SETRANGE %s %lld X", key, at);
    assert_int_equal(r->integer, remove ? 1 : at + 1);
    freeReplyObject(r);
    redisFree(c);
    kvt_rkeys_free(&k);
    state_free(&st);
}

static void test_corrupt_or_missing_object(void **state)
{
    (void)state;
    for (int round = 0; round < 2; round++) {
        const char *prefix = round ? "miss" : "bad";
        kvt_remote *w = open_share(prefix, true, 0), *rd = open_share(prefix, false, 0);
        for (int b = 0; b < 3; b++)
            assert_int_equal(put_branch(w, 0, b), 0);
        wait_synced(rd, 3);
        damage_object(prefix, 1, round == 1);
        /* the reader meets the damage: a miss, and every record needing the object leaves */
        assert_int_equal(restore_branch(rd, 0, 1), 0);
        struct kvt_remote_stats rs = stats(rd);
        assert_int_equal(round ? rs.misses : rs.corrupt, 1);
        assert_int_equal(rs.entries, 0);
        struct server_state st;
        check_server(prefix, true, &st);
        assert_int_equal(st.records, 0);
        assert_int_equal(st.objects, 0);
        state_free(&st);
        /* the writer's view learns it; the next branch uploads the prompt again */
        wait_synced(w, 0);
        assert_int_equal(restore_branch(w, 0, 2), -1);
        assert_int_equal(put_branch(w, 0, 2), 0);
        check_server(prefix, true, &st);
        assert_int_equal(st.objects, 2);
        state_free(&st);
        wait_synced(rd, 1);
        assert_int_equal(restore_branch(rd, 0, 2), 1);
        kvt_remote_close(w);
        kvt_remote_close(rd);
    }
}

struct writer {
    const char *prefix;
    int p, b;
    pthread_barrier_t *go;
    int rc;
};

static void *write_one(void *arg)
{
    struct writer *w = arg;
    kvt_remote *r = open_share(w->prefix, true, 0);
    pthread_barrier_wait(w->go);
    w->rc = r ? put_branch(r, w->p, w->b) : -1;
    kvt_remote_close(r);
    return NULL;
}

static void test_two_writers_one_prefix(void **state)
{
    (void)state;
    pthread_barrier_t go;
    for (int p = 0; p < 8; p++) {
        pthread_barrier_init(&go, NULL, 2);
        struct writer a = {"two", p, 0, &go, -1}, b = {"two", p, 1, &go, -1};
        pthread_t ta, tb;
        pthread_create(&ta, NULL, write_one, &a);
        pthread_create(&tb, NULL, write_one, &b);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        pthread_barrier_destroy(&go);
        assert_int_equal(a.rc, 0);
        assert_int_equal(b.rc, 0);
    }
    struct server_state st;
    check_server("two", true, &st);
    assert_int_equal(st.records, 16);
    assert_int_equal(st.objects, 16); /* each prompt's two chunks once */
    size_t listed_keys = 0;
    for (size_t i = 0; i < st.objects; i++)
        listed_keys += st.objs[i].n_chunks;
    all_restore("two", &st, 8, 2);
    state_free(&st);
    redisContext *c = cli();
    redisReply *keys = cmd(c, "KEYS two:*.*"); /* a losing writer's copies were deleted */
    assert_int_equal(keys->elements, listed_keys);
    freeReplyObject(keys);
    redisFree(c);
}

/* A child that uploads the branches of prompts 4 @p round .. 4 @p round + 3 until it is killed
 * (or done). */
static void writer_child(int round)
{
    kvt_remote *r = open_share("kill", true, 0);
    for (int i = 0; r && i < 12; i++)
        put_branch(r, 4 * round + i / 3, i % 3);
    _exit(0);
}

/* Keys of objects that are not listed must expire; listed ones restore. */
static void check_after_kill(int prompts)
{
    struct server_state st;
    check_server("kill", false, &st);
    struct kvt_rkeys k;
    kvt_rkeys_init(&k, "kill", REMOTE_MODEL, REMOTE_FP, REMOTE_TOK);
    redisContext *c = cli();
    redisReply *keys = cmd(c, "KEYS kill:*.*");
    for (size_t i = 0; i < keys->elements; i++) {
        bool is_listed = false;
        for (size_t s = 0; !is_listed && s < st.objects; s++)
            for (uint32_t j = 0; !is_listed && j < st.objs[s].n_chunks; j++) {
                char key[256];
                obj_key(&k, &st.objs[s], j, key);
                is_listed = !strcmp(key, keys->element[i]->str);
            }
        redisReply *ttl = cmd(c, "PTTL %s", keys->element[i]->str);
        assert_true(is_listed || ttl->integer > 0);
        freeReplyObject(ttl);
    }
    freeReplyObject(keys);
    redisFree(c);
    kvt_rkeys_free(&k);
    all_restore("kill", &st, prompts, 3);
    print_message("%zu records, %zu objects\n", st.records, st.objects);
    state_free(&st);
}

static void test_writer_killed_mid_upload(void **state)
{
    (void)state;
    srand(37);
    for (int round = 0; round < 12; round++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            writer_child(round);
        msleep(10 + rand() % 50);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        check_after_kill(48);
    }
}

/* Records of shared entries that are not what they claim (object counts past their length or
 * their tokens, a foreign namespace hash) are not indexed, and the index scripts remove them
 * without failing or releasing anything they do not hold. */
static void test_hostile_shared_records(void **state)
{
    (void)state;
    kvt_remote *w = open_share("hos", true, 0);
    assert_int_equal(put_branch(w, 0, 0), 0);
    struct server_state st;
    check_server("hos", true, &st);
    size_t len = 0;
    uint8_t *good = kvt_rrec_encode(&st.recs[0], &len);
    assert_non_null(good);
    state_free(&st);
    struct kvt_rkeys k;
    kvt_rkeys_init(&k, "hos", REMOTE_MODEL, REMOTE_FP, REMOTE_TOK);
    redisContext *c = cli();
    const char *uuids[3] = {"11111111111111111111111111111111", "22222222222222222222222222222222",
                            "33333333333333333333333333333333"};
    for (int i = 0; i < 3; i++) {
        uint8_t *bad = malloc(len);
        memcpy(bad, good, len);
        memcpy(bad + 4, uuids[i], 32);
        if (i == 0)
            memset(bad + 78 + bad[77], 0xff, 4); /* 4 billion objects */
        else if (i == 1)
            bad[79] ^= 1; /* another namespace hash */
        else
            bad[78 + bad[77]] = 1; /* one object where the tokens need two */
        freeReplyObject(cmd(c, "HSET %s %s %b", k.idx, uuids[i], bad, len));
        freeReplyObject(cmd(c, "ZADD %s 1 %s", k.log, uuids[i]));
        free(bad);
    }
    free(good);
    freeReplyObject(cmd(c, "DEL %s", k.bytes)); /* recounted by the next script, theirs too */
    kvt_remote *rd = open_share("hos", false, 0);
    wait_synced(rd, 1); /* only the real one */
    assert_int_equal(restore_branch(rd, 0, 0), 1);
    size_t dropped = 0;
    assert_int_equal(kvt_remote_gc(w, 1, false, &dropped), 0); /* the scripts remove them all */
    assert_int_equal(dropped, 1); /* the undecodable ones are removed, not reported */
    check_server("hos", true, &st);
    assert_int_equal(st.records, 0);
    assert_int_equal(st.objects, 0);
    state_free(&st);
    redisFree(c);
    kvt_rkeys_free(&k);
    kvt_remote_close(rd);
    kvt_remote_close(w);
}

/* A put whose record was published but could not be made permanent (PERSIST refused to this
 * user) fails whole: the record leaves the index with its objects, never listed with keys
 * deleted under it; the next writer of the prefix uploads it again and a reader restores it. */
static void test_failure_after_publish(void **state)
{
    (void)state;
    char *out = NULL;
    assert_int_equal(
        redis_cli(&S, "ACL SETUSER nopersist on '>pw' '~*' '&*' '+@all' '-persist'", &out), 0);
    free(out);
    struct kvt_remote_opts o;
    char url[160];
    snprintf(url, sizeof(url), "redis://nopersist:pw@127.0.0.1:%d/afterpub", S.port);
    remote_opts(&o, url, 4096, 2000, 100);
    o.share_prefixes = true;
    kvt_remote *w = NULL;
    assert_int_equal(kvt_remote_open(&o, &w), 0);
    assert_true(put_branch(w, 0, 0) < 0);
    struct server_state st;
    check_server("afterpub", true, &st); /* every listed object's keys are there */
    assert_int_equal(st.records, 0);
    assert_int_equal(st.objects, 0);
    state_free(&st);
    kvt_remote *ok = open_share("afterpub", true, 0);
    assert_int_equal(put_branch(ok, 0, 1), 0);
    kvt_remote *rd = open_share("afterpub", false, 0);
    wait_synced(rd, 1);
    assert_int_equal(restore_branch(rd, 0, 1), 1);
    kvt_remote_close(rd);
    kvt_remote_close(ok);
    kvt_remote_close(w);
}

/* A shared entry's record rewritten to list no objects names bytes that are only its tail:
 * every cache but the tail's rows missing. A miss (V21), never a short entry served. */
static void test_tail_listed_as_whole(void **state)
{
    (void)state;
    kvt_remote *w = open_share("tail", true, 0);
    assert_int_equal(put_branch(w, 0, 0), 0);
    struct server_state st;
    check_server("tail", true, &st);
    assert_true(st.recs[0].n_objs > 0);
    struct kvt_rrec plain = st.recs[0];
    plain.n_objs = 0;
    plain.objs = NULL;
    size_t len = 0;
    uint8_t *rec = kvt_rrec_encode(&plain, &len);
    assert_non_null(rec);
    struct kvt_rkeys k;
    kvt_rkeys_init(&k, "tail", REMOTE_MODEL, REMOTE_FP, REMOTE_TOK);
    redisContext *c = cli();
    freeReplyObject(cmd(c, "HSET %s %s %b", k.idx, plain.uuid, rec, len));
    free(rec);
    state_free(&st);
    kvt_remote *rd = open_share("tail", false, 0);
    wait_synced(rd, 1);
    assert_int_equal(restore_branch(rd, 0, 0), 0);
    assert_int_equal(stats(rd).corrupt, 1);
    redisFree(c);
    kvt_rkeys_free(&k);
    kvt_remote_close(rd);
    kvt_remote_close(w);
}

static char *cli_args(const char *verb, const char *prefix)
{
    return strf("%s --redis %s --model-id %s --config-fingerprint %s --tokenizer-hash %s", verb,
                redis_url(&S, prefix), REMOTE_MODEL, REMOTE_FP, REMOTE_TOK);
}

/* kvtier ls and gc --redis: the objects listed once; gc drops the records whose object lost
 * a piece, and their objects with them. */
static void test_cli_ls_gc(void **state)
{
    (void)state;
    kvt_remote *w = open_share("cli", true, 0);
    for (int b = 0; b < 3; b++)
        assert_int_equal(put_branch(w, 0, b), 0);
    damage_object("cli", 0, true);            /* a piece of prompt 0's first object */
    assert_int_equal(put_branch(w, 1, 0), 0); /* another prompt, untouched */
    char *args = cli_args("ls", "cli"), *out = NULL;
    assert_int_equal(run_cli(args, true, &out), 0);
    print_message("%s", out);
    assert_non_null(strstr(out, "4 entries"));
    assert_non_null(strstr(out, "shared prefix objects: 4"));
    free(out);
    free(args);
    args = cli_args("gc", "cli");
    assert_int_equal(run_cli(args, true, &out), 0);
    print_message("%s", out);
    assert_non_null(strstr(out, "dropped 3 records"));
    free(out);
    free(args);
    struct server_state st;
    check_server("cli", true, &st);
    assert_int_equal(st.records, 1);
    assert_int_equal(st.objects, 2);
    state_free(&st);
    kvt_remote_close(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_branches_share),
        cmocka_unit_test(test_eviction_keeps_records_whole),
        cmocka_unit_test(test_corrupt_or_missing_object),
        cmocka_unit_test(test_two_writers_one_prefix),
        cmocka_unit_test(test_writer_killed_mid_upload),
        cmocka_unit_test(test_hostile_shared_records),
        cmocka_unit_test(test_tail_listed_as_whole),
        cmocka_unit_test(test_failure_after_publish),
        cmocka_unit_test(test_cli_ls_gc),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
