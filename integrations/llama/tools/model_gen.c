/*
 * Random-weight GGUF models (model_gen.h). Matrices are scaled by 1/sqrt(fan-in) so that
 * activations stay in range through the layers; norms are ones; mamba's A is negative, as
 * llama.cpp requires.
 */
#include "model_gen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"

bool model_spec_named(const char *name, struct model_spec *out)
{
    static const struct {
        const char *name;
        struct model_spec m;
    } known[] = {
        {"llama", {"llama", 2, 64, 2, 2, 128, 256, 4096, 0, 0, 0, 0, 0, false, 1, false}},
        {"qwen3", {"qwen3", 2, 128, 4, 2, 256, 256, 4096, 0, 0, 0, 0, 0, false, 2, false}},
        {"gemma2", {"gemma2", 4, 64, 2, 1, 128, 256, 4096, 0, 0, 0, 0, 32, false, 5, false}},
        {"mamba", {"mamba", 2, 64, 0, 0, 0, 256, 4096, 128, 4, 16, 4, 0, false, 3, false}},
        /* prefill of a few thousand tokens takes seconds on two cores */
        {"demo", {"llama", 8, 512, 8, 4, 1408, 256, 16384, 0, 0, 0, 0, 0, true, 4, false}},
        {"chat", {"llama", 2, 64, 2, 2, 128, CHAT_VOCAB, 4096, 0, 0, 0, 0, 0, false, 6, true}},
        {"chat-demo",
         {"llama", 8, 512, 8, 4, 1408, CHAT_VOCAB, 16384, 0, 0, 0, 0, 0, true, 7, true}},
    };
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (strcmp(name, known[i].name) == 0) {
            *out = known[i].m;
            return true;
        }
    return false;
}

static uint64_t next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Uniform in [-1, 1). */
static float uni(uint64_t *s)
{
    return (float)((double)(next(s) >> 11) / 4503599627370496.0 - 1.0);
}

enum fill { ONES, RANDOM, NEG_EXP, SMALL };

struct gen {
    const struct model_spec *m;
    struct ggml_context *ctx;
    struct gguf_context *gguf;
    uint64_t rng;
};

/* A tensor of @p ne0 x @p ne1 (ne1 0: a vector) named @p name, filled as @p f says. */
static struct ggml_tensor *add(struct gen *g, const char *name, int64_t ne0, int64_t ne1,
                               enum fill f)
{
    bool mat = ne1 > 0 && f == RANDOM;
    enum ggml_type type = mat && g->m->f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
    struct ggml_tensor *t = ne1 > 0 ? ggml_new_tensor_2d(g->ctx, type, ne0, ne1)
                                    : ggml_new_tensor_1d(g->ctx, type, ne0);
    ggml_set_name(t, name);
    int64_t n = ne0 * (ne1 > 0 ? ne1 : 1);
    float *v = malloc((size_t)n * sizeof(*v));
    float scale = 1.0f / sqrtf((float)ne0);
    for (int64_t i = 0; i < n; i++) {
        switch (f) {
        case ONES: v[i] = 1.0f; break;
        case RANDOM: v[i] = uni(&g->rng) * scale * 1.7f; break;
        case NEG_EXP: v[i] = -expf(uni(&g->rng)); break;
        case SMALL: v[i] = uni(&g->rng) * 0.1f; break;
        }
    }
    if (type == GGML_TYPE_F16)
        ggml_fp32_to_fp16_row(v, t->data, n);
    else
        memcpy(t->data, v, (size_t)n * sizeof(*v));
    free(v);
    gguf_add_tensor(g->gguf, t);
    return t;
}

/* Chat models: the output rows of every token but printable ASCII and the space are zero,
 * so their logits (0) lose to the largest of ~95 random ones: greedy text is readable and
 * runs to max_tokens, which makes the server's tests long enough to compare. */
static void printable_output(struct ggml_tensor *out, uint32_t n_vocab)
{
    size_t row = ggml_row_size(out->type, out->ne[0]);
    for (uint32_t t = 0; t < n_vocab; t++) {
        bool printable = (t >= 5 + 0x20 && t <= 5 + 0x7E) || t == CHAT_VOCAB - 1;
        if (!printable)
            memset((char *)out->data + t * row, 0, row);
    }
}

