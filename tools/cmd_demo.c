/*
 * `kvtier demo`: an inference server's life on a local directory store, through the public
 * API only. A multi-turn conversation with Llama-3-8B's KV geometry is served from the RAM
 * prompt cache with write-behind to disk (each turn takes the cached prefix, "prefills" the
 * new prompt tokens and "decodes" the reply by appending deterministic pseudo-random KV),
 * the cache is flushed, the server "restarts" (everything closed and reopened), and the next
 * turn's longest prefix comes back from disk. The restored state is checked byte for byte
 * (hash of the state bytes) against what was built, and the restore time is set against an
 * estimate of the prefill it saves.
 */
#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "cli.h"

#define FINGERPRINT "kvtier-demo-llama3-8b-bf16"
#define MAX_TURNS 16

struct demo_opts {
    const char *dir;
    int turns;
    size_t tokens;      /* conversation length after the last turn */
    double prefill_tps; /* assumed prefill rate of the estimate */
};

struct demo {
    const struct demo_opts *o;
    const struct bench_model *m;
    bool tty;
    int32_t *tok; /* the whole conversation, then the next prompt */
    size_t n_tok;
};

static double now_s(void)
{
    return bench_now();
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* A progress bar on stderr when it is a terminal; nothing otherwise (the steps print lines). */
static void bar(const struct demo *d, const char *what, double frac)
{
    if (!d->tty)
        return;
    int w = 30, full = (int)(frac * w + 0.5);
    fprintf(stderr, "\r\033[K  [");
    for (int i = 0; i < w; i++)
        fputc(i < full ? '#' : '.', stderr);
    fprintf(stderr, "] %3.0f%% %s", frac * 100, what);
    fflush(stderr);
}

static void bar_done(const struct demo *d)
{
    if (d->tty) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
}

static void log_line(void *ud, int level, const char *msg)
{
    (void)ud;
    if (level >= KVT_LOG_INFO)
        say("    log: %s\n", msg);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

static void mib(char *buf, size_t n, uint64_t bytes)
{
    snprintf(buf, n, "%.0f MiB", (double)bytes / (1024.0 * 1024.0));
}

static void opts_for(const struct demo *d, struct kvt_pcache_opts *po)
{
    kvt_pcache_opts_init(po);
    po->ram_max_bytes = 8ull << 30;
    po->cold_dir = d->o->dir;
    po->cold.model_id = "meta-llama/Meta-Llama-3-8B-Instruct";
    po->cold.config_fingerprint = FINGERPRINT;
    po->cold.tokenizer_hash = "demo-tokenizer";
    po->cold.n_layers = (size_t)d->m->layers;
    po->snapshot_debounce_ms = 100; /* the reply is done: snapshot soon */
    po->log = log_line;
}

/* Deterministic token ids of the conversation. */
static void make_tokens(int32_t *tok, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t v;
        bench_fill(&v, sizeof(v), &seed);
        tok[i] = (int32_t)(v % 128000);
    }
}

/*
 * One turn: take the cached prefix of the prompt tok[0, prompt), prefill the rest of the
 * prompt, decode up to @p end, and put the result back. *@p hash receives the state hash.
 */
static int serve_turn(struct demo *d, kvt_pcache *pc, int turn, size_t prompt, size_t end,
                      uint64_t *hash, size_t *cached)
{
    struct kvt_take tk = {0};
    struct kvt_entry *e = NULL;
    kvt_cache **caches = NULL;
    int rc = kvt_pcache_take(pc, d->tok, prompt, NULL, &tk);
    if (rc < 0)
        return cli_error("take", rc);
    *cached = tk.entry ? tk.entry->n_tokens : 0;
    size_t nl = (size_t)d->m->layers;
    caches = calloc(nl, sizeof(*caches));
    if (!caches) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t l = 0; l < nl; l++) {
        if (tk.entry) {
            caches[l] = tk.entry->caches[l];
            tk.entry->caches[l] = NULL;
        } else {
            struct kvt_cache_info kv = {.kind = KVT_KIND_KV};
            rc = kvt_cache_new(&kv, &caches[l]);
            if (rc < 0)
                goto out;
        }
        /* the same bytes for the same (layer, turn) on every run */
        uint64_t rng = ((uint64_t)l + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)(turn + 1) << 48;
        rc = bench_cache_append_random(caches[l], d->m, prompt - *cached, &rng);
        if (rc == 0)
            rc = bench_cache_append_random(caches[l], d->m, end - prompt, &rng);
        if (rc < 0)
            goto out;
        char what[96];
        snprintf(what, sizeof(what), "turn %d: layer %zu/%zu", turn + 1, l + 1, nl);
        bar(d, what, (double)(l + 1) / (double)nl);
    }
    bar_done(d);
    rc = kvt_entry_new(d->tok, end, caches, nl, NULL, &e);
    if (rc < 0)
        goto out;
    free(caches); /* the entry owns the caches now */
    caches = NULL;
    rc = bench_entry_state_hash(e, hash);
    if (rc == 0) {
        rc = kvt_pcache_put(pc, e, tk.retain); /* takes both on every path */
        tk.retain = NULL;
        e = NULL;
    }
out:
    if (caches) {
        for (size_t l = 0; l < nl; l++)
            kvt_cache_free(caches[l]);
        free(caches);
    }
    kvt_entry_free(e);
    kvt_entry_free(tk.entry); /* the caches moved out are NULL in it: frees the rest */
    kvt_retain_release(tk.retain);
    return rc < 0 ? cli_error("serving a turn", rc) : 0;
}

