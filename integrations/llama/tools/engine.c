/*
 * The demo and benchmark's llama.cpp engine (engine.h).
 */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ggml-backend.h"
#include "model_gen.h"

#define BATCH 512

double engine_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void quiet(enum ggml_log_level level, const char *text, void *ud)
{
    (void)ud;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

int engine_ensure_model(const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0)
        return 0;
    struct model_spec m;
    model_spec_named("demo", &m);
    fprintf(stderr, "generating the demo model (%s, %u layers, dim %u, random weights) ...\n", path,
            m.n_layer, m.n_embd);
    return model_write(&m, path);
}

int engine_open(struct engine *e, const char *path, unsigned n_ctx)
{
    memset(e, 0, sizeof(*e));
    llama_log_set(quiet, NULL);
    ggml_backend_load_all_from_path(KVT_LLAMA_LIB_DIR);
    e->model = llama_model_load_from_file(path, llama_model_default_params());
    if (!e->model) {
        fprintf(stderr, "cannot load %s\n", path);
        return -1;
    }
    e->cp = llama_context_default_params();
    e->cp.n_ctx = n_ctx;
    e->cp.n_batch = BATCH;
    e->cp.n_ubatch = BATCH;
    e->cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    e->cp.n_threads = e->cp.n_threads_batch = (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    e->ctx = llama_init_from_model(e->model, e->cp);
    if (!e->ctx) {
        fprintf(stderr, "cannot create a context of %u tokens\n", n_ctx);
        llama_model_free(e->model);
        return -1;
    }
    e->vocab = llama_model_get_vocab(e->model);
    e->n_vocab = llama_vocab_n_tokens(e->vocab);
    return 0;
}

void engine_close(struct engine *e)
{
    llama_free(e->ctx);
    llama_model_free(e->model);
}

int engine_decode(struct engine *e, const llama_token *t, size_t n, const char *what)
{
    double t0 = engine_now();
    for (size_t i = 0; i < n;) {
        size_t k = n - i < BATCH ? n - i : BATCH;
        if (llama_decode(e->ctx, llama_batch_get_one((llama_token *)t + i, (int32_t)k))) {
            fprintf(stderr, "llama_decode failed\n");
            return -1;
        }
        i += k;
        if (what && n > BATCH)
            fprintf(stderr, "\r  %s: %zu/%zu tokens, %.1f s", what, i, n, engine_now() - t0);
    }
    if (what && n > BATCH)
        fputc('\n', stderr);
    return 0;
}

const float *engine_logits(const struct engine *e)
{
    return llama_get_logits_ith(e->ctx, -1);
}

llama_token engine_greedy(const struct engine *e)
{
    const float *l = engine_logits(e);
    int best = 0;
    for (int i = 1; i < e->n_vocab; i++)
        if (l[i] > l[best])
            best = i;
    return (llama_token)best;
}

llama_token *engine_tokenize(const struct engine *e, const char *text, size_t *n)
{
    int32_t len = (int32_t)strlen(text);
    llama_token *t = malloc(((size_t)len + 8) * sizeof(*t));
    int32_t got = t ? llama_tokenize(e->vocab, text, len, t, len + 8, false, false) : -1;
    if (got < 0) {
        free(t);
        return NULL;
    }
    *n = (size_t)got;
    return t;
}

char *engine_user_text(int turn, size_t chars)
{
    static const char *const words[] = {
        "the",          "cache", "restores",  "prefix", "of",       "a",       "long",
        "conversation", "from",  "disk",      "so",     "that",     "nothing", "is",
        "computed",     "twice", "when",      "server", "restarts", "model",   "tokens",
        "state",        "layer", "attention", "keys",   "values"};
    char *s = malloc(chars + 64);
    size_t at = (size_t)snprintf(s, chars + 64, "Turn %d. ", turn);
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(turn + 1);
    while (at < chars) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        at += (size_t)snprintf(s + at, chars + 64 - at, "%s ",
                               words[x % (sizeof(words) / sizeof(words[0]))]);
    }
    return s;
}
