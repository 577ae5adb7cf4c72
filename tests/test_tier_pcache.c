/*
 * The RAM prompt cache (TIER.md §2) with counting stub caches and a stub cold tier, through
 * the public kvt_pcache calls: non-consuming take with trimmed clones, the cold tier's
 * strictly-longer rule and its fallbacks, put (oversize, duplicates, trimmable-only
 * supersession, LRU eviction that spills owned clones and never the fresh insert), spill
 * failures that degrade to no spill, retain shares, demote_idle, clear, peek, find_exact and
 * the on_put hook.
 */
#include "test_tier_stubs.h"

#include "tier/ram_lru.h"

static struct kvt_store C;
static struct gate G;
static int hook_runs;
static int on_put_calls;
static int32_t on_put_tok[64];
static size_t on_put_n;
static char on_put_ns[32];

static void count_hook(void *ud)
{
    (*(int *)ud)++;
}

static void user_on_put(void *ud, const int32_t *tok, size_t n, const char *ns)
{
    (void)ud;
    on_put_calls++;
    on_put_n = n;
    memcpy(on_put_tok, tok, (n < 64 ? n : 64) * sizeof(*tok));
    snprintf(on_put_ns, sizeof(on_put_ns), "%s", ns);
}

static int setup(void **state)
{
    (void)state;
    world_reset();
    log_reset();
    cold_init(&C);
    gate_init(&G);
    hook_runs = 0;
    on_put_calls = 0;
    atomic_store(&stub_now, 1000000);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    assert_int_equal(world_get(&W.caches_live), 0); /* nothing leaked */
    assert_int_equal(world_get(&W.bufs_live), 0);
    cold_destroy(&C);
    gate_destroy(&G);
    return 0;
}

static kvt_pcache *open_tier(bool cold, uint64_t ram_max)
{
    struct kvt_tier_cfg cfg = {
        .cache = &stub_cache_ops,
        .cold = cold ? &stub_cold_ops : NULL,
        .store = cold ? &C : NULL,
        .ram_max_bytes = ram_max,
        .spill_queue_max_bytes = 1 << 30,
        .write_behind = false,
        .snapshot_debounce_ms = 1000,
        .snapshot_busy_retry_ms = 5000,
        .flush_timeout_ms = 60000,
        .run_exclusive = gate_run,
        .engine = &G,
        .on_put = user_on_put,
        .wall_ms = stub_wall,
        .log = stub_log,
    };
    kvt_pcache *pc = NULL;
    assert_int_equal(kvt_tier_open(&cfg, &pc), 0);
    assert_non_null(pc);
    return pc;
}

/* Wait until the queue has written everything (flush with write-behind off = drain). */
static void settle_queue(kvt_pcache *pc)
{
    struct kvt_flush_report r;
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
}

static void seq(int32_t *out, int32_t start, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = start + (int32_t)i;
}

static void free_take(struct kvt_take *t)
{
    st_entry_free(t->entry);
    kvt_retain_release(t->retain);
    memset(t, 0, sizeof(*t));
}

static void stats(kvt_pcache *pc, struct kvt_pcache_stats *st)
{
    kvt_pcache_get_stats(pc, st);
}

static void test_take_miss_counts(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(false, 1 << 20);
    int32_t p[3] = {1, 2, 3};
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take(pc, p, 3, "", &t), 0);
    assert_null(t.entry);
    assert_null(t.retain);
    struct kvt_pcache_stats st;
    stats(pc, &st);
    assert_int_equal(st.misses, 1);
    assert_int_equal(st.hits, 0);
    assert_false(st.has_cold);
    kvt_pcache_close(pc);
}

