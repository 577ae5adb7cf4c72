/*
 * Identity of a llama.cpp context (llama_identity.h). The fingerprint is the Wyhash of a
 * canonical text: the mapping's version, llama.cpp's version, every GGUF metadata pair but
 * the tokenizer's (architecture, hyper-parameters, rope and norm settings), the model's
 * description and parameter count, the weights digest, and the context parameters that
 * change what the state means or how it is laid out. The model file is hashed whole: reading
 * it costs one pass over a file llama.cpp has just mapped, and nothing cheaper tells two
 * fine-tunes of one architecture apart.
 */
#include "llama_identity.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A growing text, hashed as it grows. */
struct canon {
    struct kvt_wyhash_state h;
};

static void put(struct canon *c, const char *fmt, ...) KVT_PRINTF(2, 3);
static void put(struct canon *c, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n > 0)
        kvt_wyhash_update(&c->h, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
    kvt_wyhash_update(&c->h, "\n", 1);
}

static int file_digest(const char *path, char out[17])
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kvt_set_error(-errno, "%s: cannot open the model file: %s", path, strerror(errno));
    size_t cap = 8u << 20;
    uint8_t *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return kvt_set_error(-ENOMEM, "out of memory");
    }
    struct kvt_wyhash_state h;
    kvt_wyhash_init(&h, 0);
    int rc = 0;
    for (;;) {
        ssize_t r = read(fd, buf, cap);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = kvt_set_error(-errno, "%s: cannot read the model file: %s", path, strerror(errno));
            break;
        }
        if (r == 0)
            break;
        kvt_wyhash_update(&h, buf, (size_t)r);
    }
    free(buf);
    close(fd);
    snprintf(out, 17, "%016" PRIx64, kvt_wyhash_final(&h));
    return rc;
}

static void model_meta(struct canon *c, const struct llama_model *m)
{
    char key[256], val[1024];
    int32_t n = llama_model_meta_count(m);
    for (int32_t i = 0; i < n; i++) {
        if (llama_model_meta_key_by_index(m, i, key, sizeof(key)) < 0 ||
            strncmp(key, "tokenizer.", 10) == 0)
            continue;
        if (llama_model_meta_val_str_by_index(m, i, val, sizeof(val)) < 0)
            val[0] = '\0';
        put(c, "meta %s=%s", key, val);
    }
    char desc[256];
    llama_model_desc(m, desc, sizeof(desc));
    put(c, "desc %s params %" PRIu64 " layers %d embd %d heads %d kv-heads %d swa %d rope %d", desc,
        llama_model_n_params(m), llama_model_n_layer(m), llama_model_n_embd(m),
        llama_model_n_head(m), llama_model_n_head_kv(m), llama_model_n_swa(m),
        (int)llama_model_rope_type(m));
}

/*
 * The context parameters that change what the state's bytes mean or how a sequence's rows are
 * laid out. Flash attention counts as on or off: llama.cpp creates the same memory for AUTO
 * and ENABLED (V token-major) and AUTO resolves to the flash kernel wherever the device has
 * one; off transposes V and runs the other kernel, whose rows differ in their last bits.
 * n_seq_max, kv_unified and swa_full change only how many cells and streams the context
 * has: a sequence's cells and rows are the same, and a restore places them in its own stream.
 */
static void context_params(struct canon *c, const struct llama_context_params *p)
{
    put(c, "type_k %d type_v %d flash_attn %s", p->type_k, p->type_v,
        p->flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED ? "off" : "on");
    /* llama.cpp stores quantized K and V rotated (Hadamard) where the head size allows,
     * unless its environment says otherwise when the context is made: the same bytes then
     * hold other rows */
    const char *no_rot = getenv("LLAMA_ATTN_ROT_DISABLE");
    if (ggml_is_quantized(p->type_k) || ggml_is_quantized(p->type_v))
        put(c, "attn_rot_disable %d", no_rot && atoi(no_rot) != 0);
    put(c, "rope %d base %a scale %a yarn %a %a %a %a %u", (int)p->rope_scaling_type,
        p->rope_freq_base, p->rope_freq_scale, p->yarn_ext_factor, p->yarn_attn_factor,
        p->yarn_beta_fast, p->yarn_beta_slow, p->yarn_orig_ctx);
    put(c, "pooling %d attention %d", (int)p->pooling_type, (int)p->attention_type);
}

/* The LoRA adapters and control vector the handle declares (llama.h cannot report them). */
static int adapters(struct canon *c, const struct kvt_llama_opts *o)
{
    if (o->n_loras && !o->loras)
        return kvt_set_error(-EINVAL, "kvt_llama_open: %zu LoRA adapters but no list", o->n_loras);
    for (size_t i = 0; i < o->n_loras; i++) {
        const struct kvt_llama_lora *l = &o->loras[i];
        if (!l->adapter || (!l->path && !l->digest))
            return kvt_set_error(-EINVAL,
                                 "kvt_llama_open: LoRA adapter %zu needs the adapter "
                                 "and its path or digest",
                                 i);
        if (l->scale == 0.0f) /* llama.cpp leaves it out */
            continue;
        char digest[17 + 64];
        int rc = 0;
        if (l->digest)
            snprintf(digest, sizeof(digest), "%.80s", l->digest);
        else
            rc = file_digest(l->path, digest);
        if (rc)
            return rc;
        put(c, "lora %s scale %a", digest, l->scale);
    }
    const struct kvt_llama_cvec *v = o->cvec;
    if (v && (!v->data || v->len == 0))
        return kvt_set_error(-EINVAL, "kvt_llama_open: a control vector needs its data");
    if (v)
        put(c, "cvec n_embd %d layers %d..%d len %zu data %016" PRIx64, v->n_embd, v->il_start,
            v->il_end, v->len, kvt_wyhash(0, v->data, v->len * sizeof(float)));
    return 0;
}

