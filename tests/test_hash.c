/* Wyhash known answers (golden/wyhash-vectors.json), streaming == one-shot, and the copying
 * update == memcpy + update. */
#include "support/support.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "hash/hash.h"

static size_t unhex(const char *hex, uint8_t *out)
{
    size_t n = strlen(hex) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
    return n;
}

static void check_group(json_t *root, const char *group, int *count)
{
    json_t *arr = json_object_get(root, group);
    assert_non_null(arr);
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        const char *hex = json_string_value(json_object_get(v, "input_hex"));
        const char *want = json_string_value(json_object_get(v, "hash"));
        json_t *seedj = json_object_get(v, "seed");
        uint64_t seed = seedj ? (uint64_t)json_integer_value(seedj) : 0;
        uint8_t *buf = malloc(strlen(hex) / 2 + 1);
        size_t n = unhex(hex, buf);
        char got[17];
        snprintf(got, sizeof(got), "%016llx", (unsigned long long)kvt_wyhash(seed, buf, n));
        assert_string_equal(got, want);

        /* streaming, fed in odd pieces */
        for (size_t piece = 1; piece <= 67; piece += 11) {
            struct kvt_wyhash_state st;
            kvt_wyhash_init(&st, seed);
            for (size_t off = 0; off < n; off += piece)
                kvt_wyhash_update(&st, buf + off, off + piece > n ? n - off : piece);
            assert_int_equal(kvt_wyhash_final(&st), kvt_wyhash(seed, buf, n));
        }
        free(buf);
        (*count)++;
    }
}

static void test_golden_vectors(void **state)
{
    (void)state;
    json_t *root = load_json(golden_path("wyhash-vectors.json"));
    assert_non_null(root);
    int count = 0;
    check_group(root, "zig_seeded", &count);
    check_group(root, "seed0", &count);
    assert_int_equal(count, 32);
    json_decref(root);
}

static void test_spec_table(void **state)
{
    (void)state;
    assert_int_equal(kvt_wyhash(0, "", 0), 0x0409638ee2bde459ull);
    assert_int_equal(kvt_wyhash(0, "abc", 3), 0x02a4f1d7cb516c72ull);
    assert_int_equal(kvt_wyhash(0, "hello world", 11), 0x668d5e431c3b2573ull);
    assert_int_equal(kvt_wyhash(0, "lora-a", 6), 0x73153433c8ddcab2ull);
    uint8_t z[16384] = {0};
    assert_int_equal(kvt_wyhash(0, z, 128), 0xb06da037eb85a067ull);
    assert_int_equal(kvt_wyhash(0, z, 16384), 0x86fe6596b9718e7cull);
}

/* Every length 0..400 and every split point agree with the one-shot hash. */
static void test_streaming_all_splits(void **state)
{
    (void)state;
    uint8_t buf[400];
    uint64_t rs = 42;
    fill_random(buf, sizeof(buf), &rs);
    for (size_t n = 0; n <= sizeof(buf); n++) {
        uint64_t want = kvt_wyhash(0, buf, n);
        for (size_t cut = 0; cut <= n; cut += (n > 100 ? 7 : 1)) {
            struct kvt_wyhash_state st;
            kvt_wyhash_init(&st, 0);
            kvt_wyhash_update(&st, buf, cut);
            kvt_wyhash_update(&st, buf + cut, n - cut);
            assert_int_equal(kvt_wyhash_final(&st), want);
        }
    }
}

/* Pieces of every size from 0 to 200 bytes, copied and hashed in one pass: the hash of the
 * whole and the copy are exact, and nothing past a piece is written. */
static void test_update_copy(void **state)
{
    (void)state;
    enum { N = 20000 };
    uint8_t *src = malloc(N), *dst = malloc(N + 1);
    assert_non_null(src);
    assert_non_null(dst);
    uint64_t rs = 7;
    fill_random(src, N, &rs);
    for (size_t start = 0; start < 3; start++) {
        memset(dst, 0xa5, N + 1);
        struct kvt_wyhash_state st;
        kvt_wyhash_init(&st, 0);
        size_t at = start;
        kvt_wyhash_update(&st, src, start); /* some hashed without a copy first */
        memcpy(dst, src, start);
        for (size_t piece = 0; at < N; piece = (piece + 1) % 201) {
            size_t m = piece < N - at ? piece : N - at;
            kvt_wyhash_update_copy(&st, dst + at, src + at, m);
            at += m;
            assert_int_equal(dst[at], 0xa5); /* the next byte is not written yet */
        }
        assert_int_equal(kvt_wyhash_final(&st), kvt_wyhash(0, src, N));
        assert_memory_equal(dst, src, N);
        assert_int_equal(dst[N], 0xa5);
    }
    free(src);
    free(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_vectors),
        cmocka_unit_test(test_spec_table),
        cmocka_unit_test(test_streaming_all_splits),
        cmocka_unit_test(test_update_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
