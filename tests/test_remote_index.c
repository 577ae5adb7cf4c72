/*
 * The remote index at scale, against a real redis-server started here: a removal costs other
 * hosts its uuid, not a new listing of the index; room is made against the server's own byte
 * total, whatever a host's stale view says; an entry's chunks are deleted in one command per
 * 256; and restores on one handle from several threads run at once.
 */
#include "support/redis_srv.h"
#include "support/slow_relay.h"
#include "support/support.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"

#define N_TOK 300
#define QUIET 3600000 /* poll_ms: the suites sync by hand */

static char *base;
static struct redis_srv S;

static int group_setup(void **state)
{
    (void)state;
    return redis_suite_start(&S, "remote-index", &base);
}

static int group_teardown(void **state)
{
    (void)state;
    return redis_suite_stop(&S, &base);
}

static kvt_remote *open_remote(const char *url, uint64_t chunk, uint64_t max_bytes)
{
    struct kvt_remote_opts o;
    remote_opts(&o, url, chunk, 2000, QUIET);
    if (max_bytes)
        o.max_bytes = max_bytes;
    kvt_remote *r = NULL;
    assert_int_equal(kvt_remote_open(&o, &r), 0);
    return r;
}

static struct kvt_remote_stats stats(kvt_remote *r)
{
    struct kvt_remote_stats st;
    kvt_remote_get_stats(r, &st);
    return st;
}

/* A number from the server's INFO (field "name:"). */
static long long info(const char *section, const char *name)
{
    char *cmd = strf("INFO %s", section), *out = NULL;
    redis_cli(&S, cmd, &out);
    char *at = out ? strstr(out, name) : NULL;
    long long v = at ? atoll(at + strlen(name) + 1) : -1;
    free(out);
    free(cmd);
    return v;
}

/* Bytes the server sent for one refresh of @p r (an INFO call's own reply measured beside). */
static long long refresh_bytes(kvt_remote *r)
{
    long long a = info("stats", "total_net_output_bytes");
    long long b = info("stats", "total_net_output_bytes");
    assert_int_equal(kvt_remote_refresh(r), 0);
    long long c = info("stats", "total_net_output_bytes");
    return (c - b) - (b - a);
}

/* One entry removed by another host: the reader's next sync reads its uuid, not the index. */
static void test_removal_costs_its_uuid(void **state)
{
    (void)state;
    const char *url = redis_url(&S, "delta");
    kvt_remote *w = open_remote(url, 0, 0), *r = open_remote(url, 0, 0);
    for (int i = 0; i < 40; i++)
        assert_int_equal(remote_put(w, 400 + (uint64_t)i, N_TOK), 0);
    long long first = refresh_bytes(r);
    assert_int_equal(stats(r).entries, 40);
    size_t dropped = 0;
    assert_int_equal(kvt_remote_gc(w, stats(w).bytes - 1, false, &dropped), 0);
    assert_int_equal(dropped, 1);
    long long removal = refresh_bytes(r);
    assert_int_equal(kvt_remote_refresh(r), 0);
    long long idle = refresh_bytes(r);
    print_message("bytes read: first sync %lld, after a removal %lld, idle %lld\n", first, removal,
                  idle);
    assert_int_equal(stats(r).entries, 39);
    assert_int_equal(remote_restore(r, 400, N_TOK), -1); /* the oldest went */
    assert_true(removal < 1000);
    assert_true(removal * 20 < first);
    kvt_remote_close(w);
    kvt_remote_close(r);
}

/* Two writers whose views are stale (no polling): the second's upload still makes room
 * under the cap against what the server holds, and the evicted entry's chunks go too. */