static void test_take_clones_trimmed_and_keeps_donor(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(false, 1 << 20);
    struct kvt_entry *e = sentry_seq(1, 10, "", 2, 100, true);
    int donor_buf0 = cache_buf_id(e, 0), donor_buf1 = cache_buf_id(e, 1);
    assert_int_equal(kvt_pcache_put(pc, e, NULL), 0);

    int32_t p[7];
    seq(p, 1, 6);
    p[6] = 99;
    for (int round = 0; round < 2; round++) {
        struct kvt_take t;
        assert_int_equal(kvt_pcache_take(pc, p, 7, "", &t), 0);
        assert_non_null(t.entry);
        assert_false(t.from_disk);
        assert_int_equal(t.entry->n_tokens, 6);
        assert_memory_equal(t.entry->tokens, p, 6 * sizeof(int32_t));
        assert_int_equal(t.entry->n_caches, 2);
        assert_true(cache_is_clone(t.entry, 0));
        assert_int_equal(cache_buf_id(t.entry, 0), donor_buf0);
        assert_int_equal(cache_buf_id(t.entry, 1), donor_buf1);
        assert_int_equal(cache_offset(t.entry, 0), 6); /* trimmed by 10 - 6 */
        assert_int_equal(cache_offset(t.entry, 1), 6);
        free_take(&t);
    }
    assert_int_equal(world_get(&W.trim_tokens), 2 * 2 * 4);
    assert_false(buf_released(donor_buf0)); /* the donor stays, untouched */
    struct kvt_pcache_stats st;
    stats(pc, &st);
    assert_int_equal(st.records, 1);
    assert_int_equal(st.hits, 2);
    assert_int_equal(st.misses, 0);
    assert_true(kvt_pcache_find_exact(pc, (int32_t[]){1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 10, ""));
    kvt_pcache_close(pc);
    assert_true(buf_released(donor_buf0));
}

static void test_take_leaves_one_token(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(false, 1 << 20);
    kvt_pcache_put(pc, sentry_seq(1, 10, "", 1, 100, true), NULL);
    int32_t p[10];
    seq(p, 1, 10);
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take(pc, p, 10, "", &t), 0);
    assert_non_null(t.entry);
    assert_int_equal(t.entry->n_tokens, 9); /* n - 1: one token is always left to compute */
    assert_int_equal(cache_offset(t.entry, 0), 9);
    free_take(&t);
    assert_int_equal(kvt_pcache_take(pc, p, 1, "", &t), 0); /* a 1-token prompt always misses */
    assert_null(t.entry);
    assert_int_equal(kvt_pcache_take(pc, p, 0, "", &t), 0);
    assert_null(t.entry);
    kvt_pcache_close(pc);
}

static void test_take_untrimmable_donor(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(false, 1 << 20);
    kvt_pcache_put(pc, sentry_seq(1, 10, "", 1, 100, false), NULL);
    int32_t p[11];
    seq(p, 1, 11);
    struct kvt_take t;
    p[5] = 99; /* diverges after 5 tokens: the ring cannot be rewound */
    assert_int_equal(kvt_pcache_take(pc, p, 11, "", &t), 0);
    assert_null(t.entry);
    p[5] = 6; /* extends it: usable as is */
    assert_int_equal(kvt_pcache_take(pc, p, 11, "", &t), 0);
    assert_non_null(t.entry);
    assert_int_equal(t.entry->n_tokens, 10);
    assert_int_equal(cache_offset(t.entry, 0), 10);
    free_take(&t);
    assert_int_equal(world_get(&W.trims), 0);
    struct kvt_pcache_stats st;
    stats(pc, &st);
    assert_int_equal(st.misses, 1);
    assert_int_equal(st.hits, 1);
    kvt_pcache_close(pc);
}

static void test_take_namespaces_are_separate(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(false, 1 << 20);
    kvt_pcache_put(pc, sentry_seq(1, 10, "a", 1, 100, true), NULL);
    int32_t p[11];
    seq(p, 1, 11);
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take(pc, p, 11, "", &t), 0);
    assert_null(t.entry);
    assert_int_equal(kvt_pcache_take(pc, p, 11, NULL, &t), 0);
    assert_null(t.entry);
    assert_int_equal(kvt_pcache_take(pc, p, 11, "a+b", &t), 0);
    assert_null(t.entry);
    assert_int_equal(kvt_pcache_take(pc, p, 11, "a", &t), 0);
    assert_non_null(t.entry);
    assert_string_equal(t.entry->meta.ns, "a");
    free_take(&t);
    kvt_pcache_close(pc);
}

