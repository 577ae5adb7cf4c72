/*
 * The remote tier over a real local Redis Cluster of 3 masters with one replica each
 * (started here): entries written by another process are found and restored byte for byte,
 * spread over the masters; MOVED and ASK are followed; when a master is killed its replica
 * takes over and every entry is kept; when that new master (with no replica left) is killed
 * too, its entries become misses within the timeout and everything else is still served.
 * Shared prefix objects live on the masters of their own hash tags and are fetched from there,
 * redirections followed per chunk.
 */
#include "support/redis_srv.h"
#include "support/support.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "remote/remote_parts.h"
#include "remote/robj.h"
#include "store/share.h"

#define N_TOK 200
#define N_ENTRIES 9
#define SEED 200

static char *base;
static struct redis_cluster C;
static char url[512];

static int group_setup(void **state)
{
    (void)state;
    if (!redis_available())
        return -1;
    base = scratch_dir("remote-cluster");
    if (!base || redis_cluster_start(&C, base, 3, 1) < 0)
        return -1;
    /* every node as a seed: the suite kills masters, the seed among them */
    int len = snprintf(url, sizeof(url), "redis://127.0.0.1:%d", C.node[0].port);
    for (int i = 1; i < C.n; i++)
        len += snprintf(url + len, sizeof(url) - (size_t)len, ",127.0.0.1:%d", C.node[i].port);
    snprintf(url + len, sizeof(url) - (size_t)len, "/cl");
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    redis_cluster_stop(&C);
    if (base)
        rm_rf(base);
    free(base);
    return 0;
}

static void log_fn(void *ud, int level, const char *msg)
{
    (void)ud;
    if (level >= KVT_LOG_WARN && getenv("KVT_TEST_VERBOSE"))
        fprintf(stderr, "log: %s\n", msg);
}

static kvt_remote *open_remote_at(const char *at, uint64_t chunk)
{
    struct kvt_remote_opts o;
    kvt_remote_opts_init(&o);
    o.url = at;
    o.model_id = REMOTE_MODEL;
    o.config_fingerprint = REMOTE_FP;
    o.tokenizer_hash = REMOTE_TOK;
    o.timeout_ms = 500;
    o.poll_ms = 100;
    o.log = log_fn;
    if (chunk)
        o.chunk_bytes = chunk;
    kvt_remote *r = NULL;
    assert_int_equal(kvt_remote_open(&o, &r), 0);
    return r;
}

static kvt_remote *open_remote(void)
{
    return open_remote_at(url, 0);
}

/* 1 identical, 0 miss; wrong bytes fail the test. */
static int restore(kvt_remote *r, uint64_t seed)
{
    int32_t tok[N_TOK + 1];
    remote_tokens(seed, N_TOK, tok);
    tok[N_TOK] = 1;
    struct kvt_hit hit;
    assert_int_equal(kvt_remote_find(r, tok, N_TOK + 1, "", &hit), 0);
    if (hit.prefix_len != N_TOK)
        return 0;
    struct kvt_entry *got = NULL;
    assert_int_equal(kvt_remote_restore(r, &hit, &got), 0);
    if (!got)
        return 0;
    struct kvt_entry *want = synth_random_entry(tok, N_TOK, seed, "m", "f", "t");
    assert_true(synth_same_entry_bytes(got, want));
    kvt_entry_free(want);
    kvt_entry_free(got);
    return 1;
}

/* The node that is master now for the chunks of entry @p seed (via its uuid in the view). */
static int master_of_entry(kvt_remote *r, uint64_t seed)
{
    int32_t tok[N_TOK + 1];
    remote_tokens(seed, N_TOK, tok);
    tok[N_TOK] = 1;
    struct kvt_hit hit;
    kvt_remote_find(r, tok, N_TOK + 1, "", &hit);
    struct kvt_store_record *v;
    size_t n;
    assert_int_equal(kvt_remote_list(r, &v, &n), 0);
    int m = -1;
    for (size_t i = 0; i < n; i++) {
        if (v[i].id != hit.id)
            continue;
        char tag[40];
        snprintf(tag, sizeof(tag), "{%s}", v[i].path);
        m = redis_cluster_master_of(&C, kvt_key_slot(tag, strlen(tag)));
    }
    kvt_store_list_free(v);
    return m;
}