static void addf(struct gen *g, const char *fmt, int il, int64_t ne0, int64_t ne1, enum fill f)
{
    char name[64];
    snprintf(name, sizeof(name), fmt, il);
    add(g, name, ne0, ne1, f);
}

static void key_u32(struct gen *g, const char *key, uint32_t v)
{
    char k[96];
    snprintf(k, sizeof(k), "%s.%s", g->m->arch, key);
    gguf_set_val_u32(g->gguf, k, v);
}

/* ChatML, which llama_chat_apply_template() recognises by its <|im_start|>. */
static const char chat_template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* SentencePiece ("llama") with byte fallback and no merges: a space is "▁", every other byte
 * its <0xXX> token, so any UTF-8 text round-trips. */
static void chat_vocab(struct gen *g)
{
    static const char *const special[] = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"};
    const char *tok[CHAT_VOCAB];
    char bytes[256][8];
    float scores[CHAT_VOCAB];
    int32_t types[CHAT_VOCAB];
    for (int i = 0; i < 5; i++) {
        tok[i] = special[i];
        types[i] = i == 0 ? 2 : 3; /* unknown, control */
    }
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof(bytes[b]), "<0x%02X>", b);
        tok[5 + b] = bytes[b];
        types[5 + b] = 6; /* byte */
    }
    tok[CHAT_VOCAB - 1] = "\xe2\x96\x81";
    types[CHAT_VOCAB - 1] = 1; /* normal */
    for (int i = 0; i < CHAT_VOCAB; i++)
        scores[i] = 0.0f;
    gguf_set_val_str(g->gguf, "tokenizer.ggml.model", "llama");
    gguf_set_val_bool(g->gguf, "tokenizer.ggml.add_space_prefix", false);
    gguf_set_val_u32(g->gguf, "tokenizer.ggml.bos_token_id", 1);
    gguf_set_val_u32(g->gguf, "tokenizer.ggml.eos_token_id", 4);
    gguf_set_val_str(g->gguf, "tokenizer.chat_template", chat_template);
    gguf_set_arr_str(g->gguf, "tokenizer.ggml.tokens", tok, CHAT_VOCAB);
    gguf_set_arr_data(g->gguf, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, CHAT_VOCAB);
    gguf_set_arr_data(g->gguf, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, CHAT_VOCAB);
}

static void set_keys(struct gen *g)
{
    const struct model_spec *m = g->m;
    char name[96], k[96];
    snprintf(name, sizeof(name), "kvtier-%s-%ux%u-seed%llu", m->arch, m->n_layer, m->n_embd,
             (unsigned long long)m->seed);
    gguf_set_val_str(g->gguf, "general.architecture", m->arch);
    gguf_set_val_str(g->gguf, "general.name", name);
    key_u32(g, "vocab_size", m->n_vocab);
    key_u32(g, "context_length", m->n_ctx_train);
    key_u32(g, "embedding_length", m->n_embd);
    key_u32(g, "block_count", m->n_layer);
    snprintf(k, sizeof(k), "%s.attention.layer_norm_rms_epsilon", m->arch);
    gguf_set_val_f32(g->gguf, k, 1e-5f);
    if (strcmp(m->arch, "mamba") == 0) {
        key_u32(g, "feed_forward_length", 0);
        key_u32(g, "attention.head_count", 0);
        key_u32(g, "ssm.inner_size", m->ssm_inner);
        key_u32(g, "ssm.conv_kernel", m->ssm_conv);
        key_u32(g, "ssm.state_size", m->ssm_state);
        key_u32(g, "ssm.time_step_rank", m->ssm_dt_rank);
    } else {
        key_u32(g, "feed_forward_length", m->n_ff);
        key_u32(g, "attention.head_count", m->n_head);
        key_u32(g, "attention.head_count_kv", m->n_head_kv);
        snprintf(k, sizeof(k), "%s.rope.freq_base", m->arch);
        gguf_set_val_f32(g->gguf, k, 10000.0f);
        if (m->n_swa)
            key_u32(g, "attention.sliding_window", m->n_swa);
    }
    if (m->chat) {
        chat_vocab(g);
        return;
    }
    gguf_set_val_str(g->gguf, "tokenizer.ggml.model", "test");
    const char **tok = malloc(m->n_vocab * sizeof(*tok));
    char *text = malloc((size_t)m->n_vocab * 16);
    float *scores = malloc(m->n_vocab * sizeof(*scores));
    int32_t *types = malloc(m->n_vocab * sizeof(*types));
    for (uint32_t i = 0; i < m->n_vocab; i++) {
        snprintf(text + 16 * i, 16, "<t%x>", i);
        tok[i] = text + 16 * i;
        scores[i] = 0.0f;
        types[i] = 1; /* normal */
    }
    gguf_set_arr_str(g->gguf, "tokenizer.ggml.tokens", tok, m->n_vocab);
    gguf_set_arr_data(g->gguf, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, m->n_vocab);
    gguf_set_arr_data(g->gguf, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, m->n_vocab);
    free(tok);
    free(text);
    free(scores);
    free(types);
}

