/*
 * Write-behind snapshots, the durable flush and idle demotion (TIER.md §5–§7) over stubs:
 * debounced snapshots keyed by exact tokens, the engine gate around every blocking step
 * (clone and N + 1 write steps), refusing and failing gates that are counted and leak
 * nothing, failed snapshots that stay dirty and are retried, missing entries, busy
 * postponement, single-flight flush with timeout, and the demotion tick.
 */
#include "test_tier_stubs.h"

static struct kvt_store C;
static struct gate G;

static int setup(void **state)
{
    (void)state;
    world_reset();
    log_reset();
    cold_init(&C);
    gate_init(&G);
    atomic_store(&stub_busy_flag, false);
    atomic_store(&stub_busy_calls, 0);
    atomic_store(&stub_now, 1000000);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    assert_int_equal(world_get(&W.caches_live), 0);
    assert_int_equal(world_get(&W.bufs_live), 0);
    assert_int_equal(cold_get(&C, &C.open_tmp), 0); /* no write left anything open */
    cold_destroy(&C);
    gate_destroy(&G);
    return 0;
}

struct opts {
    int64_t debounce_ms, retry_ms;
    bool write_behind_off;
    int64_t demote_idle_ms, demote_interval_ms;
    uint64_t ram_max;
};

static kvt_pcache *open_tier(const struct opts *o)
{
    struct kvt_tier_cfg cfg = {
        .cache = &stub_cache_ops,
        .cold = &stub_cold_ops,
        .store = &C,
        .ram_max_bytes = o->ram_max ? o->ram_max : 1 << 20,
        .spill_queue_max_bytes = 1 << 30,
        .write_behind = !o->write_behind_off,
        .demote_idle_ms = o->demote_idle_ms,
        .demote_interval_ms = o->demote_interval_ms,
        .snapshot_debounce_ms = o->debounce_ms,
        .snapshot_busy_retry_ms = o->retry_ms ? o->retry_ms : 5000,
        .flush_timeout_ms = 60000,
        .run_exclusive = gate_run,
        .busy = stub_busy,
        .engine = &G,
        .wall_ms = stub_wall,
        .log = stub_log,
    };
    kvt_pcache *pc = NULL;
    assert_int_equal(kvt_tier_open(&cfg, &pc), 0);
    return pc;
}

static uint64_t pending_snapshots(kvt_pcache *pc)
{
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    return st.pending_snapshots;
}

static uint64_t records(kvt_pcache *pc)
{
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    return st.records;
}

static const int32_t A[] = {1, 2, 3, 4, 5};
static const int32_t B[] = {6, 7, 8, 9, 10}; /* same length as A */

static void put(kvt_pcache *pc, const int32_t *tok, size_t n)
{
    assert_int_equal(kvt_pcache_put(pc, sentry_new(tok, n, "", 1, 100, true), NULL), 0);
}

static void test_snapshot_after_debounce(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(&(struct opts){.debounce_ms = 5});
    put(pc, A, 5);
    WAIT_FOR(cold_has(&C, A, 5, ""));
    WAIT_FOR(pending_snapshots(pc) == 0);
    assert_int_equal(records(pc), 1); /* write-behind copies; RAM keeps the entry */
    assert_int_equal(cold_get(&C, &C.put_ok), 1);
    /* One gated clone step plus three gated write steps (two tensors). */
    assert_int_equal(gate_get(&G, &G.ran), 4);
    kvt_pcache_close(pc);
}

static void test_equal_length_prompts_keep_separate_snapshots(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(&(struct opts){.debounce_ms = 600000});
    put(pc, A, 5);
    put(pc, B, 5);
    assert_int_equal(pending_snapshots(pc), 2);
    struct kvt_flush_report r;
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_true(r.durable);
    assert_int_equal(r.pending_snapshots, 0);
    assert_int_equal(r.entries, 2);
    assert_int_equal(r.longest_durable_prefix_tokens, 5);
    assert_true(cold_has(&C, A, 5, ""));
    assert_true(cold_has(&C, B, 5, ""));
    kvt_pcache_close(pc);
}

static void test_same_key_coalesces(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(&(struct opts){.debounce_ms = 600000});
    put(pc, A, 5);
    put(pc, A, 5);
    assert_int_equal(pending_snapshots(pc), 1);
    struct kvt_flush_report r;
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_true(r.durable);
    assert_int_equal(cold_get(&C, &C.puts), 1);
    kvt_pcache_close(pc);
}

static void test_failed_snapshot_stays_dirty_and_is_retried(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(&(struct opts){.debounce_ms = 600000, .retry_ms = 600000});
    C.fail_puts = 1;
    put(pc, A, 5);
    struct kvt_flush_report r;
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_false(r.durable);
    assert_int_equal(r.failed, 1);
    assert_int_equal(r.pending_snapshots, 1);
    assert_int_equal(r.entries, 0);
    assert_false(cold_has(&C, A, 5, ""));
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    assert_int_equal(st.failed_spills, 1);
    assert_int_equal(st.pending_snapshots, 1);

    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_true(r.durable);
    assert_int_equal(r.failed, 0); /* failures count per flush */
    assert_int_equal(r.pending_snapshots, 0);
    assert_true(cold_has(&C, A, 5, ""));
    kvt_pcache_close(pc);
}

