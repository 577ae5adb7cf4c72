/*
 * Header validation from memory (FORMAT.md §11.2, V1-V20) on crafted file images, one check at
 * a time and in combination (the first failing check decides), plus the JSON.stringify
 * serializer and the UTF-8 rules of the writer.
 */
#include "support/support.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"

/* A file image: valid prefix for @p json, zero padding, then @p data bytes of zeros. */
static uint8_t *image(const char *json, uint64_t data, size_t *n)
{
    size_t hl = strlen(json);
    uint64_t ds = kvt_align_up(26 + hl);
    *n = (size_t)(ds + data);
    uint8_t *b = calloc(1, *n);
    memcpy(b, "MLXBUNKV2\n", 10);
    uint32_t hl32 = (uint32_t)hl, ds32 = (uint32_t)ds;
    memcpy(b + 10, &hl32, 4);
    memcpy(b + 14, &ds32, 4);
    uint64_t hh = kvt_wyhash(0, json, hl);
    memcpy(b + 18, &hh, 8);
    memcpy(b + 26, json, hl);
    return b;
}

static int parse_image(const uint8_t *b, size_t n, struct kvt_header **h)
{
    return kvt_header_parse(b, n, n, NULL, "img", h);
}

static int parse(const char *json, uint64_t data, struct kvt_header **h)
{
    size_t n;
    uint8_t *b = image(json, data, &n);
    int rc = parse_image(b, n, h);
    free(b);
    return rc;
}

/* The rc and the check ID the message names must be @p code and @p id. */
static void expect_rc(int rc, int code, const char *id)
{
    char want[16];
    snprintf(want, sizeof(want), ": %s: ", id);
    if (rc != code || !strstr(kvt_last_error(), want))
        fail_msg("want %d %s, got %d: %s", code, id, rc, kvt_last_error());
}

static void expect_fail(const char *json, uint64_t data, int code, const char *id)
{
    struct kvt_header *h = (struct kvt_header *)1;
    int rc = parse(json, data, &h);
    expect_rc(rc, code, id);
    assert_null(h);
}

static struct kvt_header *expect_ok(const char *json, uint64_t data)
{
    struct kvt_header *h = NULL;
    int rc = parse(json, data, &h);
    if (rc)
        fail_msg("want ok, got %d: %s\n%s", rc, kvt_last_error(), json);
    assert_non_null(h);
    return h;
}

/* A kv layer of [1,2,2,8] bf16 (64 bytes per tensor) with replaceable pieces. */
#define SLOT(off, shape, dtype)                                                                    \
    "{\"off\":" off ",\"bytes\":64,\"shape\":" shape ",\"dtype\":" dtype                           \
    ",\"hash\":\"0000000000000000\"}"
#define KV_SLOTS SLOT("0", "[1,2,2,8]", "12") "," SLOT("16384", "[1,2,2,8]", "12")
#define KV_CACHE "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" KV_SLOTS "]}"
#define HDR(top, caches)                                                                           \
    "{\"formatVersion\":3,\"createdAt\":1" top ",\"tokens\":[1,2],\"caches\":[" caches "]}"
#define KV_DATA (16384 + 64)

static void test_valid_kv(void **state)
{
    (void)state;
    struct kvt_header *h = expect_ok(HDR(",\"modelId\":\"m\"", KV_CACHE), KV_DATA);
    assert_int_equal(h->format_version, 3);
    assert_int_equal(h->created_at, 1);
    assert_string_equal(h->model_id, "m");
    assert_null(h->ns);
    assert_int_equal(h->n_tokens, 2);
    assert_int_equal(h->tokens[1], 2);
    assert_int_equal(h->n_caches, 1);
    assert_int_equal(h->caches[0].info.kind, KVT_KIND_KV);
    assert_int_equal(h->caches[0].n_slots, 2);
    assert_int_equal(h->caches[0].slots[1].off, 16384);
    assert_int_equal(h->data_start, 16384);
    assert_true(kvt_header_is_indexable(h));
    assert_true(kvt_header_is_trimmable(h));
    kvt_header_free(h);
}

