/*
 * `kvtier-llama bench`: kvtier as the prompt cache of a live llama.cpp context holding an
 * 8k-token prefill of the demo model, against limits measured in the same run on the same
 * directory (bench/harness/bench_raw.c, the baselines `kvtier bench` uses):
 *   restore: kvt_llama_load() from a cold file into the context, against a raw read of the
 *            same file's bytes (O_DIRECT, several reads in flight) plus
 *            llama_state_seq_set_data() of the same state from memory;
 *   save:    kvt_llama_save() + kvt_llama_flush() (durable), against
 *            llama_state_seq_get_data() plus a raw durable write of those bytes (the faster
 *            of buffered and O_DIRECT by median); each starts with no earlier file to replace;
 *   prefill: the time to compute the same context again, the cost a restore saves.
 * Each repetition times both sides back to back, in alternating order; ratios are limit
 * time / kvtier time (above 1: faster than the limit), medians over the repetitions. The
 * restores start with one pair outside the medians, the process's first restore reported apart.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "cmds.h"
#include "engine.h"

#define MAX_REPEAT 64

struct bench_args {
    const char *dir, *model;
    size_t tokens;
    int repeat;
    bool json;
};

struct bench_run {
    struct engine e;
    kvt_llama *kl;
    llama_token *tok;
    size_t n;
    uint8_t *blob; /* the state as llama.cpp gives it */
    size_t blob_size;
    char *raw_path, *entry_path;
    uint64_t file_size;
    double prefill, get;
    double first_load; /* the process's first restore, outside the medians */
    double save[MAX_REPEAT], save_lim[MAX_REPEAT], save_ratio[MAX_REPEAT];
    double load[MAX_REPEAT], load_lim[MAX_REPEAT], load_ratio[MAX_REPEAT];
    double read[MAX_REPEAT], set[MAX_REPEAT], ram_load[MAX_REPEAT];
    double kvt_set[MAX_REPEAT + 1]; /* set_data's share of kvtier's restores */
    bool identical;
};

static int fail(const char *what)
{
    fprintf(stderr, "bench: %s: %s\n", what, kvt_last_error());
    return -1;
}

/*
 * Remove the entry an earlier save left, as the limit removes its earlier file: a save that
 * replaces an entry also unlinks the old file before it reports, which on ext4 with discard
 * takes 25-35 ms for 64 MiB and is no part of writing the new one.
 */
static int remove_saved(struct bench_run *b)
{
    kvt_store *s = kvt_pcache_store(kvt_llama_pcache(b->kl));
    struct kvt_store_record *v;
    size_t n;
    if (kvt_store_list(s, &v, &n))
        return fail("list");
    for (size_t i = 0; i < n; i++)
        unlink(v[i].path);
    kvt_store_list_free(v);
    return n && kvt_store_refresh(s) ? fail("refresh") : 0;
}

/* kvtier's save: into RAM, then durable on disk. */
static int time_save(struct bench_run *b, double *secs)
{
    kvt_pcache_clear(kvt_llama_pcache(b->kl));
    if (remove_saved(b))
        return -1;
    bench_settle_disk(b->raw_path);
    double t0 = engine_now();
    if (kvt_llama_save(b->kl, 0, b->tok, b->n) || kvt_llama_flush(b->kl, -1))
        return fail("save");
    *secs = engine_now() - t0;
    return 0;
}

/* The limit of a save: copy the state out of llama.cpp, write it durably. */
static int time_save_limit(struct bench_run *b, bool direct, double *secs)
{
    unlink(b->raw_path);
    bench_settle_disk(b->raw_path);
    double t0 = engine_now(), w;
    if (llama_state_seq_get_data(b->e.ctx, b->blob, b->blob_size, 0) != b->blob_size)
        return fail("llama_state_seq_get_data");
    struct bench_span s = {b->blob, 0, b->blob_size};
    int rc = bench_raw_write(b->raw_path, &s, 1, b->blob_size, direct, &w);
    if (rc)
        return fprintf(stderr, "bench: raw write: %s\n", strerror(-rc)), -1;
    *secs = engine_now() - t0;
    return 0;
}

/* kvtier's restore from a cold file into the live context; *@p set: set_data's share. */
static int time_load(struct bench_run *b, double *secs, double *set)
{
    kvt_pcache_clear(kvt_llama_pcache(b->kl));
    llama_memory_seq_rm(llama_get_memory(b->e.ctx), 0, -1, -1);
    if (bench_make_cold(b->entry_path))
        return fail("make cold");
    struct kvt_llama_loaded l;
    double t0 = engine_now();
    if (kvt_llama_load(b->kl, 0, b->tok, b->n + 1, &l))
        return fail("load");
    *secs = engine_now() - t0;
    *set = l.set_ms / 1e3;
    if (l.n_tokens != b->n || !l.from_disk)
        return fprintf(stderr, "bench: the load found %zu tokens\n", l.n_tokens), -1;
    return 0;
}