static void test_take_longest_then_earliest(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(false, 1 << 20);
    struct kvt_entry *a = sentry_new((int32_t[]){1, 2, 3, 4, 50}, 5, "", 1, 10, true);
    struct kvt_entry *b = sentry_new((int32_t[]){1, 2, 3, 4, 60}, 5, "", 1, 10, true);
    int abuf = cache_buf_id(a, 0);
    kvt_pcache_put(pc, a, NULL);
    kvt_pcache_put(pc, b, NULL);
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take(pc, (int32_t[]){1, 2, 3, 4, 70, 80}, 6, "", &t), 0);
    assert_int_equal(t.entry->n_tokens, 4);
    assert_int_equal(cache_buf_id(t.entry, 0), abuf); /* tie: the earliest record */
    free_take(&t);

    struct kvt_entry *c = sentry_new((int32_t[]){1, 2, 3, 4, 70, 80, 90}, 7, "", 1, 10, true);
    int cbuf = cache_buf_id(c, 0);
    kvt_pcache_put(pc, c, NULL);
    assert_int_equal(kvt_pcache_take(pc, (int32_t[]){1, 2, 3, 4, 70, 81}, 6, "", &t), 0);
    assert_int_equal(t.entry->n_tokens, 5); /* the longest prefix wins over insertion order */
    assert_int_equal(cache_buf_id(t.entry, 0), cbuf);
    free_take(&t);
    kvt_pcache_close(pc);
}

static void test_cold_strictly_longer_wins(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(true, 1 << 20);
    int32_t disk[10];
    seq(disk, 1, 10);
    cold_insert(&C, disk, 10, "", true, 2, 200);
    kvt_pcache_put(pc, sentry_seq(1, 6, "", 2, 100, true), NULL);

    int32_t p[9];
    seq(p, 1, 8);
    p[8] = 99;
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take(pc, p, 9, "", &t), 0);
    assert_non_null(t.entry);
    assert_true(t.from_disk);
    assert_null(t.retain);
    assert_int_equal(t.entry->n_tokens, 8);
    assert_memory_equal(t.entry->tokens, p, 8 * sizeof(int32_t));
    assert_int_equal(cache_offset(t.entry, 0), 8); /* trimmed from 10 */
    assert_int_equal(cache_offset(t.entry, 1), 8);
    assert_false(cache_is_clone(t.entry, 0));
    free_take(&t);
    assert_int_equal(cold_get(&C, &C.restores), 1);

    struct kvt_pcache_stats st;
    stats(pc, &st);
    assert_int_equal(st.records, 1); /* a restore is not inserted into RAM */
    assert_int_equal(st.hits, 1);    /* RAM candidacy decides hit/miss */
    kvt_pcache_close(pc);
}

static void test_cold_tie_goes_to_ram(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(true, 1 << 20);
    int32_t disk[7];
    seq(disk, 1, 7);
    cold_insert(&C, disk, 7, "", true, 1, 100);
    kvt_pcache_put(pc, sentry_seq(1, 6, "", 1, 100, true), NULL);
    int32_t p[7];
    seq(p, 1, 6);
    p[6] = 99; /* RAM and disk both give 6 */
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take(pc, p, 7, "", &t), 0);
    assert_non_null(t.entry);
    assert_false(t.from_disk);
    assert_int_equal(t.entry->n_tokens, 6);
    free_take(&t);
    assert_int_equal(cold_get(&C, &C.restores), 0);
    assert_int_equal(cold_get(&C, &C.finds), 1);
    kvt_pcache_close(pc);
}

static void test_cold_hit_without_donor_is_a_miss(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(true, 1 << 20);
    int32_t disk[10];
    seq(disk, 1, 10);
    cold_insert(&C, disk, 10, "", false, 1, 100);
    int32_t p[11];
    seq(p, 1, 11);
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take(pc, p, 11, "", &t), 0);
    assert_non_null(t.entry);
    assert_true(t.from_disk);
    assert_int_equal(t.entry->n_tokens, 10); /* untrimmable but no trim needed */
    free_take(&t);
    struct kvt_pcache_stats st;
    stats(pc, &st);
    assert_int_equal(st.misses, 1);
    assert_int_equal(st.hits, 0);
    kvt_pcache_close(pc);
}

static void test_cold_untrimmable_tail_falls_back(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(true, 1 << 20);
    int32_t disk[10];
    seq(disk, 1, 10);
    cold_insert(&C, disk, 10, "", true, 2, 200); /* the header says trimmable … */
    C.restore_live_untrimmable = true;           /* … the live caches disagree */
    kvt_pcache_put(pc, sentry_seq(1, 4, "", 1, 100, true), NULL);
    int32_t p[9];
    seq(p, 1, 8);
    p[8] = 99;
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take(pc, p, 9, "", &t), 0);
    assert_true(log_has("[prompt-cache] cold entry unusable: 10 tokens, needs trim 2 but "
                        "untrimmable (wrapped ring/SSM) — re-prefilling"));
    assert_non_null(t.entry);
    assert_false(t.from_disk);
    assert_int_equal(t.entry->n_tokens, 4);
    free_take(&t);
    assert_int_equal(world_get(&W.caches_live), 1); /* the loaded caches are gone */
    kvt_pcache_close(pc);
}

