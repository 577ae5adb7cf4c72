/*
 * store_stress: one of several processes hammering one small-capped store directory
 * (STORE.md §12.4). For a bounded time it stores, finds, restores, refreshes and reopens at
 * random, with entries whose tensor bytes derive from their tokens, so every restore is
 * checked byte for byte. Some puts run gated and slow (a run_exclusive that sleeps before
 * each step), so their .tmp files outlive the short reaping grace and only their lock keeps
 * other processes' scans from reaping them (the grace is 200 ms, the pauses 300 ms).
 *
 * With "share" after the cap the store keeps shared prefixes once (docs/SHARING.md) and the
 * prompts run up to 800 tokens, so that conversations share 256-token chunks.
 *
 * Usage: store_stress DIR ID SECONDS CAP_BYTES [share]
 * Prints one summary line. Exit 0 only if no restore returned wrong bytes, no put failed, no
 * .tmp was reaped, no file was found corrupt and no warning was logged.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvtier.h"
#include "support/synth.h"

#define MAX_TOK 800

static const char *const MODEL = "stress/model";
static const char *const FP = "fp-stress";
static const char *const TOKH = "tk-stress";

static uint64_t rng;
static unsigned long warnings;
static bool share;
static size_t max_tok = 64; /* MAX_TOK with share */

static uint64_t next(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}

