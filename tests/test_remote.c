/*
 * The remote tier against real redis-server processes started here (single server): two
 * processes with separate local directories share entries byte for byte through one server;
 * ties go to the nearer tier; faults (server absent at open, killed mid-put and mid-get,
 * restarted empty, paused beyond the timeout, a corrupt, oversized or deleted chunk, hostile
 * index records) end in counted misses, never wrong data or a hang, while the local tiers
 * keep serving; the chunks of a writer killed before it publishes expire; AUTH with a password and
 * an ACL user, a unix socket, the byte cap, and the CLI's --redis commands.
 */
#include "support/redis_srv.h"
#include "support/support.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "remote/remote_parts.h"

#define N_TOK 300

static char *base;
static struct redis_srv S, SA; /* plain; with a password and an ACL user */

static int group_setup(void **state)
{
    (void)state;
    if (!redis_available())
        return -1;
    base = scratch_dir("remote");
    if (!base || redis_start(&S, base, 0, "") < 0)
        return -1;
    if (redis_start(&SA, base, 0, "--requirepass sekrit") < 0)
        return -1;
    char *out = NULL;
    redis_cli(&SA, "-a sekrit --no-auth-warning ACL SETUSER kvuser on '>pw2' '~au:*' '+@all'",
              &out);
    free(out);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    redis_kill(&S);
    redis_kill(&SA);
    if (base)
        rm_rf(base);
    free(base);
    return 0;
}

static void ropts(struct kvt_remote_opts *o, const char *url)
{
    kvt_remote_opts_init(o);
    o->url = url;
    o->model_id = REMOTE_MODEL;
    o->config_fingerprint = REMOTE_FP;
    o->tokenizer_hash = REMOTE_TOK;
    o->timeout_ms = 500;
    o->poll_ms = 100;
}

static kvt_remote *open_remote(const char *url, uint64_t chunk)
{
    struct kvt_remote_opts o;
    ropts(&o, url);
    if (chunk)
        o.chunk_bytes = chunk;
    kvt_remote *r = NULL;
    assert_int_equal(kvt_remote_open(&o, &r), 0);
    return r;
}

static struct kvt_entry *entry_of(uint64_t seed, size_t n)
{
    int32_t tok[16384];
    assert_true(n <= 16384);
    remote_tokens(seed, n, tok);
    return synth_random_entry(tok, n, seed, "m", "f", "t");
}

static int put(kvt_remote *r, uint64_t seed, size_t n)
{
    struct kvt_entry *e = entry_of(seed, n);
    int rc = kvt_remote_put(r, e);
    kvt_entry_free(e);
    return rc;
}

/* Find and restore entry @p seed: 1 identical, 0 miss (find or restore); fails on wrong data. */
static int restore(kvt_remote *r, uint64_t seed, size_t n)
{
    int32_t tok[16385];
    remote_tokens(seed, n, tok);
    tok[n] = 1;
    struct kvt_hit hit;
    assert_int_equal(kvt_remote_find(r, tok, n + 1, "", &hit), 0);
    if (hit.prefix_len != n)
        return 0;
    struct kvt_entry *got = NULL;
    assert_int_equal(kvt_remote_restore(r, &hit, &got), 0);
    if (!got)
        return 0;
    struct kvt_entry *want = entry_of(seed, n);
    assert_true(synth_same_entry_bytes(got, want));
    assert_int_equal(got->n_tokens, n);
    kvt_entry_free(want);
    kvt_entry_free(got);
    return 1;
}

static struct kvt_remote_stats stats(kvt_remote *r)
{
    struct kvt_remote_stats st;
    kvt_remote_get_stats(r, &st);
    return st;
}

/* ---- two hosts ---------------------------------------------------------------------------- */

static kvt_pcache *open_pc_wb(const char *dir, const struct kvt_remote_opts *ro, bool wb)
{
    struct kvt_pcache_opts o;
    kvt_pcache_opts_init(&o);
    o.write_behind = wb;
    o.cold_dir = dir;
    o.cold.model_id = REMOTE_MODEL;
    o.cold.config_fingerprint = REMOTE_FP;
    o.cold.tokenizer_hash = REMOTE_TOK;
    o.snapshot_debounce_ms = 0;
    o.remote = ro;
    kvt_pcache *pc = NULL;
    assert_int_equal(kvt_pcache_open(&o, &pc), 0);
    return pc;
}

