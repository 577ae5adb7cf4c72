/*
 * The golden files (tests/golden, expected.json): every file reads, loads and verifies with
 * exactly the summary or the category and check ID that expected.json gives, through the API
 * and through the built CLI (`kvtier inspect --json`, `kvtier verify`); the caller
 * expectations of load_expectations; and byte-exact rewrites: every valid golden file,
 * loaded and saved again, and the FORMAT.md §9 worked example built from scratch.
 */
#include "support/support.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"

static json_t *expected;
static char *dir;

static int setup(void **state)
{
    (void)state;
    expected = load_json(golden_path("expected.json"));
    dir = scratch_dir("golden");
    return expected && dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    json_decref(expected);
    rm_rf(dir);
    free(dir);
    return 0;
}

static int category_code(const char *cat)
{
    if (!strcmp(cat, "format"))
        return KVT_E_FORMAT;
    if (!strcmp(cat, "unsupported"))
        return KVT_E_UNSUPPORTED;
    if (!strcmp(cat, "corrupt"))
        return KVT_E_CORRUPT;
    if (!strcmp(cat, "mismatch"))
        return KVT_E_MISMATCH;
    fail_msg("unknown category %s", cat);
    return 0;
}

/* The check ID a message names (": V15: ..." -> "V15"), or "". */
static void check_of(const char *msg, char out[8])
{
    out[0] = '\0';
    for (const char *p = msg; (p = strstr(p, ": ")) != NULL; p++) {
        const char *q = p + 2;
        size_t n = 1;
        if (*q != 'V' && *q != 'L')
            continue;
        while (n < 6 && q[n] >= '0' && q[n] <= '9')
            n++;
        if (n > 1 && q[n] == ':') {
            memcpy(out, q, n);
            out[n] = '\0';
            return;
        }
    }
}

static void expect_failure(const char *file, int rc, const json_t *want)
{
    const char *cat = json_string_value(json_object_get(want, "category"));
    const char *id = json_string_value(json_object_get(want, "check"));
    char got[8];
    check_of(kvt_last_error(), got);
    if (rc != category_code(cat) || strcmp(got, id))
        fail_msg("%s: want %s %s, got %d (%s): %s", file, cat, id, rc, got, kvt_last_error());
}

static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

/* The expected.json summary of a header, built independently of the CLI. */
static json_t *summary(const struct kvt_header *h)
{
    json_t *o = json_object();
    json_object_set_new(o, "formatVersion", json_integer(h->format_version));
    json_object_set_new(o, "createdAt", json_integer(h->created_at));
    json_object_set_new(o, "modelId", str_or_null(h->model_id));
    json_object_set_new(o, "configFingerprint", str_or_null(h->config_fingerprint));
    json_object_set_new(o, "tokenizerHash", str_or_null(h->tokenizer_hash));
    json_object_set_new(o, "ns", str_or_null(h->ns));
    json_object_set_new(o, "n_tokens", json_integer((json_int_t)h->n_tokens));
    char hex[17];
    snprintf(hex, sizeof(hex), "%016llx",
             (unsigned long long)kvt_wyhash(0, h->tokens, h->n_tokens * sizeof(int32_t)));
    json_object_set_new(o, "tokens_hash", json_string(hex));
    json_t *tok = json_array();
    for (size_t i = 0; i < h->n_tokens; i++)
        json_array_append_new(tok, json_integer(h->tokens[i]));
    json_object_set_new(o, "tokens", tok);
    json_object_set_new(o, "dataStart", json_integer(h->data_start));
    json_object_set_new(o, "file_size", json_integer((json_int_t)h->file_size));
    json_object_set_new(o, "indexable", json_boolean(kvt_header_is_indexable(h)));
    json_t *caches = json_array();
    for (size_t i = 0; i < h->n_caches; i++) {
        const struct kvt_cache_header *c = &h->caches[i];
        const struct kvt_cache_info *in = &c->info;
        json_t *co = json_object();
        json_object_set_new(co, "kind", json_string(kvt_kind_name(in->kind)));
        json_object_set_new(co, "offset", json_integer(in->offset));
        if (in->kind == KVT_KIND_ROTATING || in->kind == KVT_KIND_ROTATING_QKV) {
            json_object_set_new(co, "idx", json_integer(in->idx));
            json_object_set_new(co, "maxSize", json_integer(in->max_size));
        }
        if (in->kind == KVT_KIND_QKV || in->kind == KVT_KIND_ROTATING_QKV) {
            json_object_set_new(co, "groupSize", json_integer(in->group_size));
            json_object_set_new(co, "bits", json_integer(in->bits));
        }
        if (in->kind == KVT_KIND_TURBOQUANT) {
            json_object_set_new(co, "kBits", json_integer(in->k_bits));
            json_object_set_new(co, "vBits", json_integer(in->v_bits));
            json_object_set_new(co, "headDim", json_integer(in->head_dim));
        }
        json_t *ts = json_array();
        for (int j = 0; j < c->n_slots; j++) {
            const struct kvt_slot *s = &c->slots[j];
            json_t *so = json_object();
            json_object_set_new(so, "off", json_integer((json_int_t)s->off));
            json_t *shape = json_array();
            for (int d = 0; d < s->rank; d++)
                json_array_append_new(shape, json_integer(s->shape[d]));
            json_object_set_new(so, "shape", shape);
            json_object_set_new(so, "dtype", json_integer(s->dtype));
            json_object_set_new(so, "bytes", json_integer((json_int_t)s->bytes));
            snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)s->hash);
            json_object_set_new(so, "hash", json_string(hex));
            json_array_append_new(ts, so);
        }
        json_object_set_new(co, "tensors", ts);
        json_array_append_new(caches, co);
    }
    json_object_set_new(o, "caches", caches);
    return o;
}