static void test_busy_postpones_timer_snapshots(void **state)
{
    (void)state;
    atomic_store(&stub_busy_flag, true);
    kvt_pcache *pc = open_tier(&(struct opts){.debounce_ms = 1, .retry_ms = 1});
    put(pc, A, 5);
    WAIT_FOR(atomic_load(&stub_busy_calls) >= 3); /* re-armed on every busy tick */
    assert_int_equal(cold_get(&C, &C.puts), 0);
    assert_int_equal(gate_get(&G, &G.calls), 0); /* busy never leads to an exclusion call */
    assert_int_equal(pending_snapshots(pc), 1);
    atomic_store(&stub_busy_flag, false);
    WAIT_FOR(cold_has(&C, A, 5, ""));
    WAIT_FOR(pending_snapshots(pc) == 0);
    kvt_pcache_close(pc);
}

static void test_forced_flush_ignores_busy(void **state)
{
    (void)state;
    atomic_store(&stub_busy_flag, true);
    kvt_pcache *pc = open_tier(&(struct opts){.debounce_ms = 600000});
    put(pc, A, 5);
    struct kvt_flush_report r;
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_true(r.durable);
    assert_true(cold_has(&C, A, 5, ""));
    kvt_pcache_close(pc);
}

static void test_missing_and_durable_prefix(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(&(struct opts){.debounce_ms = 600000});
    put(pc, A, 5);
    kvt_pcache_clear(pc); /* left RAM without reaching the disk */
    struct kvt_flush_report r;
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_false(r.durable);
    assert_int_equal(r.missing, 1);
    assert_int_equal(r.pending_snapshots, 0); /* missing clears the key */
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_true(r.durable);
    assert_int_equal(r.missing, 0);

    /* Gone from RAM but a longer trimmable entry on disk covers it: stored. */
    int32_t longer[8] = {6, 7, 8, 9, 10, 11, 12, 13};
    cold_insert(&C, longer, 8, "", true, 1, 100);
    put(pc, B, 5);
    kvt_pcache_clear(pc);
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_true(r.durable);
    assert_int_equal(r.missing, 0);

    /* An untrimmable longer entry does not. */
    int32_t ring[8] = {20, 21, 22, 23, 24, 25, 26, 27};
    cold_insert(&C, ring, 8, "", false, 1, 100);
    put(pc, ring, 5);
    kvt_pcache_clear(pc);
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_false(r.durable);
    assert_int_equal(r.missing, 1);
    kvt_pcache_close(pc);
}

static void test_refusing_gate_is_counted_and_leaks_nothing(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(&(struct opts){.debounce_ms = 600000, .retry_ms = 600000});
    put(pc, A, 5);
    gate_refuse_from(&G, 2); /* the clone step runs, the first write step is refused */
    struct kvt_flush_report r;
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_false(r.durable);
    assert_int_equal(r.failed, 1);
    assert_int_equal(r.pending_snapshots, 1);
    assert_int_equal(r.pending_spills, 0);
    assert_int_equal(cold_get(&C, &C.refused_puts), 1);
    assert_int_equal(cold_get(&C, &C.open_tmp), 0);
    assert_int_equal(world_get(&W.caches_live), 1); /* the snapshot clone was released */

    gate_refuse_from(&G, 1); /* now even the clone step is refused: nothing is enqueued */
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_false(r.durable);
    assert_int_equal(r.failed, 0);
    assert_int_equal(r.pending_snapshots, 1);
    assert_int_equal(cold_get(&C, &C.puts), 1);

    gate_refuse_from(&G, 0);
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_true(r.durable);
    assert_true(cold_has(&C, A, 5, ""));
    kvt_pcache_close(pc);
}

static void test_failing_write_step_keeps_queue_going(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(&(struct opts){.debounce_ms = 600000, .ram_max = 150});
    C.fail_step = 2;
    put(pc, A, 5);
    put(pc, B, 5); /* evicts A: its spill fails at write step 2 */
    struct kvt_flush_report r;
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_false(r.durable);
    assert_int_equal(cold_get(&C, &C.open_tmp), 0);
    assert_true(r.failed >= 1);
    C.fail_step = 0;
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_true(r.durable);
    assert_true(cold_has(&C, B, 5, ""));
    assert_false(cold_has(&C, A, 5, "")); /* A's spill failed and A left RAM: lost */
    kvt_pcache_close(pc);
}

struct flush_arg {
    kvt_pcache *pc;
    int64_t timeout;
    struct kvt_flush_report r;
    int rc;
};

static void *flush_thread(void *p)
{
    struct flush_arg *a = p;
    a->rc = kvt_pcache_flush(a->pc, a->timeout, &a->r);
    return NULL;
}