static int masters_of[N_ENTRIES];

static void test_cross_host_over_cluster(void **state)
{
    (void)state;
    char *cmd = strf("%s/tests/progs/remote_peer put '%s' '%s/writer' %d %d %d", KVT_BUILD_DIR, url,
                     base, SEED, N_TOK, N_ENTRIES);
    char *out = NULL;
    assert_int_equal(run_capture(cmd, &out), 0);
    print_message("writer: %s", out);
    free(out);
    free(cmd);
    kvt_remote *r = open_remote();
    assert_int_equal(kvt_remote_refresh(r), 0);
    bool seen[12] = {0};
    int distinct = 0;
    for (int i = 0; i < N_ENTRIES; i++) {
        assert_int_equal(restore(r, SEED + i), 1);
        masters_of[i] = master_of_entry(r, SEED + i);
        assert_true(masters_of[i] >= 0);
        distinct += !seen[masters_of[i]];
        seen[masters_of[i]] = true;
    }
    print_message("%d entries on %d masters\n", N_ENTRIES, distinct);
    assert_true(distinct >= 2);
    kvt_remote_close(r);
}

/* A stale slot map: MOVED is followed (and the map refreshed); a slot being migrated: ASK. */
static void test_redirections(void **state)
{
    (void)state;
    struct kvt_rcfg cfg = {.host = "127.0.0.1", .port = C.node[0].port, .timeout_ms = 500};
    struct kvt_rclient rc;
    assert_int_equal(kvt_rclient_init(&rc, &cfg), 0);
    kvt_rclient_arm(&rc, 0);
    struct kvt_rnode *n;
    assert_int_equal(kvt_rclient_node(&rc, "cl:probe", &n), 0);
    assert_true(rc.cluster);
    uint16_t slot = kvt_key_slot("cl:probe", 8);
    uint16_t right = rc.slots[slot];
    rc.slots[slot] = (uint16_t)((right + 1) % rc.n_nodes); /* wrong on purpose */
    int err = 0;
    kvt_rclient_arm(&rc, 0);
    redisReply *rep =
        kvt_rclient_cmd(&rc, "cl:probe", 3, (const char *[]){"SET", "cl:probe", "1"}, NULL, &err);
    assert_non_null(rep);
    assert_int_equal(rep->type, REDIS_REPLY_STATUS);
    freeReplyObject(rep);
    assert_int_equal(rc.slots[slot], right); /* MOVED corrected the map */

    /* ASK: the slot of "cl:ask" migrates from its master to another one */
    uint16_t s2 = kvt_key_slot("cl:ask", 6);
    int src = redis_cluster_master_of(&C, s2), dst = -1;
    for (int i = 0; i < C.n && dst < 0; i++)
        for (unsigned s = 0; s < 16384 && dst < 0; s += 512)
            if (i != src && redis_cluster_master_of(&C, s) == i)
                dst = i;
    assert_true(src >= 0 && dst >= 0);
    char *sid = NULL, *did = NULL;
    redis_cli(&C.node[src], "CLUSTER MYID", &sid);
    redis_cli(&C.node[dst], "CLUSTER MYID", &did);
    sid[strcspn(sid, "\n")] = did[strcspn(did, "\n")] = '\0';
    char *a1 = strf("CLUSTER SETSLOT %u IMPORTING %s", s2, sid);
    char *a2 = strf("CLUSTER SETSLOT %u MIGRATING %s", s2, did);
    assert_int_equal(redis_cli(&C.node[dst], a1, NULL), 0);
    assert_int_equal(redis_cli(&C.node[src], a2, NULL), 0);
    kvt_rclient_arm(&rc, 0);
    rep = kvt_rclient_cmd(&rc, "cl:ask", 3, (const char *[]){"SET", "cl:ask", "v"}, NULL, &err);
    assert_non_null(rep);
    print_message("SET during migration: %s\n", rep->type == REDIS_REPLY_STATUS ? rep->str : "?");
    assert_int_equal(rep->type, REDIS_REPLY_STATUS); /* answered by dst after ASKING */
    freeReplyObject(rep);
    char *out = NULL;
    redis_cli(&C.node[src], "-c GET cl:ask", &out); /* redis-cli follows ASK too */
    assert_non_null(strstr(out, "v"));
    free(out);
    char *st1 = strf("CLUSTER SETSLOT %u NODE %s", s2, sid);
    char *del =
        strf("printf 'ASKING\\nDEL cl:ask\\n' | redis-cli -p %d >/dev/null", C.node[dst].port);
    run_capture(del, NULL);
    free(del);
    redis_cli(&C.node[dst], st1, NULL);
    redis_cli(&C.node[src], st1, NULL);
    free(st1);
    free(a1);
    free(a2);
    free(sid);
    free(did);
    kvt_rclient_free(&rc);
}

