/*
 * The fed load (format/feed_load.c) against the file loader on the same bytes: a file of all
 * six kinds fed in pieces of many sizes gives the same entry and header as kvt_file_load();
 * bytes flipped one at a time (every fifth byte the loaders check, every 251st other; a flip of
 * a checked byte must fail), truncations and a wrong identity give
 * exactly the file loader's result code, and a failed feed hands nothing out. Feeding too few
 * or too many bytes is refused, and a reset feed starts over cleanly. A large entry fed into
 * fresh memory (no buffer cache: the restore helper faults destinations in ahead) lands the
 * file loader's bytes.
 */
#include "support/support.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"
#include "progs/crash_entry.h"

static char *dir, *path;
static uint8_t *img;
static size_t img_len;
static struct kvt_entry *ref;
static struct kvt_header *hdr;

/* Flips tried: every PROTECTED_STRIDE-th byte the loaders check, every UNREAD_STRIDE-th other. */
#define PROTECTED_STRIDE 5
#define UNREAD_STRIDE 251

static int setup(void **state)
{
    (void)state;
    dir = scratch_dir("feed");
    if (!dir)
        return -1;
    path = strf("%s/mixed.mlxkv", dir);
    int32_t tok[12]; /* both rings (maxSize 8) have wrapped */
    for (int i = 0; i < 12; i++)
        tok[i] = 500 + 11 * i;
    struct kvt_entry *e;
    if (synth_entry(tok, 12, SYNTH_ALL_KINDS, 6, "feed", &e) != 0)
        return -1;
    struct kvt_save_opts o = {.no_sync = true};
    int rc = kvt_file_save(path, e, &o, NULL);
    kvt_entry_free(e);
    if (rc == 0)
        rc = kvt_file_load(path, NULL, &ref, &hdr);
    img = read_file(path, &img_len);
    return rc == 0 && img ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvt_entry_free(ref);
    kvt_header_free(hdr);
    free(img);
    rm_rf(dir);
    free(path);
    free(dir);
    return 0;
}

/* Feed @p n bytes of @p data as a file of @p size bytes, in pieces of at most @p piece
 * (0: a pseudo-random size each). Returns the first error, or kvt_feed_finish()'s result. */
static int feed(const uint8_t *data, size_t n, uint64_t size, size_t piece,
                const struct kvt_expect *x, struct kvt_entry **out, struct kvt_header **h)
{
    struct kvt_feed *f;
    assert_int_equal(kvt_feed_new(size, x, "fed", &f), 0);
    uint64_t rng = 7;
    int rc = 0;
    for (size_t at = 0; at < n && rc == 0;) {
        uint8_t *dst;
        size_t len;
        rc = kvt_feed_next(f, &dst, &len);
        if (rc)
            break;
        assert_true(len > 0);
        size_t m = piece ? piece : 1 + xs64(&rng) % 50000;
        m = m < len ? m : len;
        m = m < n - at ? m : n - at;
        memcpy(dst, data + at, m);
        rc = kvt_feed_wrote(f, m);
        at += m;
    }
    if (rc == 0)
        rc = kvt_feed_finish(f, out, h);
    else
        assert_int_equal(kvt_feed_finish(f, out, h), rc); /* the stop is sticky */
    if (rc) {
        assert_null(*out);
        assert_true(!h || !*h);
    }
    kvt_feed_free(f);
    return rc;
}

static void test_pieces_give_the_file_loaders_entry(void **state)
{
    (void)state;
    static const size_t pieces[] = {1, 7, 26, 4096, 16384, 1 << 20, 0};
    for (size_t i = 0; i < sizeof(pieces) / sizeof(pieces[0]); i++) {
        struct kvt_entry *e = NULL;
        struct kvt_header *h = NULL;
        assert_int_equal(feed(img, img_len, img_len, pieces[i], NULL, &e, &h), 0);
        assert_true(synth_same_caches(ref, e));
        assert_int_equal(e->n_tokens, ref->n_tokens);
        assert_memory_equal(e->tokens, ref->tokens, e->n_tokens * sizeof(int32_t));
        assert_string_equal(e->meta.model_id, SYNTH_MODEL);
        assert_int_equal(e->created_at, ref->created_at);
        assert_int_equal(h->file_size, img_len);
        kvt_header_free(h);
        kvt_entry_free(e);
    }
}

/* The file loader's result on @p data (written to the suite's file). */
static int file_result(const uint8_t *data, size_t n, const struct kvt_expect *x)
{
    assert_int_equal(write_file(path, data, n), 0);
    struct kvt_entry *e = NULL;
    int rc = kvt_file_load(path, x, &e, NULL);
    kvt_entry_free(e);
    return rc;
}

