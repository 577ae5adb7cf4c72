/*
 * A llama.cpp engine for kvtier-llama's demo and benchmark: a generated model in a real
 * context, batched prefill with progress, greedy decoding, and the demo conversation's text.
 */
#ifndef KVT_LLAMA_ENGINE_H
#define KVT_LLAMA_ENGINE_H

#include <stdbool.h>
#include <stddef.h>

#include "kvtier-llama.h"

struct engine {
    struct llama_model *model;
    struct llama_context *ctx;
    struct llama_context_params cp;
    const struct llama_vocab *vocab;
    int n_vocab;
};

/** Seconds on the monotonic clock. */
double engine_now(void);
/** Generate the demo model at @p path unless it exists (progress on stderr). 0 or -1. */
int engine_ensure_model(const char *path);
/** Load @p path into a context of @p n_ctx tokens (flash attention on, F16 K/V). 0 or -1. */
int engine_open(struct engine *e, const char *path, unsigned n_ctx);
void engine_close(struct engine *e);
/**
 * Decode @p n tokens into sequence 0 in batches; with @p what set, a progress line on stderr.
 * Logits are kept for the last token only. 0 or -1.
 */
int engine_decode(struct engine *e, const llama_token *t, size_t n, const char *what);
/** The argmax of the last decode's logits. */
llama_token engine_greedy(const struct engine *e);
/** The last decode's logits (n_vocab floats). */
const float *engine_logits(const struct engine *e);
/** Tokenize @p text (no special tokens); *@p n receives the count. NULL on failure. */
llama_token *engine_tokenize(const struct engine *e, const char *text, size_t *n);
/** The demo's user message of turn @p turn, about @p chars characters long (malloc'd). */
char *engine_user_text(int turn, size_t chars);

#endif