/* @p want without its "ok" key equals @p got; or every key of want is in got (subset). */
static void expect_summary(const char *file, const json_t *want, const json_t *got, bool subset)
{
    const char *key;
    json_t *v;
    size_t n = 0;
    json_object_foreach((json_t *)want, key, v)
    {
        if (!strcmp(key, "ok"))
            continue;
        n++;
        json_t *g = json_object_get(got, key);
        if (!g || !json_equal(v, g)) {
            char *a = json_dumps(v, JSON_COMPACT), *b = g ? json_dumps(g, JSON_COMPACT) : NULL;
            fail_msg("%s: %s: want %s, got %s", file, key, a, b ? b : "(missing)");
        }
    }
    if (!subset)
        assert_int_equal(n, json_object_size(got));
}

static void test_headers(void **state)
{
    (void)state;
    const char *file;
    json_t *want;
    int n = 0;
    json_object_foreach(json_object_get(expected, "files"), file, want)
    {
        struct kvt_header *h = (struct kvt_header *)1;
        int rc = kvt_file_read_header(golden_path(file), NULL, &h);
        const char *check = json_string_value(json_object_get(want, "check"));
        if (json_is_true(json_object_get(want, "ok")) || (check && check[0] == 'L')) {
            if (rc)
                fail_msg("%s: %s", file, kvt_last_error());
            if (json_is_true(json_object_get(want, "ok"))) {
                json_t *got = summary(h);
                expect_summary(file, want, got, false);
                json_decref(got);
            }
            kvt_header_free(h);
        } else {
            expect_failure(file, rc, want);
            assert_null(h);
        }

        /* the same verdict from memory */
        size_t len;
        uint8_t *bytes = read_file(golden_path(file), &len);
        assert_non_null(bytes);
        struct kvt_header *hm;
        int rm = kvt_header_parse(bytes, len, len, NULL, file, &hm);
        assert_int_equal(rm, rc);
        if (!rm)
            assert_int_equal(hm->file_size, len);
        kvt_header_free(hm);
        free(bytes);
        n++;
    }
    assert_int_equal(n, json_object_size(json_object_get(expected, "files")));
}