static void test_cold_restore_miss_and_trim_failure_degrade(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(true, 1 << 20);
    int32_t disk[10];
    seq(disk, 1, 10);
    cold_insert(&C, disk, 10, "", true, 1, 100);
    kvt_pcache_put(pc, sentry_seq(1, 4, "", 1, 100, true), NULL);
    int32_t p[9];
    seq(p, 1, 8);
    p[8] = 99;

    C.restore_miss = true;
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take(pc, p, 9, "", &t), 0);
    assert_non_null(t.entry);
    assert_false(t.from_disk);
    assert_int_equal(t.entry->n_tokens, 4);
    free_take(&t);

    C.restore_miss = false;
    pthread_mutex_lock(&W.mu);
    W.fail_trim = true; /* the RAM donor needs no trim: only the cold trim fails */
    pthread_mutex_unlock(&W.mu);
    assert_int_equal(kvt_pcache_take(pc, p, 9, "", &t), 0);
    assert_true(log_has("[prompt-cache] cold entry unusable: 10 tokens, trim 2 failed"));
    assert_non_null(t.entry);
    assert_false(t.from_disk);
    assert_int_equal(t.entry->n_tokens, 4);
    free_take(&t);

    /* No RAM donor and a failed restore: a plain miss. */
    int32_t q[9];
    seq(q, 1, 8);
    q[8] = 99;
    kvt_pcache_clear(pc);
    C.restore_miss = true;
    assert_int_equal(kvt_pcache_take(pc, q, 9, "", &t), 0);
    assert_null(t.entry);
    kvt_pcache_close(pc);
}

static void test_take_clone_failure_returns_error(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(false, 1 << 20);
    kvt_retain *r;
    assert_int_equal(kvt_retain_new(count_hook, &hook_runs, &r), 0);
    kvt_pcache_put(pc, sentry_seq(1, 10, "", 3, 100, true), r);
    pthread_mutex_lock(&W.mu);
    W.fail_clone_at = W.clone_calls + 2; /* the second cache's clone fails */
    pthread_mutex_unlock(&W.mu);
    int32_t p[6];
    seq(p, 1, 6);
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take(pc, p, 6, "", &t), -ENOMEM);
    assert_null(t.entry);
    assert_null(t.retain);
    assert_int_equal(world_get(&W.caches_live), 3); /* the built clone was released */
    assert_int_equal(hook_runs, 0);                 /* the record still holds the share */

    pthread_mutex_lock(&W.mu);
    W.fail_trim = true;
    pthread_mutex_unlock(&W.mu);
    assert_int_equal(kvt_pcache_take(pc, p, 6, "", &t), KVT_E_STATE);
    assert_null(t.entry);
    assert_int_equal(world_get(&W.caches_live), 3);
    kvt_pcache_clear(pc);
    assert_int_equal(hook_runs, 1);
    kvt_pcache_close(pc);
}

static void test_put_oversize_spills_without_hook(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(true, 150);
    kvt_retain *r;
    assert_int_equal(kvt_retain_new(count_hook, &hook_runs, &r), 0);
    assert_int_equal(kvt_pcache_put(pc, sentry_seq(1, 5, "", 2, 100, true), r), 0);
    assert_int_equal(hook_runs, 1); /* the live entry is released at once */
    settle_queue(pc);
    int32_t tok[5];
    seq(tok, 1, 5);
    assert_true(cold_has(&C, tok, 5, ""));
    assert_int_equal(on_put_calls, 0);
    struct kvt_pcache_stats st;
    stats(pc, &st);
    assert_int_equal(st.records, 0);
    assert_int_equal(st.total_bytes, 0);
    kvt_pcache_close(pc);
}

static void test_put_replaces_duplicates_without_spill(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(true, 1 << 20);
    struct kvt_entry *a = sentry_seq(1, 5, "", 1, 100, true);
    int abuf = cache_buf_id(a, 0);
    kvt_pcache_put(pc, a, NULL);
    kvt_pcache_put(pc, sentry_seq(1, 5, "", 1, 100, true), NULL);
    kvt_pcache_put(pc, sentry_seq(1, 5, "x", 1, 100, true), NULL); /* other ns: kept */
    assert_true(buf_released(abuf));
    settle_queue(pc);
    assert_int_equal(cold_get(&C, &C.puts), 0);
    struct kvt_pcache_stats st;
    stats(pc, &st);
    assert_int_equal(st.records, 2);
    assert_int_equal(st.total_bytes, 200);
    kvt_pcache_close(pc);
}

