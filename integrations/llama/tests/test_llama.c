/*
 * The llama.cpp integration on a real llama.cpp (the prebuilt 0.5.0 CPU libraries) with
 * generated models: a sequence prefilled and decoded in one process, saved through kvtier,
 * loaded in a new process, gives bit-identical logits for every next step, for llama, qwen3
 * (grouped KV heads) and mamba (recurrent state), flash attention on and off, F16, BF16, F32
 * and q8_0/q4_0 K/V; a RAM-tier reload in the same process does too. A shared prefix is reused
 * (attention: trimmed; recurrent: exact extensions only) and matches a full recompute within
 * a tolerance. Other weights, vocabulary, KV type, context setting or namespace miss, and a
 * corrupted entry file is a miss that never reaches llama.cpp.
 *
 * The chat example, restarted, continues from the disk cache with the same replies.
 *
 * Each process is tests/progs/llama_worker; this suite generates the models and compares.
 */
#include "support/support.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_gen.h"

#define N_TOK 48 /* tokens saved: 32 prefilled in one batch, 16 decoded one at a time */
#define PREFILL 32
#define NEXT 77 /* the token decoded after the restore */
#define STEPS 6 /* greedy steps after it, each step's logits compared */

static char *model_path(const char *name)
{
    return strf("%s/%s.gguf", test_dir, name);
}

/* Generate the test models once per suite run. */
static int gen_models(void **state)
{
    if (test_dir_setup(state))
        return -1;
    const char *names[] = {"llama", "qwen3", "gemma2", "mamba"};
    for (size_t i = 0; i < 4; i++) {
        struct model_spec m;
        model_spec_named(names[i], &m);
        char *p = model_path(names[i]);
        int rc = model_write(&m, p);
        free(p);
        if (rc)
            return -1;
    }
    struct model_spec m;
    model_spec_named("llama", &m);
    m.seed = 99; /* other weights, same everything else */
    char *p = model_path("llama-weights");
    int rc = model_write(&m, p);
    free(p);
    model_spec_named("llama", &m);
    m.n_vocab = 300; /* another vocabulary */
    p = model_path("llama-vocab");
    rc |= model_write(&m, p);
    free(p);
    model_spec_named("gemma2", &m);
    m.n_swa = 128; /* a window the tests' 48 tokens never fill */
    p = model_path("gemma2-wide");
    rc |= model_write(&m, p);
    free(p);
    model_spec_named("llama", &m);
    m.n_embd = 128; /* heads of 64: llama.cpp stores quantized K and V rotated */
    m.n_ff = 256;
    p = model_path("llama-h64");
    rc |= model_write(&m, p);
    free(p);
    model_spec_named("llama", &m);
    for (uint64_t seed = 7; seed <= 8; seed++) { /* two adapters of rank 4 */
        p = model_path(seed == 7 ? "llama-lora" : "llama-lora-b");
        rc |= lora_write(&m, 4, seed, p);
        free(p);
    }
    return rc;
}

static char *tokens_arg(const int32_t *t, size_t n)
{
    size_t cap = n * 12 + 1, at = 0;
    char *s = malloc(cap);
    s[0] = '\0';
    for (size_t i = 0; i < n; i++)
        at += (size_t)snprintf(s + at, cap - at, i ? ",%d" : "%d", t[i]);
    return s;
}

static void prompt(int32_t *t, size_t n, int32_t salt)
{
    for (size_t i = 0; i < n; i++)
        t[i] = (int32_t)((i * 37 + 11 + (size_t)salt * 101) % 256);
}

