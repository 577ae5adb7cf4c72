/*
 * A second host for the remote-tier suites: its own process and its own local directory,
 * sharing only the Redis server with the suite.
 *   remote_peer put  URL DIR SEED N COUNT    store COUNT entries (seeds SEED..), upload them
 *   remote_peer take URL DIR SEED N WAIT_MS  find entry SEED through the remote within
 *                                            WAIT_MS, compare it byte for byte, check that
 *                                            it was promoted into DIR
 * Prints one line of results; exit 0 on success.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "support/redis_srv.h"
#include "support/support.h"

static kvt_pcache *open_pc(const char *url, const char *dir)
{
    static struct kvt_remote_opts ro;
    kvt_remote_opts_init(&ro);
    ro.url = url;
    ro.poll_ms = 100;
    ro.timeout_ms = 3000;
    struct kvt_pcache_opts o;
    kvt_pcache_opts_init(&o);
    o.cold_dir = dir;
    o.cold.model_id = REMOTE_MODEL;
    o.cold.config_fingerprint = REMOTE_FP;
    o.cold.tokenizer_hash = REMOTE_TOK;
    o.snapshot_debounce_ms = 0;
    o.remote = &ro;
    kvt_pcache *pc = NULL;
    if (kvt_pcache_open(&o, &pc) < 0)
        fprintf(stderr, "open: %s\n", kvt_last_error());
    return pc;
}

static int do_put(kvt_pcache *pc, uint64_t seed, size_t n, int count)
{
    int32_t *tok = malloc(n * sizeof(*tok));
    for (int k = 0; k < count; k++) {
        remote_tokens(seed + (uint64_t)k, n, tok);
        kvt_pcache_put(pc, synth_random_entry(tok, n, seed + (uint64_t)k, "m", "f", "t"), NULL);
    }
    free(tok);
    struct kvt_flush_report r;
    kvt_pcache_flush(pc, 60000, &r);
    kvt_remote_drain(kvt_pcache_remote(pc), 60000);
    struct kvt_remote_stats st;
    kvt_remote_get_stats(kvt_pcache_remote(pc), &st);
    printf("durable=%d puts=%llu failures=%llu\n", r.durable, (unsigned long long)st.puts,
           (unsigned long long)st.put_failures);
    return r.durable && st.puts == (uint64_t)count ? 0 : 1;
}

static bool same_bytes(const struct kvt_entry *got, uint64_t seed, const int32_t *tok, size_t n)
{
    struct kvt_entry *want = synth_random_entry(tok, n, seed, "m", "f", "t");
    bool same = synth_same_entry_bytes(got, want) && got->n_tokens == n &&
                !memcmp(got->tokens, tok, n * sizeof(*tok));
    kvt_entry_free(want);
    return same;
}

static int do_take(kvt_pcache *pc, uint64_t seed, size_t n, int64_t wait_ms)
{
    int32_t *tok = malloc((n + 1) * sizeof(*tok));
    remote_tokens(seed, n, tok);
    tok[n] = 7; /* one token left to compute */
    int64_t t0 = now_ms();
    struct kvt_take t = {0};
    while (now_ms() - t0 < wait_ms) {
        kvt_pcache_take(pc, tok, n + 1, "", &t);
        if (t.entry)
            break;
        msleep(20);
    }
    int64_t found_ms = now_ms() - t0;
    bool same = t.entry && t.from_remote && same_bytes(t.entry, seed, tok, n);
    kvt_entry_free(t.entry);
    kvt_retain_release(t.retain);
    struct kvt_flush_report r;
    kvt_pcache_flush(pc, 60000, &r);
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    printf("from_remote=%d identical=%d found_ms=%lld promoted=%llu\n", t.from_remote, same,
           (long long)found_ms, (unsigned long long)st.cold.entries);
    free(tok);
    return same && st.cold.entries >= 1 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: remote_peer put|take URL DIR SEED N COUNT|WAIT_MS\n");
        return 2;
    }
    kvt_pcache *pc = open_pc(argv[2], argv[3]);
    if (!pc)
        return 2;
    uint64_t seed = strtoull(argv[4], NULL, 10);
    size_t n = strtoull(argv[5], NULL, 10);
    int rc = !strcmp(argv[1], "put") ? do_put(pc, seed, n, atoi(argv[6]))
                                     : do_take(pc, seed, n, atoll(argv[6]));
    kvt_pcache_close(pc);
    return rc;
}
