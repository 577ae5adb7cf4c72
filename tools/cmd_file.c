/*
 * File commands of the kvtier CLI: `inspect` (print a header, as text or as JSON whose keys
 * mirror the golden summaries), `verify` (structural and hash check of files and directory
 * trees) and `synth` (write a valid synthetic entry of any kind through the public cache API).
 * Public API only.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"

/* ---- shared helpers ---- */

static const char *category_name(int rc)
{
    switch (rc) {
    case KVT_E_FORMAT: return "format";
    case KVT_E_UNSUPPORTED: return "unsupported";
    case KVT_E_CORRUPT: return "corrupt";
    case KVT_E_MISMATCH: return "mismatch";
    default: return "error";
    }
}

/* A rejected file (exit 1) as opposed to an OS or usage failure (exit 2). */
static bool is_file_verdict(int rc)
{
    return rc == KVT_E_FORMAT || rc == KVT_E_UNSUPPORTED || rc == KVT_E_CORRUPT ||
           rc == KVT_E_MISMATCH;
}

/* The check ID ("V15", "L3") a library message names after ": ", or "" when it names none. */
static void check_id(const char *msg, char out[8])
{
    out[0] = '\0';
    for (const char *p = msg; (p = strstr(p, ": ")) != NULL; p++) {
        const char *q = p + 2;
        if (*q != 'V' && *q != 'L')
            continue;
        size_t n = 1;
        while (n < 6 && isdigit((unsigned char)q[n]))
            n++;
        if (n > 1 && q[n] == ':') {
            memcpy(out, q, n);
            out[n] = '\0';
            return;
        }
    }
}

static void hex16(char out[17], uint64_t v)
{
    snprintf(out, 17, "%016llx", (unsigned long long)v);
}

static void json_str_or_null(FILE *f, const char *s)
{
    if (s)
        cli_json_string(f, s);
    else
        fputs("null", f);
}

/* The scalars of a cache after offset, in FORMAT.md §3.3 order. */
struct scalar {
    const char *key;
    int64_t value;
};

static int cache_scalars(const struct kvt_cache_info *in, struct scalar out[4])
{
    int n = 0;
    if (in->kind == KVT_KIND_ROTATING || in->kind == KVT_KIND_ROTATING_QKV) {
        out[n++] = (struct scalar){"idx", in->idx};
        out[n++] = (struct scalar){"maxSize", in->max_size};
    }
    if (in->kind == KVT_KIND_QKV || in->kind == KVT_KIND_ROTATING_QKV) {
        out[n++] = (struct scalar){"groupSize", in->group_size};
        out[n++] = (struct scalar){"bits", in->bits};
    }
    if (in->kind == KVT_KIND_TURBOQUANT) {
        out[n++] = (struct scalar){"kBits", in->k_bits};
        out[n++] = (struct scalar){"vBits", in->v_bits};
        out[n++] = (struct scalar){"headDim", in->head_dim};
    }
    return n;
}

static void print_shape(FILE *f, const struct kvt_slot *s, const char *sep)
{
    fputc('[', f);
    for (int d = 0; d < s->rank; d++)
        fprintf(f, "%s%lld", d ? sep : "", (long long)s->shape[d]);
    fputc(']', f);
}

/* ---- inspect ---- */