static kvt_pcache *open_pc(const char *dir, const struct kvt_remote_opts *ro)
{
    return open_pc_wb(dir, ro, true);
}

static void test_two_processes(void **state)
{
    (void)state;
    /* host A: this process, its own directory; host B: another process, another directory */
    struct kvt_remote_opts ro;
    ropts(&ro, redis_url(&S, "two"));
    ro.model_id = ro.config_fingerprint = ro.tokenizer_hash = NULL; /* the store's identity */
    char *dir_a = strf("%s/host-a", base), *dir_b = strf("%s/host-b", base);
    kvt_pcache *a = open_pc(dir_a, &ro);
    kvt_pcache_put(a, entry_of(11, N_TOK), NULL);
    struct kvt_flush_report fr;
    assert_int_equal(kvt_pcache_flush(a, 30000, &fr), 0);
    assert_true(fr.durable);
    assert_int_equal(kvt_remote_drain(kvt_pcache_remote(a), 30000), 0);
    assert_int_equal(stats(kvt_pcache_remote(a)).puts, 1);

    char *cmd = strf("%s/tests/progs/remote_peer take '%s' '%s' 11 %d 5000", KVT_BUILD_DIR,
                     redis_url(&S, "two"), dir_b, N_TOK);
    char *out = NULL;
    int rc = run_capture(cmd, &out);
    print_message("peer: %s", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "from_remote=1 identical=1"));
    free(out);
    free(cmd);
    kvt_pcache_close(a);
    free(dir_a);
    free(dir_b);
}

/* Entries published by another process appear within the poll period (REMOTE.md). */
static void test_cross_host_delay(void **state)
{
    (void)state;
    kvt_remote *b = open_remote(redis_url(&S, "delay"), 0);
    char *cmd = strf("%s/tests/progs/remote_peer put '%s' '%s/delay-a' 21 %d 1", KVT_BUILD_DIR,
                     redis_url(&S, "delay"), base, N_TOK);
    assert_int_equal(run_capture(cmd, NULL), 0);
    int64_t t0 = now_ms();
    int got = 0;
    while (!(got = restore(b, 21, N_TOK)) && now_ms() - t0 < 3000)
        msleep(5);
    int64_t delay = now_ms() - t0;
    print_message("found %lld ms after the writer exited (poll 100 ms)\n", (long long)delay);
    assert_int_equal(got, 1);
    assert_true(delay < 1000 * SLACK);
    free(cmd);
    kvt_remote_close(b);
}

/* RAM, then the local store, then the remote: the longest wins, ties go to the nearer tier. */
static void test_nearer_tier_wins_ties(void **state)
{
    (void)state;
    struct kvt_remote_opts ro;
    ropts(&ro, redis_url(&S, "ties"));
    char *dir = strf("%s/ties", base);
    kvt_pcache *pc = open_pc_wb(dir, &ro, false); /* RAM entries stay out of the store */
    kvt_remote *other = open_remote(redis_url(&S, "ties"), 0);
    assert_int_equal(put(other, 31, N_TOK), 0);
    kvt_pcache_put(pc, entry_of(31, N_TOK), NULL); /* same tokens in RAM */
    kvt_remote_refresh(kvt_pcache_remote(pc));
    int32_t tok[N_TOK + 1];
    remote_tokens(31, N_TOK, tok);
    tok[N_TOK] = 1;
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take(pc, tok, N_TOK + 1, "", &t), 0);
    assert_non_null(t.entry);
    assert_false(t.from_disk);
    kvt_entry_free(t.entry);
    kvt_retain_release(t.retain);
    kvt_pcache_clear(pc); /* RAM empty, store empty: the remote serves and is promoted */
    assert_int_equal(kvt_pcache_take(pc, tok, N_TOK + 1, "", &t), 0);
    assert_non_null(t.entry);
    assert_true(t.from_remote);
    kvt_entry_free(t.entry);
    struct kvt_flush_report fr;
    kvt_pcache_flush(pc, 30000, &fr);
    struct kvt_hit h;
    kvt_store_find(kvt_pcache_store(pc), tok, N_TOK + 1, "", &h);
    assert_int_equal(h.prefix_len, N_TOK); /* promoted into the local store */
    assert_int_equal(kvt_pcache_take(pc, tok, N_TOK + 1, "", &t), 0);
    assert_true(t.from_disk);
    assert_false(t.from_remote); /* now the store ties with the remote: the store serves */
    kvt_entry_free(t.entry);
    kvt_remote_close(other);
    kvt_pcache_close(pc);
    free(dir);
}

