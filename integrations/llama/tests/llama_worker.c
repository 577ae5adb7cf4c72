/*
 * One process of the llama.cpp integration's tests: loads a generated model into a real
 * llama.cpp context with kvtier as its prompt cache, then
 *   save:  prefills the first --prefill tokens of the prompt in one batch, decodes the
 *          rest of --tokens one at a time, saves the sequence, flushes; with --out it goes
 *          on uninterrupted: decodes --next and --steps greedy tokens, writing each step's
 *          logits to --out. With --reload it first loads the sequence back from the RAM
 *          tier (printing what was loaded), as a server does between turns; with
 *          --reload-tokens it loads that other prompt from the RAM tier instead and goes on
 *          from there.
 *   load:  loads the longest cached prefix of --tokens + --next, decodes what is left in
 *          one batch, then the same greedy steps, logits to --out; prints what was loaded.
 *   full:  no cache: prefills --tokens + --next the way load decodes them after its prefix
 *          (--split tokens first, the rest in one batch), logits to --out.
 * Context settings: --n-seq, --unified, --swa-full, --fa 0|1|auto, --type, --ctx; --seq: the
 * sequence load fills and decodes in, and the one save saves (it always decodes in 0).
 * --shift K: after decoding, save drops the first K tokens and shifts the rest down by K
 * (llama_memory_seq_rm + seq_add, a context shift), then saves the remaining tokens; with
 * --settle it first decodes --next and removes it again, so that llama.cpp's own decode has
 * applied the shift to the rows before the save.
 * --lora FILE [--lora-scale S] and --cvec SEED declare a LoRA adapter and a control vector
 * (generated from the seed; --cvec-embd declares another width) to kvtier, which sets them
 * on the context.
 * Prints "loaded=N entry=M disk=D pos_max=P" for load; exits 0, or 1 with a message; a
 * refused load or save prints "failed rc=R pos_max=P" (P: the sequence's, after the call).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "kvtier-llama.h"

struct args {
    const char *mode, *model, *dir, *out, *ns, *type, *lora;
    int fa, prefill, steps, split, reload, settle;
    int n_ctx, n_seq, unified, swa_full, seq, shift;
    float lora_scale;
    unsigned cvec_seed;
    int cvec_embd; /* declared n_embd of the control vector; 0: the model's */
    float rope_base;
    llama_token *tok;
    int n_tok;
    llama_token *reload_tok; /* --reload-tokens: load this prompt from RAM after the save */
    int n_reload;
    llama_token next;
};

static void quiet(enum ggml_log_level level, const char *text, void *ud)
{
    (void)level;
    (void)text;
    (void)ud;
}

static int die(const char *what)
{
    fprintf(stderr, "llama_worker: %s: %s\n", what, kvt_last_error());
    return 1;
}

static llama_token *parse_tokens(const char *s, int *n)
{
    int cap = 16;
    llama_token *t = malloc((size_t)cap * sizeof(*t));
    *n = 0;
    for (char *end; *s; s = *end ? end + 1 : end) {
        long v = strtol(s, &end, 10);
        if (end == s)
            break;
        if (*n == cap)
            t = realloc(t, (size_t)(cap *= 2) * sizeof(*t));
        t[(*n)++] = (llama_token)v;
    }
    return t;
}

static enum ggml_type kv_type(const char *s)
{
    if (strcmp(s, "q8_0") == 0)
        return GGML_TYPE_Q8_0;
    if (strcmp(s, "q4_0") == 0)
        return GGML_TYPE_Q4_0;
    if (strcmp(s, "f32") == 0)
        return GGML_TYPE_F32;
    if (strcmp(s, "bf16") == 0)
        return GGML_TYPE_BF16;
    return GGML_TYPE_F16;
}