static void test_eviction_against_shared_state(void **state)
{
    (void)state;
    const char *url = redis_url(&S, "shared");
    kvt_remote *probe = open_remote(url, 0, 0);
    assert_int_equal(remote_put(probe, 450, N_TOK), 0);
    uint64_t one = stats(probe).bytes;
    assert_int_equal(kvt_remote_gc(probe, 1, false, NULL), 0);
    kvt_remote_close(probe);
    uint64_t cap = one * 7 / 2;                       /* three entries fit, not four */
    kvt_remote *b = open_remote(url, 256 << 10, cap); /* its view: empty, and it stays so */
    kvt_remote *a = open_remote(url, 256 << 10, cap);
    for (int i = 0; i < 3; i++)
        assert_int_equal(remote_put(a, 451 + (uint64_t)i, N_TOK), 0);
    assert_int_equal(remote_put(b, 454, N_TOK), 0);
    kvt_remote *c = open_remote(url, 256 << 10, cap);
    print_message("after 4 uploads under a cap of 3: %llu entries, %llu of %llu bytes\n",
                  (unsigned long long)stats(c).entries, (unsigned long long)stats(c).bytes,
                  (unsigned long long)cap);
    assert_int_equal(stats(c).entries, 3);
    assert_true(stats(c).bytes <= cap);
    assert_int_equal(remote_restore(c, 451, N_TOK), -1);
    assert_int_equal(remote_restore(c, 454, N_TOK), 1);
    char *out = NULL;
    redis_cli(&S, "EVAL \"return #redis.call('KEYS', 'shared:*:{*}:*')\" 0", &out);
    long long chunks = atoll(out);
    free(out);
    assert_int_equal(chunks, 3 * (long long)((one + (256 << 10) - 1) / (256 << 10)));
    kvt_remote_close(a);
    kvt_remote_close(b);
    kvt_remote_close(c);
}

/* An entry of 249 chunks is deleted with one DEL, not 249 round trips. */
static void test_chunk_deletes_batched(void **state)
{
    (void)state;
    kvt_remote *r = open_remote(redis_url(&S, "del"), 4096, 0);
    assert_int_equal(remote_put(r, 460, N_TOK), 0);
    assert_int_equal(redis_cli(&S, "CONFIG RESETSTAT", NULL), 0);
    size_t dropped = 0;
    assert_int_equal(kvt_remote_gc(r, 1, false, &dropped), 0);
    assert_int_equal(dropped, 1);
    long long dels = info("commandstats", "cmdstat_del:calls");
    print_message("DEL calls for one entry of %llu bytes in 4 KiB chunks: %lld\n",
                  (unsigned long long)stats(r).put_bytes, dels);
    assert_true(dels >= 1 && dels <= 2);
    char *out = NULL;
    redis_cli(&S, "EVAL \"return #redis.call('KEYS', 'del:*:{*}:*')\" 0", &out);
    assert_int_equal(atoll(out), 0);
    free(out);
    kvt_remote_close(r);
}

struct bg {
    kvt_remote *r;
    int got;
    int64_t ms;
};

static void *bg_restore(void *arg)
{
    struct bg *b = arg;
    int64_t t0 = now_ms();
    b->got = remote_restore(b->r, 470, N_TOK);
    b->ms = now_ms() - t0;
    return NULL;
}

/* A restore stuck on a slow link does not hold up a restore of another entry on the same
 * handle from another thread. */
static void test_restores_run_at_once(void **state)
{
    (void)state;
    kvt_remote *w = open_remote(redis_url(&S, "conc"), 0, 0);
    assert_int_equal(remote_put(w, 470, N_TOK), 0); /* about 1 MB */
    assert_int_equal(remote_put(w, 471, 8), 0);     /* below 256 KiB */
    struct slow_relay P;
    assert_int_equal(slow_relay_start(&P, S.port, 256 << 10), 0);
    char url[128];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/conc", P.port);
    kvt_remote *r = open_remote(url, 0, 0);
    assert_int_equal(stats(r).entries, 2);
    P.slow = 1; /* each connection trickles after its first 256 KiB */
    struct bg b = {r, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, bg_restore, &b);
    msleep(200);
    int64_t t0 = now_ms();
    int small = remote_restore(r, 471, 8);
    int64_t small_ms = now_ms() - t0;
    pthread_join(th, NULL);
    print_message("big restore %d after %lld ms; small one beside it %d after %lld ms\n", b.got,
                  (long long)b.ms, small, (long long)small_ms);
    assert_int_equal(small, 1);
    assert_true(small_ms < 1000 * SLACK); /* one after the other: the big one's 1.8 s first */
    assert_int_equal(b.got, 0);           /* the deadline */
    kvt_remote_close(r);
    kvt_remote_close(w);
    slow_relay_stop(&P);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_removal_costs_its_uuid),
        cmocka_unit_test(test_eviction_against_shared_state),
        cmocka_unit_test(test_chunk_deletes_batched),
        cmocka_unit_test(test_restores_run_at_once),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