/* Run the worker; returns its exit status and its stdout in *out (may be NULL). */
static int worker(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int worker(char **out, const char *fmt, ...)
{
    char args[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    char *cmd = strf("%s/tests/progs/llama_worker %s", KVT_BUILD_DIR, args);
    int rc = run_capture(cmd, out);
    free(cmd);
    return rc;
}

struct loaded {
    long loaded, entry, disk, pos_max;
};

static struct loaded parse_loaded(const char *s)
{
    struct loaded l = {-1, -1, -1, -2};
    const char *at = strstr(s, "loaded=");
    assert_non_null(at);
    assert_int_equal(sscanf(at, "loaded=%ld entry=%ld disk=%ld pos_max=%ld", &l.loaded, &l.entry,
                            &l.disk, &l.pos_max),
                     4);
    return l;
}

struct config {
    const char *model, *type;
    int fa;
};

static char *config_args(const struct config *c, const char *dir)
{
    char *m = model_path(c->model);
    char *s = strf("--model %s --dir %s --type %s --fa %d", m, dir, c->type, c->fa);
    free(m);
    return s;
}

static void save(const struct config *c, const char *dir, const int32_t *tok, const char *extra)
{
    char *ca = config_args(c, dir), *ta = tokens_arg(tok, N_TOK);
    assert_int_equal(worker(NULL, "save %s --tokens %s --prefill %d %s", ca, ta, PREFILL, extra),
                     0);
    free(ca);
    free(ta);
}

/* Load in a new process (prompt: @p tok[0..n) then NEXT); returns what it loaded. */
static struct loaded load(const struct config *c, const char *dir, const int32_t *tok, size_t n,
                          const char *extra)
{
    char *ca = config_args(c, dir), *ta = tokens_arg(tok, n), *out;
    assert_int_equal(
        worker(&out, "load %s --tokens %s --next %d --steps %d %s", ca, ta, NEXT, STEPS, extra), 0);
    struct loaded l = parse_loaded(out);
    free(out);
    free(ca);
    free(ta);
    return l;
}

/* What a refused call returned, and what the sequence held after it. */
static void assert_refused(const char *out, int want_rc)
{
    int rc = 0;
    long pos_max = -2;
    const char *at = strstr(out, "failed rc=");
    if (!at)
        fail_msg("not refused:\n%s", out);
    assert_int_equal(sscanf(at, "failed rc=%d pos_max=%ld", &rc, &pos_max), 2);
    assert_int_equal(rc, want_rc);
    assert_int_equal(pos_max, -1); /* nothing placed */
}

static void assert_same_file(const char *a, const char *b)
{
    size_t na, nb;
    uint8_t *x = read_file(a, &na), *y = read_file(b, &nb);
    assert_non_null(x);
    assert_non_null(y);
    assert_int_equal(na, nb);
    assert_true(na >= sizeof(float) * 256 * (STEPS + 1));
    assert_memory_equal(x, y, na);
    free(x);
    free(y);
}

/* Every .mlxkv file under @p dir (recursively) passes `kvtier verify`; returns their count. */
static int verify_all(const char *dir)
{
    char *out;
    char *args = strf("verify %s", dir);
    int rc = run_cli(args, true, &out);
    free(args);
    if (rc != 0)
        print_error("%s\n", out);
    assert_int_equal(rc, 0);
    int n = 0;
    assert_int_equal(sscanf(out, "%d file", &n), 1);
    free(out);
    return n;
}

/* Save in one process and load in another: the next steps' logits are bit-identical. */
static void roundtrip(const struct config *c)
{
    char *dir = strf("%s/rt-%s-%s-%d", test_dir, c->model, c->type, c->fa);
    char *a = strf("%s.uninterrupted", dir), *b = strf("%s.restored", dir),
         *r = strf("%s.reloaded", dir);
    int32_t tok[N_TOK];
    prompt(tok, N_TOK, 0);
    char *extra = strf("--next %d --steps %d --out %s", NEXT, STEPS, a);
    save(c, dir, tok, extra);
    free(extra);

    char *out_b = strf("--out %s", b);
    struct loaded l = load(c, dir, tok, N_TOK, out_b);
    free(out_b);
    assert_int_equal(l.loaded, N_TOK);
    assert_int_equal(l.entry, N_TOK);
    assert_int_equal(l.disk, 1);
    assert_int_equal(l.pos_max, N_TOK - 1);
    assert_same_file(a, b);

    /* the RAM tier's copy, loaded back in the saving process, is exact too */
    char *ca = config_args(c, dir), *ta = tokens_arg(tok, N_TOK), *out;
    char *dir2 = strf("%s-ram", dir);
    free(ca);
    ca = config_args(c, dir2);
    assert_int_equal(worker(&out,
                            "save %s --tokens %s --prefill %d --reload --next %d --steps %d "
                            "--out %s",
                            ca, ta, PREFILL, NEXT, STEPS, r),
                     0);
    l = parse_loaded(out);
    assert_int_equal(l.loaded, N_TOK);
    assert_int_equal(l.disk, 0);
    assert_same_file(a, r);
    assert_true(verify_all(dir) >= 1);
    free(out);
    free(ca);
    free(ta);
    free(dir2);
    free(a);
    free(b);
    free(r);
    free(dir);
}

static void test_llama_f16_fa(void **s)
{
    (void)s;
    roundtrip(&(struct config){"llama", "f16", 1});
}

static void test_llama_f16_no_fa(void **s)
{
    (void)s;
    roundtrip(&(struct config){"llama", "f16", 0});
}

static void test_llama_f32_no_fa(void **s)
{
    (void)s;
    roundtrip(&(struct config){"llama", "f32", 0});
}

static void test_llama_q8_0(void **s)
{
    (void)s;
    roundtrip(&(struct config){"llama", "q8_0", 1});
    roundtrip(&(struct config){"llama-h64", "q8_0", 1});
}

static void test_llama_bf16(void **s)
{
    (void)s;
    roundtrip(&(struct config){"llama", "bf16", 1});
}

static void test_llama_q4_0(void **s)
{
    (void)s;
    roundtrip(&(struct config){"llama", "q4_0", 1});
}

static void test_qwen3_f16_fa(void **s)
{
    (void)s;
    roundtrip(&(struct config){"qwen3", "f16", 1});
}

static void test_qwen3_f16_no_fa(void **s)
{
    (void)s;
    roundtrip(&(struct config){"qwen3", "f16", 0});
}

static void test_qwen3_q8_0(void **s)
{
    (void)s;
    roundtrip(&(struct config){"qwen3", "q8_0", 1});
}

/* Sliding window: the 48 tokens wrap gemma2's window of 32 (and not gemma2-wide's). */
static void test_gemma2(void **s)
{
    (void)s;
    roundtrip(&(struct config){"gemma2", "f16", 1});
    roundtrip(&(struct config){"gemma2", "f16", 0});
    roundtrip(&(struct config){"gemma2-wide", "f16", 1});
    roundtrip(&(struct config){"gemma2", "q8_0", 1});
}

static void test_mamba(void **s)
{
    (void)s;
    roundtrip(&(struct config){"mamba", "f16", 1});
    roundtrip(&(struct config){"mamba", "f16", 0});
}

/* Largest absolute difference between two logit files, relative to the largest logit. */
static double logit_diff(const char *a, const char *b)
{
    size_t na, nb;
    float *x = (float *)read_file(a, &na), *y = (float *)read_file(b, &nb);
    assert_int_equal(na, nb);
    double d = 0, top = 1;
    for (size_t i = 0; i < na / sizeof(float); i++) {
        d = fmax(d, fabs((double)x[i] - (double)y[i]));
        top = fmax(top, fabs((double)x[i]));
    }
    free(x);
    free(y);
    return d / top;
}

/*
 * A prompt sharing the first 40 tokens of the stored 48 (32 prefilled, 8 decoded singly):
 * attention loads 40 (trimmed from the 48-token entry) and continues within tolerance of a
 * recompute of the whole prompt; recurrent state and a wrapped sliding window cannot be
 * trimmed, so they miss, and serve only an exact extension.
 */
static void prefix_reuse(const struct config *c, double tolerance)
{
    char *dir = strf("%s/px-%s-%s-%d", test_dir, c->model, c->type, c->fa);
    int32_t tok[N_TOK + 10];
    prompt(tok, N_TOK, 0);
    save(c, dir, tok, "");
    int32_t diverge[50];
    memcpy(diverge, tok, 40 * sizeof(*tok));
    prompt(diverge + 40, 10, 5);
    char *a = strf("%s.reused", dir), *b = strf("%s.full", dir);
    char *oa = strf("--out %s", a);
    struct loaded l = load(c, dir, diverge, 50, oa);
    if (strcmp(c->model, "mamba") == 0 || strcmp(c->model, "gemma2") == 0) {
        assert_int_equal(l.loaded, 0);
        assert_int_equal(l.pos_max, -1);
        prompt(tok + N_TOK, 10, 5); /* an exact extension is served */
        l = load(c, dir, tok, N_TOK + 10, "");
        assert_int_equal(l.loaded, N_TOK);
    } else {
        assert_int_equal(l.loaded, 40);
        assert_int_equal(l.entry, N_TOK);
        assert_int_equal(l.pos_max, 39);
        char *ca = config_args(c, dir), *ta = tokens_arg(diverge, 50);
        assert_int_equal(worker(NULL,
                                "full %s --tokens %s --next %d --steps %d --split 40 --out %s", ca,
                                ta, NEXT, STEPS, b),
                         0);
        double d = logit_diff(a, b);
        print_message(
            "%s %s fa=%d: reused prefix vs recompute: max |dlogit| / max |logit| = %.2e\n",
            c->model, c->type, c->fa, d);
        assert_true(d <= tolerance);
        free(ca);
        free(ta);
    }
    free(oa);
    free(a);
    free(b);
    free(dir);
}

/* The same reuse from the RAM tier in the saving process: the taken entry is a trimmed
 * clone (for gemma2-wide, a ring trimmed before it wrapped). */
static void prefix_reuse_ram(const struct config *c, double tolerance)
{
    char *dir = strf("%s/pxr-%s-%s-%d", test_dir, c->model, c->type, c->fa);
    int32_t tok[N_TOK], diverge[50];
    prompt(tok, N_TOK, 0);
    memcpy(diverge, tok, 40 * sizeof(*tok));
    prompt(diverge + 40, 10, 5);
    char *a = strf("%s.reused", dir), *b = strf("%s.full", dir), *out;
    char *ca = config_args(c, dir), *ta = tokens_arg(tok, N_TOK), *tr = tokens_arg(diverge, 50);
    assert_int_equal(worker(&out,
                            "save %s --tokens %s --prefill %d --reload-tokens %s --next %d "
                            "--steps %d --out %s",
                            ca, ta, PREFILL, tr, NEXT, STEPS, a),
                     0);
    struct loaded l = parse_loaded(out);
    assert_int_equal(l.loaded, 40);
    assert_int_equal(l.disk, 0);
    assert_int_equal(l.pos_max, 39);
    assert_int_equal(worker(NULL, "full %s --tokens %s --next %d --steps %d --split 40 --out %s",
                            ca, tr, NEXT, STEPS, b),
                     0);
    double d = logit_diff(a, b);
    print_message("%s %s fa=%d: reused prefix from RAM vs recompute: %.2e\n", c->model, c->type,
                  c->fa, d);
    assert_true(d <= tolerance);
    free(out);
    free(ca);
    free(ta);
    free(tr);
    free(a);
    free(b);
    free(dir);
}

static void test_prefix_reuse(void **s)
{
    (void)s;
    /* The reused rows 32-39 were computed one token at a time, the recompute's in one batch:
     * matrix products and flash attention then sum in other orders, so the logits cannot be
     * expected to agree bit for bit. */
    prefix_reuse(&(struct config){"llama", "f16", 1}, 1e-3);
    prefix_reuse(&(struct config){"llama", "f16", 0}, 1e-3);
    prefix_reuse(&(struct config){"qwen3", "q8_0", 1}, 1e-3);
    prefix_reuse(&(struct config){"gemma2-wide", "f16", 1}, 1e-3);
    prefix_reuse(&(struct config){"mamba", "f16", 1}, 0);
    prefix_reuse(&(struct config){"gemma2", "f16", 1}, 0); /* a wrapped window */
    prefix_reuse_ram(&(struct config){"llama", "f16", 0}, 1e-3);
    prefix_reuse_ram(&(struct config){"gemma2-wide", "f16", 1}, 1e-3);
}

/* Whatever differs in identity is a miss; the same configuration is a hit (the control). */
static void test_other_identity_misses(void **s)
{
    (void)s;
    const struct config c = {"llama", "f16", 1};
    char *dir = strf("%s/identity", test_dir);
    int32_t tok[N_TOK];
    prompt(tok, N_TOK, 0);
    save(&c, dir, tok, "");
    assert_int_equal(load(&c, dir, tok, N_TOK, "").loaded, N_TOK);
    const struct {
        struct config c;
        const char *extra;
    } other[] = {
        {{"llama-weights", "f16", 1}, ""},          /* other weights */
        {{"llama-vocab", "f16", 1}, ""},            /* other vocabulary */
        {{"llama", "q8_0", 1}, ""},                 /* other KV type */
        {{"llama", "f16", 0}, ""},                  /* flash attention off */
        {{"llama", "f16", 1}, "--rope-base 20000"}, /* other rope base */
        {{"llama", "f16", 1}, "--ns tenant-b"},     /* other namespace */
    };
    for (size_t i = 0; i < sizeof(other) / sizeof(other[0]); i++) {
        struct loaded l = load(&other[i].c, dir, tok, N_TOK, other[i].extra);
        assert_int_equal(l.loaded, 0);
        assert_int_equal(l.pos_max, -1);
    }
    free(dir);
}

/*
 * A context shift (the first 10 tokens removed, the rest moved down by 10) leaves llama.cpp a
 * K-shift that it applies at its next decode. Saved right after the shift, the 38 tokens
 * restore in a new process bit-identically with the same tokens saved after llama.cpp's own
 * decode applied the shift (--settle). The shifted context's own continuation is the
 * reference within a tolerance only: it reuses the freed cells, so its rows lie at other
 * cell indices and attention sums them in another order.
 */
static void shifted_roundtrip(const struct config *c)
{
    enum { SHIFT = 10 };
    char *dir = strf("%s/shift-%s-%s-%d", test_dir, c->model, c->type, c->fa);
    char *settled = strf("%s-settled", dir);
    char *a = strf("%s.uninterrupted", dir), *b = strf("%s.restored", dir),
         *r = strf("%s.restored", settled);
    int32_t tok[N_TOK];
    prompt(tok, N_TOK, 0);
    char *extra = strf("--shift %d --next %d --steps %d --out %s", SHIFT, NEXT, STEPS, a);
    save(c, dir, tok, extra);
    free(extra);
    extra = strf("--shift %d --settle --next %d", SHIFT, NEXT);
    save(c, settled, tok, extra);
    char *ob = strf("--out %s", b), * or = strf("--out %s", r);
    struct loaded l = load(c, dir, tok + SHIFT, N_TOK - SHIFT, ob);
    assert_int_equal(l.loaded, N_TOK - SHIFT);
    assert_int_equal(l.disk, 1);
    assert_int_equal(l.pos_max, N_TOK - SHIFT - 1);
    assert_int_equal(load(c, settled, tok + SHIFT, N_TOK - SHIFT, or).loaded, N_TOK - SHIFT);
    assert_same_file(r, b);
    double d = logit_diff(a, b);
    print_message("%s %s fa=%d: shifted, restored vs the shifted context's continuation: %.2e\n",
                  c->model, c->type, c->fa, d);
    assert_true(d <= 1e-2);
    free(ob);
    free(or);
    free(extra);
    free(a);
    free(b);
    free(r);
    free(settled);
    free(dir);
}

static void test_context_shift(void **s)
{
    (void)s;
    shifted_roundtrip(&(struct config){"llama", "f16", 1});
    shifted_roundtrip(&(struct config){"llama", "f16", 0});
    /* quantized K: this llama.cpp shifts it only where it stores it rotated (heads of 64) */
    shifted_roundtrip(&(struct config){"llama-h64", "q8_0", 1});
}

/* Save with @p save_extra, load in a new process with @p load_extra: a hit, bit-identical.
 * Returns the uninterrupted run's logits file; *@p dir_out (if not NULL) gets the store. */
static char *restore_across(const char *name, const struct config *c, const char *save_extra,
                            const char *load_extra, char **dir_out)
{
    char *dir = strf("%s/across-%s", test_dir, name);
    char *a = strf("%s.uninterrupted", dir), *b = strf("%s.restored", dir);
    int32_t tok[N_TOK];
    prompt(tok, N_TOK, 0);
    char *se = strf("%s --next %d --steps %d --out %s", save_extra, NEXT, STEPS, a);
    char *le = strf("%s --out %s", load_extra, b);
    save(c, dir, tok, se);
    struct loaded l = load(c, dir, tok, N_TOK, le);
    assert_int_equal(l.loaded, N_TOK);
    assert_int_equal(l.disk, 1);
    assert_int_equal(l.pos_max, N_TOK - 1);
    assert_same_file(a, b);
    free(se);
    free(le);
    free(b);
    if (dir_out)
        *dir_out = dir;
    else
        free(dir);
    return a;
}

/*
 * Settings that change how many cells and streams a context has, not what a sequence's rows
 * mean, are not identity: a server that changes its slot count keeps its cache. Flash
 * attention AUTO creates the memory ENABLED does and resolves to the same kernel here.
 * (Flash attention off stays a miss: V is laid out transposed and computed by another
 * kernel; test_other_identity_misses.)
 */
static void test_identity_across_settings(void **s)
{
    (void)s;
    const struct config llama = {"llama", "f16", 1}, gemma2 = {"gemma2", "f16", 1};
    const struct {
        const char *name;
        const struct config *c;
        const char *save, *load;
    } across[] = {
        {"n-seq", &llama, "", "--n-seq 4 --seq 2"},
        {"unified", &llama, "", "--n-seq 4 --unified --seq 3"},
        {"unified-back", &llama, "--n-seq 4 --unified", ""},
        {"fa-auto", &llama, "", "--fa auto"},
        {"fa-auto-back", &llama, "--fa auto", ""},
        {"swa-full-off", &gemma2, "", "--swa-full 0"},
        {"swa-full-on", &gemma2, "--swa-full 0", ""},
    };
    for (size_t i = 0; i < sizeof(across) / sizeof(across[0]); i++)
        free(restore_across(across[i].name, across[i].c, across[i].save, across[i].load, NULL));
}

/* A sequence id outside the context's is -EINVAL for load and save, with nothing placed. */
static void test_bad_sequence_refused(void **s)
{
    (void)s;
    const struct config c = {"llama", "f16", 1};
    char *dir = strf("%s/bad-seq", test_dir);
    int32_t tok[N_TOK];
    prompt(tok, N_TOK, 0);
    save(&c, dir, tok, "");
    char *ca = config_args(&c, dir), *ta = tokens_arg(tok, N_TOK), *out;
    const int bad[] = {4, 1, -1}; /* n_seq_max is 1 */
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(
            worker(&out, "load %s --tokens %s --next %d --seq %d", ca, ta, NEXT, bad[i]), 1);
        assert_refused(out, -EINVAL);
        free(out);
        assert_int_equal(
            worker(&out, "save %s --tokens %s --prefill %d --seq %d", ca, ta, PREFILL, bad[i]), 1);
        assert_refused(out, -EINVAL);
        free(out);
    }
    /* the control: the same sequence in a context of five */
    assert_int_equal(load(&c, dir, tok, N_TOK, "--n-seq 5 --seq 4").loaded, N_TOK);
    free(ca);
    free(ta);
    free(dir);
}

/* Whether two logit files differ at all. */
static bool files_differ(const char *a, const char *b)
{
    size_t na, nb;
    uint8_t *x = read_file(a, &na), *y = read_file(b, &nb);
    bool d = na != nb || memcmp(x, y, na) != 0;
    free(x);
    free(y);
    return d;
}

/* Entries saved under @p save_extra (adapters) restore bit-identically with the same
 * declaration and miss under each of @p other; returns the uninterrupted logits' path. */
static char *adapter_case(const char *name, const char *save_extra, const char *const *other,
                          size_t n_other)
{
    const struct config c = {"llama", "f16", 1};
    int32_t tok[N_TOK];
    prompt(tok, N_TOK, 0);
    char *dir, *a = restore_across(name, &c, save_extra, save_extra, &dir);
    for (size_t i = 0; i < n_other; i++) {
        struct loaded l = load(&c, dir, tok, N_TOK, other[i]);
        if (l.loaded != 0)
            fail_msg("%s: loaded %ld tokens with \"%s\"", name, l.loaded, other[i]);
        assert_int_equal(l.pos_max, -1);
    }
    free(dir);
    return a;
}

/*
 * LoRA adapters and control vectors change every row after the first layer: an entry saved
 * with them restores bit-identically only under the same declaration, and misses without
 * them, with another adapter or scale, or another vector; a base entry misses under any.
 */
static void test_adapters_are_identity(void **s)
{
    (void)s;
    char *lora = model_path("llama-lora"), *lora_b = model_path("llama-lora-b");
    char *with = strf("--lora %s", lora), *half = strf("--lora %s --lora-scale 0.5", lora);
    char *other = strf("--lora %s", lora_b);
    const char *not_lora[] = {"", half, other, "--cvec 7"};
    char *l = adapter_case("lora", with, not_lora, 4);
    const char *not_cvec[] = {"", "--cvec 8", with};
    char *v = adapter_case("cvec", "--cvec 7", not_cvec, 3);
    const char *not_base[] = {with, "--cvec 7"};
    char *base = adapter_case("no-adapter", "", not_base, 2);
    assert_true(files_differ(l, base)); /* each changes what the model computes */
    assert_true(files_differ(v, base));
    /* a vector llama.cpp refuses fails the open, with its reason */
    char *m = model_path("llama"), *dir = strf("%s/adapters-bad", test_dir), *out;
    assert_int_equal(worker(&out,
                            "load --model %s --dir %s --tokens 1,2,3 --cvec 7 "
                            "--cvec-embd 63 2>&1",
                            m, dir),
                     1);
    assert_non_null(strstr(out, "llama.cpp refused the control vector (n_embd 63"));
    free(out);
    free(dir);
    free(m);
    free(l);
    free(v);
    free(base);
    free(with);
    free(half);
    free(other);
    free(lora);
    free(lora_b);
}

/*
 * Quantized K and V of heads of 64 are stored rotated, unless LLAMA_ATTN_ROT_DISABLE is set
 * where the context is made: an entry saved rotated misses in a process that stores them
 * plain, and the other way round.
 */
static void test_attention_rotation_is_identity(void **s)
{
    (void)s;
    const struct config c = {"llama-h64", "q8_0", 1};
    int32_t tok[N_TOK];
    prompt(tok, N_TOK, 0);
    for (int saved_plain = 0; saved_plain < 2; saved_plain++) {
        char *dir = strf("%s/attn-rot-%d", test_dir, saved_plain);
        if (saved_plain)
            setenv("LLAMA_ATTN_ROT_DISABLE", "1", 1);
        save(&c, dir, tok, "");
        assert_int_equal(load(&c, dir, tok, N_TOK, "").loaded, N_TOK); /* the control */
        if (saved_plain)
            unsetenv("LLAMA_ATTN_ROT_DISABLE");
        else
            setenv("LLAMA_ATTN_ROT_DISABLE", "1", 1);
        struct loaded l = load(&c, dir, tok, N_TOK, "");
        assert_int_equal(l.loaded, 0);
        assert_int_equal(l.pos_max, -1);
        unsetenv("LLAMA_ATTN_ROT_DISABLE");
        free(dir);
    }
}

/* Paths of the .mlxkv files under @p dir (two levels: <fingerprint>/<ns>/). */
static int find_entries(const char *dir, char **paths, int max)
{
    int n = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d)) && n < max;) {
        if (e->d_name[0] == '.')
            continue;
        char *sub = strf("%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(sub, &st) == 0 && S_ISDIR(st.st_mode)) {
            n += find_entries(sub, paths + n, max - n);
            free(sub);
        } else if (strstr(e->d_name, ".mlxkv") && !strstr(e->d_name, ".tmp")) {
            paths[n++] = sub;
        } else {
            free(sub);
        }
    }
    closedir(d);
    return n;
}

