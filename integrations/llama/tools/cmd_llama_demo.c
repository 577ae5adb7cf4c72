/*
 * `kvtier-llama demo` (what `make demo` runs): a multi-turn conversation on a generated model
 * in a real llama.cpp context, with kvtier as its prompt cache. A first process runs the
 * first turns, saving the conversation after each, makes it durable, then goes on with the
 * last turn uninterrupted. A second process (the restart) takes the longest prefix from disk
 * and continues the same last turn, then re-prefills the whole prompt for comparison. The
 * parent prints time to first token both ways, measured in the same run, and whether the
 * restarted continuation's logits are bit-identical to the uninterrupted run's.
 */
#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmds.h"
#include "engine.h"

extern char **environ;

#define TURNS 4
#define REPLY_TOKENS 24
#define STEPS 8 /* greedy steps of the last turn whose logits are compared */
#define N_CTX 8192

struct demo_args {
    const char *dir, *model, *out, *results, *transcript;
};

static int parse(int argc, char **argv, struct demo_args *a)
{
    static const struct option opts[] = {{"dir", 1, 0, 'd'},        {"model", 1, 0, 'm'},
                                         {"out", 1, 0, 'o'},        {"results", 1, 0, 'r'},
                                         {"transcript", 1, 0, 't'}, {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 'd': a->dir = optarg; break;
        case 'm': a->model = optarg; break;
        case 'o': a->out = optarg; break;
        case 'r': a->results = optarg; break;
        case 't': a->transcript = optarg; break;
        default: return -1;
        }
    }
    return 0;
}

/* The user message of @p turn: a long document first, then short questions. */
static llama_token *user_turn(const struct engine *e, int turn, size_t *n)
{
    char *text = engine_user_text(turn, turn == 0 ? 17000 : turn < TURNS - 1 ? 1500 : 160);
    llama_token *t = engine_tokenize(e, text, n);
    free(text);
    return t;
}

/* A growing token list. */
struct convo {
    llama_token *tok;
    size_t n, cap;
};

static void convo_add(struct convo *c, const llama_token *t, size_t n)
{
    if (c->n + n > c->cap) {
        c->cap = (c->n + n) * 2;
        c->tok = realloc(c->tok, c->cap * sizeof(*c->tok));
    }
    memcpy(c->tok + c->n, t, n * sizeof(*t));
    c->n += n;
}

/* Greedy reply of @p n tokens after the last decode; appended to the conversation. */
static int reply(struct engine *e, struct convo *c, int n, FILE *logits)
{
    for (int i = 0; i < n; i++) {
        if (logits && fwrite(engine_logits(e), sizeof(float), (size_t)e->n_vocab, logits) !=
                          (size_t)e->n_vocab)
            return -1;
        llama_token t = engine_greedy(e);
        convo_add(c, &t, 1);
        if (engine_decode(e, &t, 1, NULL))
            return -1;
    }
    return 0;
}

static kvt_llama *open_cache(struct engine *e, const struct demo_args *a)
{
    struct kvt_llama_opts o;
    kvt_llama_opts_init(&o);
    o.cache_dir = a->dir;
    o.model_path = a->model;
    o.cparams = &e->cp;
    kvt_llama *kl;
    if (kvt_llama_open(e->ctx, &o, &kl)) {
        fprintf(stderr, "kvt_llama_open: %s\n", kvt_last_error());
        return NULL;
    }
    return kl;
}

static int transcript_write(const char *path, const struct convo *c);