/* The loaded entry agrees with its header. */
static void expect_entry(const char *file, const struct kvt_entry *e, const struct kvt_header *h)
{
    assert_int_equal(e->n_tokens, h->n_tokens);
    if (h->n_tokens)
        assert_memory_equal(e->tokens, h->tokens, h->n_tokens * sizeof(int32_t));
    assert_int_equal(e->n_caches, h->n_caches);
    assert_int_equal(e->created_at, h->created_at);
    if (h->model_id)
        assert_string_equal(e->meta.model_id, h->model_id);
    if (h->ns)
        assert_string_equal(e->meta.ns, h->ns);
    for (size_t i = 0; i < e->n_caches; i++) {
        struct kvt_cache_info in;
        kvt_cache_get_info(e->caches[i], &in);
        const struct kvt_cache_info *w = &h->caches[i].info;
        if (in.kind != w->kind || in.offset != w->offset || in.idx != w->idx ||
            in.max_size != w->max_size || in.group_size != w->group_size || in.bits != w->bits ||
            in.k_bits != w->k_bits || in.v_bits != w->v_bits || in.head_dim != w->head_dim)
            fail_msg("%s: caches[%zu] scalars differ from the header", file, i);
        struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
        int n = kvt_cache_state(e->caches[i], t);
        assert_int_equal(n, h->caches[i].n_slots);
        for (int j = 0; j < n; j++) {
            const struct kvt_slot *s = &h->caches[i].slots[j];
            assert_int_equal(t[j].dtype, s->dtype);
            assert_int_equal(t[j].rank, s->rank);
            assert_memory_equal(t[j].shape, s->shape, sizeof(int64_t) * (size_t)s->rank);
            struct kvt_tensor c;
            assert_int_equal(kvt_tensor_contiguous(&c, &t[j]), 0);
            uint64_t hh = kvt_wyhash(0, kvt_buf_data(c.buf), kvt_tensor_nbytes(&c));
            kvt_tensor_release(&c);
            if (hh != s->hash)
                fail_msg("%s: caches[%zu].tensors[%d] restored bytes differ", file, i, j);
            kvt_tensor_release(&t[j]);
        }
    }
}

static void test_loads(void **state)
{
    (void)state;
    const char *file;
    json_t *want;
    json_object_foreach(json_object_get(expected, "files"), file, want)
    {
        const char *path = golden_path(file);
        struct kvt_entry *e = (struct kvt_entry *)1;
        struct kvt_header *h = (struct kvt_header *)1;
        int rc = kvt_file_load(path, NULL, &e, &h);
        int rv = kvt_file_verify(path, NULL);
        char vmsg[1024];
        snprintf(vmsg, sizeof(vmsg), "%s", kvt_last_error());
        if (json_is_true(json_object_get(want, "ok"))) {
            if (rc || rv)
                fail_msg("%s: load %d, verify %d: %s", file, rc, rv, kvt_last_error());
            expect_entry(file, e, h);
            kvt_entry_free(e);
            kvt_header_free(h);
            continue;
        }
        expect_failure(file, rc, want);
        assert_null(e);
        assert_null(h);
        assert_int_equal(rv, rc);
        char id[8];
        check_of(vmsg, id);
        assert_string_equal(id, json_string_value(json_object_get(want, "check")));
        if (json_is_true(json_object_get(want, "only_with_verify"))) {
            /* tensor-byte-flipped: loads (and verifies) when hashes are not checked */
            struct kvt_expect x = {.no_verify = true};
            rc = kvt_file_load(path, &x, &e, &h);
            if (rc)
                fail_msg("%s without verify: %s", file, kvt_last_error());
            assert_int_equal(kvt_file_verify(path, &x), 0);
            kvt_header_free(h);
            kvt_entry_free(e);
        }
    }
}

static void test_load_expectations(void **state)
{
    (void)state;
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(expected, "load_expectations"), i, c)
    {
        const char *file = json_string_value(json_object_get(c, "file"));
        json_t *ex = json_object_get(c, "expect");
        struct kvt_expect x = {
            .model_id = json_string_value(json_object_get(ex, "modelId")),
            .config_fingerprint = json_string_value(json_object_get(ex, "configFingerprint")),
            .tokenizer_hash = json_string_value(json_object_get(ex, "tokenizerHash")),
            .ns = json_string_value(json_object_get(ex, "ns")),
        };
        struct kvt_entry *e;
        int rc = kvt_file_load(golden_path(file), &x, &e, NULL);
        if (json_is_true(json_object_get(c, "ok"))) {
            if (rc)
                fail_msg("%s: %s", file, kvt_last_error());
            kvt_entry_free(e);
        } else {
            expect_failure(file, rc, c);
            assert_non_null(strstr(kvt_last_error(), " mismatch (file "));
            assert_int_equal(kvt_file_verify(golden_path(file), &x), rc);
        }
    }
    /* L2, and an expected key the header lacks */
    struct kvt_expect x = {.n_layers = 5};
    struct kvt_entry *e;
    assert_int_equal(kvt_file_load(golden_path("mixed.mlxkv"), &x, &e, NULL), KVT_E_MISMATCH);
    assert_non_null(strstr(kvt_last_error(), ": L2: 6 cached layers but model has 5"));
    x.n_layers = 6;
    assert_int_equal(kvt_file_load(golden_path("mixed.mlxkv"), &x, &e, NULL), 0);
    kvt_entry_free(e);
}

