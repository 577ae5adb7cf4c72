/*
 * The header JSON reader: V6-V13 of FORMAT.md §11.2 over untrusted bytes, then the decoded
 * header goes through V14-V20 (header_check.c). Each check is one pass over the whole header,
 * in the order of §11.2, so the first failing check decides the result. jansson parses
 * strictly (duplicate keys rejected, UTF-8 checked, nothing after the top-level value).
 *
 * Numbers: every number is read as JSON.parse reads it (the nearest double), and "an integer"
 * is a number whose value is integral, so 3, 3.0 and 3e0 are the same integer and 2^53 or
 * more never is one (it cannot be exact). docs/FORMAT-NOTES.md records the edge cases.
 */
#include "format/format.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

static const char *const meta_keys[4] = {"modelId", "configFingerprint", "tokenizerHash", "ns"};

static const char *nm(const char *name)
{
    return name ? name : "header";
}

/* A number with an integral value (as JSON.parse sees it); *out receives it. */
static bool num_int(const json_t *v, double *out)
{
    if (!json_is_number(v))
        return false;
    double d = json_number_value(v);
    if (d != d || d - d != 0)
        return false; /* NaN or infinite */
    double mag = d < 0 ? -d : d;
    if (mag < 9223372036854775808.0 && (double)(int64_t)d != d)
        return false; /* has a fraction (every double of magnitude >= 2^63 is integral) */
    *out = d;
    return true;
}

/* An integer in [0, limit) (limit <= 2^53). */
static bool get_uint(const json_t *v, uint64_t limit, uint64_t *out)
{
    double d;
    if (!num_int(v, &d) || d < 0 || d >= (double)limit)
        return false;
    *out = (uint64_t)d;
    return true;
}

/* A string without embedded NUL equal to @p want. */
static bool str_eq(const json_t *v, const char *want)
{
    return json_is_string(v) && json_string_length(v) == strlen(want) &&
           !strcmp(json_string_value(v), want);
}

static bool has_nul(const json_t *v)
{
    return json_string_length(v) != strlen(json_string_value(v));
}

/* The kind of a cache object whose "kind" is a known kind name, else -1. */
static int known_kind(const json_t *cache)
{
    const json_t *k = json_object_get(cache, "kind");
    if (!json_is_string(k) || has_nul(k))
        return -1;
    return kvt_kind_from_name(json_string_value(k));
}

/* V8 */
static int check_version(const json_t *root, const char *name)
{
    double d;
    const json_t *v = json_object_get(root, "formatVersion");
    if (!v || !num_int(v, &d))
        return kvt_fail(KVT_E_CORRUPT, "%s: V8: formatVersion is missing or not an integer",
                        nm(name));
    if (d != KVT_FORMAT_VERSION)
        return kvt_fail(KVT_E_UNSUPPORTED, "%s: V8: unsupported formatVersion %.17g", nm(name), d);
    return 0;
}

/* V9: features of later reference versions. */
static int check_features(const json_t *root, const char *name)
{
    const json_t *cp = json_object_get(root, "codecProvider");
    if (cp && !str_eq(cp, "mlx-cache-v3"))
        return kvt_fail(KVT_E_UNSUPPORTED, "%s: V9: codecProvider %s%s%s is not supported",
                        nm(name), json_is_string(cp) ? "\"" : "",
                        json_is_string(cp) ? json_string_value(cp) : "(not a string)",
                        json_is_string(cp) ? "\"" : "");
    if (json_object_get(root, "attachments"))
        return kvt_fail(KVT_E_UNSUPPORTED, "%s: V9: attachments are not supported", nm(name));
    if (json_object_get(root, "generationCheckpoint"))
        return kvt_fail(KVT_E_UNSUPPORTED, "%s: V9: generationCheckpoint is not supported",
                        nm(name));
    const json_t *caches = json_object_get(root, "caches");
    size_t i;
    const json_t *c;
    json_array_foreach(caches, i, c)
    {
        if (json_is_object(c) && json_object_get(c, "minimumReusableOffset"))
            return kvt_fail(KVT_E_UNSUPPORTED,
                            "%s: V9: caches[%zu].minimumReusableOffset is not supported", nm(name),
                            i);
    }
    /* a metadata string with U+0000 cannot be a C string; such files are left alone */
    for (int k = 0; k < 4; k++) {
        const json_t *v = json_object_get(root, meta_keys[k]);
        if (json_is_string(v) && has_nul(v))
            return kvt_fail(KVT_E_UNSUPPORTED, "%s: V9: %s contains U+0000, not supported",
                            nm(name), meta_keys[k]);
    }
    return 0;
}