/* Process 1: turns 0..TURNS-2 with saves, durable, then the last turn uninterrupted. */
static int first_process(struct engine *e, kvt_llama *kl, const struct demo_args *a, FILE *res)
{
    struct convo c = {0};
    for (int turn = 0; turn < TURNS - 1; turn++) {
        size_t n;
        llama_token *u = user_turn(e, turn, &n);
        convo_add(&c, u, n);
        free(u);
        struct kvt_llama_loaded l;
        if (kvt_llama_load(kl, 0, c.tok, c.n, &l))
            return -1;
        double t0 = engine_now();
        char what[64];
        snprintf(what, sizeof(what), "turn %d prefill", turn + 1);
        if (engine_decode(e, c.tok + l.n_tokens, c.n - l.n_tokens, what) ||
            reply(e, &c, REPLY_TOKENS, NULL))
            return -1;
        printf("  turn %d: %zu tokens in context (%zu from the cache, %zu computed), "
               "%d-token reply, %.2f s\n",
               turn + 1, c.n, l.n_tokens, c.n - REPLY_TOKENS - l.n_tokens, REPLY_TOKENS,
               engine_now() - t0);
        /* the reply's last token is decoded, so the sequence holds the whole conversation */
        if (kvt_llama_save(kl, 0, c.tok, c.n)) {
            fprintf(stderr, "kvt_llama_save: %s\n", kvt_last_error());
            return -1;
        }
    }
    double t0 = engine_now();
    if (kvt_llama_flush(kl, -1)) {
        fprintf(stderr, "kvt_llama_flush: %s\n", kvt_last_error());
        return -1;
    }
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(kvt_llama_pcache(kl), &st);
    fprintf(res, "saved_tokens %zu\nsaved_bytes %llu\nflush_s %f\n", c.n,
            (unsigned long long)st.cold.total_bytes, engine_now() - t0);
    printf("  durable on disk: %llu entries, %.1f MiB\n", (unsigned long long)st.cold.entries,
           (double)st.cold.total_bytes / 1048576.0);

    size_t n;
    llama_token *u = user_turn(e, TURNS - 1, &n);
    convo_add(&c, u, n);
    int rc = transcript_write(a->transcript, &c);
    FILE *lg = fopen(a->out, "wb");
    if (rc == 0)
        rc = lg ? engine_decode(e, u, n, NULL) : -1;
    if (rc == 0)
        rc = reply(e, &c, STEPS, lg);
    if (lg && fclose(lg))
        rc = -1;
    free(u);
    free(c.tok);
    return rc;
}

/* The client's transcript: what it sends as the last turn's prompt, kept across the restart. */
static int transcript_write(const char *path, const struct convo *c)
{
    FILE *f = fopen(path, "wb");
    int rc = f && fwrite(c->tok, sizeof(*c->tok), c->n, f) == c->n ? 0 : -1;
    if (f && fclose(f))
        rc = -1;
    return rc;
}

static int transcript_read(const char *path, struct convo *c)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    llama_token t;
    while (fread(&t, sizeof(t), 1, f) == 1)
        convo_add(c, &t, 1);
    fclose(f);
    return c->n ? 0 : -1;
}

/* Process 2: the last turn from the disk prefix, then from a full re-prefill. */
static int restart_process(struct engine *e, kvt_llama *kl, const struct demo_args *a, FILE *res)
{
    struct convo c = {0};
    int rc = transcript_read(a->transcript, &c);
    if (rc) {
        fprintf(stderr, "restart: no transcript\n");
        return -1;
    }
    /* time to first token with the cache: load the prefix, prefill the new turn, sample */
    FILE *lg = fopen(a->out, "wb");
    double t0 = engine_now();
    struct kvt_llama_loaded l;
    rc = lg ? kvt_llama_load(kl, 0, c.tok, c.n, &l) : -1;
    double t_load = engine_now() - t0;
    if (rc == 0)
        rc = engine_decode(e, c.tok + l.n_tokens, c.n - l.n_tokens, NULL);
    if (rc == 0)
        engine_greedy(e);
    double ttft_cache = engine_now() - t0;
    struct convo tail = {0};
    if (rc == 0)
        rc = reply(e, &tail, STEPS, lg);
    if (lg && fclose(lg))
        rc = -1;
    if (rc) {
        fprintf(stderr, "restart: %s\n", kvt_last_error());
        return -1;
    }
    printf("  restored %zu tokens from %s in %.3f s, prefilled the %zu new ones\n", l.n_tokens,
           l.from_disk ? "disk" : "RAM", t_load, c.n - l.n_tokens);

    /* time to first token without it: the whole prompt prefilled again */
    llama_memory_seq_rm(llama_get_memory(e->ctx), 0, -1, -1);
    t0 = engine_now();
    rc = engine_decode(e, c.tok, c.n, "re-prefill without the cache");
    if (rc == 0)
        engine_greedy(e);
    double ttft_full = engine_now() - t0;
    fprintf(res,
            "restored_tokens %zu\nfrom_disk %d\nload_s %f\nttft_cache_s %f\nprompt_tokens %zu\n"
            "ttft_full_s %f\n",
            l.n_tokens, l.from_disk, t_load, ttft_cache, c.n, ttft_full);
    free(tail.tok);
    free(c.tok);
    return rc;
}

int cmd_llama_demo_turns(int argc, char **argv)
{
    struct demo_args a = {0};
    if (argc < 2 || parse(argc - 1, argv + 1, &a) || !a.dir || !a.model || !a.out || !a.results ||
        !a.transcript)
        return 2;
    bool first = strcmp(argv[1], "first") == 0;
    struct engine e;
    if (engine_open(&e, a.model, N_CTX))
        return 1;
    kvt_llama *kl = open_cache(&e, &a);
    FILE *res = fopen(a.results, "w");
    int rc = kl && res ? 0 : -1;
    if (rc == 0)
        rc = first ? first_process(&e, kl, &a, res) : restart_process(&e, kl, &a, res);
    if (res && fclose(res))
        rc = -1;
    kvt_llama_close(kl, -1);
    engine_close(&e);
    return rc ? 1 : 0;
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st;
    (void)flag;
    (void)f;
    return remove(p);
}