static void test_put_supersedes_ancestors_only_when_trimmable(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(true, 1 << 20);
    kvt_pcache_put(pc, sentry_seq(1, 3, "", 1, 10, true), NULL);
    kvt_pcache_put(pc, sentry_seq(1, 3, "o", 1, 10, true), NULL);
    kvt_pcache_put(pc, sentry_seq(1, 5, "", 1, 10, true), NULL); /* supersedes [1..3] in "" */
    struct kvt_pcache_stats st;
    stats(pc, &st);
    assert_int_equal(st.records, 2);
    assert_false(kvt_pcache_find_exact(pc, (int32_t[]){1, 2, 3}, 3, ""));
    assert_true(kvt_pcache_find_exact(pc, (int32_t[]){1, 2, 3}, 3, "o"));

    kvt_pcache_put(pc, sentry_seq(1, 8, "", 1, 10, false), NULL); /* untrimmable: keeps [1..5] */
    stats(pc, &st);
    assert_int_equal(st.records, 3);
    assert_true(kvt_pcache_find_exact(pc, (int32_t[]){1, 2, 3, 4, 5}, 5, ""));

    kvt_pcache_put(pc, sentry_seq(1, 4, "", 1, 10, true), NULL); /* shorter: removes nothing */
    stats(pc, &st);
    assert_int_equal(st.records, 4);
    settle_queue(pc);
    assert_int_equal(cold_get(&C, &C.puts), 0); /* supersession never spills */
    kvt_pcache_close(pc);
}

static void test_lru_eviction_spills_and_spares_fresh(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(true, 250);
    kvt_pcache_put(pc, sentry_seq(100, 4, "", 1, 100, true), NULL); /* A */
    kvt_pcache_put(pc, sentry_seq(200, 4, "", 1, 100, true), NULL); /* B */
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take(pc, (int32_t[]){100, 101, 102, 103, 9}, 5, "", &t), 0);
    assert_non_null(t.entry); /* A is now more recent than B */
    free_take(&t);
    kvt_pcache_put(pc, sentry_seq(300, 4, "", 1, 100, true), NULL); /* C: B goes */
    struct kvt_pcache_stats st;
    stats(pc, &st);
    assert_int_equal(st.records, 2);
    assert_int_equal(st.total_bytes, 200);
    assert_true(kvt_pcache_find_exact(pc, (int32_t[]){100, 101, 102, 103}, 4, ""));
    assert_false(kvt_pcache_find_exact(pc, (int32_t[]){200, 201, 202, 203}, 4, ""));
    settle_queue(pc);
    assert_true(cold_has(&C, (int32_t[]){200, 201, 202, 203}, 4, ""));
    assert_int_equal(cold_get(&C, &C.puts), 1);

    /* A fresh insert larger than what is left never evicts itself. */
    kvt_pcache_put(pc, sentry_seq(400, 4, "", 1, 240, true), NULL);
    stats(pc, &st);
    assert_int_equal(st.records, 1);
    assert_true(kvt_pcache_find_exact(pc, (int32_t[]){400, 401, 402, 403}, 4, ""));
    settle_queue(pc);
    assert_int_equal(cold_get(&C, &C.puts), 3);
    kvt_pcache_close(pc);
}

static void test_eviction_spill_owns_clones(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(true, 150);
    kvt_retain *r;
    assert_int_equal(kvt_retain_new(count_hook, &hook_runs, &r), 0);
    struct kvt_entry *a = sentry_seq(1, 4, "", 1, 100, true);
    int abuf = cache_buf_id(a, 0);
    kvt_pcache_put(pc, a, r);
    gate_block(&G, true); /* the writer will hold the spill inside the engine gate */
    int disposes0 = world_get(&W.disposes);
    kvt_pcache_put(pc, sentry_seq(9, 4, "", 1, 100, true), NULL); /* evicts A */

    assert_int_equal(hook_runs, 1);                          /* donor released at once */
    assert_int_equal(world_get(&W.disposes), disposes0 + 1); /* its cache object too */
    assert_int_equal(world_get(&W.clones_made), 1);          /* exactly one owned clone */
    assert_false(buf_released(abuf));                        /* pinned by the spill */
    struct kvt_pcache_stats st;
    stats(pc, &st);
    assert_int_equal(st.pending_spills, 1);
    assert_int_equal(st.pending_spill_bytes, 100);
    assert_int_equal(st.records, 1);

    gate_wait_held(&G, 1);
    assert_false(buf_released(abuf));
    gate_block(&G, false);
    settle_queue(pc);
    assert_true(buf_released(abuf)); /* released when the write settled */
    assert_int_equal(cold_get(&C, &C.put_ok), 1);
    assert_int_equal(gate_get(&G, &G.ran), 3); /* 2 tensors = 3 gated steps */
    stats(pc, &st);
    assert_int_equal(st.pending_spills, 0);
    kvt_pcache_close(pc);
}

