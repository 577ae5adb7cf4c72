/*
 * Small random-weight GGUF models for the llama.cpp integration's tests, demo and benchmark
 * (no model hub is reachable): written with ggml's own gguf API, deterministic for a seed,
 * with llama.cpp's built-in "test" tokenizer (five characters of text per token), or, for
 * the chat models, a byte-level SentencePiece vocabulary (every UTF-8 text tokenizes and
 * detokenizes back to itself) with ChatML's special tokens and chat template.
 */
#ifndef KVT_LLAMA_MODEL_GEN_H
#define KVT_LLAMA_MODEL_GEN_H

#include <stdbool.h>
#include <stdint.h>

struct model_spec {
    const char *arch; /* "llama", "qwen3" (grouped KV heads, q/k norms), "gemma2" (sliding
                         window on every other layer) or "mamba" */
    uint32_t n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab, n_ctx_train;
    uint32_t ssm_inner, ssm_conv, ssm_state, ssm_dt_rank; /* mamba */
    uint32_t n_swa;                                       /* gemma2: the window */
    bool f16;                                             /* weight matrices in F16 (else F32) */
    uint64_t seed;                                        /* the weights */
    bool chat; /* byte-level vocabulary and ChatML template (n_vocab must be CHAT_VOCAB) */
};

/* The chat vocabulary: <unk> <s> </s> <|im_start|> <|im_end|>, the 256 bytes, "▁" (space). */
#define CHAT_VOCAB 262

/** The spec of a named model: "llama", "qwen3", "gemma2", "mamba", "chat" (tiny, for
 * tests), "demo" or "chat-demo" (the demo's size with the chat vocabulary). */
bool model_spec_named(const char *name, struct model_spec *out);
/** Write the model to @p path. @return 0, or -1 with a message on stderr. */
int model_write(const struct model_spec *m, const char *path);
/** Write a LoRA adapter for attention model @p m to @p path: rank @p rank on every layer's K
 * and V projections, random weights from @p seed. @return 0, or -1 with a message on stderr. */
int lora_write(const struct model_spec *m, uint32_t rank, uint64_t seed, const char *path);

#endif