static void test_prefix_checks(void **state)
{
    (void)state;
    struct kvt_header *h;
    size_t n;
    uint8_t *b = image(HDR("", KV_CACHE), KV_DATA, &n);

    expect_rc(kvt_header_parse(b, 25, 25, NULL, "img", &h), KVT_E_CORRUPT, "V1");
    expect_rc(kvt_header_parse(b, 0, 0, NULL, "img", &h), KVT_E_CORRUPT, "V1");

    b[0] ^= 1;
    expect_rc(parse_image(b, n, &h), KVT_E_FORMAT, "V2");
    b[0] ^= 1;
    b[8] = '1';
    expect_rc(parse_image(b, n, &h), KVT_E_UNSUPPORTED, "V2");
    b[8] = '2';

    uint32_t hl, v;
    memcpy(&hl, b + 10, 4);
    v = 0;
    memcpy(b + 10, &v, 4);
    expect_rc(parse_image(b, n, &h), KVT_E_CORRUPT, "V3");
    v = (uint32_t)n - 25;
    memcpy(b + 10, &v, 4);
    expect_rc(parse_image(b, n, &h), KVT_E_CORRUPT, "V3");
    memcpy(b + 10, &hl, 4);

    struct kvt_read_opts small = {.max_header_bytes = hl - 1};
    expect_rc(kvt_header_parse(b, n, n, &small, "img", &h), KVT_E_UNSUPPORTED, "V4");
    small.max_header_bytes = hl;
    assert_int_equal(kvt_header_parse(b, n, n, &small, "img", &h), 0);
    kvt_header_free(h);

    v = 32768;
    memcpy(b + 14, &v, 4);
    expect_rc(parse_image(b, n, &h), KVT_E_CORRUPT, "V5");
    v = 16384;
    memcpy(b + 14, &v, 4);
    /* dataStart beyond EOF: a file that ends inside the padding */
    expect_rc(kvt_header_parse(b, 26 + hl, 26 + hl, NULL, "img", &h), KVT_E_CORRUPT, "V5");

    b[26 + 3] ^= 0x20;
    expect_rc(parse_image(b, n, &h), KVT_E_CORRUPT, "V6");
    b[26 + 3] ^= 0x20;

    /* the caller must supply the header bytes it claims to have */
    assert_int_equal(kvt_header_parse(b, 100, n, NULL, "img", &h), -EINVAL);
    assert_null(h);
    free(b);
}

static void test_json_syntax(void **state)
{
    (void)state;
    expect_fail(HDR("", KV_CACHE) "x", KV_DATA, KVT_E_CORRUPT, "V7");
    expect_fail(HDR("", KV_CACHE) "{}", KV_DATA, KVT_E_CORRUPT, "V7");
    expect_fail("{\"formatVersion\":3", KV_DATA, KVT_E_CORRUPT, "V7");
    expect_fail("[1,2]", KV_DATA, KVT_E_CORRUPT, "V7");
    expect_fail("\"str\"", KV_DATA, KVT_E_CORRUPT, "V7");
    expect_fail("\xef\xbb\xbf" HDR("", KV_CACHE), KV_DATA, KVT_E_CORRUPT, "V7");
    /* duplicate keys, top level and nested */
    expect_fail(HDR(",\"ns\":\"a\",\"ns\":\"a\"", KV_CACHE), KV_DATA, KVT_E_CORRUPT, "V7");
    expect_fail(
        HDR("", "{\"kind\":\"kv\",\"kind\":\"kv\",\"offset\":2,\"tensors\":[" KV_SLOTS "]}"),
        KV_DATA, KVT_E_CORRUPT, "V7");
    /* invalid UTF-8: stray byte, overlong, encoded surrogate, beyond U+10FFFF */
    expect_fail(HDR(",\"ns\":\"\xff\"", KV_CACHE), KV_DATA, KVT_E_CORRUPT, "V7");
    expect_fail(HDR(",\"ns\":\"\xc0\x80\"", KV_CACHE), KV_DATA, KVT_E_CORRUPT, "V7");
    expect_fail(HDR(",\"ns\":\"\xed\xa0\x80\"", KV_CACHE), KV_DATA, KVT_E_CORRUPT, "V7");
    expect_fail(HDR(",\"ns\":\"\xf4\x90\x80\x80\"", KV_CACHE), KV_DATA, KVT_E_CORRUPT, "V7");
    /* a raw control character inside a string */
    expect_fail(HDR(",\"ns\":\"a\tb\"", KV_CACHE), KV_DATA, KVT_E_CORRUPT, "V7");
    /* a number too large for a double */
    expect_fail(HDR(",\"extra\":1e400", KV_CACHE), KV_DATA, KVT_E_CORRUPT, "V7");

    /* whitespace around the value is fine; unknown keys are ignored */
    struct kvt_header *h =
        expect_ok(" \n\t" HDR(",\"extra\":{\"x\":[1,null]}", KV_CACHE) "\r\n ", KV_DATA);
    kvt_header_free(h);
    /* valid UTF-8 and escapes decode */
    h = expect_ok(HDR(",\"ns\":\"\\u00e8\xf0\x9f\x98\x80\\n\"", KV_CACHE), KV_DATA);
    assert_string_equal(h->ns, "\xc3\xa8\xf0\x9f\x98\x80\n");
    kvt_header_free(h);
}