static int copy_id(void *ud, size_t k, const char *id)
{
    memcpy(((char(*)[33])ud)[k], id, 33);
    return 0;
}

/* A master other than @p src, and the node ids of both (caller frees). */
static int other_master(int src, char **sid, char **did)
{
    int dst = -1;
    for (int i = 0; i < C.n && dst < 0; i++)
        for (unsigned s = 0; s < 16384 && dst < 0; s += 512)
            if (i != src && redis_cluster_master_of(&C, s) == i)
                dst = i;
    assert_true(src >= 0 && dst >= 0);
    redis_cli(&C.node[src], "CLUSTER MYID", sid);
    redis_cli(&C.node[dst], "CLUSTER MYID", did);
    (*sid)[strcspn(*sid, "\n")] = (*did)[strcspn(*did, "\n")] = '\0';
    return dst;
}

/* A live migration of a slot from its master to another one. */
struct migration {
    unsigned slot;
    int src, dst;
    char *sid, *did;
};

/* Start migrating @p slot: IMPORTING on the other master, MIGRATING on its own. */
static void migration_begin(unsigned slot, struct migration *m)
{
    *m = (struct migration){.slot = slot, .src = redis_cluster_master_of(&C, slot)};
    m->dst = other_master(m->src, &m->sid, &m->did);
    char *imp = strf("CLUSTER SETSLOT %u IMPORTING %s", slot, m->sid);
    char *mgr = strf("CLUSTER SETSLOT %u MIGRATING %s", slot, m->did);
    assert_int_equal(redis_cli(&C.node[m->dst], imp, NULL), 0);
    assert_int_equal(redis_cli(&C.node[m->src], mgr, NULL), 0);
    free(imp);
    free(mgr);
}

/* The migration completes: every node learns the slot's new owner at once. */
static void migration_end(struct migration *m)
{
    char *own = strf("CLUSTER SETSLOT %u NODE %s", m->slot, m->did);
    for (int i = 0; i < C.n; i++)
        if (C.node[i].pid > 0)
            redis_cli(&C.node[i], own, NULL);
    free(own);
    free(m->sid);
    free(m->did);
}

/* MIGRATE the chunks of @p keys whose index has bit @p odd (1: odd, 0: even) from @p src to
 * @p dst. */
static void migrate(int src, int dst, char (*keys)[256], uint32_t n, int odd)
{
    char *list = strf("%s", "");
    for (uint32_t i = (uint32_t)odd; i < n; i += 2) {
        char *l = strf("%s '%s'", list, keys[i]);
        free(list);
        list = l;
    }
    char *cmd = strf("MIGRATE 127.0.0.1 %d \"\" 0 5000 KEYS %s", C.node[dst].port, list);
    char *out = NULL;
    assert_int_equal(redis_cli(&C.node[src], cmd, &out), 0);
    assert_non_null(strstr(out, "OK"));
    free(out);
    free(cmd);
    free(list);
}