static void test_concurrent_flushes_share_one_run(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(&(struct opts){.debounce_ms = 600000});
    put(pc, A, 5);
    put(pc, B, 5);
    gate_block(&G, true);
    struct flush_arg a1 = {pc, -1, {0}, -1}, a2 = {pc, -1, {0}, -1};
    pthread_t t1, t2;
    pthread_create(&t1, NULL, flush_thread, &a1);
    gate_wait_held(&G, 1); /* the first flush is inside the gate */
    pthread_create(&t2, NULL, flush_thread, &a2);
    usleep(5000);
    gate_block(&G, false);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    assert_int_equal(a1.rc, 0);
    assert_int_equal(a2.rc, 0);
    assert_true(a1.r.durable);
    assert_true(a2.r.durable);
    assert_int_equal(a2.r.entries, 2);
    assert_int_equal(cold_get(&C, &C.puts), 2); /* one write per key, not per caller */
    kvt_pcache_close(pc);
}

static void test_flush_timeout(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(&(struct opts){.debounce_ms = 600000});
    put(pc, A, 5);
    gate_block(&G, true);
    struct flush_arg a = {pc, 30, {0}, 0};
    pthread_t t;
    pthread_create(&t, NULL, flush_thread, &a);
    gate_wait_held(&G, 1);
    /* The snapshot's clone step is held by the engine: the flush gives up. */
    struct flush_arg b = {pc, 30, {0}, 0};
    flush_thread(&b); /* joins the running flush and times out with it, or on its own */
    assert_int_equal(b.rc, KVT_E_TIMEOUT);
    assert_false(b.r.durable);
    gate_block(&G, false);
    pthread_join(t, NULL);
    struct kvt_flush_report r;
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_true(r.durable);
    assert_true(cold_has(&C, A, 5, ""));
    kvt_pcache_close(pc);
}

static void test_put_during_attempt_stays_dirty(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(&(struct opts){.debounce_ms = 1});
    gate_block(&G, true);
    put(pc, A, 5);
    gate_wait_held(&G, 1); /* the timer's attempt waits for the engine */
    put(pc, A, 5);         /* a newer entry under the same key */
    gate_block(&G, false);
    /* The running attempt stores one version; the re-put re-arms the key for another. */
    WAIT_FOR(cold_get(&C, &C.put_ok) >= 2 && pending_snapshots(pc) == 0);
    kvt_pcache_close(pc);
}

static void test_write_behind_off_still_spills(void **state)
{
    (void)state;
    kvt_pcache *pc =
        open_tier(&(struct opts){.debounce_ms = 1, .write_behind_off = true, .ram_max = 150});
    put(pc, A, 5);
    assert_int_equal(pending_snapshots(pc), 0);
    struct kvt_flush_report r;
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_true(r.durable);
    assert_int_equal(cold_get(&C, &C.puts), 0);
    put(pc, B, 5); /* evicts A: spill-on-evict works regardless */
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_true(cold_has(&C, A, 5, ""));
    assert_false(cold_has(&C, B, 5, ""));
    kvt_pcache_close(pc);
}

static void test_close_does_not_flush(void **state)
{
    (void)state;
    kvt_pcache *pc = open_tier(&(struct opts){.debounce_ms = 600000});
    put(pc, A, 5);
    put(pc, B, 5);
    kvt_pcache_close(pc);
    assert_int_equal(cold_get(&C, &C.puts), 0);
    assert_int_equal(cold_get(&C, &C.closes), 1);
}

static void test_demotion_tick(void **state)
{
    (void)state;
    atomic_store(&stub_busy_flag, true);
    kvt_pcache *pc = open_tier(
        &(struct opts){.debounce_ms = 600000, .demote_idle_ms = 1000, .demote_interval_ms = 2});
    put(pc, A, 5);
    atomic_store(&stub_now, 1000000 + 5000);
    WAIT_FOR(atomic_load(&stub_busy_calls) >= 3); /* ticks skipped while busy */
    assert_int_equal(records(pc), 1);
    atomic_store(&stub_busy_flag, false);
    WAIT_FOR(log_has("[ssd-cache] demoted 1 idle entry to disk")); /* logged after the pass */
    assert_int_equal(records(pc), 0);
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    assert_int_equal(st.demotions, 1);
    struct kvt_flush_report r;
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_true(r.durable); /* the snapshot key is satisfied by the demoted copy */
    assert_true(cold_has(&C, A, 5, ""));
    kvt_pcache_close(pc);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_snapshot_after_debounce),
        T(test_equal_length_prompts_keep_separate_snapshots),
        T(test_same_key_coalesces),
        T(test_failed_snapshot_stays_dirty_and_is_retried),
        T(test_busy_postpones_timer_snapshots),
        T(test_forced_flush_ignores_busy),
        T(test_missing_and_durable_prefix),
        T(test_refusing_gate_is_counted_and_leaks_nothing),
        T(test_failing_write_step_keeps_queue_going),
        T(test_concurrent_flushes_share_one_run),
        T(test_flush_timeout),
        T(test_put_during_attempt_stays_dirty),
        T(test_write_behind_off_still_spills),
        T(test_close_does_not_flush),
        T(test_demotion_tick),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