static void test_version(void **state)
{
    (void)state;
    expect_fail("{\"tokens\":[],\"caches\":[" KV_CACHE "]}", KV_DATA, KVT_E_CORRUPT, "V8");
    expect_fail("{\"formatVersion\":\"3\",\"tokens\":[2,2],\"caches\":[" KV_CACHE "]}", KV_DATA,
                KVT_E_CORRUPT, "V8");
    expect_fail("{\"formatVersion\":3.5,\"tokens\":[2,2],\"caches\":[" KV_CACHE "]}", KV_DATA,
                KVT_E_CORRUPT, "V8");
    expect_fail("{\"formatVersion\":4,\"tokens\":[2,2],\"caches\":[" KV_CACHE "]}", KV_DATA,
                KVT_E_UNSUPPORTED, "V8");
    expect_fail("{\"formatVersion\":2,\"tokens\":[2,2],\"caches\":[" KV_CACHE "]}", KV_DATA,
                KVT_E_UNSUPPORTED, "V8");
    /* a version-4 file with a broken body is still only "unsupported" */
    expect_fail("{\"formatVersion\":4,\"tokens\":5}", 0, KVT_E_UNSUPPORTED, "V8");
    /* 3.0 and 3e0 are the integer 3, as JSON.parse reads them */
    struct kvt_header *h =
        expect_ok("{\"formatVersion\":3.0,\"tokens\":[1,2],\"caches\":[" KV_CACHE "]}", KV_DATA);
    assert_int_equal(h->created_at, -1);
    kvt_header_free(h);
    h = expect_ok("{\"formatVersion\":3e0,\"tokens\":[1,2],\"caches\":[" KV_CACHE "]}", KV_DATA);
    kvt_header_free(h);
}

static void test_features(void **state)
{
    (void)state;
    struct kvt_header *h = expect_ok(HDR(",\"codecProvider\":\"mlx-cache-v3\"", KV_CACHE), KV_DATA);
    kvt_header_free(h);
    expect_fail(HDR(",\"codecProvider\":\"other\"", KV_CACHE), KV_DATA, KVT_E_UNSUPPORTED, "V9");
    expect_fail(HDR(",\"codecProvider\":7", KV_CACHE), KV_DATA, KVT_E_UNSUPPORTED, "V9");
    expect_fail(HDR(",\"attachments\":[]", KV_CACHE), KV_DATA, KVT_E_UNSUPPORTED, "V9");
    expect_fail(HDR(",\"generationCheckpoint\":{}", KV_CACHE), KV_DATA, KVT_E_UNSUPPORTED, "V9");
    expect_fail(
        HDR("", "{\"kind\":\"kv\",\"offset\":2,\"minimumReusableOffset\":1,\"tensors\":[" KV_SLOTS
                "]}"),
        KV_DATA, KVT_E_UNSUPPORTED, "V9");
    expect_fail(HDR(",\"modelId\":\"a\\u0000b\"", KV_CACHE), KV_DATA, KVT_E_UNSUPPORTED, "V9");
    /* V9 runs before the structural checks */
    expect_fail(HDR(",\"attachments\":[]", "5"), KV_DATA, KVT_E_UNSUPPORTED, "V9");
}