/* The record of @p uuid and all @p n chunks exist (redis-cli -c follows MOVED and ASK). */
static bool entry_intact(const struct kvt_rkeys *k, const char *uuid, char (*keys)[256], uint32_t n)
{
    char *cmd = strf("-c HEXISTS '%s' %s", k->idx, uuid);
    char *out = NULL;
    redis_cli(&C.node[0], cmd, &out);
    bool ok = out && atoi(out) == 1;
    free(out);
    free(cmd);
    for (uint32_t i = 0; ok && i < n; i++) {
        cmd = strf("-c EXISTS '%s'", keys[i]);
        redis_cli(&C.node[0], cmd, &out);
        ok = out && atoi(out) == 1;
        free(out);
        free(cmd);
    }
    return ok;
}

/*
 * A live slot migration of one entry's chunks (the slot MIGRATING on its master, IMPORTING on
 * another, the odd chunks MIGRATEd): a restore meanwhile follows ASK chunk by chunk and comes
 * back whole, and the record and every chunk stay. Once the migration completes, a restore
 * follows MOVED.
 */
static void test_restore_during_migration(void **state)
{
    (void)state;
    char mig[512];
    snprintf(mig, sizeof(mig), "%.*s/mig", (int)(strrchr(url, '/') - url), url);
    kvt_remote *w = open_remote_at(mig, 64 << 10);
    int32_t tok[N_TOK];
    remote_tokens(SEED + 50, N_TOK, tok);
    struct kvt_entry *e = synth_random_entry(tok, N_TOK, SEED + 50, "m", "f", "t");
    assert_int_equal(kvt_remote_put(w, e), 0);
    kvt_entry_free(e);
    struct kvt_store_record *v;
    size_t n;
    assert_int_equal(kvt_remote_list(w, &v, &n), 0);
    assert_int_equal(n, 1);
    char uuid[33];
    memcpy(uuid, v[0].path, 33);
    uint32_t chunks = (uint32_t)((v[0].bytes + (64 << 10) - 1) / (64 << 10));
    kvt_store_list_free(v);
    kvt_remote_close(w);
    struct kvt_rkeys k;
    assert_int_equal(kvt_rkeys_init(&k, "mig", REMOTE_MODEL, REMOTE_FP, REMOTE_TOK), 0);
    char(*keys)[256] = calloc(chunks, sizeof(*keys));
    for (uint32_t i = 0; i < chunks; i++)
        kvt_rkeys_chunk(&k, "", uuid, i, keys[i], sizeof(keys[i]));
    struct migration m;
    migration_begin(kvt_key_slot(keys[0], strlen(keys[0])), &m);
    migrate(m.src, m.dst, keys, chunks, 1);
    print_message("%u chunks, the odd ones moved from node %d to %d\n", chunks, m.src, m.dst);

    kvt_remote *r = open_remote_at(mig, 64 << 10); /* a reader, synced at open */
    assert_int_equal(restore(r, SEED + 50), 1);
    assert_true(entry_intact(&k, uuid, keys, chunks));
    struct kvt_remote_stats st;
    kvt_remote_get_stats(r, &st);
    assert_int_equal(st.misses + st.corrupt + st.errors, 0);

    migrate(m.src, m.dst, keys, chunks, 0); /* the migration completes: the slot is dst's */
    migration_end(&m);
    assert_int_equal(restore(r, SEED + 50), 1); /* MOVED, followed */
    assert_true(entry_intact(&k, uuid, keys, chunks));
    kvt_remote_close(r);
    free(keys);
    kvt_rkeys_free(&k);
}

