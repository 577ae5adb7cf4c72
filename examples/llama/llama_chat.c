/*
 * A chat loop on llama.cpp with kvtier as its persistent prompt cache: a copyable starting
 * point. Each line on stdin is a user turn; the conversation so far is the prompt. Before
 * each turn the longest cached prefix is loaded (after a restart: from disk), only the rest
 * is computed, and after the reply the conversation is saved (RAM now, disk behind).
 *
 *   cc llama_chat.c $(pkg-config --cflags --libs kvtier-llama) -lllama -lggml -lggml-base
 *   ./llama_chat --model model.gguf --cache-dir ~/.cache/llm-kv < questions.txt
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ggml-backend.h"
#include "kvtier-llama.h"

struct chat {
    struct llama_context *ctx;
    const struct llama_vocab *vocab;
    kvt_llama *cache;
    llama_token *tok; /* the conversation */
    size_t n, cap;
};

static int append_text(struct chat *c, const char *text)
{
    int32_t len = (int32_t)strlen(text);
    if (c->n + (size_t)len + 8 > c->cap) {
        c->cap = (c->n + (size_t)len + 8) * 2;
        c->tok = realloc(c->tok, c->cap * sizeof(*c->tok));
    }
    int32_t got = llama_tokenize(c->vocab, text, len, c->tok + c->n, (int32_t)(c->cap - c->n),
                                 c->n == 0, false);
    if (got < 0)
        return -1;
    c->n += (size_t)got;
    return 0;
}

/* Decode tokens [from, c->n) of the conversation into sequence 0. */
static int decode_from(struct chat *c, size_t from)
{
    for (size_t i = from; i < c->n;) {
        int32_t k = (int32_t)(c->n - i < 512 ? c->n - i : 512);
        if (llama_decode(c->ctx, llama_batch_get_one(c->tok + i, k)))
            return -1;
        i += (size_t)k;
    }
    return 0;
}

static int turn(struct chat *c, const char *line, int max_reply)
{
    char *msg = malloc(strlen(line) + 32);
    sprintf(msg, "User: %s\nAssistant:", line);
    int rc = append_text(c, msg);
    free(msg);
    struct kvt_llama_loaded got;
    if (rc == 0 && kvt_llama_load(c->cache, 0, c->tok, c->n, &got) == 0)
        fprintf(stderr, "[kvtier: %zu of %zu prompt tokens from the %s cache in %.1f ms]\n",
                got.n_tokens, c->n, got.n_tokens ? (got.from_disk ? "disk" : "RAM") : "(no)",
                got.ms);
    if (rc || decode_from(c, got.n_tokens))
        return -1;
    struct llama_sampler *greedy = llama_sampler_init_greedy();
    for (int i = 0; i < max_reply; i++) {
        llama_token t = llama_sampler_sample(greedy, c->ctx, -1);
        if (llama_vocab_is_eog(c->vocab, t))
            break;
        char piece[64];
        int32_t np = llama_token_to_piece(c->vocab, t, piece, sizeof(piece), 0, false);
        fwrite(piece, 1, np > 0 ? (size_t)np : 0, stdout);
        if (c->n == c->cap)
            c->tok = realloc(c->tok, (c->cap *= 2) * sizeof(*c->tok));
        c->tok[c->n++] = t;
        if (llama_decode(c->ctx, llama_batch_get_one(&t, 1)))
            break;
    }
    llama_sampler_free(greedy);
    putchar('\n');
    /* the whole conversation is in the sequence: keep it for the next turn or process */
    if (kvt_llama_save(c->cache, 0, c->tok, c->n))
        fprintf(stderr, "[kvtier: not saved: %s]\n", kvt_last_error());
    return 0;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *cache_dir = NULL, *backends = NULL;
    unsigned n_ctx = 4096;
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    static const struct option opts[] = {{"model", 1, 0, 'm'},    {"cache-dir", 1, 0, 'c'},
                                         {"ctx", 1, 0, 'n'},      {"threads", 1, 0, 't'},
                                         {"backends", 1, 0, 'b'}, {0, 0, 0, 0}};
    for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        if (o == 'm')
            model_path = optarg;
        else if (o == 'c')
            cache_dir = optarg;
        else if (o == 'n')
            n_ctx = (unsigned)atoi(optarg);
        else if (o == 't')
            threads = atoi(optarg);
        else if (o == 'b')
            backends = optarg;
        else
            return 2;
    }
    if (!model_path || !cache_dir) {
        fprintf(stderr, "usage: llama_chat --model M.gguf --cache-dir DIR [--ctx N] [--threads N] "
                        "[--backends DIR]\n");
        return 2;
    }
    /* llama.cpp's CPU back-ends: where --backends says, else where ggml looks by default */
    if (backends)
        ggml_backend_load_all_from_path(backends);
    else
        ggml_backend_load_all();
    struct llama_model *model =
        llama_model_load_from_file(model_path, llama_model_default_params());
    if (!model)
        return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = cp.n_threads_batch = threads;
    struct chat c = {.ctx = llama_init_from_model(model, cp),
                     .vocab = llama_model_get_vocab(model)};
    if (!c.ctx)
        return 1;

    struct kvt_llama_opts o;
    kvt_llama_opts_init(&o);
    o.cache_dir = cache_dir;
    o.model_path = model_path; /* its bytes key the cache, with cp's settings */
    o.cparams = &cp;
    if (kvt_llama_open(c.ctx, &o, &c.cache)) {
        fprintf(stderr, "kvtier: %s\n", kvt_last_error());
        return 1;
    }
    char line[4096];
    while (fgets(line, sizeof(line), stdin)) {
        line[strcspn(line, "\n")] = '\0';
        if (turn(&c, line, 64))
            break;
    }
    kvt_llama_close(c.cache, -1); /* everything saved is on disk when this returns */
    llama_free(c.ctx);
    llama_model_free(model);
    free(c.tok);
    return 0;
}