static void attention_layers(struct gen *g)
{
    const struct model_spec *m = g->m;
    int64_t hd = m->n_embd / m->n_head, kv = hd * m->n_head_kv;
    for (uint32_t il = 0; il < m->n_layer; il++) {
        int i = (int)il;
        addf(g, "blk.%d.attn_norm.weight", i, m->n_embd, 0, ONES);
        addf(g, "blk.%d.attn_q.weight", i, m->n_embd, m->n_embd, RANDOM);
        addf(g, "blk.%d.attn_k.weight", i, m->n_embd, kv, RANDOM);
        addf(g, "blk.%d.attn_v.weight", i, m->n_embd, kv, RANDOM);
        addf(g, "blk.%d.attn_output.weight", i, m->n_embd, m->n_embd, RANDOM);
        if (strcmp(m->arch, "qwen3") == 0) {
            addf(g, "blk.%d.attn_q_norm.weight", i, hd, 0, ONES);
            addf(g, "blk.%d.attn_k_norm.weight", i, hd, 0, ONES);
        }
        addf(g, "blk.%d.ffn_norm.weight", i, m->n_embd, 0, ONES);
        addf(g, "blk.%d.ffn_gate.weight", i, m->n_embd, m->n_ff, RANDOM);
        addf(g, "blk.%d.ffn_up.weight", i, m->n_embd, m->n_ff, RANDOM);
        addf(g, "blk.%d.ffn_down.weight", i, m->n_ff, m->n_embd, RANDOM);
        if (strcmp(m->arch, "gemma2") == 0) { /* norms after attention and after the FFN */
            addf(g, "blk.%d.post_attention_norm.weight", i, m->n_embd, 0, ONES);
            addf(g, "blk.%d.post_ffw_norm.weight", i, m->n_embd, 0, ONES);
        }
    }
}

static void mamba_layers(struct gen *g)
{
    const struct model_spec *m = g->m;
    int64_t di = m->ssm_inner, ds = m->ssm_state, dt = m->ssm_dt_rank;
    for (uint32_t il = 0; il < m->n_layer; il++) {
        int i = (int)il;
        addf(g, "blk.%d.attn_norm.weight", i, m->n_embd, 0, ONES);
        addf(g, "blk.%d.ssm_in.weight", i, m->n_embd, 2 * di, RANDOM);
        addf(g, "blk.%d.ssm_conv1d.weight", i, m->ssm_conv, di, RANDOM);
        addf(g, "blk.%d.ssm_conv1d.bias", i, di, 0, SMALL);
        addf(g, "blk.%d.ssm_x.weight", i, di, dt + 2 * ds, RANDOM);
        addf(g, "blk.%d.ssm_dt.weight", i, dt, di, RANDOM);
        addf(g, "blk.%d.ssm_dt.bias", i, di, 0, SMALL);
        addf(g, "blk.%d.ssm_a", i, ds, di, NEG_EXP);
        addf(g, "blk.%d.ssm_d", i, di, 0, ONES);
        addf(g, "blk.%d.ssm_out.weight", i, di, m->n_embd, RANDOM);
    }
}