static size_t rnd(size_t n)
{
    return (size_t)(next() % n);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void on_log(void *ud, int level, const char *msg)
{
    (void)ud;
    if (level >= KVT_LOG_WARN) {
        warnings++;
        fprintf(stderr, "store_stress: warning: %s\n", msg);
    }
}

static struct kvt_entry *synth(const int32_t *tok, size_t n, bool trimmable)
{
    struct kvt_entry *e;
    return synth_entry(tok, n, "", trimmable, &e) ? NULL : e;
}

static bool same_state(const kvt_cache *a, const kvt_cache *b)
{
    struct kvt_tensor ta[KVT_MAX_CACHE_TENSORS], tb[KVT_MAX_CACHE_TENSORS];
    int na = kvt_cache_state(a, ta), nb = kvt_cache_state(b, tb);
    bool same = na > 0 && na == nb;
    for (int i = 0; i < na; i++) {
        if (same) {
            size_t bytes = kvt_tensor_nbytes(&ta[i]);
            uint8_t *x = malloc(bytes + 1), *y = malloc(bytes + 1);
            same = x && y && bytes == kvt_tensor_nbytes(&tb[i]);
            if (same) {
                kvt_tensor_copy_out(&ta[i], x);
                kvt_tensor_copy_out(&tb[i], y);
                same = !memcmp(x, y, bytes);
            }
            free(x);
            free(y);
        }
        kvt_tensor_release(&ta[i]);
        if (i < nb)
            kvt_tensor_release(&tb[i]);
    }
    return same;
}

/* Prompts that share prefixes: a few conversations, cut anywhere, with divergent tails. */
static size_t gen_tokens(int32_t *tok)
{
    size_t base = rnd(5), n = 2 + rnd(max_tok - 2), cut = rnd(2) ? rnd(n) : n;
    for (size_t i = 0; i < n; i++)
        tok[i] = i < cut ? (int32_t)(base * 1000 + i) : (int32_t)(50000 + rnd(3));
    return n;
}

static int slow_exclusive(void *engine, kvt_step_fn step, void *arg)
{
    (void)engine;
    /* Longer than the grace: for the end of each pause only the lock protects the .tmp. */
    struct timespec d = {0, 300 * 1000000};
    nanosleep(&d, NULL);
    return step(arg);
}

static int open_store(const char *dir, uint64_t cap, kvt_store **s)
{
    struct kvt_store_opts o;
    kvt_store_opts_init(&o);
    o.model_id = MODEL;
    o.config_fingerprint = FP;
    o.tokenizer_hash = TOKH;
    if (cap)
        o.max_bytes = cap;
    o.tmp_grace_ms = 200; /* covers create-to-lock even on a loaded machine */
    o.share_prefixes = share;
    o.log = on_log;
    int rc = kvt_store_open(dir, &o, s);
    if (rc)
        fprintf(stderr, "store_stress: open: %s\n", kvt_last_error());
    return rc;
}

struct totals {
    unsigned long puts, slow_puts, hits, restores, misses, refreshes, reopens, bad;
    uint64_t store_failures, tmp_reaped, corrupt_files;
};

static void add_stats(kvt_store *s, struct totals *t)
{
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    t->store_failures += st.store_failures;
    t->tmp_reaped += st.tmp_reaped;
    t->corrupt_files += st.corrupt_files;
}

static void check_restore(kvt_store *s, const int32_t *prompt, size_t n, struct totals *t)
{
    struct kvt_hit hit;
    if (kvt_store_find(s, prompt, n, "", &hit)) {
        t->bad++;
        return;
    }
    if (!hit.prefix_len)
        return;
    t->hits++;
    struct kvt_entry *e;
    if (kvt_store_restore(s, &hit, &e)) {
        t->bad++;
        return;
    }
    if (!e) {
        t->misses++; /* removed by another process (or evicted) since the find: allowed */
        return;
    }
    t->restores++;
    bool ok = e->n_tokens == hit.n_tokens && hit.prefix_len < n && hit.prefix_len <= e->n_tokens &&
              !memcmp(e->tokens, prompt, hit.prefix_len * sizeof(*prompt));
    struct kvt_entry *want = ok ? synth(e->tokens, e->n_tokens, e->n_caches == 1) : NULL;
    ok = ok && want && want->n_caches == e->n_caches;
    for (size_t i = 0; ok && i < e->n_caches; i++)
        ok = same_state(e->caches[i], want->caches[i]);
    if (!ok) {
        fprintf(stderr, "store_stress: restore returned wrong bytes (%zu tokens)\n", e->n_tokens);
        t->bad++;
    }
    kvt_entry_free(want);
    kvt_entry_free(e);
}

int main(int argc, char **argv)
{
    if (argc != 5 && !(argc == 6 && !strcmp(argv[5], "share"))) {
        fprintf(stderr, "usage: store_stress DIR ID SECONDS CAP_BYTES [share]\n");
        return 2;
    }
    share = argc == 6;
    max_tok = share ? MAX_TOK : 64;
    const char *dir = argv[1];
    int id = atoi(argv[2]);
    double secs = atof(argv[3]);
    uint64_t cap = strtoull(argv[4], NULL, 10);
    rng = 0x9e3779b97f4a7c15ull * (uint64_t)(id + 1) ^ (uint64_t)getpid();
    kvt_store *s;
    if (open_store(dir, cap, &s))
        return 2;
    struct totals t = {0};
    int32_t tok[MAX_TOK + 1];
    double end = now_s() + secs;
    while (now_s() < end && !t.bad) {
        size_t what = rnd(100);
        if (what < 35) {
            size_t n = gen_tokens(tok);
            bool slow = rnd(8) == 0;
            struct kvt_entry *e = synth(tok, n, rnd(10) < 7);
            if (!e) {
                t.bad++;
                break;
            }
            int rc = kvt_store_put(s, e, slow ? slow_exclusive : NULL, NULL);
            kvt_entry_free(e);
            if (rc) {
                fprintf(stderr, "store_stress: put: %s\n", kvt_last_error());
                t.bad++;
            }
            t.puts++;
            t.slow_puts += slow;
        } else if (what < 80) {
            size_t n = gen_tokens(tok);
            tok[n] = (int32_t)(60000 + rnd(2));
            check_restore(s, tok, n + rnd(2), &t);
        } else if (what < 92) {
            if (kvt_store_refresh(s)) {
                fprintf(stderr, "store_stress: refresh: %s\n", kvt_last_error());
                t.bad++;
            }
            t.refreshes++;
        } else if (what < 96) {
            size_t n = gen_tokens(tok);
            (void)kvt_store_has_durable_prefix(s, tok, n, "");
        } else {
            add_stats(s, &t);
            kvt_store_close(s);
            if (open_store(dir, cap, &s))
                return 2;
            t.reopens++;
        }
    }
    add_stats(s, &t);
    kvt_store_close(s);
    printf("store_stress %d: %lu puts (%lu slow), %lu hits, %lu restores, %lu misses, %lu "
           "refreshes, %lu reopens; %lu bad, %llu store failures, %llu tmp reaped, %llu corrupt, "
           "%lu warnings\n",
           id, t.puts, t.slow_puts, t.hits, t.restores, t.misses, t.refreshes, t.reopens, t.bad,
           (unsigned long long)t.store_failures, (unsigned long long)t.tmp_reaped,
           (unsigned long long)t.corrupt_files, warnings);
    bool ok =
        !t.bad && !t.store_failures && !t.tmp_reaped && !t.corrupt_files && !warnings && t.puts > 0;
    return ok ? 0 : 1;
}