static void inspect_json(FILE *f, const struct kvt_header *h)
{
    char hex[17];
    fprintf(f, "{\"ok\":true,\"formatVersion\":%d,\"createdAt\":", h->format_version);
    if (h->created_at >= 0)
        fprintf(f, "%lld", (long long)h->created_at);
    else
        fputs("null", f);
    fputs(",\"modelId\":", f);
    json_str_or_null(f, h->model_id);
    fputs(",\"configFingerprint\":", f);
    json_str_or_null(f, h->config_fingerprint);
    fputs(",\"tokenizerHash\":", f);
    json_str_or_null(f, h->tokenizer_hash);
    fputs(",\"ns\":", f);
    json_str_or_null(f, h->ns);
    hex16(hex, kvt_wyhash(0, h->tokens, h->n_tokens * sizeof(int32_t)));
    fprintf(f, ",\"n_tokens\":%zu,\"tokens_hash\":\"%s\",\"tokens\":[", h->n_tokens, hex);
    for (size_t i = 0; i < h->n_tokens; i++)
        fprintf(f, "%s%d", i ? "," : "", (int)h->tokens[i]);
    hex16(hex, h->header_hash);
    fprintf(f,
            "],\"headerLen\":%u,\"headerHash\":\"%s\",\"dataStart\":%u,\"file_size\":%llu,"
            "\"indexable\":%s,\"trimmable\":%s,\"caches\":[",
            h->header_len, hex, h->data_start, (unsigned long long)h->file_size,
            kvt_header_is_indexable(h) ? "true" : "false",
            kvt_header_is_trimmable(h) ? "true" : "false");
    for (size_t i = 0; i < h->n_caches; i++) {
        const struct kvt_cache_header *c = &h->caches[i];
        fprintf(f, "%s{\"kind\":\"%s\",\"offset\":%lld", i ? "," : "", kvt_kind_name(c->info.kind),
                (long long)c->info.offset);
        struct scalar sc[4];
        int n = cache_scalars(&c->info, sc);
        for (int k = 0; k < n; k++)
            fprintf(f, ",\"%s\":%lld", sc[k].key, (long long)sc[k].value);
        fputs(",\"tensors\":[", f);
        for (int j = 0; j < c->n_slots; j++) {
            const struct kvt_slot *s = &c->slots[j];
            fprintf(f, "%s{\"off\":%llu,\"shape\":", j ? "," : "", (unsigned long long)s->off);
            print_shape(f, s, ",");
            hex16(hex, s->hash);
            fprintf(f, ",\"dtype\":%d,\"bytes\":%llu,\"hash\":\"%s\"}", s->dtype,
                    (unsigned long long)s->bytes, hex);
        }
        fputs("]}", f);
    }
    fputs("]}\n", f);
}

static void print_meta(FILE *f, const char *key, const char *value)
{
    fprintf(f, "  %-18s ", key);
    if (value)
        cli_json_string(f, value);
    else
        fputs("(absent)", f);
    fputc('\n', f);
}

static void inspect_text(FILE *f, const char *path, const struct kvt_header *h)
{
    char hex[17];
    hex16(hex, h->header_hash);
    fprintf(f, "%s\n", path);
    fprintf(f, "  %-18s v%d (header %u bytes, hash %s, data at %u)\n", "format", h->format_version,
            h->header_len, hex, h->data_start);
    fprintf(f, "  %-18s %llu bytes\n", "file size", (unsigned long long)h->file_size);
    if (h->created_at >= 0) {
        time_t secs = (time_t)(h->created_at / 1000);
        struct tm tm;
        char when[32] = "?";
        if (gmtime_r(&secs, &tm))
            strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", &tm);
        fprintf(f, "  %-18s %lld (%s)\n", "created", (long long)h->created_at, when);
    } else {
        fprintf(f, "  %-18s (absent)\n", "created");
    }
    print_meta(f, "modelId", h->model_id);
    print_meta(f, "configFingerprint", h->config_fingerprint);
    print_meta(f, "tokenizerHash", h->tokenizer_hash);
    print_meta(f, "ns", h->ns);
    fprintf(f, "  %-18s %zu [", "tokens", h->n_tokens);
    for (size_t i = 0; i < h->n_tokens && i < 32; i++)
        fprintf(f, "%s%d", i ? ", " : "", (int)h->tokens[i]);
    fprintf(f, "%s]\n", h->n_tokens > 32 ? ", ..." : "");
    fprintf(f, "  %-18s %s\n", "indexable", kvt_header_is_indexable(h) ? "yes" : "no");
    fprintf(f, "  %-18s %s\n", "trimmable", kvt_header_is_trimmable(h) ? "yes" : "no");
    fprintf(f, "  %-18s %zu\n", "caches", h->n_caches);
    for (size_t i = 0; i < h->n_caches; i++) {
        const struct kvt_cache_header *c = &h->caches[i];
        fprintf(f, "  [%zu] %s offset %lld", i, kvt_kind_name(c->info.kind),
                (long long)c->info.offset);
        struct scalar sc[4];
        int n = cache_scalars(&c->info, sc);
        for (int k = 0; k < n; k++)
            fprintf(f, " %s %lld", sc[k].key, (long long)sc[k].value);
        fputc('\n', f);
        for (int j = 0; j < c->n_slots; j++) {
            const struct kvt_slot *s = &c->slots[j];
            hex16(hex, s->hash);
            fprintf(f, "      tensors[%d] off %llu bytes %llu shape ", j,
                    (unsigned long long)s->off, (unsigned long long)s->bytes);
            print_shape(f, s, ",");
            fprintf(f, " %s (%d) hash %s\n", kvt_dtype_name(s->dtype), s->dtype, hex);
        }
    }
}