/* Bytes of tensor data the model needs, with room for ggml's per-tensor overhead. */
static size_t arena_bytes(const struct model_spec *m)
{
    size_t per = (size_t)m->n_embd * (m->n_ff * 3 + m->n_embd * 4 + m->ssm_inner * 4) +
                 (size_t)m->ssm_inner * (m->ssm_conv + 2 * m->ssm_state + m->ssm_dt_rank + 8);
    size_t all = per * m->n_layer + (size_t)m->n_embd * m->n_vocab * 2 + m->n_embd * 4;
    return all * sizeof(float) + (m->n_layer * 16 + 16) * (ggml_tensor_overhead() + 64);
}

static bool gen_init(struct gen *g, const struct model_spec *m, size_t bytes, uint64_t seed)
{
    struct ggml_init_params ip = {.mem_size = bytes, .mem_buffer = NULL, .no_alloc = false};
    *g = (struct gen){.m = m,
                      .ctx = ggml_init(ip),
                      .gguf = gguf_init_empty(),
                      .rng = seed * 0x9E3779B97F4A7C15ull + 1};
    if (g->ctx && g->gguf)
        return true;
    fprintf(stderr, "model_gen: out of memory\n");
    return false;
}

/* Write the file through a temporary name, then free the generator. */
static int gen_finish(struct gen *g, const char *path)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    bool ok = gguf_write_to_file(g->gguf, tmp, false) && rename(tmp, path) == 0;
    if (!ok) {
        fprintf(stderr, "model_gen: cannot write %s\n", path);
        remove(tmp);
    }
    gguf_free(g->gguf);
    ggml_free(g->ctx);
    return ok ? 0 : -1;
}

int lora_write(const struct model_spec *m, uint32_t rank, uint64_t seed, const char *path)
{
    int64_t kv = (int64_t)(m->n_embd / m->n_head * m->n_head_kv);
    size_t bytes = (size_t)m->n_layer * 4 * (m->n_embd + kv) * rank * sizeof(float) +
                   (m->n_layer * 4 + 4) * (ggml_tensor_overhead() + 64);
    struct gen g;
    if (!gen_init(&g, m, bytes, seed))
        return -1;
    gguf_set_val_str(g.gguf, "general.type", "adapter");
    gguf_set_val_str(g.gguf, "general.architecture", m->arch);
    gguf_set_val_str(g.gguf, "adapter.type", "lora");
    gguf_set_val_f32(g.gguf, "adapter.lora.alpha", (float)rank);
    for (uint32_t il = 0; il < m->n_layer; il++) /* x -> A (rank) -> B (K or V rows) */
        for (int w = 0; w < 2; w++) {
            char name[64];
            snprintf(name, sizeof(name), "blk.%u.attn_%c.weight.lora_a", il, "kv"[w]);
            add(&g, name, m->n_embd, rank, RANDOM);
            snprintf(name, sizeof(name), "blk.%u.attn_%c.weight.lora_b", il, "kv"[w]);
            add(&g, name, rank, kv, RANDOM);
        }
    return gen_finish(&g, path);
}

int model_write(const struct model_spec *m, const char *path)
{
    struct gen g;
    if (!gen_init(&g, m, arena_bytes(m), m->seed))
        return -1;
    set_keys(&g);
    add(&g, "token_embd.weight", m->n_embd, m->n_vocab, RANDOM);
    add(&g, "output_norm.weight", m->n_embd, 0, ONES);
    if (strcmp(m->arch, "gemma2") != 0) { /* gemma2 ties its output to the embedding */
        struct ggml_tensor *out = add(&g, "output.weight", m->n_embd, m->n_vocab, RANDOM);
        if (m->chat)
            printable_output(out, m->n_vocab);
    }
    if (strcmp(m->arch, "mamba") == 0)
        mamba_layers(&g);
    else
        attention_layers(&g);
    return gen_finish(&g, path);
}