/* Decode @p n tokens at sequence @p seq's next positions, in batches, logits for the last. */
static int decode_in(struct llama_context *ctx, llama_seq_id seq, const llama_token *t, int n)
{
    struct llama_batch b = llama_batch_init(256, 0, 1);
    int rc = 0;
    for (int i = 0; rc == 0 && i < n; i += b.n_tokens) {
        llama_pos p0 = llama_memory_seq_pos_max(llama_get_memory(ctx), seq) + 1;
        b.n_tokens = n - i < 256 ? n - i : 256;
        for (int j = 0; j < b.n_tokens; j++) {
            b.token[j] = t[i + j];
            b.pos[j] = p0 + j;
            b.n_seq_id[j] = 1;
            b.seq_id[j][0] = seq;
            b.logits[j] = j == b.n_tokens - 1;
        }
        rc = llama_decode(ctx, b) ? -1 : 0;
    }
    llama_batch_free(b);
    return rc;
}

static int decode(struct llama_context *ctx, llama_token *t, int n)
{
    return decode_in(ctx, 0, t, n);
}

static llama_token argmax(const float *l, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[best])
            best = i;
    return (llama_token)best;
}

/* Write the logits of the last decode, then @p steps greedy single-token steps' logits in
 * sequence @p seq. */
static int continue_greedy(struct llama_context *ctx, llama_seq_id seq, int n_vocab, int steps,
                           FILE *out)
{
    for (int s = 0;; s++) {
        const float *l = llama_get_logits_ith(ctx, -1);
        if (!l || fwrite(l, sizeof(float), (size_t)n_vocab, out) != (size_t)n_vocab)
            return -1;
        if (s == steps)
            return 0;
        llama_token t = argmax(l, n_vocab);
        if (decode_in(ctx, seq, &t, 1))
            return -1;
    }
}

/* Report a refused call: its code and what sequence @p seq holds after it. */
static int refused(struct llama_context *ctx, const char *what, int rc, llama_seq_id seq)
{
    printf("failed rc=%d pos_max=%d\n", rc,
           seq >= 0 ? llama_memory_seq_pos_max(llama_get_memory(ctx), seq) : -1);
    fflush(stdout);
    return die(what);
}

/* Load the cached prefix of @p all into sequence @p seq and print what came back.
 * @return the tokens loaded, or -1. */
static int load_and_report(kvt_llama *kl, struct llama_context *ctx, llama_seq_id seq,
                           llama_token *all, int n)
{
    struct kvt_llama_loaded r;
    int rc = kvt_llama_load(kl, seq, all, (size_t)n, &r);
    if (rc)
        return refused(ctx, "kvt_llama_load", rc, seq), -1;
    printf("loaded=%zu entry=%zu disk=%d pos_max=%d\n", r.n_tokens, r.n_entry, r.from_disk,
           llama_memory_seq_pos_max(llama_get_memory(ctx), seq));
    fflush(stdout);
    return (int)r.n_tokens;
}

/* A context shift of sequence 0: drop its first @p k tokens, move the rest down by @p k. */
static void shift(struct llama_context *ctx, int k)
{
    llama_memory_t mem = llama_get_memory(ctx);
    llama_memory_seq_rm(mem, 0, 0, k);
    llama_memory_seq_add(mem, 0, k, -1, -k);
}

/* A control vector of small values for layers 1.. from @p seed. */
static float *control_vector(unsigned seed, size_t n)
{
    float *v = malloc(n * sizeof(*v));
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        v[i] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5);
    }
    return v;
}