static void json_failure(FILE *f, const char *path, int rc, const char *msg)
{
    char id[8];
    check_id(msg, id);
    fputs("{\"ok\":false,\"file\":", f);
    cli_json_string(f, path);
    fprintf(f, ",\"category\":\"%s\",\"check\":", category_name(rc));
    json_str_or_null(f, id[0] ? id : NULL);
    fputs(",\"message\":", f);
    cli_json_string(f, msg);
    fputs("}\n", f);
}

static const char INSPECT_USAGE[] = "inspect FILE [--json]";

int cmd_inspect(int argc, char **argv)
{
    const char *path = NULL;
    bool json = false;
    if (cli_wants_help(argc, argv))
        return cli_usage(stdout, INSPECT_USAGE, 0);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = true;
        else if (argv[i][0] == '-' || path)
            goto usage;
        else
            path = argv[i];
    }
    if (!path)
        goto usage;
    struct kvt_header *h;
    int rc = kvt_file_read_header(path, NULL, &h);
    if (rc) {
        const char *msg = kvt_last_error()[0] ? kvt_last_error() : kvt_strerror(rc);
        if (json)
            json_failure(stdout, path, rc, msg);
        else
            fprintf(stderr, "kvtier: inspect: %s (%s)\n", msg, category_name(rc));
        return is_file_verdict(rc) ? EXIT_BAD : EXIT_USAGE;
    }
    if (json)
        inspect_json(stdout, h);
    else
        inspect_text(stdout, path, h);
    kvt_header_free(h);
    return 0;
usage:
    return cli_usage(stderr, INSPECT_USAGE, EXIT_USAGE);
}

/* ---- verify ---- */

struct path_list {
    char **v;
    size_t n, cap;
};

static int list_add(struct path_list *l, char *p)
{
    if (!p)
        return -ENOMEM;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        char **nv = realloc(l->v, cap * sizeof(*nv));
        if (!nv) {
            free(p);
            return -ENOMEM;
        }
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = p;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static char *join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p) {
        memcpy(p, dir, a);
        p[a] = '/';
        memcpy(p + a + 1, name, b + 1);
    }
    return p;
}