static void tokenizer_digest(const struct llama_model *m, char out[17])
{
    struct canon c;
    kvt_wyhash_init(&c.h, 0);
    const struct llama_vocab *v = llama_model_get_vocab(m);
    int32_t n = llama_vocab_n_tokens(v);
    put(&c, "type %d n %d bos %d eos %d eot %d sep %d pad %d add_bos %d add_eos %d",
        (int)llama_vocab_type(v), n, llama_vocab_bos(v), llama_vocab_eos(v), llama_vocab_eot(v),
        llama_vocab_sep(v), llama_vocab_pad(v), llama_vocab_get_add_bos(v),
        llama_vocab_get_add_eos(v));
    char key[256], val[1024];
    for (int32_t i = 0; i < llama_model_meta_count(m); i++)
        if (llama_model_meta_key_by_index(m, i, key, sizeof(key)) >= 0 &&
            (strcmp(key, "tokenizer.ggml.model") == 0 || strcmp(key, "tokenizer.ggml.pre") == 0) &&
            llama_model_meta_val_str_by_index(m, i, val, sizeof(val)) >= 0)
            put(&c, "%s=%s", key, val);
    for (int32_t t = 0; t < n; t++) {
        const char *text = llama_vocab_get_text(v, t);
        put(&c, "%d %a %d", t, llama_vocab_get_score(v, t), (int)llama_vocab_get_attr(v, t));
        kvt_wyhash_update(&c.h, text, strlen(text) + 1);
    }
    snprintf(out, 17, "%016" PRIx64, kvt_wyhash_final(&c.h));
}

/* Memory kinds and settings whose state the mapping cannot represent faithfully. */
static int check_supported(const struct llama_model *m, const struct llama_context_params *p)
{
    const char *why = NULL;
    enum llama_rope_type rt = llama_model_rope_type(m);
    if (llama_model_is_hybrid(m))
        why = "hybrid attention + recurrent memory";
    else if (rt == LLAMA_ROPE_TYPE_MROPE || rt == LLAMA_ROPE_TYPE_IMROPE ||
             rt == LLAMA_ROPE_TYPE_VISION)
        why = "multi-dimensional positions (M-RoPE)";
    else if (llama_model_has_encoder(m))
        why = "encoder-decoder models";
    else if (p->ctx_other || p->ctx_type != llama_context_default_params().ctx_type)
        why = "contexts that share memory with another context";
    else if (p->n_rs_seq != 0)
        why = "recurrent rollback snapshots (n_rs_seq)";
    if (why)
        return kvt_set_error(KVT_E_UNSUPPORTED, "kvtier-llama: %s are not mapped", why);
    return 0;
}

int identity_derive(struct llama_context *ctx, const struct kvt_llama_opts *o,
                    struct llama_identity *id)
{
    if (strcmp(llama_version(), KVT_LLAMA_KNOWN_VERSION) != 0)
        return kvt_set_error(KVT_E_UNSUPPORTED,
                             "kvtier-llama: llama.cpp %s is not the build this library maps "
                             "(%s); its state layout may differ",
                             llama_version(), KVT_LLAMA_KNOWN_VERSION);
    const struct llama_model *m = llama_get_model(ctx);
    const struct llama_context_params *p = o->cparams;
    int rc = check_supported(m, p);
    if (rc)
        return rc;
    char weights[17 + 64];
    if (o->weights_digest)
        snprintf(weights, sizeof(weights), "%.80s", o->weights_digest);
    else if ((rc = file_digest(o->model_path, weights)))
        return rc;

    uint32_t n_seq = llama_n_seq_max(ctx);
    struct canon c;
    kvt_wyhash_init(&c.h, 0);
    put(&c, "kvtier-llama 1 llama.cpp %s", llama_version());
    model_meta(&c, m);
    put(&c, "weights %s", weights);
    context_params(&c, p);
    if ((rc = adapters(&c, o)))
        return rc;
    snprintf(id->fingerprint, sizeof(id->fingerprint), "llama-%016" PRIx64, kvt_wyhash_final(&c.h));

    char tok[17];
    tokenizer_digest(m, tok);
    snprintf(id->tokenizer_hash, sizeof(id->tokenizer_hash), "vocab-%s", tok);
    char name[128];
    if (llama_model_meta_val_str(m, "general.name", name, sizeof(name)) < 0)
        llama_model_desc(m, name, sizeof(name));
    snprintf(id->model_id, sizeof(id->model_id), "llama.cpp:%s", name);

    bool recurrent = llama_model_is_recurrent(m);
    id->shape = (struct llama_shape){
        .recurrent = recurrent,
        .n_layer = (uint32_t)llama_model_n_layer(m),
        .n_stream = p->kv_unified ? 1 : n_seq,
        .type_k = recurrent ? 0 : (int32_t)p->type_k,
        .type_v = recurrent ? 0 : (int32_t)p->type_v,
        /* llama.cpp lays V out transposed exactly when flash attention is off outright */
        .v_trans = !recurrent && p->flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED,
        .n_swa = recurrent ? 0 : (uint32_t)llama_model_n_swa(m),
    };
    if (id->shape.n_layer == 0 || id->shape.n_layer > KVT_LLAMA_MAX_LAYERS)
        return kvt_set_error(KVT_E_UNSUPPORTED, "kvtier-llama: %u layers", id->shape.n_layer);
    return 0;
}