#define QKV_CACHE(params)                                                                          \
    "{\"kind\":\"qkv\",\"offset\":2" params ",\"tensors\":["                                       \
    "{\"off\":0,\"bytes\":128,\"shape\":[1,2,2,8],\"dtype\":3,\"hash\":\"0000000000000000\"},"     \
    "{\"off\":16384,\"bytes\":16,\"shape\":[1,2,2,2],\"dtype\":12,\"hash\":\"0000000000000000\"}," \
    "{\"off\":32768,\"bytes\":16,\"shape\":[1,2,2,2],\"dtype\":12,\"hash\":\"0000000000000000\"}," \
    "{\"off\":49152,\"bytes\":128,\"shape\":[1,2,2,8],\"dtype\":3,\"hash\":\"0000000000000000\"}," \
    "{\"off\":65536,\"bytes\":16,\"shape\":[1,2,2,2],\"dtype\":12,\"hash\":\"0000000000000000\"}," \
    "{\"off\":81920,\"bytes\":16,\"shape\":[1,2,2,2],\"dtype\":12,\"hash\":\"0000000000000000\"}]" \
    "}"
#define QKV_DATA (81920 + 16)

static void test_values(void **state)
{
    (void)state;
    /* D = 64, bits 4, groupSize 32: packed 64 * 4 / 32 = 8 words, scales 64 / 32 = 2 */
    struct kvt_header *h = expect_ok(HDR("", QKV_CACHE(",\"groupSize\":32,\"bits\":4")), QKV_DATA);
    kvt_header_free(h);
    expect_fail(HDR("", "{\"kind\":\"mla\",\"offset\":2,\"tensors\":[]}"), 0, KVT_E_UNSUPPORTED,
                "V10");
    expect_fail(HDR("", "{\"offset\":2,\"tensors\":[" KV_SLOTS "]}"), KV_DATA, KVT_E_CORRUPT,
                "V10");
    expect_fail(HDR("", "{\"kind\":5,\"offset\":2,\"tensors\":[" KV_SLOTS "]}"), KV_DATA,
                KVT_E_CORRUPT, "V10");
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" SLOT(
                            "0", "[1,2,2,8]", "14") "," SLOT("16384", "[1,2,2,8]", "12") "]}"),
                KV_DATA, KVT_E_UNSUPPORTED, "V10");
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" SLOT(
                            "0", "[1,2,2,8]", "-1") "," SLOT("16384", "[1,2,2,8]", "12") "]}"),
                KV_DATA, KVT_E_UNSUPPORTED, "V10");
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" SLOT(
                            "0", "[1,2,2,8]", "1.5") "," SLOT("16384", "[1,2,2,8]", "12") "]}"),
                KV_DATA, KVT_E_CORRUPT, "V10");
    expect_fail(HDR("", QKV_CACHE(",\"groupSize\":32,\"bits\":7")), QKV_DATA, KVT_E_UNSUPPORTED,
                "V10");
    expect_fail(HDR("", QKV_CACHE(",\"groupSize\":48,\"bits\":4")), QKV_DATA, KVT_E_UNSUPPORTED,
                "V10");
    expect_fail(HDR("", QKV_CACHE(",\"groupSize\":32")), QKV_DATA, KVT_E_CORRUPT, "V10");
    expect_fail(HDR("", QKV_CACHE(",\"groupSize\":32,\"bits\":\"4\"")), QKV_DATA, KVT_E_CORRUPT,
                "V10");
    expect_fail(HDR("", "{\"kind\":\"turboquant\",\"offset\":0,\"kBits\":8,\"vBits\":3,"
                        "\"headDim\":96,\"tensors\":[]}"),
                0, KVT_E_UNSUPPORTED, "V10");
    expect_fail(HDR("", "{\"kind\":\"turboquant\",\"offset\":0,\"kBits\":6,\"vBits\":3,"
                        "\"headDim\":64,\"tensors\":[]}"),
                0, KVT_E_UNSUPPORTED, "V10");
    /* an unknown kind anywhere wins over a damaged known one: a newer file is never corrupt */
    expect_fail(HDR("", QKV_CACHE(",\"groupSize\":32") ",{\"kind\":\"mla\"}"), QKV_DATA,
                KVT_E_UNSUPPORTED, "V10");
}