static void test_flips_as_the_file_loader(void **state)
{
    (void)state;
    uint8_t *bad = malloc(img_len);
    assert_non_null(bad);
    size_t failed = 0, tried = 0, checked = 0;
    for (size_t off = 0; off < img_len; off++) {
        bool is = loader_checks_byte(hdr, off);
        checked += is;
        if (is ? checked % PROTECTED_STRIDE != 1 : off % UNREAD_STRIDE != 0)
            continue;
        tried++;
        memcpy(bad, img, img_len);
        bad[off] ^= (uint8_t)(1u << (off % 8));
        int want = file_result(bad, img_len, NULL);
        struct kvt_entry *e = NULL;
        int got = feed(bad, img_len, img_len, 0, NULL, &e, NULL);
        if (got != want)
            fail_msg("flip at %zu: fed %d, file %d", off, got, want);
        if (got == 0)
            assert_true(synth_same_caches(ref, e)); /* an unread byte changes nothing */
        if (is && got == 0)
            fail_msg("flip at %zu of a checked byte was accepted", off);
        failed += got != 0;
        kvt_entry_free(e);
    }
    assert_true(failed > 0 && failed < tried);
    print_message("%zu of %zu flips refused, each as the file loader refuses it\n", failed, tried);
    free(bad);
    assert_int_equal(write_file(path, img, img_len), 0);
}

static void test_truncations_as_the_file_loader(void **state)
{
    (void)state;
    for (size_t n = 0; n < img_len; n += n < 64 ? 1 : 997) {
        int want = file_result(img, n, NULL);
        struct kvt_entry *e = NULL;
        assert_int_not_equal(want, 0);
        assert_int_equal(feed(img, n, n, 0, NULL, &e, NULL), want);
    }
    assert_int_equal(write_file(path, img, img_len), 0);
}

static void test_identity_mismatch(void **state)
{
    (void)state;
    struct kvt_expect x = {.model_id = "another/model"};
    struct kvt_entry *e = NULL;
    assert_int_equal(feed(img, img_len, img_len, 4096, &x, &e, NULL), KVT_E_MISMATCH);
    assert_non_null(strstr(kvt_last_error(), "L1"));
    x = (struct kvt_expect){.ns = "other"};
    assert_int_equal(feed(img, img_len, img_len, 4096, &x, &e, NULL), KVT_E_MISMATCH);
}

static void test_short_long_and_reset(void **state)
{
    (void)state;
    struct kvt_entry *e = NULL;
    /* fewer bytes than the size announced */
    struct kvt_feed *f;
    assert_int_equal(kvt_feed_new(img_len + 1, NULL, "fed", &f), 0);
    uint8_t *dst;
    size_t len, at = 0;
    while (at < img_len) {
        assert_int_equal(kvt_feed_next(f, &dst, &len), 0);
        len = len < img_len - at ? len : img_len - at;
        memcpy(dst, img + at, len);
        int rc = kvt_feed_wrote(f, len);
        if (rc) { /* the file is a byte longer than its header says: still valid */
            fail_msg("feed refused a valid prefix: %s", kvt_last_error());
        }
        at += len;
    }
    assert_int_equal(kvt_feed_finish(f, &e, NULL), -EINVAL);
    assert_null(e);
    /* more than asked for */
    assert_int_equal(kvt_feed_next(f, &dst, &len), 0);
    assert_int_equal(kvt_feed_wrote(f, len + 1), -EINVAL);
    kvt_feed_free(f);

    /* half of a corrupt copy, then a reset and the intact file */
    assert_int_equal(kvt_feed_new(img_len, NULL, "fed", &f), 0);
    for (at = 0; at < img_len / 2;) {
        assert_int_equal(kvt_feed_next(f, &dst, &len), 0);
        len = len < img_len / 2 - at ? len : img_len / 2 - at;
        memset(dst, 0x5a, len);
        if (kvt_feed_wrote(f, len))
            break;
        at += len;
    }
    kvt_feed_reset(f);
    for (at = 0; at < img_len; at += len) {
        assert_int_equal(kvt_feed_next(f, &dst, &len), 0);
        memcpy(dst, img + at, len);
        assert_int_equal(kvt_feed_wrote(f, len), 0);
    }
    assert_int_equal(kvt_feed_finish(f, &e, NULL), 0);
    assert_true(synth_same_caches(ref, e));
    kvt_entry_free(e);
    kvt_feed_free(f);
}

static void test_large_into_fresh_memory(void **state)
{
    (void)state;
    int32_t *tok = malloc(3000 * sizeof(*tok));
    assert_non_null(tok);
    for (int i = 0; i < 3000; i++)
        tok[i] = (i * 13) % 5000;
    struct kvt_entry *e = synth_random_entry(tok, 3000, 17, "m", "f", "t");
    char *big = strf("%s/big.mlxkv", dir);
    struct kvt_save_opts o = {.no_sync = true};
    assert_int_equal(kvt_file_save(big, e, &o, NULL), 0);
    size_t n;
    uint8_t *bytes = read_file(big, &n);
    assert_non_null(bytes);
    size_t limit = kvt_buf_cache_limit(0); /* every destination is a fresh mapping */
    struct kvt_entry *got = NULL;
    assert_int_equal(feed(bytes, n, n, 0, NULL, &got, NULL), 0);
    kvt_buf_cache_limit(limit);
    assert_true(synth_same_entry_bytes(e, got));
    kvt_entry_free(got);
    kvt_entry_free(e);
    free(bytes);
    free(big);
    free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_give_the_file_loaders_entry),
        cmocka_unit_test(test_flips_as_the_file_loader),
        cmocka_unit_test(test_truncations_as_the_file_loader),
        cmocka_unit_test(test_identity_mismatch),
        cmocka_unit_test(test_short_long_and_reset),
        cmocka_unit_test(test_large_into_fresh_memory),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