static void test_eviction_clone_failure_skips_spill(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(true, 150);
    struct kvt_entry *a = sentry_seq(1, 4, "", 2, 50, true);
    int abuf = cache_buf_id(a, 1);
    kvt_pcache_put(pc, a, NULL);
    pthread_mutex_lock(&W.mu);
    W.fail_clone_at = W.clone_calls + 2;
    pthread_mutex_unlock(&W.mu);
    assert_int_equal(kvt_pcache_put(pc, sentry_seq(9, 4, "", 2, 50, true), NULL), 0);
    assert_true(buf_released(abuf)); /* evicted and gone: no clone pins it */
    assert_true(log_has("[prompt-cache] spill of 4 tokens skipped"));
    settle_queue(pc);
    assert_int_equal(cold_get(&C, &C.puts), 0);
    struct kvt_pcache_stats st;
    stats(pc, &st);
    assert_int_equal(st.records, 1);
    assert_int_equal(st.pending_spills, 0);
    kvt_pcache_close(pc);
}

/* The sink itself refuses (it owns and releases the clones on that path too). */
static int failing_sink_calls;
static int failing_sink(void *ud, struct kvt_entry *clones)
{
    (void)ud;
    failing_sink_calls++;
    st_entry_free(clones);
    return -ENOMEM;
}

static void test_eviction_sink_failure_skips_spill(void **state)
{
    (void)state;
    failing_sink_calls = 0;
    struct kvt_tier_cfg cfg = {
        .ram_max_bytes = 150,
        .cache = &stub_cache_ops,
        .cold = &stub_cold_ops,
        .store = &C,
        .log = stub_log,
    };
    struct kvt_ram_lru_links links = {.spill = failing_sink};
    struct kvt_ram_lru *pc;
    assert_int_equal(kvt_ram_lru_new(&cfg, &links, &pc), 0);
    kvt_retain *r;
    assert_int_equal(kvt_retain_new(count_hook, &hook_runs, &r), 0);
    assert_int_equal(kvt_ram_lru_put(pc, sentry_seq(1, 4, "", 1, 100, true), r), 0);
    assert_int_equal(kvt_ram_lru_put(pc, sentry_seq(9, 4, "", 1, 100, true), NULL), 0);
    assert_int_equal(failing_sink_calls, 1);
    assert_int_equal(hook_runs, 1);
    assert_int_equal(world_get(&W.caches_live), 1); /* only the fresh record */
    assert_int_equal(cold_get(&C, &C.puts), 0);
    struct kvt_pcache_stats st;
    kvt_ram_lru_get_stats(pc, &st);
    assert_int_equal(st.records, 1);
    kvt_ram_lru_free(pc);
}

static void test_sync_spill_without_owned_sink(void **state)
{
    (void)state;
    struct kvt_tier_cfg cfg = {
        .ram_max_bytes = 150,
        .cache = &stub_cache_ops,
        .cold = &stub_cold_ops,
        .store = &C,
    };
    struct kvt_ram_lru *pc;
    assert_int_equal(kvt_ram_lru_new(&cfg, NULL, &pc), 0);
    kvt_ram_lru_put(pc, sentry_seq(1, 4, "", 1, 100, true), NULL);
    kvt_ram_lru_put(pc, sentry_seq(9, 4, "", 1, 100, true), NULL);
    assert_int_equal(cold_get(&C, &C.put_ok), 1); /* the live entry, stored synchronously */
    assert_true(cold_has(&C, (int32_t[]){1, 2, 3, 4}, 4, ""));
    assert_int_equal(world_get(&W.clones_made), 0);
    kvt_ram_lru_free(pc);
}