static void test_types(void **state)
{
    (void)state;
    expect_fail(HDR(",\"modelId\":5", KV_CACHE), KV_DATA, KVT_E_CORRUPT, "V11");
    expect_fail(HDR(",\"ns\":null", KV_CACHE), KV_DATA, KVT_E_CORRUPT, "V11");
    expect_fail("{\"formatVersion\":3,\"createdAt\":-1,\"tokens\":[1,2],\"caches\":[" KV_CACHE "]}",
                KV_DATA, KVT_E_CORRUPT, "V11");
    expect_fail("{\"formatVersion\":3,\"createdAt\":1.5,\"tokens\":[1,2],\"caches\":[" KV_CACHE
                "]}",
                KV_DATA, KVT_E_CORRUPT, "V11");
    expect_fail("{\"formatVersion\":3,\"createdAt\":9007199254740992,\"tokens\":[1,2],"
                "\"caches\":[" KV_CACHE "]}",
                KV_DATA, KVT_E_CORRUPT, "V11");
    struct kvt_header *h = expect_ok("{\"formatVersion\":3,\"createdAt\":9007199254740991,"
                                     "\"tokens\":[1,2],\"caches\":[" KV_CACHE "]}",
                                     KV_DATA);
    assert_int_equal(h->created_at, 9007199254740991LL);
    kvt_header_free(h);
    expect_fail("{\"formatVersion\":3,\"caches\":[" KV_CACHE "]}", KV_DATA, KVT_E_CORRUPT, "V11");
    expect_fail("{\"formatVersion\":3,\"tokens\":[-1],\"caches\":[" KV_CACHE "]}", KV_DATA,
                KVT_E_CORRUPT, "V11");
    expect_fail("{\"formatVersion\":3,\"tokens\":[2147483648],\"caches\":[" KV_CACHE "]}", KV_DATA,
                KVT_E_CORRUPT, "V11");
    h = expect_ok("{\"formatVersion\":3,\"tokens\":[2147483647],\"caches\":[" KV_CACHE "]}",
                  KV_DATA);
    assert_int_equal(h->tokens[0], 2147483647);
    assert_false(kvt_header_is_indexable(h)); /* offset 2 != 1 token */
    kvt_header_free(h);
    expect_fail("{\"formatVersion\":3,\"tokens\":[1.5],\"caches\":[" KV_CACHE "]}", KV_DATA,
                KVT_E_CORRUPT, "V11");
    expect_fail("{\"formatVersion\":3,\"tokens\":{},\"caches\":[" KV_CACHE "]}", KV_DATA,
                KVT_E_CORRUPT, "V11");
    expect_fail(HDR("", ""), 0, KVT_E_CORRUPT, "V11");
    expect_fail("{\"formatVersion\":3,\"tokens\":[]}", 0, KVT_E_CORRUPT, "V11");
    expect_fail(HDR("", "5"), 0, KVT_E_CORRUPT, "V11");
    expect_fail(HDR("", "{\"kind\":\"kv\",\"tensors\":[" KV_SLOTS "]}"), KV_DATA, KVT_E_CORRUPT,
                "V11");
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":9007199254740992,\"tensors\":[" KV_SLOTS "]}"),
                KV_DATA, KVT_E_CORRUPT, "V11");
    expect_fail(
        HDR("", "{\"kind\":\"rotating\",\"offset\":2,\"maxSize\":8,\"tensors\":[" KV_SLOTS "]}"),
        KV_DATA, KVT_E_CORRUPT, "V11");
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":{}}"), KV_DATA, KVT_E_CORRUPT,
                "V11");
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[5,6]}"), KV_DATA, KVT_E_CORRUPT,
                "V11");
}