struct param_rule {
    const char *key;
    bool (*ok)(int64_t);
};

static const struct param_rule qkv_params[] = {
    {"bits", kvt_qkv_bits_ok}, {"groupSize", kvt_qkv_group_ok}, {NULL, NULL}};
static const struct param_rule tq_params[] = {{"kBits", kvt_tq_bits_ok},
                                              {"vBits", kvt_tq_bits_ok},
                                              {"headDim", kvt_tq_head_dim_ok},
                                              {NULL, NULL}};

static const struct param_rule *params_of(int kind)
{
    if (kind == KVT_KIND_QKV || kind == KVT_KIND_ROTATING_QKV)
        return qkv_params;
    if (kind == KVT_KIND_TURBOQUANT)
        return tq_params;
    return NULL;
}

/*
 * V10: kinds, dtypes and quantization parameters. Values a newer writer could use are found
 * in a first pass (UNSUPPORTED) before missing or non-integer values (CORRUPT), so that a
 * newer file is never taken for a damaged one.
 */
static int check_values(const json_t *root, const char *name)
{
    const json_t *caches = json_object_get(root, "caches");
    size_t i, j;
    const json_t *c, *s;
    double d;
    json_array_foreach(caches, i, c)
    {
        if (!json_is_object(c))
            continue;
        const json_t *k = json_object_get(c, "kind");
        if (json_is_string(k) && known_kind(c) < 0)
            return kvt_fail(KVT_E_UNSUPPORTED, "%s: V10: caches[%zu].kind \"%s\" is not supported",
                            nm(name), i, json_string_value(k));
    }
    json_array_foreach(caches, i, c)
    {
        int kind = json_is_object(c) ? known_kind(c) : -1;
        if (kind < 0)
            continue;
        const struct param_rule *pr = params_of(kind);
        for (; pr && pr->key; pr++) {
            const json_t *v = json_object_get(c, pr->key);
            if (num_int(v, &d) && (d < 0 || d > 1024 || !pr->ok((int64_t)d)))
                return kvt_fail(KVT_E_UNSUPPORTED, "%s: V10: caches[%zu].%s %.17g is not supported",
                                nm(name), i, pr->key, d);
        }
        json_array_foreach(json_object_get(c, "tensors"), j, s)
        {
            if (json_is_object(s) && num_int(json_object_get(s, "dtype"), &d) &&
                (d < 0 || d >= KVT_DTYPE_COUNT))
                return kvt_fail(KVT_E_UNSUPPORTED,
                                "%s: V10: caches[%zu].tensors[%zu].dtype %.17g is not known",
                                nm(name), i, j, d);
        }
    }
    json_array_foreach(caches, i, c)
    {
        if (!json_is_object(c))
            continue;
        if (!json_is_string(json_object_get(c, "kind")) || known_kind(c) < 0)
            return kvt_fail(KVT_E_CORRUPT, "%s: V10: caches[%zu].kind is missing or not a string",
                            nm(name), i);
        const struct param_rule *pr = params_of(known_kind(c));
        for (; pr && pr->key; pr++)
            if (!num_int(json_object_get(c, pr->key), &d))
                return kvt_fail(KVT_E_CORRUPT,
                                "%s: V10: caches[%zu].%s is missing or not an integer", nm(name), i,
                                pr->key);
        json_array_foreach(json_object_get(c, "tensors"), j, s)
        {
            if (json_is_object(s) && !num_int(json_object_get(s, "dtype"), &d))
                return kvt_fail(KVT_E_CORRUPT,
                                "%s: V10: caches[%zu].tensors[%zu].dtype is missing or not an "
                                "integer",
                                nm(name), i, j);
        }
    }
    return 0;
}