/* ---- faults ------------------------------------------------------------------------------ */

static void test_absent_at_open(void **state)
{
    (void)state;
    struct redis_srv late = {0};
    int port = redis_free_port();
    char *url = strf("redis://127.0.0.1:%d/late", port);
    int64_t t0 = now_ms();
    kvt_remote *r = open_remote(url, 0); /* nobody listens: the open still succeeds */
    assert_false(stats(r).connected);
    assert_true(put(r, 41, N_TOK) < 0); /* a counted failure, quickly */
    assert_true(now_ms() - t0 < 2000 * SLACK);
    assert_int_equal(stats(r).put_failures, 1);
    assert_int_equal(restore(r, 41, N_TOK), 0);

    assert_int_equal(redis_start(&late, base, port, ""), 0);
    for (int i = 0; i < 100 && !stats(r).connected; i++)
        msleep(20);
    assert_true(stats(r).connected);
    msleep(600); /* past the client's reconnect backoff */
    assert_int_equal(put(r, 41, N_TOK), 0);
    assert_int_equal(restore(r, 41, N_TOK), 1);
    kvt_remote_close(r);
    redis_kill(&late);
    free(url);
}

struct bg {
    kvt_remote *r;
    uint64_t seed;
    size_t n;
    int rc;
    int64_t ms;
};

static void *bg_put(void *arg)
{
    struct bg *b = arg;
    int64_t t0 = now_ms();
    b->rc = put(b->r, b->seed, b->n);
    b->ms = now_ms() - t0;
    return NULL;
}

static void *bg_restore(void *arg)
{
    struct bg *b = arg;
    int64_t t0 = now_ms();
    b->rc = restore(b->r, b->seed, b->n);
    b->ms = now_ms() - t0;
    return NULL;
}

/* A server killed while an entry travels: the transfer fails within the timeout, nothing
 * partial is ever indexed or restored, and the remote recovers once a server is back. */
static void test_killed_mid_transfer(void **state)
{
    (void)state;
    struct redis_srv k = {0};
    assert_int_equal(redis_start(&k, base, 0, ""), 0);
    char url[128];
    snprintf(url, sizeof(url), "%s", redis_url(&k, "kill"));
    kvt_remote *r = open_remote(url, 1 << 20);
    struct bg b = {r, 51, 12000, 0, 0}; /* about 37 MB */
    pthread_t th;
    pthread_create(&th, NULL, bg_put, &b);
    msleep(40);
    redis_kill(&k);
    pthread_join(th, NULL);
    print_message("put: rc %d after %lld ms\n", b.rc, (long long)b.ms);
    assert_true(b.ms < 3000 * SLACK);
    assert_int_equal(redis_restart(&k), 0);
    msleep(600);
    assert_int_equal(kvt_remote_refresh(r), 0);
    assert_int_equal(restore(r, 51, 12000), 0); /* a restarted, empty server: a miss */

    assert_int_equal(put(r, 52, 12000), 0);
    b = (struct bg){r, 52, 12000, 0, 0};
    pthread_create(&th, NULL, bg_restore, &b);
    msleep(30);
    redis_kill(&k);
    pthread_join(th, NULL);
    print_message("restore: %d after %lld ms\n", b.rc, (long long)b.ms);
    assert_true(b.rc == 0 || b.rc == 1); /* a miss, or identical bytes: never wrong ones */
    assert_true(b.ms < 3000 * SLACK);
    kvt_remote_close(r);
}

/* A server restarted empty: the version counter went back, so the view is reloaded and
 * every remote entry is a miss; the local tiers keep serving what they hold. */