static void test_corrupt_entry_is_a_miss(void **s)
{
    (void)s;
    const struct config c = {"qwen3", "f16", 1};
    char *dir = strf("%s/corrupt", test_dir);
    int32_t tok[N_TOK];
    prompt(tok, N_TOK, 0);
    save(&c, dir, tok, "");
    char *paths[4];
    assert_int_equal(find_entries(dir, paths, 4), 1);
    flip_slot_byte(paths[0], 1, 1, 5, 0x10); /* a byte of layer 1's V */
    char *args = strf("verify %s", paths[0]);
    assert_int_equal(run_cli(args, false, NULL), 1);
    free(args);

    struct loaded l = load(&c, dir, tok, N_TOK, "");
    assert_int_equal(l.loaded, 0);
    assert_int_equal(l.pos_max, -1); /* nothing reached llama.cpp */
    struct stat st;
    assert_int_not_equal(stat(paths[0], &st), 0); /* disposed of, as the store does */
    free(paths[0]);
    free(dir);
}

/*
 * An intact entry under the right identity whose caches do not fit the context (another
 * layer count, another row size) is a miss: nothing reaches llama.cpp.
 */
static void test_entry_that_does_not_fit_is_a_miss(void **s)
{
    (void)s;
    const struct config c = {"llama", "f16", 1};
    for (int variant = 0; variant < 2; variant++) {
        char *dir = strf("%s/misfit-%d", test_dir, variant);
        int32_t tok[N_TOK];
        prompt(tok, N_TOK, 0);
        save(&c, dir, tok, "");
        char *paths[4];
        assert_int_equal(find_entries(dir, paths, 4), 1);
        struct kvt_entry *e;
        assert_int_equal(kvt_file_load(paths[0], NULL, &e, NULL), 0);
        if (variant == 0) {
            kvt_cache_free(e->caches[1]); /* one layer fewer */
            e->n_caches = 1;
        } else {
            const int64_t shape[4] = {1, 1, N_TOK, 48}; /* rows of another size */
            struct kvt_tensor t[2];
            for (int w = 0; w < 2; w++)
                assert_int_equal(kvt_tensor_zeros(&t[w], KVT_FLOAT16, 4, shape), 0);
            struct kvt_cache_info info = {.kind = KVT_KIND_KV, .offset = N_TOK};
            kvt_cache_free(e->caches[1]);
            assert_int_equal(kvt_cache_from_state(&info, t, 2, &e->caches[1]), 0);
            kvt_tensor_release(&t[0]);
            kvt_tensor_release(&t[1]);
        }
        struct kvt_save_opts so = {0};
        assert_int_equal(unlink(paths[0]), 0);
        assert_int_equal(kvt_file_save(paths[0], e, &so, NULL), 0);
        kvt_entry_free(e);
        struct loaded l = load(&c, dir, tok, N_TOK, "");
        assert_int_equal(l.loaded, 0);
        assert_int_equal(l.pos_max, -1);
        free(paths[0]);
        free(dir);
    }
}