/* Collect the *.mlxkv files under @p dir (recursively, sorted). -errno on failure. */
static int walk(const char *dir, struct path_list *out)
{
    DIR *d = opendir(dir);
    if (!d)
        return -errno;
    struct path_list here = {0};
    struct dirent *de;
    int rc = 0;
    while (!rc && (de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        rc = list_add(&here, join(dir, de->d_name));
    }
    closedir(d);
    if (here.n)
        qsort(here.v, here.n, sizeof(*here.v), cmp_str);
    for (size_t i = 0; i < here.n; i++) {
        char *p = here.v[i];
        struct stat st;
        if (rc || lstat(p, &st) != 0) {
            free(p);
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            rc = walk(p, out);
            free(p);
        } else if (S_ISREG(st.st_mode) && (ends_with(p, ".mlxkv") || ends_with(p, ".kvshare") ||
                                           ends_with(p, ".kvchunk"))) { /* docs/SHARING.md */
            rc = list_add(out, p);
        } else {
            free(p);
        }
    }
    free(here.v);
    return rc;
}

static const char VERIFY_USAGE[] = "verify PATH... [--json] [--no-hashes]";

int cmd_verify(int argc, char **argv)
{
    bool json = false, no_hashes = false;
    struct path_list files = {0};
    int n_paths = 0, status = 0;
    size_t bad = 0, errors = 0;
    if (cli_wants_help(argc, argv))
        return cli_usage(stdout, VERIFY_USAGE, 0);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--no-hashes"))
            no_hashes = true;
        else if (argv[i][0] == '-')
            goto usage;
        else
            n_paths++;
    }
    if (n_paths == 0)
        goto usage;
    if (json)
        fputs("{\"files\":[", stdout);
    size_t shown = 0;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-')
            continue;
        struct stat st;
        int rc = 0;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode))
            rc = walk(argv[i], &files);
        else
            rc = list_add(&files, strdup(argv[i]));
        if (rc) {
            errors++;
            if (json) {
                fprintf(stdout, "%s{\"path\":", shown++ ? "," : "");
                cli_json_string(stdout, argv[i]);
                fputs(",\"ok\":false,\"category\":\"error\",\"check\":null,\"message\":", stdout);
                cli_json_string(stdout, strerror(-rc));
                fputs("}", stdout);
            } else {
                printf("error: %s: %s\n", argv[i], strerror(-rc));
            }
        }
    }
    struct kvt_expect x = {.no_verify = no_hashes};
    for (size_t k = 0; k < files.n; k++) {
        const char *p = files.v[k];
        int rc = kvt_file_verify(p, &x);
        const char *msg = rc ? (kvt_last_error()[0] ? kvt_last_error() : kvt_strerror(rc)) : "";
        if (rc) {
            if (is_file_verdict(rc))
                bad++;
            else
                errors++;
        }
        if (json) {
            char id[8];
            check_id(msg, id);
            fprintf(stdout, "%s{\"path\":", shown++ ? "," : "");
            cli_json_string(stdout, p);
            if (rc) {
                fprintf(stdout, ",\"ok\":false,\"category\":\"%s\",\"check\":", category_name(rc));
                json_str_or_null(stdout, id[0] ? id : NULL);
                fputs(",\"message\":", stdout);
                cli_json_string(stdout, msg);
                fputs("}", stdout);
            } else {
                fputs(",\"ok\":true}", stdout);
            }
        } else if (rc) {
            printf("%s: %s\n", category_name(rc), msg);
        }
    }
    if (json)
        printf("],\"checked\":%zu,\"bad\":%zu,\"errors\":%zu}\n", files.n, bad, errors);
    else
        printf("%zu file%s checked, %zu bad, %zu error%s\n", files.n, files.n == 1 ? "" : "s", bad,
               errors, errors == 1 ? "" : "s");
    status = errors ? EXIT_USAGE : bad ? EXIT_BAD : 0;
    for (size_t k = 0; k < files.n; k++)
        free(files.v[k]);
    free(files.v);
    return status;
usage:
    return cli_usage(stderr, VERIFY_USAGE, EXIT_USAGE);
}

/* ---- synth ---- */

struct synth_opts {
    const char *out;
    int kind; /* -1 = mixed */
    int64_t layers, heads, head_dim, tokens, max_size, bits, group_size, k_bits, v_bits;
    int dtype;
    uint64_t seed, max_file_bytes;
    int64_t created_at; /* 0 = now */
    const char *ns, *model_id, *config_fingerprint, *tokenizer_hash;
};