static void test_counts_and_slots(void **state)
{
    (void)state;
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" KV_SLOTS
                        "," SLOT("32768", "[1,2,2,8]", "12") "]}"),
                KV_DATA + 16384, KVT_E_CORRUPT, "V12");
    expect_fail(HDR("", "{\"kind\":\"ssm\",\"offset\":2,\"tensors\":[]}"), 0, KVT_E_CORRUPT, "V12");
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" SLOT(
                            "0", "[1,2,2,8]",
                            "12") ",{\"off\":16384,\"shape\":[1,2,2,8],\"dtype\":12,\"hash\":"
                                  "\"0000000000000000\"}]}"),
                KV_DATA, KVT_E_CORRUPT, "V13");
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" SLOT(
                            "0", "[1,2,2,8]", "12") "," SLOT("-16384", "[1,2,2,8]", "12") "]}"),
                KV_DATA, KVT_E_CORRUPT, "V13");
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" SLOT(
                            "0", "[2,2,8]", "12") "," SLOT("16384", "[1,2,2,8]", "12") "]}"),
                KV_DATA, KVT_E_CORRUPT, "V13");
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" SLOT(
                            "0", "[1,2,-2,8]", "12") "," SLOT("16384", "[1,2,2,8]", "12") "]}"),
                KV_DATA, KVT_E_CORRUPT, "V13");
    const char *bad_hash[] = {"\"000000000000000A\"", "\"000000000000000\"", "7",
                              "\"00000000000000000\"", "\"000000000000000g\""};
    for (size_t i = 0; i < sizeof(bad_hash) / sizeof(bad_hash[0]); i++) {
        char *j = strf(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" SLOT(
                                   "0", "[1,2,2,8]", "12") ",{\"off\":16384,\"bytes\":64,"
                                                           "\"shape\":[1,2,2,8],\"dtype\":12,"
                                                           "\"hash\":%s}]}"),
                       bad_hash[i]);
        expect_fail(j, KV_DATA, KVT_E_CORRUPT, "V13");
        free(j);
    }
    /* ssm conv is rank 3 */
    expect_fail(HDR("", "{\"kind\":\"ssm\",\"offset\":2,\"tensors\":["
                        "{\"off\":0,\"bytes\":64,\"shape\":[1,2,16,1],\"dtype\":12,\"hash\":"
                        "\"0000000000000000\"}," SLOT("16384", "[1,2,2,8]", "10") "]}"),
                KV_DATA, KVT_E_CORRUPT, "V13");
    /* V12 on a later cache wins over V15 on an earlier one */
    expect_fail(
        HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" SLOT("8", "[1,2,2,8]", "12") "," SLOT(
                    "16384", "[1,2,2,8]", "12") "]},{\"kind\":\"kv\",\"offset\":2,"
                                                "\"tensors\":[]}"),
        KV_DATA, KVT_E_CORRUPT, "V12");
}

static void test_layout(void **state)
{
    (void)state;
    /* V14 */
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[{\"off\":0,\"bytes\":63,"
                        "\"shape\":[1,2,2,8],\"dtype\":12,\"hash\":\"0000000000000000\"}," SLOT(
                            "16384", "[1,2,2,8]", "12") "]}"),
                KV_DATA, KVT_E_CORRUPT, "V14");
    /* an intermediate product of 2^60 fails even though the last factor is 0 */
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":0,\"tensors\":["
                        "{\"off\":0,\"bytes\":0,\"shape\":[1073741824,1073741824,0,8],\"dtype\":12,"
                        "\"hash\":\"0000000000000000\"},"
                        "{\"off\":0,\"bytes\":0,\"shape\":[1073741824,1073741824,0,8],\"dtype\":12,"
                        "\"hash\":\"0000000000000000\"}]}"),
                0, KVT_E_CORRUPT, "V14");
    /* V15 */
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" SLOT(
                            "0", "[1,2,2,8]", "12") "," SLOT("15872", "[1,2,2,8]", "12") "]}"),
                KV_DATA, KVT_E_CORRUPT, "V15");
    assert_non_null(
        strstr(kvt_last_error(), "V15: caches[0].tensors[1].off 15872 is not a multiple of 16384"));
    /* V16: the second tensor starts inside the first */
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" SLOT(
                            "16384", "[1,2,2,8]", "12") "," SLOT("0", "[1,2,2,8]", "12") "]}"),
                KV_DATA, KVT_E_CORRUPT, "V16");
    /* V17: one byte short */
    expect_fail(HDR("", KV_CACHE), KV_DATA - 1, KVT_E_CORRUPT, "V17");
    /* zero-byte slots may share an offset and lie past EOF */
    struct kvt_header *h =
        expect_ok(HDR("", KV_CACHE ",{\"kind\":\"kv\",\"offset\":0,\"tensors\":["
                                   "{\"off\":32768,\"bytes\":0,\"shape\":[1,2,0,8],\"dtype\":12,"
                                   "\"hash\":\"0409638ee2bde459\"},"
                                   "{\"off\":32768,\"bytes\":0,\"shape\":[1,2,0,8],\"dtype\":12,"
                                   "\"hash\":\"0409638ee2bde459\"}]}"),
                  KV_DATA);
    assert_false(kvt_header_is_indexable(h));
    kvt_header_free(h);
}