static void test_restarted_empty(void **state)
{
    (void)state;
    struct redis_srv k = {0};
    assert_int_equal(redis_start(&k, base, 0, ""), 0);
    struct kvt_remote_opts ro;
    char url[128];
    snprintf(url, sizeof(url), "%s", redis_url(&k, "restart"));
    ropts(&ro, url);
    char *dir = strf("%s/restart", base);
    kvt_pcache *pc = open_pc(dir, &ro);
    kvt_remote *r = kvt_pcache_remote(pc);
    assert_int_equal(put(r, 61, N_TOK), 0);
    assert_int_equal(put(r, 62, N_TOK), 0);
    kvt_pcache_put(pc, entry_of(63, N_TOK), NULL);
    struct kvt_flush_report fr;
    kvt_pcache_flush(pc, 30000, &fr);
    kvt_remote_drain(r, 30000);
    assert_int_equal(stats(r).entries, 3);

    assert_int_equal(redis_restart(&k), 0);
    msleep(600);
    assert_int_equal(kvt_remote_refresh(r), 0);
    assert_int_equal(stats(r).entries, 0);
    assert_int_equal(restore(r, 61, N_TOK), 0);
    int32_t tok[N_TOK + 1];
    remote_tokens(63, N_TOK, tok);
    tok[N_TOK] = 1;
    struct kvt_take t;
    kvt_pcache_clear(pc);
    assert_int_equal(kvt_pcache_take(pc, tok, N_TOK + 1, "", &t), 0);
    assert_non_null(t.entry); /* from the local store */
    assert_false(t.from_remote);
    kvt_entry_free(t.entry);
    kvt_pcache_close(pc);
    redis_kill(&k);
    free(dir);
}

/* CLIENT PAUSE beyond the timeout: the restore gives up after about the timeout, the local
 * tiers answer at once meanwhile, and the entry restores once the pause ends. */
static void test_paused_server(void **state)
{
    (void)state;
    struct kvt_remote_opts ro;
    ropts(&ro, redis_url(&S, "pause"));
    char *dir = strf("%s/pause", base);
    kvt_pcache *pc = open_pc(dir, &ro);
    kvt_remote *r = kvt_pcache_remote(pc);
    assert_int_equal(put(r, 71, N_TOK), 0);
    kvt_pcache_put(pc, entry_of(72, N_TOK), NULL);
    char *out = NULL;
    assert_int_equal(redis_cli(&S, "CLIENT PAUSE 2500 ALL", &out), 0);
    free(out);
    int64_t t0 = now_ms();
    assert_int_equal(restore(r, 71, N_TOK), 0);
    int64_t waited = now_ms() - t0;
    print_message("restore gave up after %lld ms (timeout 500 ms)\n", (long long)waited);
    assert_true(waited >= 400 && waited < 1500 * SLACK);
    assert_true(stats(r).errors >= 1);

    int32_t tok[N_TOK + 1];
    remote_tokens(72, N_TOK, tok);
    tok[N_TOK] = 1;
    struct kvt_take t;
    t0 = now_ms();
    assert_int_equal(kvt_pcache_take(pc, tok, N_TOK + 1, "", &t), 0);
    assert_non_null(t.entry); /* RAM serves while the server is paused */
    assert_true(now_ms() - t0 < 200 * SLACK);
    kvt_entry_free(t.entry);
    kvt_retain_release(t.retain);

    msleep(2600);
    int got = 0;
    for (int i = 0; i < 20 && !(got = restore(r, 71, N_TOK)); i++)
        msleep(100);
    assert_int_equal(got, 1); /* the record was kept: a timeout says nothing about the data */
    kvt_pcache_close(pc);
    free(dir);
}

static redisContext *cli_ctx(const struct redis_srv *s)
{
    redisContext *c = redisConnect("127.0.0.1", s->port);
    assert_non_null(c);
    assert_int_equal(c->err, 0);
    return c;
}

/* The key of chunk @p i of the only entry of @p r. */
static void chunk_key(kvt_remote *r, const char *prefix, uint32_t i, char *key, size_t cap)
{
    struct kvt_store_record *v;
    size_t n;
    assert_int_equal(kvt_remote_list(r, &v, &n), 0);
    assert_int_equal(n, 1);
    struct kvt_rkeys k;
    assert_int_equal(kvt_rkeys_init(&k, prefix, REMOTE_MODEL, REMOTE_FP, REMOTE_TOK), 0);
    kvt_rkeys_chunk(&k, v[0].ns, v[0].path, i, key, cap);
    kvt_rkeys_free(&k);
    kvt_store_list_free(v);
}