static int run(const struct args *a, struct llama_context *ctx, struct llama_context_params *cp,
               int n_vocab)
{
    FILE *out = a->out ? fopen(a->out, "wb") : NULL;
    if (a->out && !out)
        return die("cannot open --out");
    llama_token *all = malloc(((size_t)a->n_tok + 1) * sizeof(*all));
    memcpy(all, a->tok, (size_t)a->n_tok * sizeof(*all));
    all[a->n_tok] = a->next;
    struct kvt_llama_cvec cvec = {0};
    int rc = 0;
    if (strcmp(a->mode, "full") == 0) {
        rc = decode(ctx, all, a->split) || decode(ctx, all + a->split, a->n_tok + 1 - a->split);
        if (rc == 0)
            rc = continue_greedy(ctx, 0, n_vocab, a->steps, out);
        goto done;
    }
    struct kvt_llama_opts o;
    kvt_llama_opts_init(&o);
    o.cache_dir = a->dir;
    o.model_path = a->model;
    o.cparams = cp;
    o.ns = a->ns;
    struct kvt_llama_lora lora = {0};
    if (a->lora) {
        lora.adapter = llama_adapter_lora_init((struct llama_model *)llama_get_model(ctx), a->lora);
        lora.path = a->lora;
        lora.scale = a->lora_scale;
        o.loras = &lora;
        o.n_loras = 1;
        if (!lora.adapter) {
            rc = die("cannot load the LoRA adapter");
            goto done;
        }
    }
    if (a->cvec_seed) {
        const struct llama_model *m = llama_get_model(ctx);
        int n_embd = llama_model_n_embd(m), n_layer = llama_model_n_layer(m);
        cvec = (struct kvt_llama_cvec){NULL, (size_t)n_embd * (size_t)n_layer,
                                       a->cvec_embd ? a->cvec_embd : n_embd, 1, n_layer - 1};
        cvec.data = control_vector(a->cvec_seed, cvec.len);
        o.cvec = &cvec;
    }
    kvt_llama *kl;
    if (kvt_llama_open(ctx, &o, &kl)) {
        rc = die("kvt_llama_open");
        goto done;
    }
    if (strcmp(a->mode, "save") == 0) {
        rc = decode(ctx, all, a->prefill);
        for (int i = a->prefill; rc == 0 && i < a->n_tok; i++)
            rc = decode(ctx, all + i, 1);
        if (rc == 0 && a->shift)
            shift(ctx, a->shift);
        int kept = a->n_tok - a->shift, saved = rc;
        if (rc == 0 && a->settle && (rc = decode(ctx, all + a->n_tok, 1)) == 0)
            llama_memory_seq_rm(llama_get_memory(ctx), 0, kept, -1);
        size_t lb = (size_t)n_vocab * sizeof(float);
        float *before = rc == 0 ? malloc(lb) : NULL; /* the last decode's logits */
        if (before)
            memcpy(before, llama_get_logits_ith(ctx, -1), lb);
        if (rc == 0 && (saved = kvt_llama_save(kl, a->seq, all + a->shift, (size_t)kept)))
            rc = refused(ctx, "kvt_llama_save", saved, a->seq);
        const float *after = rc == 0 ? llama_get_logits_ith(ctx, -1) : NULL;
        if (rc == 0 && (!after || memcmp(before, after, lb)))
            rc = die("the save changed the logits of the last decode");
        free(before);
        if (rc == 0 && kvt_llama_flush(kl, -1))
            rc = die("kvt_llama_flush");
        if (rc == 0 && a->reload)
            rc = load_and_report(kl, ctx, 0, all + a->shift, kept + 1) < 0;
        if (rc == 0 && a->reload_tok) {
            llama_token *p = malloc(((size_t)a->n_reload + 1) * sizeof(*p));
            memcpy(p, a->reload_tok, (size_t)a->n_reload * sizeof(*p));
            p[a->n_reload] = a->next;
            int k = load_and_report(kl, ctx, 0, p, a->n_reload + 1);
            rc = k < 0 || decode(ctx, p + k, a->n_reload + 1 - k) ||
                 (out && continue_greedy(ctx, 0, n_vocab, a->steps, out));
            free(p);
        } else if (rc == 0 && out) {
            rc = decode(ctx, all + a->n_tok, 1) || continue_greedy(ctx, 0, n_vocab, a->steps, out);
        }
    } else {
        int loaded = load_and_report(kl, ctx, a->seq, all, a->n_tok + 1);
        rc = loaded < 0 ? loaded : decode_in(ctx, a->seq, all + loaded, a->n_tok + 1 - loaded);
        if (rc == 0 && out)
            rc = continue_greedy(ctx, a->seq, n_vocab, a->steps, out);
    }
    kvt_llama_close(kl, -1);
done:
    if (out && fclose(out))
        rc = -1;
    free((float *)cvec.data);
    free(all);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    struct args a = {
        .type = "f16", .fa = 1, .n_ctx = 1024, .n_seq = 1, .swa_full = 1, .lora_scale = 1.0f};
    static const struct option opts[] = {{"model", 1, 0, 'm'},         {"dir", 1, 0, 'd'},
                                         {"out", 1, 0, 'o'},           {"ns", 1, 0, 'n'},
                                         {"type", 1, 0, 't'},          {"fa", 1, 0, 'f'},
                                         {"prefill", 1, 0, 'p'},       {"steps", 1, 0, 's'},
                                         {"tokens", 1, 0, 'k'},        {"next", 1, 0, 'x'},
                                         {"split", 1, 0, 'S'},         {"ctx", 1, 0, 'c'},
                                         {"rope-base", 1, 0, 'r'},     {"reload", 0, 0, 'R'},
                                         {"reload-tokens", 1, 0, 'T'}, {"n-seq", 1, 0, 'N'},
                                         {"unified", 0, 0, 'U'},       {"swa-full", 1, 0, 'W'},
                                         {"seq", 1, 0, 'q'},           {"shift", 1, 0, 'h'},
                                         {"lora", 1, 0, 'l'},          {"lora-scale", 1, 0, 'L'},
                                         {"cvec", 1, 0, 'v'},          {"settle", 0, 0, 'E'},
                                         {"cvec-embd", 1, 0, 'e'},     {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 'm': a.model = optarg; break;
        case 'd': a.dir = optarg; break;
        case 'o': a.out = optarg; break;
        case 'n': a.ns = optarg; break;
        case 't': a.type = optarg; break;
        case 'f': a.fa = strcmp(optarg, "auto") == 0 ? -1 : atoi(optarg); break;
        case 'p': a.prefill = atoi(optarg); break;
        case 's': a.steps = atoi(optarg); break;
        case 'k': a.tok = parse_tokens(optarg, &a.n_tok); break;
        case 'x': a.next = atoi(optarg); break;
        case 'S': a.split = atoi(optarg); break;
        case 'c': a.n_ctx = atoi(optarg); break;
        case 'r': a.rope_base = strtof(optarg, NULL); break;
        case 'R': a.reload = 1; break;
        case 'T': a.reload_tok = parse_tokens(optarg, &a.n_reload); break;
        case 'N': a.n_seq = atoi(optarg); break;
        case 'U': a.unified = 1; break;
        case 'W': a.swa_full = atoi(optarg); break;
        case 'q': a.seq = atoi(optarg); break;
        case 'h': a.shift = atoi(optarg); break;
        case 'l': a.lora = optarg; break;
        case 'L': a.lora_scale = strtof(optarg, NULL); break;
        case 'v': a.cvec_seed = (unsigned)atoi(optarg); break;
        case 'E': a.settle = 1; break;
        case 'e': a.cvec_embd = atoi(optarg); break;
        default: return 2;
        }
    }
    if (optind != argc - 1 || !a.model || !a.tok) {
        fprintf(stderr, "usage: llama_worker save|load|full --model M --tokens 1,2,... ...\n");
        return 2;
    }
    a.mode = argv[optind];
    llama_log_set(quiet, NULL);
    ggml_backend_load_all_from_path(KVT_LLAMA_LIB_DIR);
    struct llama_model *m = llama_model_load_from_file(a.model, llama_model_default_params());
    if (!m)
        return die("cannot load the model");
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)a.n_ctx;
    cp.n_batch = 256;
    cp.n_ubatch = 256;
    cp.n_threads = cp.n_threads_batch = 1; /* tiny models: no gain from more */
    cp.flash_attn_type = a.fa < 0 ? LLAMA_FLASH_ATTN_TYPE_AUTO
                         : a.fa   ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                                  : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.n_seq_max = (uint32_t)a.n_seq;
    cp.kv_unified = a.unified;
    cp.swa_full = a.swa_full;
    cp.type_k = cp.type_v = kv_type(a.type);
    cp.rope_freq_base = a.rope_base;
    struct llama_context *ctx = llama_init_from_model(m, cp);
    if (!ctx)
        return die("cannot create the context");
    int rc = run(&a, ctx, &cp, llama_vocab_n_tokens(llama_model_get_vocab(m)));
    llama_free(ctx);
    llama_model_free(m);
    free(a.tok);
    free(a.reload_tok);
    return rc;
}