/* V11: field types. */
static int check_types(const json_t *root, const char *name)
{
    uint64_t u;
    for (int k = 0; k < 4; k++) {
        const json_t *v = json_object_get(root, meta_keys[k]);
        if (v && !json_is_string(v))
            return kvt_fail(KVT_E_CORRUPT, "%s: V11: %s is not a string", nm(name), meta_keys[k]);
    }
    const json_t *ca = json_object_get(root, "createdAt");
    if (ca && !get_uint(ca, KVT_SAFE_INT_LIMIT, &u))
        return kvt_fail(KVT_E_CORRUPT, "%s: V11: createdAt is not a non-negative integer",
                        nm(name));
    const json_t *tokens = json_object_get(root, "tokens");
    if (!json_is_array(tokens))
        return kvt_fail(KVT_E_CORRUPT, "%s: V11: tokens is missing or not an array", nm(name));
    size_t i;
    const json_t *v;
    json_array_foreach(tokens, i, v)
    {
        if (!get_uint(v, (uint64_t)1 << 31, &u))
            return kvt_fail(KVT_E_CORRUPT, "%s: V11: tokens[%zu] is not an integer in [0, 2^31)",
                            nm(name), i);
    }
    const json_t *caches = json_object_get(root, "caches");
    if (!json_is_array(caches) || json_array_size(caches) == 0)
        return kvt_fail(KVT_E_CORRUPT, "%s: V11: caches is missing or not a non-empty array",
                        nm(name));
    json_array_foreach(caches, i, v)
    {
        if (!json_is_object(v))
            return kvt_fail(KVT_E_CORRUPT, "%s: V11: caches[%zu] is not an object", nm(name), i);
        if (!get_uint(json_object_get(v, "offset"), KVT_SAFE_INT_LIMIT, &u))
            return kvt_fail(KVT_E_CORRUPT,
                            "%s: V11: caches[%zu].offset is missing or not an integer in "
                            "[0, 2^53)",
                            nm(name), i);
        int n;
        const struct kvt_scalar *sc = kvt_kind_scalars(known_kind(v), &n);
        for (int k = 0; k < n; k++)
            if (!get_uint(json_object_get(v, sc[k].key), KVT_SAFE_INT_LIMIT, &u))
                return kvt_fail(KVT_E_CORRUPT,
                                "%s: V11: caches[%zu].%s is missing or not an integer in "
                                "[0, 2^53)",
                                nm(name), i, sc[k].key);
        const json_t *tensors = json_object_get(v, "tensors");
        if (!json_is_array(tensors))
            return kvt_fail(KVT_E_CORRUPT, "%s: V11: caches[%zu].tensors is not an array", nm(name),
                            i);
        size_t j;
        const json_t *s;
        json_array_foreach(tensors, j, s)
        {
            if (!json_is_object(s))
                return kvt_fail(KVT_E_CORRUPT, "%s: V11: caches[%zu].tensors[%zu] is not an object",
                                nm(name), i, j);
        }
    }
    return 0;
}

/* V12: tensor count per kind. */
static int check_counts(const json_t *root, const char *name)
{
    size_t i;
    const json_t *c;
    json_array_foreach(json_object_get(root, "caches"), i, c)
    {
        int kind = known_kind(c);
        size_t n = json_array_size(json_object_get(c, "tensors"));
        if (n != (size_t)kvt_kind_tensor_count(kind))
            return kvt_fail(KVT_E_CORRUPT, "%s: V12: caches[%zu] (%s) has %zu tensors, not %d",
                            nm(name), i, kvt_kind_name(kind), n, kvt_kind_tensor_count(kind));
    }
    return 0;
}