static void expect_dropped(kvt_remote *r, const char *key)
{
    assert_int_equal(restore(r, 81, N_TOK), 0);
    assert_int_equal(kvt_remote_refresh(r), 0);
    assert_int_equal(stats(r).entries, 0); /* the record was removed */
    redisContext *c = cli_ctx(&S);
    redisReply *rep = redisCommand(c, "EXISTS %s", key);
    assert_int_equal(rep->integer, 0); /* and its chunks */
    freeReplyObject(rep);
    redisFree(c);
}

/* The uuid of chunk key @p key ("...:{<uuid>}:<i>") into @p out (33 bytes). */
static void chunk_uuid(const char *key, char *out)
{
    const char *a = strrchr(key, '{');
    assert_non_null(a);
    snprintf(out, 33, "%.32s", a + 1);
}

/*
 * A writer killed before it publishes (another process, SIGKILL as soon as its first chunks
 * are in Redis): no record names its chunks, and every one of them expires (a time to live
 * that only the PERSISTs after a publish lift); the chunks of published entries have none.
 */
static void test_orphan_chunks_expire(void **state)
{
    (void)state;
    redisContext *c = cli_ctx(&S);
    int unpublished = 0;
    for (int attempt = 0; attempt < 5 && !unpublished; attempt++) {
        char *pfx = strf("orphan%d", attempt);
        char *cmd = strf("exec %s/tests/progs/remote_peer put '%s' '%s/%s' 91 12000 3",
                         KVT_BUILD_DIR, redis_url(&S, pfx), base, pfx);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
            _exit(127);
        }
        size_t seen = 0;
        for (int64_t t0 = now_ms(); !seen && now_ms() - t0 < 30000 * SLACK;) {
            redisReply *rep = redisCommand(c, "KEYS %s:*:{*}:*", pfx);
            seen = rep->elements;
            freeReplyObject(rep);
            if (!seen)
                msleep(1);
        }
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        assert_true(seen > 0);

        redisReply *keys = redisCommand(c, "KEYS %s:*:{*}:*", pfx);
        redisReply *idx = redisCommand(c, "KEYS %s:{*}:idx", pfx);
        for (size_t i = 0; i < keys->elements; i++) {
            char uuid[33];
            chunk_uuid(keys->element[i]->str, uuid);
            bool published = false;
            for (size_t j = 0; j < idx->elements && !published; j++) {
                redisReply *h = redisCommand(c, "HEXISTS %s %s", idx->element[j]->str, uuid);
                published = h->integer == 1;
                freeReplyObject(h);
            }
            redisReply *ttl = redisCommand(c, "PTTL %s", keys->element[i]->str);
            if (!published) { /* at most ten minutes and a second per MB of the ~37 MB entry */
                assert_true(ttl->integer > 0 && ttl->integer <= 600000 + 40 * 1000);
                unpublished++;
            }
            freeReplyObject(ttl);
        }
        print_message("attempt %d: %zu chunk keys, %d of an unpublished upload, all expiring\n",
                      attempt, keys->elements, unpublished);
        freeReplyObject(keys);
        freeReplyObject(idx);
        free(cmd);
        free(pfx);
    }
    assert_true(unpublished > 0);

    /* a published entry's chunks are permanent */
    kvt_remote *r = open_remote(redis_url(&S, "persisted"), 64 << 10);
    assert_int_equal(put(r, 92, N_TOK), 0);
    redisReply *keys = redisCommand(c, "KEYS persisted:*:{*}:*");
    assert_true(keys->elements > 1);
    for (size_t i = 0; i < keys->elements; i++) {
        redisReply *ttl = redisCommand(c, "PTTL %s", keys->element[i]->str);
        assert_int_equal(ttl->integer, -1);
        freeReplyObject(ttl);
    }
    freeReplyObject(keys);
    assert_int_equal(restore(r, 92, N_TOK), 1);
    kvt_remote_close(r);
    redisFree(c);
}