static void test_retain_hook_runs_once_after_last_holder(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(false, 1 << 20);
    kvt_retain *r;
    assert_int_equal(kvt_retain_new(count_hook, &hook_runs, &r), 0);
    kvt_pcache_put(pc, sentry_seq(1, 5, "", 1, 10, true), r);

    struct kvt_take t1, t2;
    int32_t p[6];
    seq(p, 1, 6);
    assert_int_equal(kvt_pcache_take(pc, p, 6, "", &t1), 0);
    assert_int_equal(kvt_pcache_take(pc, p, 6, "", &t2), 0);
    assert_ptr_equal(t1.retain, r);
    assert_ptr_equal(t2.retain, r);

    /* The caller extends t1 and puts it back with its retain: the ancestor goes. */
    st_entry_free(t1.entry);
    kvt_pcache_put(pc, sentry_seq(1, 6, "", 1, 10, true), t1.retain);
    assert_false(kvt_pcache_find_exact(pc, p, 5, ""));
    assert_int_equal(hook_runs, 0);
    kvt_pcache_clear(pc);
    assert_int_equal(hook_runs, 0); /* t2 still holds it */
    free_take(&t2);
    assert_int_equal(hook_runs, 1);
    kvt_retain_release(NULL);
    kvt_pcache_close(pc);
    assert_int_equal(hook_runs, 1);
}

static void test_demote_idle_without_cold_is_a_noop(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(false, 1 << 20);
    kvt_pcache_put(pc, sentry_seq(1, 5, "", 1, 10, true), NULL);
    atomic_store(&stub_now, 9000000);
    assert_int_equal(kvt_pcache_demote_idle(pc, 0, 0), 0);
    assert_int_equal(kvt_pcache_demote_idle(pc, 1, 9000000), 0);
    struct kvt_pcache_stats st;
    stats(pc, &st);
    assert_int_equal(st.records, 1);
    assert_int_equal(st.demotions, 0);
    kvt_pcache_close(pc);
}

static void test_demote_idle_spills_idle_entries(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(true, 1 << 20);
    kvt_pcache_put(pc, sentry_seq(100, 4, "", 1, 10, true), NULL); /* at 1000000 */
    atomic_store(&stub_now, 1004000);
    kvt_pcache_put(pc, sentry_seq(200, 4, "", 1, 10, true), NULL); /* at 1004000 */
    kvt_pcache_put(pc, sentry_seq(300, 4, "", 1, 10, true), NULL);
    atomic_store(&stub_now, 1005000);
    struct kvt_take t; /* a hit refreshes the idle age of 300… */
    assert_int_equal(kvt_pcache_take(pc, (int32_t[]){300, 301, 302, 303, 1}, 5, "", &t), 0);
    free_take(&t);
    atomic_store(&stub_now, 1006000);

    assert_int_equal(kvt_pcache_demote_idle(pc, 2000, 1006000), 2); /* 100 (6 s) and 200 (2 s) */
    struct kvt_pcache_stats st;
    stats(pc, &st);
    assert_int_equal(st.records, 1);
    assert_int_equal(st.demotions, 2);
    settle_queue(pc);
    assert_true(cold_has(&C, (int32_t[]){100, 101, 102, 103}, 4, ""));
    assert_true(cold_has(&C, (int32_t[]){200, 201, 202, 203}, 4, ""));
    assert_int_equal(kvt_pcache_demote_idle(pc, 0, 0), 1); /* a host drain */
    stats(pc, &st);
    assert_int_equal(st.records, 0);
    assert_int_equal(st.demotions, 3);
    kvt_pcache_close(pc);
}

static void test_clear_never_spills(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(true, 1 << 20);
    kvt_pcache_put(pc, sentry_seq(1, 4, "", 1, 10, true), NULL);
    kvt_pcache_put(pc, sentry_seq(9, 4, "", 1, 10, true), NULL);
    kvt_pcache_clear(pc);
    struct kvt_pcache_stats st;
    stats(pc, &st);
    assert_int_equal(st.records, 0);
    assert_int_equal(world_get(&W.caches_live), 0);
    settle_queue(pc);
    assert_int_equal(cold_get(&C, &C.puts), 0);
    kvt_pcache_close(pc);
    assert_int_equal(cold_get(&C, &C.puts), 0); /* nor does close */
    assert_int_equal(cold_get(&C, &C.closes), 1);
}