/* Run this program's `demo-turns @p phase` as a new process and wait for it. */
static int spawn_phase(const char *phase, const struct demo_args *a, const char *out,
                       const char *results)
{
    char *argv[] = {"kvtier-llama",        "demo-turns", (char *)phase,    "--dir",
                    (char *)a->dir,        "--model",    (char *)a->model, "--out",
                    (char *)out,           "--results",  (char *)results,  "--transcript",
                    (char *)a->transcript, NULL};
    pid_t pid;
    fflush(stdout);
    if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ))
        return -1;
    printf("  process %d\n", (int)pid);
    fflush(stdout);
    int st;
    if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
        return -1;
    return 0;
}

/* Value of @p key in a results file ("key value" lines), or -1. */
static double result(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    char k[64];
    double v, found = -1;
    while (f && fscanf(f, "%63s %lf", k, &v) == 2)
        if (strcmp(k, key) == 0)
            found = v;
    if (f)
        fclose(f);
    return found;
}

/* Whether two logit files hold the same bytes; *n receives their float count. */
static bool same_bytes(const char *a, const char *b, size_t *n)
{
    FILE *x = fopen(a, "rb"), *y = fopen(b, "rb");
    bool same = x && y;
    *n = 0;
    for (int cx, cy; same;) {
        cx = fgetc(x);
        cy = fgetc(y);
        same = cx == cy;
        if (cx == EOF || !same)
            break;
        (*n)++;
    }
    if (x)
        fclose(x);
    if (y)
        fclose(y);
    *n /= sizeof(float);
    return same && *n > 0;
}

int cmd_llama_demo(int argc, char **argv)
{
    struct demo_args a = {.dir = "build/demo-store", .model = "build/llama/demo.gguf"};
    if (parse(argc, argv, &a) || optind != argc) {
        fprintf(stderr, "usage: kvtier-llama demo [--dir D] [--model M]\n");
        return 2;
    }
    if (engine_ensure_model(a.model))
        return 1;
    nftw(a.dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    char *run = malloc(strlen(a.dir) + 64), *u, *r, *res1, *res2;
    sprintf(run, "%s.run", a.dir);
    nftw(run, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (mkdir(run, 0755) && errno != EEXIST) {
        perror(run);
        return 1;
    }
    size_t len = strlen(run) + 32;
    u = malloc(len), r = malloc(len), res1 = malloc(len), res2 = malloc(len);
    char *tr = malloc(len);
    snprintf(tr, len, "%s/transcript", run);
    a.transcript = tr;
    snprintf(u, len, "%s/uninterrupted.logits", run);
    snprintf(r, len, "%s/restarted.logits", run);
    snprintf(res1, len, "%s/first.results", run);
    snprintf(res2, len, "%s/restart.results", run);

    printf("kvtier as llama.cpp's prompt cache: %s, store %s\n", a.model, a.dir);
    printf("first process: %d turns of a conversation, saved after each\n", TURNS - 1);
    if (spawn_phase("first", &a, u, res1)) {
        fprintf(stderr, "demo: the first process failed\n");
        return 1;
    }
    printf("first process exited; a new process continues the conversation\n");
    if (spawn_phase("restart", &a, r, res2)) {
        fprintf(stderr, "demo: the restarted process failed\n");
        return 1;
    }
    size_t nl;
    bool same = same_bytes(u, r, &nl);
    double full = result(res2, "ttft_full_s"), cached = result(res2, "ttft_cache_s");
    printf("\nturn %d after the restart (prompt of %.0f tokens):\n", TURNS,
           result(res2, "prompt_tokens"));
    printf("  time to first token, full re-prefill:       %8.3f s\n", full);
    printf("  time to first token, prefix from kvtier:    %8.3f s  (%.0f tokens restored from "
           "disk in %.3f s)\n",
           cached, result(res2, "restored_tokens"), result(res2, "load_s"));
    printf("  speedup:                                    %8.1fx\n", full / cached);
    printf("  logits of the next %d steps bit-identical to the uninterrupted run: %s (%zu "
           "values)\n",
           STEPS, same ? "yes" : "NO", nl);
    bool ok = same && result(res2, "from_disk") == 1;
    free(u);
    free(r);
    free(res1);
    free(res2);
    free(run);
    free(tr);
    return ok ? 0 : 1;
}