/* xorshift64* (the generator of the golden files) */
static uint64_t xs64(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static void fill_random(uint8_t *p, size_t n, uint64_t *rng)
{
    while (n >= 8) {
        uint64_t v = xs64(rng);
        for (int b = 0; b < 8; b++)
            p[b] = (uint8_t)(v >> (8 * b));
        p += 8;
        n -= 8;
    }
    if (n) {
        uint64_t v = xs64(rng);
        for (size_t b = 0; b < n; b++)
            p[b] = (uint8_t)(v >> (8 * b));
    }
}

/* A new contiguous tensor [1, H, rows, last] (or any 3/4-d shape) of random bytes. */
static int random_tensor(struct kvt_tensor *t, int dtype, int rank, const int64_t *shape,
                         uint64_t *rng)
{
    size_t n = kvt_dtype_size(dtype);
    for (int d = 0; d < rank; d++)
        if (__builtin_mul_overflow(n, (size_t)shape[d], &n))
            return -ENOMEM;
    kvt_buf *b;
    int rc = kvt_buf_new_uninit(n, &b);
    if (rc)
        return rc;
    rc = kvt_tensor_init(t, b, 0, dtype, rank, shape);
    kvt_buf_unref(b);
    if (rc)
        return rc;
    fill_random((uint8_t *)kvt_buf_data(t->buf), n, rng);
    return 0;
}

/* The kind's input tensors for @p rows tokens (FORMAT.md §5 order and shapes). */
static int make_rows(const struct synth_opts *o, int kind, int64_t rows, uint64_t *rng,
                     struct kvt_tensor *t, int *nt)
{
    int64_t H = o->heads, D = o->head_dim;
    int64_t last[6];
    int dt[6];
    int n = 0;
    switch (kind) {
    case KVT_KIND_KV:
    case KVT_KIND_ROTATING:
        n = 2;
        last[0] = last[1] = D;
        dt[0] = dt[1] = o->dtype;
        break;
    case KVT_KIND_QKV:
    case KVT_KIND_ROTATING_QKV:
        n = 6;
        for (int k = 0; k < 6; k += 3) {
            last[k] = D * o->bits / 32;
            last[k + 1] = last[k + 2] = D / o->group_size;
            dt[k] = KVT_UINT32;
            dt[k + 1] = dt[k + 2] = o->dtype;
        }
        break;
    case KVT_KIND_TURBOQUANT:
        n = 5;
        last[0] = D * o->k_bits / 8;
        last[1] = last[2] = last[4] = D / 32;
        last[3] = D * o->v_bits / 8;
        dt[0] = o->k_bits == 8 ? KVT_INT8 : KVT_UINT8;
        dt[1] = dt[2] = dt[4] = KVT_FLOAT16;
        dt[3] = KVT_UINT8;
        break;
    default: return -EINVAL;
    }
    for (int k = 0; k < n; k++) {
        int64_t shape[4] = {1, H, rows, last[k]};
        int rc = random_tensor(&t[k], dt[k], 4, shape, rng);
        if (rc) {
            for (int q = 0; q < k; q++)
                kvt_tensor_release(&t[q]);
            return rc;
        }
    }
    *nt = n;
    return 0;
}

static int append_rows(const struct synth_opts *o, kvt_cache *c, int kind, int64_t rows,
                       uint64_t *rng)
{
    struct kvt_tensor t[6];
    int nt;
    int rc = make_rows(o, kind, rows, rng, t, &nt);
    if (rc)
        return rc;
    rc = kvt_cache_append(c, t, nt);
    for (int k = 0; k < nt; k++)
        kvt_tensor_release(&t[k]);
    return rc;
}

static int build_layer(const struct synth_opts *o, int kind, uint64_t *rng, kvt_cache **out)
{
    struct kvt_cache_info p = {.kind = kind};
    if (kind == KVT_KIND_ROTATING || kind == KVT_KIND_ROTATING_QKV)
        p.max_size = o->max_size;
    if (kind == KVT_KIND_QKV || kind == KVT_KIND_ROTATING_QKV) {
        p.group_size = o->group_size;
        p.bits = o->bits;
    }
    if (kind == KVT_KIND_TURBOQUANT) {
        p.k_bits = o->k_bits;
        p.v_bits = o->v_bits;
    }
    kvt_cache *c;
    int rc = kvt_cache_new(&p, &c);
    if (rc)
        return rc;
    if (kind == KVT_KIND_SSM) {
        struct kvt_tensor conv, rec;
        int64_t cs[3] = {1, 3, o->heads * o->head_dim};
        int64_t rs[4] = {1, o->heads, o->head_dim, o->head_dim};
        rc = random_tensor(&conv, o->dtype, 3, cs, rng);
        if (!rc) {
            rc = random_tensor(&rec, KVT_FLOAT32, 4, rs, rng);
            if (!rc) {
                rc = kvt_cache_ssm_update(c, &conv, &rec, o->tokens);
                kvt_tensor_release(&rec);
            }
            kvt_tensor_release(&conv);
        }
    } else if (kind == KVT_KIND_ROTATING || kind == KVT_KIND_ROTATING_QKV) {
        /* a prefill chunk, then one decode step (exercises the ring's wrap rules) */
        int64_t prefill = o->tokens > 1 ? o->tokens - 1 : o->tokens;
        rc = append_rows(o, c, kind, prefill, rng);
        if (!rc && prefill < o->tokens)
            rc = append_rows(o, c, kind, 1, rng);
    } else {
        rc = append_rows(o, c, kind, o->tokens, rng);
    }
    if (rc) {
        kvt_cache_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

static bool parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static const char SYNTH_USAGE[] =
    "synth OUT --kind KIND|mixed [--layers N] [--kv-heads H] [--head-dim D]\n"
    "         [--tokens T] [--dtype bf16|f16|f32] [--seed S] [--ns NS] [--model-id ID]\n"
    "         [--config-fingerprint FP] [--tokenizer-hash TH] [--max-size M] [--bits B]\n"
    "         [--group-size G] [--k-bits K] [--v-bits V] [--max-file-bytes N]\n"
    "         [--created-at MS]\n"
    "  KIND: kv rotating qkv rotating-qkv ssm turboquant; mixed = one layer of each";

static int parse_synth(int argc, char **argv, struct synth_opts *o)
{
    *o = (struct synth_opts){
        .kind = -2,
        .layers = 2,
        .heads = 2,
        .head_dim = 64,
        .tokens = 16,
        .max_size = 256,
        .bits = 4,
        .group_size = 64,
        .k_bits = 8,
        .v_bits = 3,
        .dtype = KVT_BFLOAT16,
        .seed = 1,
        .ns = "",
        .model_id = "synth/model",
        .config_fingerprint = "fp-synth",
        .tokenizer_hash = "tk-synth",
    };
    const int64_t big = (int64_t)1 << 40;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') {
            if (o->out)
                return -1;
            o->out = a;
            continue;
        }
        if (i + 1 >= argc)
            return -1;
        const char *v = argv[++i];
        int64_t n;
        if (!strcmp(a, "--kind")) {
            o->kind = !strcmp(v, "mixed") ? -1 : kvt_kind_from_name(v);
            if (o->kind == -1 && strcmp(v, "mixed"))
                return -1;
        } else if (!strcmp(a, "--dtype")) {
            if (!strcmp(v, "bf16"))
                o->dtype = KVT_BFLOAT16;
            else if (!strcmp(v, "f16"))
                o->dtype = KVT_FLOAT16;
            else if (!strcmp(v, "f32"))
                o->dtype = KVT_FLOAT32;
            else
                return -1;
        } else if (!strcmp(a, "--ns")) {
            o->ns = v;
        } else if (!strcmp(a, "--model-id")) {
            o->model_id = v;
        } else if (!strcmp(a, "--config-fingerprint")) {
            o->config_fingerprint = v;
        } else if (!strcmp(a, "--tokenizer-hash")) {
            o->tokenizer_hash = v;
        } else if (!strcmp(a, "--max-file-bytes")) {
            if (!cli_parse_size(v, &o->max_file_bytes))
                return -1;
        } else if (!strcmp(a, "--created-at")) {
            if (!parse_i64(v, 0, ((int64_t)1 << 53) - 1, &o->created_at))
                return -1;
        } else if (!parse_i64(v, 0, big, &n)) {
            return -1;
        } else if (!strcmp(a, "--layers") && n >= 1) {
            o->layers = n;
        } else if (!strcmp(a, "--kv-heads") && n >= 1) {
            o->heads = n;
        } else if (!strcmp(a, "--head-dim") && n >= 1) {
            o->head_dim = n;
        } else if (!strcmp(a, "--tokens") && n >= 1) {
            o->tokens = n;
        } else if (!strcmp(a, "--seed")) {
            o->seed = (uint64_t)n;
        } else if (!strcmp(a, "--max-size") && n >= 1) {
            o->max_size = n;
        } else if (!strcmp(a, "--bits")) {
            o->bits = n;
        } else if (!strcmp(a, "--group-size") && n >= 1) {
            o->group_size = n;
        } else if (!strcmp(a, "--k-bits")) {
            o->k_bits = n;
        } else if (!strcmp(a, "--v-bits")) {
            o->v_bits = n;
        } else {
            return -1;
        }
    }
    if (!o->out || o->kind == -2)
        return -1;
    if (o->seed == 0)
        o->seed = 1; /* xorshift has no zero state */
    return 0;
}

int cmd_synth(int argc, char **argv)
{
    struct synth_opts o;
    if (cli_wants_help(argc, argv))
        return cli_usage(stdout, SYNTH_USAGE, 0);
    if (parse_synth(argc, argv, &o) < 0)
        return cli_usage(stderr, SYNTH_USAGE, EXIT_USAGE);
    if ((o.kind == -1 || o.kind == KVT_KIND_QKV || o.kind == KVT_KIND_ROTATING_QKV) &&
        (o.head_dim % o.group_size || (o.head_dim * o.bits) % 32)) {
        fprintf(stderr, "kvtier: synth: head-dim must be a multiple of group-size and give "
                        "whole uint32 words at the given bits\n");
        return EXIT_USAGE;
    }
    static const int mixed[6] = {KVT_KIND_KV,         KVT_KIND_ROTATING,     KVT_KIND_QKV,
                                 KVT_KIND_TURBOQUANT, KVT_KIND_ROTATING_QKV, KVT_KIND_SSM};
    size_t n_layers = o.kind == -1 ? 6 : (size_t)o.layers;
    uint64_t rng = o.seed;
    int32_t *tokens = malloc((size_t)o.tokens * sizeof(*tokens));
    kvt_cache **caches = calloc(n_layers, sizeof(*caches));
    int status = EXIT_USAGE;
    if (!tokens || !caches) {
        fprintf(stderr, "kvtier: synth: out of memory\n");
        goto out;
    }
    for (int64_t i = 0; i < o.tokens; i++)
        tokens[i] = (int32_t)(xs64(&rng) % 50000);
    for (size_t l = 0; l < n_layers; l++) {
        int kind = o.kind == -1 ? mixed[l] : o.kind;
        int rc = build_layer(&o, kind, &rng, &caches[l]);
        if (rc) {
            fprintf(stderr, "kvtier: synth: layer %zu (%s): %s\n", l, kvt_kind_name(kind),
                    kvt_last_error()[0] ? kvt_last_error() : kvt_strerror(rc));
            goto out;
        }
    }
    struct kvt_entry e = {
        .tokens = tokens,
        .n_tokens = (size_t)o.tokens,
        .caches = caches,
        .n_caches = n_layers,
        .meta = {o.model_id, o.config_fingerprint, o.tokenizer_hash, o.ns},
        .created_at = -1,
    };
    struct kvt_save_opts so = {.max_file_bytes = o.max_file_bytes, .created_at = o.created_at};
    uint64_t bytes;
    int rc = kvt_file_save(o.out, &e, &so, &bytes);
    if (rc) {
        cli_error("synth", rc);
        goto out;
    }
    printf("wrote %s: %llu bytes, %zu layer%s, %lld tokens\n", o.out, (unsigned long long)bytes,
           n_layers, n_layers == 1 ? "" : "s", (long long)o.tokens);
    status = 0;
out:
    for (size_t l = 0; caches && l < n_layers; l++)
        kvt_cache_free(caches[l]);
    free(caches);
    free(tokens);
    return status;
}