static void test_peek_changes_nothing(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(true, 250);
    kvt_pcache_put(pc, sentry_seq(100, 4, "", 1, 100, true), NULL);
    kvt_pcache_put(pc, sentry_seq(200, 4, "", 1, 100, true), NULL);
    assert_int_equal(kvt_pcache_peek_prefix_len(pc, (int32_t[]){100, 101, 102, 9}, 4, ""), 3);
    assert_int_equal(kvt_pcache_peek_prefix_len(pc, (int32_t[]){100, 101, 102, 9}, 4, "z"), 0);
    struct kvt_pcache_stats st;
    stats(pc, &st);
    assert_int_equal(st.hits, 0);
    assert_int_equal(st.misses, 0);
    kvt_pcache_put(pc, sentry_seq(300, 4, "", 1, 100, true), NULL);
    /* No LRU bump either: the oldest (100…) was evicted. */
    assert_false(kvt_pcache_find_exact(pc, (int32_t[]){100, 101, 102, 103}, 4, ""));
    assert_true(kvt_pcache_find_exact(pc, (int32_t[]){200, 201, 202, 203}, 4, ""));
    assert_false(kvt_pcache_find_exact(pc, (int32_t[]){200, 201, 202}, 3, ""));
    assert_false(kvt_pcache_find_exact(pc, (int32_t[]){200, 201, 202, 203}, 4, "z"));
    kvt_pcache_close(pc);
}

static void test_on_put_hook(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(false, 150);
    kvt_pcache_put(pc, sentry_seq(5, 3, "ad", 1, 100, true), NULL);
    assert_int_equal(on_put_calls, 1);
    assert_int_equal(on_put_n, 3);
    assert_memory_equal(on_put_tok, ((int32_t[]){5, 6, 7}), 3 * sizeof(int32_t));
    assert_string_equal(on_put_ns, "ad");
    kvt_pcache_put(pc, sentry_seq(5, 3, NULL, 1, 200, true), NULL); /* oversize: no hook */
    assert_int_equal(on_put_calls, 1);
    kvt_pcache_put(pc, sentry_seq(9, 2, NULL, 1, 100, true), NULL); /* evicts the first */
    assert_int_equal(on_put_calls, 2);
    assert_string_equal(on_put_ns, "");
    kvt_pcache_close(pc);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(false, 1 << 20);
    kvt_retain *r;
    assert_int_equal(kvt_retain_new(count_hook, &hook_runs, &r), 0);
    assert_int_equal(kvt_pcache_put(pc, NULL, r), -EINVAL);
    assert_int_equal(hook_runs, 1); /* ownership taken on every path */
    assert_int_equal(kvt_pcache_put(NULL, NULL, NULL), -EINVAL);
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take(pc, NULL, 3, "", &t), -EINVAL);
    assert_null(t.entry);
    struct kvt_flush_report rep;
    assert_int_equal(kvt_pcache_flush(pc, 0, &rep), 0); /* no cold tier: nothing to write */
    assert_true(rep.durable);
    assert_null(kvt_pcache_store(pc));
    kvt_pcache_close(pc);
    kvt_pcache_close(NULL);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_take_miss_counts),
        T(test_take_clones_trimmed_and_keeps_donor),
        T(test_take_leaves_one_token),
        T(test_take_untrimmable_donor),
        T(test_take_namespaces_are_separate),
        T(test_take_longest_then_earliest),
        T(test_cold_strictly_longer_wins),
        T(test_cold_tie_goes_to_ram),
        T(test_cold_hit_without_donor_is_a_miss),
        T(test_cold_untrimmable_tail_falls_back),
        T(test_cold_restore_miss_and_trim_failure_degrade),
        T(test_take_clone_failure_returns_error),
        T(test_put_oversize_spills_without_hook),
        T(test_put_replaces_duplicates_without_spill),
        T(test_put_supersedes_ancestors_only_when_trimmable),
        T(test_lru_eviction_spills_and_spares_fresh),
        T(test_eviction_spill_owns_clones),
        T(test_eviction_clone_failure_skips_spill),
        T(test_eviction_sink_failure_skips_spill),
        T(test_sync_spill_without_owned_sink),
        T(test_retain_hook_runs_once_after_last_holder),
        T(test_demote_idle_without_cold_is_a_noop),
        T(test_demote_idle_spills_idle_entries),
        T(test_clear_never_spills),
        T(test_peek_changes_nothing),
        T(test_on_put_hook),
        T(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