/* The limit of a restore: a raw read of the file's bytes, then set_data from memory. */
static int time_load_limit(struct bench_run *b, void *buf, double *read, double *set)
{
    llama_memory_seq_rm(llama_get_memory(b->e.ctx), 0, -1, -1);
    if (bench_make_cold(b->entry_path))
        return fail("make cold");
    struct bench_span s = {buf, 0, (size_t)b->file_size};
    bool direct;
    int rc = bench_raw_read(b->entry_path, &s, 1, read, &direct);
    if (rc)
        return fprintf(stderr, "bench: raw read: %s\n", strerror(-rc)), -1;
    double t0 = engine_now();
    if (llama_state_seq_set_data(b->e.ctx, b->blob, b->blob_size, 0) != b->blob_size)
        return fail("llama_state_seq_set_data");
    *set = engine_now() - t0;
    return 0;
}

static int find_entry(struct bench_run *b)
{
    struct kvt_store_record *v;
    size_t n;
    if (kvt_store_list(kvt_pcache_store(kvt_llama_pcache(b->kl)), &v, &n) || n != 1)
        return fprintf(stderr, "bench: expected one stored entry\n"), -1;
    free(b->entry_path);
    b->entry_path = strdup(v[0].path);
    b->file_size = v[0].bytes;
    kvt_store_list_free(v);
    return 0;
}

static int saves(struct bench_run *b, int repeat)
{
    for (int r = 0; r < repeat; r++) {
        double lim[2];
        bool kvt_first = r % 2 == 0;
        if ((kvt_first && time_save(b, &b->save[r])) || time_save_limit(b, false, &lim[0]) ||
            time_save_limit(b, true, &lim[1]) || (!kvt_first && time_save(b, &b->save[r])))
            return -1;
        b->save_lim[r] = lim[0] < lim[1] ? lim[0] : lim[1];
        b->save_ratio[r] = b->save_lim[r] / b->save[r];
        fprintf(stderr, "\r  save %d/%d", r + 1, repeat);
    }
    fputc('\n', stderr);
    unlink(b->raw_path);
    return find_entry(b);
}

static int loads(struct bench_run *b, int repeat)
{
    void *buf = bench_map(b->file_size, true);
    int rc = buf ? 0 : -1;
    /* one pair outside the medians: a first restore's one-time costs are reported apart */
    double unused[3];
    if (rc == 0 && (time_load(b, &b->first_load, &unused[0]) ||
                    time_load_limit(b, buf, &unused[1], &unused[2])))
        rc = -1;
    for (int r = 0; rc == 0 && r < repeat; r++) {
        bool kvt_first = r % 2 == 0;
        if ((kvt_first && time_load(b, &b->load[r], &b->kvt_set[r])) ||
            time_load_limit(b, buf, &b->read[r], &b->set[r]) ||
            (!kvt_first && time_load(b, &b->load[r], &b->kvt_set[r])))
            rc = -1;
        b->load_lim[r] = b->read[r] + b->set[r];
        b->load_ratio[r] = b->load_lim[r] / b->load[r];
        fprintf(stderr, "\r  restore %d/%d", r + 1, repeat);
    }
    fputc('\n', stderr);
    if (buf)
        bench_unmap(buf, b->file_size);
    /* what the last kvtier restore put into llama.cpp is the saved state, byte for byte */
    if (rc == 0 && time_load(b, &b->load[repeat], &b->kvt_set[repeat])) /* not in the medians */
        rc = -1;
    uint8_t *now = rc == 0 ? malloc(b->blob_size) : NULL;
    b->identical = now &&
                   llama_state_seq_get_data(b->e.ctx, now, b->blob_size, 0) == b->blob_size &&
                   memcmp(now, b->blob, b->blob_size) == 0;
    free(now);
    /* a RAM-tier hit: the saved entry is in RAM after a save */
    for (int r = 0; rc == 0 && r < repeat; r++) {
        struct kvt_llama_loaded l;
        if (kvt_llama_save(b->kl, 0, b->tok, b->n) ||
            kvt_llama_load(b->kl, 0, b->tok, b->n + 1, &l))
            rc = fail("RAM load");
        b->ram_load[r] = l.ms / 1e3;
    }
    return rc;
}

static double med(const double *v, int n)
{
    double c[MAX_REPEAT];
    memcpy(c, v, (size_t)n * sizeof(*v));
    return bench_median(c, (size_t)n);
}