/* Bytes changed in Redis: a tensor byte, a header byte, an oversized value, a deleted chunk. */
static void test_corrupt_and_missing_chunks(void **state)
{
    (void)state;
    static const char *prefixes[4] = {"bad-tensor", "bad-header", "bad-size", "bad-gone"};
    for (int kind = 0; kind < 4; kind++) {
        kvt_remote *r = open_remote(redis_url(&S, prefixes[kind]), 64 << 10);
        assert_int_equal(put(r, 81, N_TOK), 0);
        char key[256];
        chunk_key(r, prefixes[kind], kind == 1 ? 0 : 5, key, sizeof(key));
        redisContext *c = cli_ctx(&S);
        redisReply *rep = kind == 0 ? redisCommand(c, "SETRANGE %s 1000 %b", key, "\x5a", (size_t)1)
                          : kind == 1 ? redisCommand(c, "SETRANGE %s 40 %b", key, "\x01", (size_t)1)
                          : kind == 2 ? redisCommand(c, "APPEND %s %s", key, "trailing bytes")
                                      : redisCommand(c, "DEL %s", key);
        assert_non_null(rep);
        freeReplyObject(rep);
        redisFree(c);
        expect_dropped(r, key);
        struct kvt_remote_stats st = stats(r);
        print_message("%s: corrupt %llu misses %llu\n", prefixes[kind],
                      (unsigned long long)st.corrupt, (unsigned long long)st.misses);
        assert_int_equal(kind == 3 ? st.misses : st.corrupt, 1);
        kvt_remote_close(r);
    }
}

/* A hit carries the index that found it: a remote tier refuses a hit another remote tier or a
 * store found, whose id names a record of another index. */
static void test_hit_of_another_index_refused(void **state)
{
    (void)state;
    kvt_remote *a = open_remote(redis_url(&S, "hit-a"), 0),
               *b = open_remote(redis_url(&S, "hit-b"), 0);
    assert_int_equal(put(a, 95, N_TOK), 0);
    assert_int_equal(put(b, 96, N_TOK), 0);
    int32_t tok[N_TOK + 1];
    remote_tokens(95, N_TOK, tok);
    tok[N_TOK] = 1;
    struct kvt_hit ha;
    assert_int_equal(kvt_remote_find(a, tok, N_TOK + 1, "", &ha), 0);
    assert_int_equal(ha.prefix_len, N_TOK);
    assert_int_not_equal(ha.store, 0);
    struct kvt_entry *got = (struct kvt_entry *)1;
    assert_int_equal(kvt_remote_restore(b, &ha, &got), -EINVAL);
    assert_null(got);
    assert_non_null(strstr(kvt_last_error(), "another index"));
    struct kvt_hit none = ha;
    none.store = 0; /* a hit no index made */
    assert_int_equal(kvt_remote_restore(a, &none, &got), -EINVAL);
    assert_int_equal(kvt_remote_restore(a, &ha, &got), 0); /* its own: restored */
    assert_non_null(got);
    kvt_entry_free(got);
    assert_int_equal(restore(b, 96, N_TOK), 1);
    kvt_remote_close(a);
    kvt_remote_close(b);
}

/* Index records that cannot be trusted are ignored; counts come before allocations. */
static void test_hostile_index_records(void **state)
{
    (void)state;
    kvt_remote *r = open_remote(redis_url(&S, "hostile"), 0);
    assert_int_equal(put(r, 91, N_TOK), 0);
    struct kvt_rkeys k;
    assert_int_equal(kvt_rkeys_init(&k, "hostile", REMOTE_MODEL, REMOTE_FP, REMOTE_TOK), 0);
    struct kvt_rrec rec = {.ns = "",
                           .bytes = (uint64_t)1 << 62,
                           .chunk = 1 << 20,
                           .n_chunks = 7,
                           .tokens = (int32_t[]){1, 2, 3},
                           .n_tokens = 3};
    memcpy(rec.uuid, "0123456789abcdef0123456789abcdef", 33);
    struct kvt_rclient rc;
    struct kvt_rcfg cfg = {.host = "127.0.0.1", .port = S.port, .timeout_ms = 500};
    assert_int_equal(kvt_rclient_init(&rc, &cfg), 0);
    kvt_rclient_arm(&rc, 0);
    assert_int_equal(kvt_rindex_publish(&rc, &k, &rec), 0); /* 4 EiB, wrong chunk count */
    memcpy(rec.uuid, "fedcba9876543210fedcba9876543210", 33);
    rec.bytes = 100, rec.chunk = 64, rec.n_chunks = 2; /* chunk below the minimum */
    assert_int_equal(kvt_rindex_publish(&rc, &k, &rec), 0);
    redisReply *rep = kvt_rclient_cmd(
        &rc, k.idx, 4, (const char *[]){"HSET", k.idx, "junk", "KVR1\xff"}, NULL, &(int){0});
    freeReplyObject(rep);
    assert_int_equal(kvt_remote_refresh(r), 0);
    assert_int_equal(stats(r).entries, 1); /* only the real one */
    assert_int_equal(restore(r, 91, N_TOK), 1);
    kvt_rclient_free(&rc);
    kvt_rkeys_free(&k);
    kvt_remote_close(r);
}