static void test_roles_shapes_rings(void **state)
{
    (void)state;
    /* V18 */
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[{\"off\":0,\"bytes\":32,"
                        "\"shape\":[1,2,2,8],\"dtype\":1,\"hash\":\"0000000000000000\"},"
                        "{\"off\":16384,\"bytes\":32,\"shape\":[1,2,2,8],\"dtype\":1,"
                        "\"hash\":\"0000000000000000\"}]}"),
                KV_DATA, KVT_E_CORRUPT, "V18");
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" SLOT(
                            "0", "[1,2,2,8]", "12") "," SLOT("16384", "[1,2,2,8]", "9") "]}"),
                KV_DATA, KVT_E_CORRUPT, "V18");
    /* V19: heads differ; token axis != offset */
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" SLOT(
                            "0", "[1,2,2,8]", "12") "," SLOT("16384", "[1,1,2,16]", "12") "]}"),
                KV_DATA, KVT_E_CORRUPT, "V19");
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":4,\"tensors\":[" KV_SLOTS "]}"), KV_DATA,
                KVT_E_CORRUPT, "V19");
    /* V19 for qkv: packed * 32 = scales * groupSize * bits (8 * 32 != 2 * 32 * 8) */
    expect_fail(HDR("", QKV_CACHE(",\"groupSize\":32,\"bits\":8")), QKV_DATA, KVT_E_CORRUPT, "V19");
    /* Dk != Dv is fine for kv */
    struct kvt_header *h = expect_ok(
        HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" SLOT(
                    "0", "[1,2,2,8]",
                    "12") ",{\"off\":16384,\"bytes\":32,\"shape\":[1,2,2,4],\"dtype\":12,\"hash\":"
                          "\"0000000000000000\"}]}"),
        KV_DATA);
    kvt_header_free(h);
    /* V20 */
#define RING(o, i, m)                                                                              \
    "{\"kind\":\"rotating\",\"offset\":" o ",\"idx\":" i ",\"maxSize\":" m                         \
    ",\"tensors\":[" KV_SLOTS "]}"
    h = expect_ok(HDR("", RING("9", "1", "2")), KV_DATA);
    assert_false(kvt_header_is_trimmable(h));
    kvt_header_free(h);
    h = expect_ok(HDR("", RING("2", "2", "8")), KV_DATA);
    assert_true(kvt_header_is_trimmable(h));
    kvt_header_free(h);
    expect_fail(HDR("", RING("2", "2", "0")), KV_DATA, KVT_E_CORRUPT, "V20");
    expect_fail(HDR("", RING("2", "3", "8")), KV_DATA, KVT_E_CORRUPT, "V20");
    expect_fail(HDR("", RING("3", "2", "8")), KV_DATA, KVT_E_CORRUPT, "V20");
    /* V18 is checked on every cache before V19 on any */
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":4,\"tensors\":[" KV_SLOTS
                        "]},{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" SLOT(
                            "32768", "[1,2,2,8]", "12") "," SLOT("49152", "[1,2,2,8]", "9") "]}"),
                KV_DATA + 32768, KVT_E_CORRUPT, "V18");
}

static void test_numbers(void **state)
{
    (void)state;
    struct kvt_header *h = expect_ok(
        HDR("", "{\"kind\":\"kv\",\"offset\":2.0,\"tensors\":[" SLOT(
                    "0", "[1,2,2e0,8]", "12") "," SLOT("1.6384e4", "[1,2,2,8]", "12.0") "]}"),
        KV_DATA);
    assert_int_equal(h->caches[0].info.offset, 2);
    assert_int_equal(h->caches[0].slots[0].shape[2], 2);
    assert_int_equal(h->caches[0].slots[1].off, 16384);
    kvt_header_free(h);
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":2.5,\"tensors\":[" KV_SLOTS "]}"), KV_DATA,
                KVT_E_CORRUPT, "V11");
    /* 2^53 + 1 reads as 2^53: never an exact integer */
    expect_fail(HDR("", "{\"kind\":\"kv\",\"offset\":9007199254740993,\"tensors\":[" KV_SLOTS "]}"),
                KV_DATA, KVT_E_CORRUPT, "V11");
    expect_fail(
        HDR("", "{\"kind\":\"kv\",\"offset\":2,\"tensors\":[" SLOT("0", "[1,2,2,8]", "12") "," SLOT(
                    "18446744073709551616", "[1,2,2,8]", "12") "]}"),
        KV_DATA, KVT_E_CORRUPT, "V13");
}