static void report(const struct bench_run *b, const struct bench_args *a)
{
    int n = a->repeat;
    double mib = (double)b->file_size / 1048576.0;
    double load = med(b->load, n), save = med(b->save, n);
    if (a->json) {
        printf("{\"tokens\": %zu, \"state_bytes\": %zu, \"file_bytes\": %llu, \"repeat\": %d, "
               "\"prefill_s\": %.6f, \"restore_s\": %.6f, \"restore_limit_s\": %.6f, "
               "\"restore_ratio\": %.4f, \"raw_read_s\": %.6f, \"set_data_s\": %.6f, "
               "\"save_s\": %.6f, \"save_limit_s\": %.6f, \"save_ratio\": %.4f, "
               "\"restore_set_data_s\": %.6f, \"first_restore_s\": %.6f, "
               "\"ram_restore_s\": %.6f, \"prefill_over_restore\": %.1f, \"identical\": %s}\n",
               b->n, b->blob_size, (unsigned long long)b->file_size, n, b->prefill, load,
               med(b->load_lim, n), med(b->load_ratio, n), med(b->read, n), med(b->set, n), save,
               med(b->save_lim, n), med(b->save_ratio, n), med(b->kvt_set, n), b->first_load,
               med(b->ram_load, n), b->prefill / load, b->identical ? "true" : "false");
        return;
    }
    printf("kvtier-llama bench: %zu-token context of %s, %.1f MiB state, %d repetitions "
           "(medians)\n",
           b->n, a->model, mib, n);
    printf("  %-34s %9s %9s %7s\n", "", "kvtier", "limit", "ratio");
    printf("  %-34s %8.4fs %8.4fs %7.2f   (kvtier: set_data %.4fs; limit: raw read %.4fs + "
           "set_data %.4fs)\n",
           "restore, cold file -> llama.cpp", load, med(b->load_lim, n), med(b->load_ratio, n),
           med(b->kvt_set, n), med(b->read, n), med(b->set, n));
    printf("  %-34s %8.4fs %8.4fs %7.2f   (limit: get_data + raw durable write)\n",
           "save, llama.cpp -> durable file", save, med(b->save_lim, n), med(b->save_ratio, n));
    printf("  %-34s %8.4fs   (once, outside the medians)\n", "restore, first in the process",
           b->first_load);
    printf("  %-34s %8.4fs\n", "restore from the RAM tier", med(b->ram_load, n));
    printf("  %-34s %8.3fs   re-prefill / restore = %.0fx\n", "re-prefill of the context",
           b->prefill, b->prefill / load);
    printf("  state after restore identical to the saved one: %s\n", b->identical ? "yes" : "NO");
}

static int parse(int argc, char **argv, struct bench_args *a)
{
    static const struct option opts[] = {{"dir", 1, 0, 'd'},    {"model", 1, 0, 'm'},
                                         {"tokens", 1, 0, 't'}, {"repeat", 1, 0, 'r'},
                                         {"json", 0, 0, 'j'},   {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 'd': a->dir = optarg; break;
        case 'm': a->model = optarg; break;
        case 't': a->tokens = strtoull(optarg, NULL, 10); break;
        case 'r': a->repeat = atoi(optarg); break;
        case 'j': a->json = true; break;
        default: return -1;
        }
    }
    return optind == argc && a->tokens >= 2 && a->repeat >= 1 && a->repeat < MAX_REPEAT ? 0 : -1;
}

static int setup(struct bench_run *b, const struct bench_args *a)
{
    if (engine_ensure_model(a->model) || engine_open(&b->e, a->model, (unsigned)a->tokens + 256))
        return -1;
    b->n = a->tokens;
    b->tok = malloc((b->n + 1) * sizeof(*b->tok));
    for (size_t i = 0; i <= b->n; i++)
        b->tok[i] = (llama_token)((i * 37 + 11) % (size_t)b->e.n_vocab);
    double t0 = engine_now();
    if (engine_decode(&b->e, b->tok, b->n, "prefill"))
        return -1;
    b->prefill = engine_now() - t0;
    b->blob_size = llama_state_seq_get_size(b->e.ctx, 0);
    b->blob = malloc(b->blob_size);
    if (!b->blob || llama_state_seq_get_data(b->e.ctx, b->blob, b->blob_size, 0) != b->blob_size)
        return fail("llama_state_seq_get_data");
    mkdir(a->dir, 0755);
    size_t len = strlen(a->dir) + 16;
    b->raw_path = malloc(len);
    snprintf(b->raw_path, len, "%s/raw.bin", a->dir);
    struct kvt_llama_opts o;
    kvt_llama_opts_init(&o);
    o.cache_dir = a->dir;
    o.model_path = a->model;
    o.cparams = &b->e.cp;
    o.ram_max_bytes = 4 * (uint64_t)b->blob_size;
    if (kvt_llama_open(b->e.ctx, &o, &b->kl))
        return fail("kvt_llama_open");
    return 0;
}

int cmd_llama_bench(int argc, char **argv)
{
    struct bench_args a = {
        .dir = "build/llama-bench", .model = "build/llama/demo.gguf", .tokens = 8192, .repeat = 7};
    if (parse(argc, argv, &a)) {
        fprintf(stderr, "usage: kvtier-llama bench [--dir D] [--model M] [--tokens N] "
                        "[--repeat R] [--json]\n");
        return 2;
    }
    struct bench_run *b = calloc(1, sizeof(*b));
    int rc = setup(b, &a);
    if (rc == 0)
        rc = saves(b, a.repeat);
    if (rc == 0)
        rc = loads(b, a.repeat);
    if (rc == 0)
        report(b, &a);
    kvt_llama_close(b->kl, -1);
    if (b->e.ctx)
        engine_close(&b->e);
    free(b->tok);
    free(b->blob);
    free(b->raw_path);
    free(b->entry_path);
    free(b);
    return rc ? 1 : 0;
}