static bool hash_ok(const json_t *v)
{
    if (!json_is_string(v) || json_string_length(v) != 16)
        return false;
    const char *s = json_string_value(v);
    for (int i = 0; i < 16; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

/* V13: slot fields. */
static int check_slots(const json_t *root, const char *name)
{
    size_t i, j, d;
    const json_t *c, *s, *dim;
    uint64_t u;
    json_array_foreach(json_object_get(root, "caches"), i, c)
    {
        int kind = known_kind(c);
        json_array_foreach(json_object_get(c, "tensors"), j, s)
        {
            if (!get_uint(json_object_get(s, "off"), KVT_SAFE_INT_LIMIT, &u) ||
                !get_uint(json_object_get(s, "bytes"), KVT_SAFE_INT_LIMIT, &u))
                return kvt_fail(KVT_E_CORRUPT,
                                "%s: V13: caches[%zu].tensors[%zu] off or bytes is missing or "
                                "not an integer in [0, 2^53)",
                                nm(name), i, j);
            const json_t *shape = json_object_get(s, "shape");
            int rank = kvt_slot_rank(kind, (int)j);
            if (!json_is_array(shape) || json_array_size(shape) != (size_t)rank)
                return kvt_fail(KVT_E_CORRUPT,
                                "%s: V13: caches[%zu].tensors[%zu].shape is not an array of "
                                "rank %d",
                                nm(name), i, j, rank);
            json_array_foreach(shape, d, dim)
            {
                if (!get_uint(dim, KVT_SAFE_INT_LIMIT, &u))
                    return kvt_fail(KVT_E_CORRUPT,
                                    "%s: V13: caches[%zu].tensors[%zu].shape[%zu] is not a "
                                    "non-negative integer below 2^53",
                                    nm(name), i, j, d);
            }
            if (!hash_ok(json_object_get(s, "hash")))
                return kvt_fail(KVT_E_CORRUPT,
                                "%s: V13: caches[%zu].tensors[%zu].hash is not 16 lowercase hex "
                                "digits",
                                nm(name), i, j);
        }
    }
    return 0;
}

static uint64_t u53(const json_t *v)
{
    uint64_t u = 0;
    get_uint(v, KVT_SAFE_INT_LIMIT, &u);
    return u;
}

static char *dup_meta(const json_t *root, const char *key, bool *oom)
{
    const json_t *v = json_object_get(root, key);
    if (!v)
        return NULL;
    char *s = strdup(json_string_value(v));
    if (!s)
        *oom = true;
    return s;
}

/*
 * Decode a header that passed V7-V13; fails only with -ENOMEM. @p fast_tok (may be NULL) holds
 * the tokens when the fast path read them; it is moved into @p h.
 */
static int extract(const json_t *root, int32_t **fast_tok, size_t n_fast, struct kvt_header *h)
{
    bool oom = false;
    const json_t *ca = json_object_get(root, "createdAt");
    h->format_version = KVT_FORMAT_VERSION;
    h->created_at = ca ? (int64_t)u53(ca) : -1;
    h->model_id = dup_meta(root, "modelId", &oom);
    h->config_fingerprint = dup_meta(root, "configFingerprint", &oom);
    h->tokenizer_hash = dup_meta(root, "tokenizerHash", &oom);
    h->ns = dup_meta(root, "ns", &oom);
    const json_t *tokens = json_object_get(root, "tokens");
    bool fast = *fast_tok != NULL;
    if (fast) {
        h->n_tokens = n_fast;
        h->tokens = *fast_tok;
        *fast_tok = NULL;
    } else {
        h->n_tokens = json_array_size(tokens);
        h->tokens = malloc(h->n_tokens ? h->n_tokens * sizeof(int32_t) : 1);
    }
    const json_t *caches = json_object_get(root, "caches");
    h->n_caches = json_array_size(caches);
    h->caches = calloc(h->n_caches, sizeof(*h->caches));
    if (oom || !h->tokens || !h->caches)
        return -ENOMEM;
    size_t i, j;
    const json_t *v, *s;
    if (!fast)
        json_array_foreach(tokens, i, v) h->tokens[i] = (int32_t)u53(v);
    json_array_foreach(caches, i, v)
    {
        struct kvt_cache_header *c = &h->caches[i];
        c->info.kind = known_kind(v);
        c->info.offset = (int64_t)u53(json_object_get(v, "offset"));
        int n;
        const struct kvt_scalar *sc = kvt_kind_scalars(c->info.kind, &n);
        for (int k = 0; k < n; k++)
            *kvt_scalar_ptr(&c->info, &sc[k]) = (int64_t)u53(json_object_get(v, sc[k].key));
        const json_t *tensors = json_object_get(v, "tensors");
        c->n_slots = (int)json_array_size(tensors);
        json_array_foreach(tensors, j, s)
        {
            struct kvt_slot *slot = &c->slots[j];
            slot->off = u53(json_object_get(s, "off"));
            slot->bytes = u53(json_object_get(s, "bytes"));
            slot->dtype = (int)u53(json_object_get(s, "dtype"));
            const json_t *shape = json_object_get(s, "shape");
            slot->rank = (int)json_array_size(shape);
            for (int d = 0; d < slot->rank; d++)
                slot->shape[d] = (int64_t)u53(json_array_get(shape, (size_t)d));
            slot->hash = strtoull(json_string_value(json_object_get(s, "hash")), NULL, 16);
        }
    }
    return 0;
}

/* The header JSON as a tree (V7), its token list parsed apart (header_tokens.c): 0, or the
 * error with nothing left allocated. */
static int load_json(const uint8_t *json, uint32_t len, const char *name, json_t **root,
                     int32_t **fast_tok, size_t *n_fast)
{
    struct kvt_token_split sp;
    if (kvt_header_split_tokens(json, len, &sp) < 0)
        return kvt_fail(-ENOMEM, "%s: out of memory parsing the header", nm(name));
    *fast_tok = sp.tok;
    *n_fast = sp.n_tok;
    json_error_t jerr;
    *root = json_loadb((const char *)(sp.json ? sp.json : json), sp.json ? sp.len : len,
                       JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &jerr);
    free(sp.json);
    if (*root)
        return 0;
    if (jerr.position >= 0 && (size_t)jerr.position > sp.cut_at)
        jerr.position += (int)sp.cut_len; /* the error's byte in the header as written */
    free(*fast_tok);
    *fast_tok = NULL;
    if (json_error_code(&jerr) == json_error_out_of_memory)
        return kvt_fail(-ENOMEM, "%s: out of memory parsing the header", nm(name));
    return kvt_fail(KVT_E_CORRUPT, "%s: V7: invalid header JSON at byte %d: %s", nm(name),
                    jerr.position, jerr.text);
}

int kvt_header_parse_json(const uint8_t *json, const struct kvt_prefix *p, uint64_t file_size,
                          const char *name, struct kvt_header **out)
{
    *out = NULL;
    uint64_t hh = kvt_wyhash(0, json, p->header_len);
    if (hh != p->header_hash)
        return kvt_fail(KVT_E_CORRUPT,
                        "%s: V6: header hash mismatch (stored %016" PRIx64 ", computed %016" PRIx64
                        ")",
                        nm(name), p->header_hash, hh);

    int32_t *fast_tok;
    size_t n_fast;
    json_t *root;
    int rc = load_json(json, p->header_len, name, &root, &fast_tok, &n_fast);
    if (rc)
        return rc;
    if (!json_is_object(root)) {
        rc = kvt_fail(KVT_E_CORRUPT, "%s: V7: the header JSON is not an object", nm(name));
        goto out;
    }
    if ((rc = check_version(root, name)) || (rc = check_features(root, name)) ||
        (rc = check_values(root, name)) || (rc = check_types(root, name)) ||
        (rc = check_counts(root, name)) || (rc = check_slots(root, name)))
        goto out;

    struct kvt_header *h = calloc(1, sizeof(*h));
    if (!h) {
        rc = kvt_fail(-ENOMEM, "%s: out of memory", nm(name));
        goto out;
    }
    rc = extract(root, &fast_tok, n_fast, h);
    h->header_len = p->header_len;
    h->data_start = p->data_start;
    h->header_hash = p->header_hash;
    h->file_size = file_size;
    if (rc < 0)
        rc = kvt_fail(rc, "%s: out of memory decoding the header", nm(name));
    else
        rc = kvt_header_check_layout(h, name);
    if (rc) {
        kvt_header_free(h);
        goto out;
    }
    *out = h;
out:
    free(fast_tok);
    json_decref(root);
    return rc;
}