/* Redis's maxmemory with allkeys-lru as the backstop: entries whose chunks it evicted are
 * misses that clean up their records; every other entry restores byte for byte. */
static void test_maxmemory_eviction(void **state)
{
    (void)state;
    struct redis_srv k = {0};
    assert_int_equal(redis_start(&k, base, 0, "--maxmemory 6mb --maxmemory-policy allkeys-lru"), 0);
    char url[128];
    snprintf(url, sizeof(url), "%s", redis_url(&k, "lru"));
    kvt_remote *r = open_remote(url, 0);
    for (uint64_t s = 141; s < 153; s++)
        put(r, s, N_TOK); /* about 1 MB each: twice what the server keeps */
    kvt_remote_refresh(r);
    int restored = 0;
    for (uint64_t s = 141; s < 153; s++)
        restored += restore(r, s, N_TOK); /* identical or a miss: never wrong bytes */
    struct kvt_remote_stats st = stats(r);
    print_message("%d of 12 restored; misses %llu, failed uploads %llu\n", restored,
                  (unsigned long long)st.misses, (unsigned long long)st.put_failures);
    assert_true(restored >= 1 && restored < 12);
    assert_int_equal(st.corrupt, 0);
    kvt_remote_close(r);
    redis_kill(&k);
}

/* ---- security, capacity, CLI ----------------------------------------------------------- */

static void test_auth(void **state)
{
    (void)state;
    struct kvt_remote_opts o;
    char url[160];
    snprintf(url, sizeof(url), "redis://:wrong@127.0.0.1:%d/au", SA.port);
    ropts(&o, url);
    kvt_remote *r = NULL;
    assert_int_equal(kvt_remote_open(&o, &r), -EACCES);
    assert_null(r);
    print_message("wrong password: %s\n", kvt_last_error());
    assert_non_null(strstr(kvt_last_error(), "authentication refused"));
    assert_null(strstr(kvt_last_error(), "wrong"));

    snprintf(url, sizeof(url), "rediss://:wrong@127.0.0.1:%d/au", SA.port); /* bad scheme */
    ropts(&o, url);
    assert_int_equal(kvt_remote_open(&o, &r), -EINVAL);
    assert_non_null(strstr(kvt_last_error(), "not rediss://"));
    assert_null(strstr(kvt_last_error(), "wrong"));

    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/au", SA.port); /* no password at all */
    ropts(&o, url);
    assert_int_equal(kvt_remote_open(&o, &r), -EACCES);
    assert_non_null(strstr(kvt_last_error(), "authentication required"));

    o.password = "sekrit"; /* the option overrides the URL's */
    assert_int_equal(kvt_remote_open(&o, &r), 0);
    assert_int_equal(put(r, 101, N_TOK), 0);
    kvt_remote_close(r);

    snprintf(url, sizeof(url), "redis://kvuser:pw2@127.0.0.1:%d/au", SA.port); /* ACL user */
    ropts(&o, url);
    assert_int_equal(kvt_remote_open(&o, &r), 0);
    assert_int_equal(restore(r, 101, N_TOK), 1);
    kvt_remote_close(r);
}

static void test_unix_socket(void **state)
{
    (void)state;
    char *url = strf("unix://%s?prefix=sock", S.sock);
    kvt_remote *r = open_remote(url, 0);
    assert_true(stats(r).connected);
    assert_int_equal(put(r, 111, N_TOK), 0);
    kvt_remote *tcp = open_remote(redis_url(&S, "sock"), 0); /* same keys over TCP */
    assert_int_equal(restore(tcp, 111, N_TOK), 1);
    kvt_remote_close(tcp);
    kvt_remote_close(r);
    free(url);
}