static void test_cli_inspect(void **state)
{
    (void)state;
    const char *file;
    json_t *want;
    json_object_foreach(json_object_get(expected, "files"), file, want)
    {
        char *args = strf("inspect --json '%s'", golden_path(file)), *out;
        int st = run_cli(args, false, &out);
        free(args);
        json_error_t err;
        json_t *got = json_loads(out, 0, &err);
        if (!got)
            fail_msg("%s: inspect printed no JSON (%s): %s", file, err.text, out);
        const char *check = json_string_value(json_object_get(want, "check"));
        bool header_ok = json_is_true(json_object_get(want, "ok")) || (check && check[0] == 'L');
        assert_int_equal(json_is_true(json_object_get(got, "ok")), header_ok);
        assert_int_equal(st, header_ok ? 0 : 1);
        if (json_is_true(json_object_get(want, "ok"))) {
            expect_summary(file, want, got, true);
        } else if (!header_ok) {
            assert_true(
                json_equal(json_object_get(want, "category"), json_object_get(got, "category")));
            assert_true(json_equal(json_object_get(want, "check"), json_object_get(got, "check")));
        }
        json_decref(got);
        free(out);
    }
    char *out;
    assert_int_equal(run_cli("inspect /nonexistent/file.mlxkv", false, &out), 2);
    free(out);
    assert_int_equal(run_cli("inspect", false, &out), 2);
    free(out);
    char *args = strf("inspect '%s'", golden_path("mixed.mlxkv"));
    assert_int_equal(run_cli(args, false, &out), 0);
    assert_non_null(strstr(out, "rotating-qkv offset 16 idx 0 maxSize 8 groupSize 128 bits 2"));
    assert_non_null(strstr(out, "\"lora-a\""));
    free(args);
    free(out);
}

static void test_cli_verify(void **state)
{
    (void)state;
    size_t bad = 0;
    const char *file;
    json_t *want;
    json_object_foreach(json_object_get(expected, "files"), file, want) bad +=
        !json_is_true(json_object_get(want, "ok"));

    char *out, *args = strf("verify --json '%s/golden'", KVT_TEST_DIR);
    assert_int_equal(run_cli(args, false, &out), 1);
    free(args);
    json_t *got = json_loads(out, 0, NULL);
    assert_non_null(got);
    assert_int_equal(json_integer_value(json_object_get(got, "bad")), bad);
    assert_int_equal(json_integer_value(json_object_get(got, "checked")),
                     json_object_size(json_object_get(expected, "files")));
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(got, "files"), i, f)
    {
        const char *p = json_string_value(json_object_get(f, "path"));
        const json_t *w = json_object_get(json_object_get(expected, "files"), strrchr(p, '/') + 1);
        assert_non_null(w);
        assert_true(json_equal(json_object_get(w, "ok"), json_object_get(f, "ok")));
        if (!json_is_true(json_object_get(w, "ok"))) {
            assert_true(json_equal(json_object_get(w, "category"), json_object_get(f, "category")));
            assert_true(json_equal(json_object_get(w, "check"), json_object_get(f, "check")));
        }
    }
    json_decref(got);
    free(out);

    /* text: one line per bad file naming the check, then the summary line */
    args = strf("verify '%s/golden'", KVT_TEST_DIR);
    assert_int_equal(run_cli(args, false, &out), 1);
    size_t lines = 0;
    for (char *p = out; (p = strchr(p, '\n')) != NULL; p++)
        lines++;
    assert_int_equal(lines, bad + 1);
    assert_non_null(strstr(out, "V15: caches[0].tensors[1].off 15872 is not a multiple of 16384"));
    free(args);
    free(out);

    args = strf("verify '%s' '%s'", golden_path("kv.mlxkv"), golden_path("mixed.mlxkv"));
    assert_int_equal(run_cli(args, false, &out), 0);
    free(args);
    free(out);
    args = strf("verify '%s'", golden_path("tensor-byte-flipped.mlxkv"));
    assert_int_equal(run_cli(args, false, &out), 1);
    assert_non_null(strstr(out, "L3: tensor hash mismatch at offset"));
    free(args);
    free(out);
    args = strf("verify --no-hashes '%s'", golden_path("tensor-byte-flipped.mlxkv"));
    assert_int_equal(run_cli(args, false, &out), 0);
    free(args);
    free(out);
    args = strf("verify '%s' /nonexistent/x.mlxkv", golden_path("kv.mlxkv"));
    assert_int_equal(run_cli(args, false, &out), 2);
    free(args);
    free(out);
    assert_int_equal(run_cli("verify", false, &out), 2);
    free(out);
}

