/*
 * The header's fast token reader agrees with the general JSON path: every spelling of the
 * tokens array is accepted or rejected with the same category and check, and gives the same
 * tokens, whichever path reads it.
 */
#include "support/support.h"

#include <stdlib.h>
#include <string.h>

#include "format/format.h"

static uint8_t *golden;
static size_t golden_n;

static int setup(void **state)
{
    (void)state;
    golden = read_file(golden_path("v3-worked-example.mlxkv"), &golden_n);
    return golden ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    free(golden);
    return 0;
}

/* The worked example with `"tokens":[1,2,3,4]` spelled as @p spelling, re-hashed. */
static int parse_with(const char *spelling, struct kvt_header **h)
{
    uint32_t hl = (uint32_t)golden[10] | (uint32_t)golden[11] << 8;
    char *json = strndup((const char *)golden + KVT_PREFIX_LEN, hl);
    char *at = strstr(json, "\"tokens\":[1,2,3,4]");
    assert_non_null(at);
    *at = '\0';
    char *edited = strf("%s%s%s", json, spelling, at + strlen("\"tokens\":[1,2,3,4]"));
    size_t n = strlen(edited);
    assert_true(KVT_PREFIX_LEN + n <= 16384);

    uint8_t *file = malloc(golden_n);
    memcpy(file, golden, golden_n);
    memset(file + KVT_PREFIX_LEN, 0, 16384 - KVT_PREFIX_LEN);
    memcpy(file + KVT_PREFIX_LEN, edited, n);
    uint64_t hh = kvt_wyhash(0, edited, n);
    for (int b = 0; b < 4; b++)
        file[10 + b] = (uint8_t)(n >> (8 * b));
    for (int b = 0; b < 8; b++)
        file[18 + b] = (uint8_t)(hh >> (8 * b));
    int rc = kvt_header_parse(file, golden_n, golden_n, NULL, "t", h);
    free(file);
    free(edited);
    free(json);
    return rc;
}

static void expect_tokens(const char *spelling, const int32_t *want, size_t n)
{
    struct kvt_header *h = NULL;
    int rc = parse_with(spelling, &h);
    if (rc)
        fail_msg("%s: %s", spelling, kvt_last_error());
    assert_int_equal(h->n_tokens, n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(h->tokens[i], want[i]);
    kvt_header_free(h);
}

static void expect_error(const char *spelling, int code, const char *check)
{
    struct kvt_header *h = (struct kvt_header *)1;
    int rc = parse_with(spelling, &h);
    assert_int_equal(rc, code);
    assert_null(h);
    if (!strstr(kvt_last_error(), check))
        fail_msg("%s: expected %s, got: %s", spelling, check, kvt_last_error());
}

static void test_accepted_spellings(void **state)
{
    (void)state;
    const int32_t t4[4] = {1, 2, 3, 4}, big[2] = {0, 2147483647};
    expect_tokens("\"tokens\":[1,2,3,4]", t4, 4);             /* fast path */
    expect_tokens("\"tokens\" : [ 1 ,\n2 ,\t3,4\r ]", t4, 4); /* fast path, whitespace */
    expect_tokens("\"tokens\":[1,2,3,4.0]", t4, 4);           /* general path: JSON.parse's 4 */
    expect_tokens("\"tokens\":[1,2,3,4e0]", t4, 4);
    expect_tokens("\"tok\\u0065ns\":[1,2,3,4]", t4, 4); /* escaped key: general path */
    expect_tokens("\"tokens\":[0,2147483647]", big, 2);
    expect_tokens("\"tokens\":[]", NULL, 0);
    expect_tokens("\"tokens\":[ ]", NULL, 0);
}

static void test_rejected_spellings(void **state)
{
    (void)state;
    expect_error("\"tokens\":[01,2,3,4]", KVT_E_CORRUPT, "V7");
    expect_error("\"tokens\":[1,2,3,]", KVT_E_CORRUPT, "V7");
    expect_error("\"tokens\":[1,,2]", KVT_E_CORRUPT, "V7");
    expect_error("\"tokens\":[1 2]", KVT_E_CORRUPT, "V7");
    expect_error("\"tokens\":[1,2],\"tokens\":[1,2]", KVT_E_CORRUPT, "V7");
    expect_error("\"tokens\":[-1,2,3,4]", KVT_E_CORRUPT, "V11");
    expect_error("\"tokens\":[2147483648]", KVT_E_CORRUPT, "V11");
    expect_error("\"tokens\":[99999999999999999999]", KVT_E_CORRUPT, "V11");
    expect_error("\"tokens\":[1.5]", KVT_E_CORRUPT, "V11");
    expect_error("\"tokens\":[[1]]", KVT_E_CORRUPT, "V11");
    expect_error("\"tokens\":[\"1\"]", KVT_E_CORRUPT, "V11");
    expect_error("\"tokens\":{}", KVT_E_CORRUPT, "V11");
}

/* The byte a V7 message names for @p spelling. */
static long error_byte(const char *spelling)
{
    struct kvt_header *h;
    assert_int_equal(parse_with(spelling, &h), KVT_E_CORRUPT);
    const char *at = strstr(kvt_last_error(), "at byte ");
    assert_non_null(at);
    return strtol(at + strlen("at byte "), NULL, 10);
}

/* An error after a token list the fast path cut out is reported at its byte in the header as
 * written: where the general path, reading the same list, reports it. */
static void test_error_position_past_the_tokens(void **state)
{
    (void)state;
    long fast = error_byte("\"tokens\":[1,2,3,4]]");
    long general = error_byte("\"tok\\u0065ns\":[1,2,3,4]]"); /* 5 bytes longer */
    assert_true(fast > (long)strlen("\"tokens\":[1,2,3,4]"));
    assert_int_equal(general - fast, 5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepted_spellings),
        cmocka_unit_test(test_rejected_spellings),
        cmocka_unit_test(test_error_position_past_the_tokens),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