/* The byte cap deletes the oldest entries first; bad URLs and options are refused. */
static void test_cap_and_options(void **state)
{
    (void)state;
    struct kvt_remote_opts o;
    ropts(&o, redis_url(&S, "cap"));
    struct kvt_entry *e = entry_of(121, N_TOK);
    uint64_t size;
    assert_int_equal(kvt_file_plan_size(e, &size), 0);
    kvt_entry_free(e);
    o.max_bytes = size * 5 / 2;
    kvt_remote *r = NULL;
    assert_int_equal(kvt_remote_open(&o, &r), 0);
    for (uint64_t s = 121; s < 124; s++) {
        assert_int_equal(put(r, s, N_TOK), 0);
        msleep(5);
    }
    struct kvt_remote_stats st = stats(r);
    assert_int_equal(st.entries, 2);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(restore(r, 121, N_TOK), 0);
    assert_int_equal(restore(r, 123, N_TOK), 1);
    assert_int_equal(put(r, 123, N_TOK), 0); /* already there: skipped, not duplicated */
    assert_int_equal(stats(r).put_skipped, 1);
    kvt_remote_close(r);

    static const char *bad[] = {"http://x",
                                "redis://",
                                "redis://h:0/p",
                                "redis://h:99999",
                                "unix://relative.sock",
                                "redis://u@h/p",
                                "redis://h/a{b}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        ropts(&o, bad[i]);
        assert_int_equal(kvt_remote_open(&o, &r), -EINVAL);
        assert_null(r);
    }
    ropts(&o, redis_url(&S, "x"));
    o.model_id = NULL;
    assert_int_equal(kvt_remote_open(&o, &r), -EINVAL);
    struct kvt_pcache_opts po;
    kvt_pcache_opts_init(&po);
    po.remote = &o; /* a remote needs a cold tier */
    kvt_pcache *pc;
    assert_int_equal(kvt_pcache_open(&po, &pc), -EINVAL);
}

static void test_cli(void **state)
{
    (void)state;
    kvt_remote *r = open_remote(redis_url(&S, "cli"), 64 << 10);
    assert_int_equal(put(r, 131, N_TOK), 0);
    assert_int_equal(put(r, 132, N_TOK), 0);
    char *id = strf("--model-id %s --config-fingerprint %s --tokenizer-hash %s", REMOTE_MODEL,
                    REMOTE_FP, REMOTE_TOK);
    char *args = strf("ls --redis %s %s", redis_url(&S, "cli"), id);
    char *out = NULL;
    assert_int_equal(run_cli(args, true, &out), 0);
    print_message("%s", out);
    assert_non_null(strstr(out, "2 entries"));
    free(out);
    free(args);
    char key[256];
    struct kvt_store_record *v;
    size_t n;
    assert_int_equal(kvt_remote_list(r, &v, &n), 0);
    struct kvt_rkeys k;
    kvt_rkeys_init(&k, "cli", REMOTE_MODEL, REMOTE_FP, REMOTE_TOK);
    kvt_rkeys_chunk(&k, "", v[0].path, 3, key, sizeof(key));
    kvt_rkeys_free(&k);
    kvt_store_list_free(v);
    redisContext *c = cli_ctx(&S);
    freeReplyObject(redisCommand(c, "DEL %s", key)); /* as if Redis had evicted it */
    redisFree(c);
    args = strf("gc --redis %s %s --dry-run", redis_url(&S, "cli"), id);
    assert_int_equal(run_cli(args, true, &out), 0);
    assert_non_null(strstr(out, "1 record"));
    free(out);
    free(args);
    args = strf("gc --redis %s %s", redis_url(&S, "cli"), id);
    assert_int_equal(run_cli(args, true, &out), 0);
    free(out);
    free(args);
    args = strf("stats --redis %s %s --json", redis_url(&S, "cli"), id);
    assert_int_equal(run_cli(args, true, &out), 0);
    print_message("%s", out);
    assert_non_null(strstr(out, "\"entries\": 1"));
    free(out);
    free(args);
    free(id);
    kvt_remote_close(r);
}

int main(void)
{
#define T(f) cmocka_unit_test(f)
    const struct CMUnitTest tests[] = {
        T(test_two_processes),
        T(test_cross_host_delay),
        T(test_nearer_tier_wins_ties),
        T(test_absent_at_open),
        T(test_killed_mid_transfer),
        T(test_restarted_empty),
        T(test_paused_server),
        T(test_orphan_chunks_expire),
        T(test_corrupt_and_missing_chunks),
        T(test_hostile_index_records),
        T(test_hit_of_another_index_refused),
        T(test_maxmemory_eviction),
        T(test_auth),
        T(test_unix_socket),
        T(test_cap_and_options),
        T(test_cli),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