static void test_serializer_escapes(void **state)
{
    (void)state;
    struct kvt_sbuf b = {0};
    kvt_json_put_string(&b, "a\"b\\c/d\b\t\n\f\r\x01\x1f\x7f\xc2\x80\xe2\x80\xa8\xe2\x80\xa9");
    assert_string_equal(b.data, "\"a\\\"b\\\\c/d\\b\\t\\n\\f\\r\\u0001\\u001f\x7f\xc2\x80"
                                "\xe2\x80\xa8\xe2\x80\xa9\"");
    kvt_sbuf_free(&b);
    kvt_json_put_string(&b, "");
    assert_string_equal(b.data, "\"\"");
    kvt_sbuf_free(&b);
    kvt_sbuf_put_u64(&b, 0);
    kvt_sbuf_puts(&b, ",");
    kvt_sbuf_put_u64(&b, 9007199254740991ull);
    assert_string_equal(b.data, "0,9007199254740991");
    kvt_sbuf_free(&b);
}

static void test_utf8(void **state)
{
    (void)state;
    size_t at = 99;
    assert_true(kvt_utf8_valid("", NULL));
    assert_true(
        kvt_utf8_valid("abc \xc3\xa8 \xe6\xb5\x8b \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf", NULL));
    assert_false(kvt_utf8_valid("ab\xff", &at));
    assert_int_equal(at, 2);
    assert_false(kvt_utf8_valid("\xc0\x80", NULL));         /* overlong NUL */
    assert_false(kvt_utf8_valid("\xe0\x80\xaf", NULL));     /* overlong '/' */
    assert_false(kvt_utf8_valid("\xed\xa0\x80", NULL));     /* surrogate */
    assert_false(kvt_utf8_valid("\xf4\x90\x80\x80", NULL)); /* above U+10FFFF */
    assert_false(kvt_utf8_valid("\xe6\xb5", NULL));         /* truncated */
    assert_false(kvt_utf8_valid("\x80", NULL));             /* lone continuation */
}

/* Parse, re-serialize: the bytes of every valid golden header come back identical. */
static void test_golden_headers_reserialize(void **state)
{
    (void)state;
    const char *names[] = {"v3-worked-example.mlxkv",  "kv.mlxkv",
                           "rotating.mlxkv",           "qkv.mlxkv",
                           "rotating-qkv.mlxkv",       "ssm.mlxkv",
                           "turboquant.mlxkv",         "mixed.mlxkv",
                           "zero-length-tensor.mlxkv", "zero-length-last.mlxkv",
                           "meta-unicode.mlxkv"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        size_t n;
        uint8_t *file = read_file(golden_path(names[i]), &n);
        assert_non_null(file);
        struct kvt_header *h;
        assert_int_equal(kvt_header_parse(file, n, n, NULL, names[i], &h), 0);
        struct kvt_sbuf b = {0};
        assert_int_equal(kvt_header_to_json(h, &b), 0);
        assert_int_equal(b.len, h->header_len);
        assert_memory_equal(b.data, file + 26, b.len);
        assert_int_equal(kvt_header_check_writable(h), 0);
        kvt_sbuf_free(&b);
        kvt_header_free(h);
        free(file);
    }
}

static void test_writable_rejects(void **state)
{
    (void)state;
    size_t n;
    uint8_t *file = read_file(golden_path("kv.mlxkv"), &n);
    struct kvt_header *h;
    assert_int_equal(kvt_header_parse(file, n, n, NULL, "kv", &h), 0);
    char *saved = h->model_id;
    h->model_id = (char *)"bad \xc3";
    assert_int_equal(kvt_header_check_writable(h), -EINVAL);
    assert_non_null(strstr(kvt_last_error(), "modelId"));
    h->model_id = saved;
    h->tokens[0] = -5;
    assert_int_equal(kvt_header_check_writable(h), -EINVAL);
    h->tokens[0] = 5;
    h->caches[0].slots[1].dtype = 10;
    assert_int_equal(kvt_header_check_writable(h), -EINVAL);
    assert_non_null(strstr(kvt_last_error(), "V14")); /* bytes no longer match the dtype */
    kvt_header_free(h);
    free(file);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_kv),
        cmocka_unit_test(test_prefix_checks),
        cmocka_unit_test(test_json_syntax),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_features),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_types),
        cmocka_unit_test(test_counts_and_slots),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_roles_shapes_rings),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_serializer_escapes),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_golden_headers_reserialize),
        cmocka_unit_test(test_writable_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