/* The objects the index lists for the prompt of branches of prompt 0 (namespace ""). */
static void prompt_objects(struct kvt_rkeys *k, struct kvt_robj *objs)
{
    int32_t t[REMOTE_BRANCH_TOK];
    remote_branch_tokens(0, 0, t);
    char ids[2][33];
    assert_int_equal(kvt_share_chunks(REMOTE_BRANCH_TOK), 2);
    kvt_share_each_chunk(t, REMOTE_BRANCH_TOK, copy_id, ids);
    struct kvt_rcfg cfg = {.host = "127.0.0.1", .port = C.node[0].port, .timeout_ms = 2000};
    struct kvt_rclient rc;
    assert_int_equal(kvt_rclient_init(&rc, &cfg), 0);
    kvt_rclient_arm(&rc, 0);
    bool have[2] = {false, false};
    assert_int_equal(kvt_rindex_objs(&rc, k, "", ids, 2, UINT64_MAX, objs, have), 0);
    assert_true(have[0] && have[1]);
    kvt_rclient_free(&rc);
}

/*
 * Shared prefix objects over the cluster: each object has its own hash tag, so the prompt's
 * objects and the branches' tails spread over the masters; a restore fetches each from its
 * own master, and follows a live migration of one object's slot chunk by chunk (ASK), then
 * its completion (MOVED), with nothing deleted.
 */
static void test_shared_objects_over_cluster(void **state)
{
    (void)state;
    char sh[512];
    snprintf(sh, sizeof(sh), "%.*s/sh", (int)(strrchr(url, '/') - url), url);
    struct kvt_remote_opts o;
    remote_opts(&o, sh, 4096, 2000, 100);
    o.share_prefixes = true;
    kvt_remote *w = NULL, *r = open_remote_at(sh, 4096);
    assert_int_equal(kvt_remote_open(&o, &w), 0);
    for (int b = 0; b < 3; b++)
        assert_int_equal(remote_put_branch(w, 0, b), 0);
    kvt_remote_close(w);
    struct kvt_rkeys k;
    assert_int_equal(kvt_rkeys_init(&k, "sh", REMOTE_MODEL, REMOTE_FP, REMOTE_TOK), 0);
    struct kvt_robj objs[2];
    prompt_objects(&k, objs);
    uint32_t n = objs[1].n_chunks;
    char(*keys)[256] = calloc(n, sizeof(*keys));
    char tag[2][KVT_ROBJ_NAME];
    for (int j = 0; j < 2; j++)
        snprintf(tag[j], sizeof(tag[j]), "%s.%s", objs[j].id, objs[j].gen);
    for (uint32_t i = 0; i < n; i++)
        kvt_rkeys_chunk(&k, "", tag[1], i, keys[i], sizeof(keys[i]));
    char key0[256];
    kvt_rkeys_chunk(&k, "", tag[0], 0, key0, sizeof(key0));
    unsigned slot = kvt_key_slot(keys[0], strlen(keys[0]));
    print_message("objects on masters %d and %d\n",
                  redis_cluster_master_of(&C, kvt_key_slot(key0, strlen(key0))),
                  redis_cluster_master_of(&C, slot));
    assert_int_equal(kvt_remote_refresh(r), 0); /* the reader sees the writer's records */
    for (int b = 0; b < 3; b++)
        assert_int_equal(remote_restore_branch(r, 0, b), 1);

    struct migration m;
    migration_begin(slot, &m);
    migrate(m.src, m.dst, keys, n, 1);
    assert_int_equal(remote_restore_branch(r, 0, 1), 1); /* ASK per chunk of the object */
    migrate(m.src, m.dst, keys, n, 0);
    migration_end(&m);
    assert_int_equal(remote_restore_branch(r, 0, 2), 1); /* MOVED */
    struct kvt_remote_stats st;
    kvt_remote_get_stats(r, &st);
    assert_int_equal(st.misses + st.corrupt + st.errors, 0);
    assert_int_equal(st.entries, 3);
    assert_int_equal(st.shared_objects, 2);
    kvt_remote_close(r);
    free(keys);
    kvt_rkeys_free(&k);
}