/* A llama.cpp reporting another version is refused at open with a clear message. */
static void test_other_llama_build_refused(void **s)
{
    (void)s;
    char *m = model_path("llama"), *dir = strf("%s/other-build", test_dir), *out;
    /* an AddressSanitizer build tolerates a preloaded library only when told to */
    char *cmd = strf("ASAN_OPTIONS=verify_asan_link_order=0 LD_PRELOAD=%s/tests/progs/"
                     "other_version.so %s/tests/progs/llama_worker load "
                     "--model %s --dir %s --tokens 1,2,3 2>&1",
                     KVT_BUILD_DIR, KVT_BUILD_DIR, m, dir);
    assert_int_equal(run_capture(cmd, &out), 1);
    assert_non_null(strstr(out, "llama.cpp 0.6.0-other is not the build this library maps"));
    free(out);
    free(cmd);
    free(dir);
    free(m);
}

/* The chat example, run twice on the same input: the restarted process takes its prompts from
 * the disk cache and replies exactly as the first did (greedy decoding from the same state). */
static void test_chat_example(void **s)
{
    (void)s;
    char *m = model_path("llama"), *dir = strf("%s/chat", test_dir);
    char *in = strf("%s/chat.in", test_dir);
    const char *lines = "hello there, how are you today\nand what about tomorrow then\n";
    assert_int_equal(write_file(in, lines, strlen(lines)), 0);
    char *out[2], *err[2];
    for (int run = 0; run < 2; run++) {
        out[run] = strf("%s/chat.out%d", test_dir, run);
        err[run] = strf("%s/chat.err%d", test_dir, run);
        char *cmd = strf("%s/examples/llama_chat --model %s --cache-dir %s --ctx 1024 --threads 1 "
                         "--backends " KVT_LLAMA_LIB_DIR " < %s > %s "
                         "2> %s",
                         KVT_BUILD_DIR, m, dir, in, out[run], err[run]);
        assert_int_equal(system(cmd), 0);
        free(cmd);
    }
    size_t n0, n1;
    char *a = (char *)read_file(out[0], &n0), *b = (char *)read_file(out[1], &n1);
    assert_true(n0 > 0);
    assert_int_equal(n0, n1);
    assert_memory_equal(a, b, n0);
    /* first process: a miss, then its first turn from RAM; the restart: both turns from disk
     * (the first process's longer conversation serves both prompts) */
    const char *want[2][2] = {
        {"0 of 10 prompt tokens", "74 of 83 prompt tokens from the RAM"},
        {"9 of 10 prompt tokens from the disk", "82 of 83 prompt tokens from the disk"}};
    for (int run = 0; run < 2; run++) {
        size_t ne;
        char *e = (char *)read_file(err[run], &ne);
        e = realloc(e, ne + 1);
        e[ne] = '\0';
        for (int t = 0; t < 2; t++)
            if (!strstr(e, want[run][t]))
                fail_msg("run %d: no \"%s\" in:\n%s", run, want[run][t], e);
        free(e);
    }
    for (int run = 0; run < 2; run++) {
        free(out[run]);
        free(err[run]);
    }
    free(a);
    free(b);
    free(in);
    free(dir);
    free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_f16_fa),
        cmocka_unit_test(test_llama_f16_no_fa),
        cmocka_unit_test(test_llama_f32_no_fa),
        cmocka_unit_test(test_llama_q8_0),
        cmocka_unit_test(test_llama_bf16),
        cmocka_unit_test(test_llama_q4_0),
        cmocka_unit_test(test_qwen3_f16_fa),
        cmocka_unit_test(test_qwen3_f16_no_fa),
        cmocka_unit_test(test_qwen3_q8_0),
        cmocka_unit_test(test_gemma2),
        cmocka_unit_test(test_mamba),
        cmocka_unit_test(test_prefix_reuse),
        cmocka_unit_test(test_other_identity_misses),
        cmocka_unit_test(test_context_shift),
        cmocka_unit_test(test_adapters_are_identity),
        cmocka_unit_test(test_bad_sequence_refused),
        cmocka_unit_test(test_identity_across_settings),
        cmocka_unit_test(test_attention_rotation_is_identity),
        cmocka_unit_test(test_corrupt_entry_is_a_miss),
        cmocka_unit_test(test_entry_that_does_not_fit_is_a_miss),
        cmocka_unit_test(test_other_llama_build_refused),
        cmocka_unit_test(test_chat_example),
    };
    return cmocka_run_group_tests(tests, gen_models, test_dir_teardown);
}