static int parse(int argc, char **argv, struct demo_opts *o)
{
    o->dir = "kvtier-demo-store";
    o->turns = 4;
    o->tokens = 16384;
    o->prefill_tps = 5000;
    for (int i = 1; i < argc; i++) {
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(argv[i], "--dir") && next) {
            o->dir = argv[++i];
        } else if (!strcmp(argv[i], "--turns") && next) {
            o->turns = (int)strtol(argv[++i], &end, 10);
            if (*end || o->turns < 1 || o->turns > MAX_TURNS)
                return -1;
        } else if (!strcmp(argv[i], "--tokens") && next) {
            o->tokens = (size_t)strtoull(argv[++i], &end, 10);
            if (*end || o->tokens < 1024 || o->tokens > 131072)
                return -1;
        } else if (!strcmp(argv[i], "--prefill-tps") && next) {
            o->prefill_tps = strtod(argv[++i], &end);
            if (*end || !(o->prefill_tps > 0))
                return -1;
        } else {
            return -1;
        }
    }
    return 0;
}

int cmd_demo(int argc, char **argv)
{
    struct demo_opts o;
    const char *usage = "demo [--dir D] [--turns N] [--tokens T] [--prefill-tps R]";
    if (cli_wants_help(argc, argv))
        return cli_usage(stdout, usage, 0);
    if (parse(argc, argv, &o) < 0)
        return cli_usage(stderr, usage, EXIT_USAGE);
    struct demo d = {.o = &o, .m = &bench_llama3_8b, .tty = isatty(STDERR_FILENO) == 1};
    size_t next_user = 700;
    d.n_tok = o.tokens + next_user;
    d.tok = malloc(d.n_tok * sizeof(*d.tok));
    if (!d.tok)
        return cli_error("demo", -ENOMEM);
    make_tokens(d.tok, d.n_tok, 2024);
    char buf[64], root[4096];
    int rc = 0, ret = EXIT_USAGE;
    kvt_pcache *pc = NULL;
    struct kvt_pcache_opts po;
    opts_for(&d, &po);
    double t_all = now_s();

    say("kvtier demo: an inference server's life on a local directory store\n");
    say("model shape: Llama-3-8B (%d layers x %d KV heads x %d head dim, %s): %zu KiB of KV "
        "per token\n",
        d.m->layers, d.m->kv_heads, d.m->head_dim, kvt_dtype_name(d.m->dtype),
        bench_token_bytes(d.m) / 1024);
    snprintf(root, sizeof(root), "%s/%s", o.dir, FINGERPRINT);
    struct stat st;
    if (stat(root, &st) == 0) {
        nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        say("store: %s (cleared the previous run's entries)\n", root);
    } else {
        say("store: %s\n", root);
    }
    if (mkdir(o.dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "kvtier demo: %s: %s\n", o.dir, strerror(errno));
        goto out;
    }

    /* 1. serve the conversation: a system prompt, then turns of user prompt and reply */
    rc = kvt_pcache_open(&po, &pc);
    if (rc < 0) {
        ret = cli_error("opening the prompt cache", rc);
        goto out;
    }
    size_t sys = o.tokens / 43, per_turn = (o.tokens - sys) / (size_t)o.turns;
    say("\n[1/4] serving a %d-turn conversation of %zu tokens (RAM prompt cache, write-behind "
        "to disk)\n",
        o.turns, o.tokens);
    uint64_t built_hash = 0;
    size_t at = 0;
    for (int t = 0; t < o.turns; t++) {
        size_t end = t == o.turns - 1 ? o.tokens : sys + per_turn * (size_t)(t + 1);
        size_t prompt = at + (t == 0 ? sys : 0) + per_turn * 3 / 8; /* user part of the turn */
        size_t cached = 0;
        double t0 = now_s();
        if (serve_turn(&d, pc, t, prompt, end, &built_hash, &cached) != 0)
            goto out;
        double dt = now_s() - t0;
        struct kvt_pcache_stats ps;
        kvt_pcache_get_stats(pc, &ps);
        mib(buf, sizeof(buf), (uint64_t)end * bench_token_bytes(d.m));
        say("  turn %d: prompt %zu tokens (%zu cached in RAM, %zu prefilled) + %zu generated "
            "-> %zu tokens, %s of KV, %.2f s; on disk so far: %llu entries, %llu tokens\n",
            t + 1, prompt, cached, prompt - cached, end - prompt, end, buf, dt,
            (unsigned long long)ps.cold.entries,
            (unsigned long long)ps.cold.longest_durable_prefix_tokens);
        at = end;
        if (t + 1 < o.turns) {
            struct timespec think = {0, 300 * 1000 * 1000}; /* the user reads and types */
            nanosleep(&think, NULL);
        }
    }

    /* 2. graceful shutdown: flush */
    struct kvt_flush_report fr;
    double t0 = now_s();
    if (d.tty)
        fprintf(stderr, "  flushing write-behind to disk...");
    rc = kvt_pcache_flush(pc, 60000, &fr);
    bar_done(&d);
    say("\n[2/4] shutdown flush: durable=%s, %llu entries on disk, longest durable prefix %llu "
        "tokens (%.2f s)\n",
        fr.durable ? "yes" : "no", (unsigned long long)fr.entries,
        (unsigned long long)fr.longest_durable_prefix_tokens, now_s() - t0);
    if (rc < 0 || !fr.durable) {
        fprintf(stderr, "kvtier demo: the flush did not make the cache durable\n");
        goto out;
    }

    /* 3. restart: close everything, reopen */
    t0 = now_s();
    kvt_pcache_close(pc);
    pc = NULL;
    double t_close = now_s() - t0;
    say("\n[3/4] restart: closed the prompt cache and store (%.2f s), reopening\n", t_close);
    t0 = now_s();
    rc = kvt_pcache_open(&po, &pc);
    if (rc < 0) {
        ret = cli_error("reopening the prompt cache", rc);
        goto out;
    }
    say("  reopened in %.3f s (recovery reads headers only)\n", now_s() - t0);

    /* 4. the next turn: its longest prefix comes from disk */
    struct kvt_take tk = {0};
    say("\n[4/4] next turn: prompt of %zu tokens (the conversation + a new user message)\n",
        d.n_tok);
    if (d.tty)
        fprintf(stderr, "  restoring from disk...");
    t0 = now_s();
    rc = kvt_pcache_take(pc, d.tok, d.n_tok, NULL, &tk);
    double t_restore = now_s() - t0;
    bar_done(&d);
    if (rc < 0) {
        ret = cli_error("take", rc);
        goto out;
    }
    if (!tk.entry || !tk.from_disk) {
        fprintf(stderr, "kvtier demo: expected a prefix from disk, got %s\n",
                tk.entry ? "a RAM hit" : "a miss");
        kvt_entry_free(tk.entry);
        kvt_retain_release(tk.retain);
        ret = EXIT_BAD;
        goto out;
    }
    uint64_t got_hash = 0;
    size_t restored = tk.entry->n_tokens;
    rc = bench_entry_state_hash(tk.entry, &got_hash);
    uint64_t state_bytes = (uint64_t)restored * bench_token_bytes(d.m);
    mib(buf, sizeof(buf), state_bytes);
    say("  restored a %zu-token prefix from disk: %s of KV in %.3f s (%.2f GB/s), %zu tokens "
        "left to prefill\n",
        restored, buf, t_restore, (double)state_bytes / t_restore / 1e9, d.n_tok - restored);
    bool same = rc == 0 && restored == o.tokens && got_hash == built_hash;
    say("  byte-identical: %s (hash of the state bytes: restored %016llx, built %016llx)\n",
        same ? "yes" : "NO", (unsigned long long)got_hash, (unsigned long long)built_hash);
    double prefill_s = (double)restored / o.prefill_tps;
    say("  re-prefill instead (ESTIMATE, not measured: %.0f tokens/s assumed for Llama-3-8B "
        "bf16 prefill on one A100-class GPU): %.2f s -> restore is %.1fx faster\n",
        o.prefill_tps, prefill_s, prefill_s / t_restore);
    kvt_pcache_put(pc, tk.entry, tk.retain); /* the server carries on with it */

    struct kvt_pcache_stats ps;
    kvt_pcache_get_stats(pc, &ps);
    mib(buf, sizeof(buf), ps.cold.total_bytes);
    say("\nstore stats: %llu entries, %s on disk (cap %.0f GiB), %llu restores (last %.1f ms), "
        "%llu spills, %llu store failures, %llu evictions, %llu corrupt files, %llu restore "
        "misses, longest durable prefix %llu tokens\n",
        (unsigned long long)ps.cold.entries, buf,
        (double)ps.cold.max_bytes / (1024.0 * 1024.0 * 1024.0),
        (unsigned long long)ps.cold.restores, ps.cold.restore_ms_last,
        (unsigned long long)ps.cold.spills, (unsigned long long)ps.cold.store_failures,
        (unsigned long long)ps.cold.evictions, (unsigned long long)ps.cold.corrupt_files,
        (unsigned long long)ps.cold.restore_misses,
        (unsigned long long)ps.cold.longest_durable_prefix_tokens);
    say("RAM tier: %llu records, %llu hits, %llu misses\n", (unsigned long long)ps.records,
        (unsigned long long)ps.hits, (unsigned long long)ps.misses);
    say("demo finished in %.1f s\n", now_s() - t_all);
    ret = same ? 0 : EXIT_BAD;
out:
    kvt_pcache_close(pc);
    free(d.tok);
    return ret;
}