/* Restore every entry, retrying while the cluster settles: how many come back identical. */
static int restore_all(kvt_remote *r, const bool *skip, int64_t settle_ms)
{
    int ok = 0;
    for (int i = 0; i < N_ENTRIES; i++) {
        if (skip && skip[i])
            continue;
        int64_t t0 = now_ms();
        int got;
        while (!(got = restore(r, SEED + i)) && now_ms() - t0 < settle_ms)
            msleep(100);
        if (!got) {
            struct kvt_remote_stats st;
            kvt_remote_get_stats(r, &st);
            print_message("entry %d (master %d): miss; errors %llu misses %llu corrupt %llu\n", i,
                          master_of_entry(r, SEED + i), (unsigned long long)st.errors,
                          (unsigned long long)st.misses, (unsigned long long)st.corrupt);
        }
        ok += got;
    }
    return ok;
}

static void wait_replicated(void)
{
    msleep(1500); /* loopback replication; the replicas ack within milliseconds */
}

static void test_failover_keeps_entries(void **state)
{
    (void)state;
    kvt_remote *r = open_remote();
    assert_int_equal(restore_all(r, NULL, 0), N_ENTRIES);
    wait_replicated();
    int victim = masters_of[0];
    assert_true(victim >= 0);
    print_message("killing master %d (port %d)\n", victim, C.node[victim].port);
    redis_kill(&C.node[victim]);
    int64_t t0 = now_ms();
    int promoted = -1;
    while ((promoted = master_of_entry(r, SEED)) == victim || promoted < 0)
        if (now_ms() - t0 > 20000)
            fail_msg("no failover after 20 s");
        else
            msleep(100);
    print_message("node %d promoted after %lld ms\n", promoted, (long long)(now_ms() - t0));
    t0 = now_ms();
    assert_int_equal(restore_all(r, NULL, 8000), N_ENTRIES); /* the replica kept them all */
    print_message("all %d entries restored %lld ms after the failover\n", N_ENTRIES,
                  (long long)(now_ms() - t0));
    kvt_remote_close(r);
}

/* The promoted replica has no replica of its own: killing it loses its entries (misses,
 * each within the timeout) while every other entry is still served. */
static void test_master_without_replica(void **state)
{
    (void)state;
    kvt_remote *r = open_remote();
    assert_int_equal(kvt_remote_refresh(r), 0);
    int victim = master_of_entry(r, SEED);
    assert_true(victim >= 0);
    bool lost[N_ENTRIES] = {0};
    int n_lost = 0;
    for (int i = 0; i < N_ENTRIES; i++) {
        lost[i] = master_of_entry(r, SEED + i) == victim;
        n_lost += lost[i];
    }
    print_message("killing master %d, which holds %d of %d entries\n", victim, n_lost, N_ENTRIES);
    redis_kill(&C.node[victim]);
    for (int i = 0; i < N_ENTRIES; i++) {
        if (!lost[i])
            continue;
        int64_t t0 = now_ms();
        assert_int_equal(restore(r, SEED + i), 0);
        assert_true(now_ms() - t0 < 1500 * SLACK);
    }
    bool *keep = lost;
    assert_int_equal(restore_all(r, keep, 3000), N_ENTRIES - n_lost);
    struct kvt_remote_stats st;
    kvt_remote_get_stats(r, &st);
    assert_int_equal(st.corrupt, 0);
    kvt_remote_close(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cross_host_over_cluster),
        cmocka_unit_test(test_redirections),
        cmocka_unit_test(test_restore_during_migration),
        cmocka_unit_test(test_shared_objects_over_cluster),
        cmocka_unit_test(test_failover_keeps_entries),
        cmocka_unit_test(test_master_without_replica),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