/* Save @p e with the golden creation time and compare with the golden bytes. */
static void expect_same_bytes(const char *file, const struct kvt_entry *e, int64_t created_at,
                              uint64_t extend_to)
{
    char *path = strf("%s/%s", dir, file);
    struct kvt_save_opts o = {.created_at = created_at, .no_sync = true};
    uint64_t bytes = 0, planned = 0;
    int rc = kvt_file_save(path, e, &o, &bytes);
    if (rc)
        fail_msg("%s: save: %s", file, kvt_last_error());
    assert_int_equal(kvt_file_plan_size(e, &planned), 0);
    assert_int_equal(planned, bytes);
    size_t n, m;
    uint8_t *want = read_file(golden_path(file), &n);
    uint8_t *got = read_file(path, &m);
    assert_non_null(want);
    assert_non_null(got);
    assert_int_equal(m, extend_to ? extend_to : n);
    assert_int_equal(bytes, m);
    if (memcmp(want, got, n))
        fail_msg("%s: rewritten bytes differ", file);
    for (size_t i = n; i < m; i++)
        assert_int_equal(got[i], 0);
    free(want);
    free(got);
    free(path);
}

static void test_rewrite_byte_exact(void **state)
{
    (void)state;
    const char *file;
    json_t *want;
    size_t n = 0;
    json_object_foreach(json_object_get(expected, "files"), file, want)
    {
        if (!json_is_true(json_object_get(want, "ok")))
            continue;
        struct kvt_entry *e;
        struct kvt_header *h;
        assert_int_equal(kvt_file_load(golden_path(file), NULL, &e, &h), 0);
        /* the reference leaves an empty last tensor past EOF; kvtier extends the file to F */
        const struct kvt_cache_header *last = &h->caches[h->n_caches - 1];
        const struct kvt_slot *ls = &last->slots[last->n_slots - 1];
        uint64_t f = (uint64_t)h->data_start + ls->off + ls->bytes;
        expect_same_bytes(file, e, h->created_at, f != h->file_size ? f : 0);
        n++;
        kvt_header_free(h);
        kvt_entry_free(e);
    }
    assert_true(n > 0);
}

static void test_worked_example_from_scratch(void **state)
{
    (void)state;
    kvt_cache *caches[2];
    for (int l = 0; l < 2; l++) {
        struct kvt_cache_info p = {.kind = KVT_KIND_KV};
        assert_int_equal(kvt_cache_new(&p, &caches[l]), 0);
        int64_t shape[4] = {1, 2, 4, 8};
        struct kvt_tensor kv[2];
        assert_int_equal(kvt_tensor_zeros(&kv[0], KVT_BFLOAT16, 4, shape), 0);
        assert_int_equal(kvt_tensor_zeros(&kv[1], KVT_BFLOAT16, 4, shape), 0);
        assert_int_equal(kvt_cache_append(caches[l], kv, 2), 0);
        kvt_tensor_release(&kv[0]);
        kvt_tensor_release(&kv[1]);
    }
    int32_t tokens[4] = {1, 2, 3, 4};
    struct kvt_entry e = {
        .tokens = tokens,
        .n_tokens = 4,
        .caches = caches,
        .n_caches = 2,
        .meta = {"stub", "fp-test", "tk-test", ""},
    };
    expect_same_bytes("v3-worked-example.mlxkv", &e, 1751500000000LL, 0);
    struct kvt_header *h;
    char *path = strf("%s/v3-worked-example.mlxkv", dir);
    assert_int_equal(kvt_file_read_header(path, NULL, &h), 0);
    assert_int_equal(h->header_len, 550);
    assert_int_equal(h->header_hash, 0x1bb3d0d6eda0b08aull);
    assert_int_equal(h->file_size, 65664);
    kvt_header_free(h);
    free(path);
    kvt_cache_free(caches[0]);
    kvt_cache_free(caches[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_headers),
        cmocka_unit_test(test_loads),
        cmocka_unit_test(test_load_expectations),
        cmocka_unit_test(test_cli_inspect),
        cmocka_unit_test(test_cli_verify),
        cmocka_unit_test(test_rewrite_byte_exact),
        cmocka_unit_test(test_worked_example_from_scratch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
