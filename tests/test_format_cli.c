/*
 * The file commands of the built CLI on synthetic entries: `kvtier synth` writes a valid,
 * deterministic entry of every kind (and the mixed list) with the requested geometry and
 * metadata; `kvtier verify` and `kvtier inspect` report it, and report damage with the check.
 */
#include "support/support.h"

#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int synth(const char *out, const char *args)
{
    char *a = strf("synth '%s' --created-at 1751500000000 %s", out, args);
    int st = run_cli(a, true, NULL);
    free(a);
    return st;
}

static void test_synth_every_kind(void **state)
{
    (void)state;
    const char *kinds[] = {"kv", "rotating", "qkv", "rotating-qkv", "ssm", "turboquant", "mixed"};
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        char *path = strf("%s/%s.mlxkv", test_dir, kinds[k]);
        char *args = strf("--kind %s --layers 3 --kv-heads 4 --head-dim 128 --tokens 21 "
                          "--dtype f16 --seed 5 --ns 'a+b' --model-id m/x --max-size 8",
                          kinds[k]);
        assert_int_equal(synth(path, args), 0);
        struct kvt_entry *e;
        struct kvt_header *h;
        int rc = kvt_file_load(path, NULL, &e, &h);
        if (rc)
            fail_msg("%s: %s", kinds[k], kvt_last_error());
        bool mixed = !strcmp(kinds[k], "mixed");
        assert_int_equal(h->n_caches, mixed ? 6 : 3);
        assert_int_equal(h->n_tokens, 21);
        assert_int_equal(h->created_at, 1751500000000LL);
        assert_string_equal(h->model_id, "m/x");
        assert_string_equal(h->ns, "a+b");
        assert_string_equal(h->config_fingerprint, "fp-synth");
        bool seen[KVT_KIND_COUNT] = {false};
        for (size_t i = 0; i < h->n_caches; i++) {
            const struct kvt_cache_header *c = &h->caches[i];
            seen[c->info.kind] = true;
            if (!mixed)
                assert_string_equal(kvt_kind_name(c->info.kind), kinds[k]);
            assert_int_equal(c->info.offset, 21);
            if (c->info.kind != KVT_KIND_SSM)
                assert_int_equal(c->slots[0].shape[1], 4);
            if (c->info.kind == KVT_KIND_KV)
                assert_int_equal(c->slots[0].dtype, KVT_FLOAT16);
            if (c->info.kind == KVT_KIND_ROTATING)
                assert_int_equal(c->info.max_size, 8);
        }
        if (mixed)
            for (int kind = 0; kind < KVT_KIND_COUNT; kind++)
                assert_true(seen[kind]);
        assert_true(kvt_header_is_indexable(h));
        kvt_header_free(h);
        kvt_entry_free(e);

        /* deterministic: the same arguments give the same bytes, another seed others */
        char *again = strf("%s/%s-again.mlxkv", test_dir, kinds[k]);
        assert_int_equal(synth(again, args), 0);
        size_t n1, n2;
        uint8_t *b1 = read_file(path, &n1), *b2 = read_file(again, &n2);
        assert_int_equal(n1, n2);
        assert_memory_equal(b1, b2, n1);
        free(b2);
        char *other = strf("%s --seed 6", args);
        assert_int_equal(synth(again, other), 0);
        b2 = read_file(again, &n2);
        assert_true(n1 != n2 || memcmp(b1, b2, n1) != 0);
        free(b1);
        free(b2);
        free(other);
        free(again);
        free(args);
        free(path);
    }
}

static void test_synth_errors(void **state)
{
    (void)state;
    char *path = strf("%s/bad.mlxkv", test_dir);
    const char *bad[] = {
        "--kind nope",
        "--kind kv --tokens 0",
        "--kind kv --dtype f64",
        "--kind kv --layers",
        "--kind qkv --head-dim 48 --group-size 64",
        "--kind turboquant --head-dim 96",
        "--kind kv --max-file-bytes 1000",
        "--tokens 4",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(synth(path, bad[i]), 2);
        assert_int_not_equal(access(path, F_OK), 0);
    }
    assert_int_equal(run_cli("synth --kind kv", true, NULL), 2);
    free(path);
}

static void test_verify_and_inspect_damage(void **state)
{
    (void)state;
    char *path = strf("%s/v.mlxkv", test_dir);
    assert_int_equal(synth(path, "--kind mixed --tokens 9"), 0);
    char *out, *args = strf("verify '%s'", test_dir);
    assert_int_equal(run_cli(args, true, &out), 0);
    free(out);

    struct kvt_header *h;
    assert_int_equal(kvt_file_read_header(path, NULL, &h), 0);
    uint64_t off = (uint64_t)h->data_start + h->caches[2].slots[1].off + 1;
    kvt_header_free(h);
    int fd = open(path, O_RDWR);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
    b ^= 0x10;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
    close(fd);

    assert_int_equal(run_cli(args, true, &out), 1);
    assert_non_null(strstr(out, "corrupt: "));
    assert_non_null(strstr(out, ": L3: tensor hash mismatch at offset"));
    assert_non_null(strstr(out, "caches[2].tensors[1]"));
    free(out);
    free(args);

    args = strf("verify --json '%s'", path);
    assert_int_equal(run_cli(args, true, &out), 1);
    json_t *j = json_loads(out, 0, NULL);
    assert_non_null(j);
    json_t *f = json_array_get(json_object_get(j, "files"), 0);
    assert_string_equal(json_string_value(json_object_get(f, "category")), "corrupt");
    assert_string_equal(json_string_value(json_object_get(f, "check")), "L3");
    json_decref(j);
    free(out);
    free(args);

    /* the header is intact: inspect still reads it */
    args = strf("inspect --json '%s'", path);
    assert_int_equal(run_cli(args, true, &out), 0);
    j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(j, "n_tokens")), 9);
    assert_int_equal(json_array_size(json_object_get(j, "caches")), 6);
    json_decref(j);
    free(out);
    free(args);

    /* a damaged header byte: inspect names V6 */
    fd = open(path, O_RDWR);
    assert_int_equal(pwrite(fd, "X", 1, 40), 1);
    close(fd);
    args = strf("inspect --json '%s'", path);
    assert_int_equal(run_cli(args, true, &out), 1);
    j = json_loads(out, 0, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "check")), "V6");
    json_decref(j);
    free(out);
    free(args);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synth_every_kind),
        cmocka_unit_test(test_synth_errors),
        cmocka_unit_test(test_verify_and_inspect_damage),
    };
    return cmocka_run_group_tests(tests, test_dir_setup, test_dir_teardown);
}
