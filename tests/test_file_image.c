/*
 * An entry's file bytes in memory (format/file_image.c): gathered in pieces of many sizes and
 * with few iovecs at a time, the image is byte for byte the file kvt_file_save() writes with
 * the same creation time, for an entry built from state (contiguous tensors) and for one
 * loaded from disk (strided views of capacity buffers); its header hash is the file's; fed to
 * the fed loader it restores the same caches; a tensor in device memory is refused.
 */
#include "support/support.h"

#include <stdlib.h>
#include <string.h>

#include "format/format.h"
#include "progs/crash_entry.h"

/* The image of @p e gathered through kvt_image_iov() in pieces of @p piece bytes, at most
 * @p max iovecs at a time; *@p n receives its size. */
static uint8_t *gather(const struct kvt_image *im, uint64_t piece, size_t max, size_t *n)
{
    *n = (size_t)kvt_image_bytes(im);
    uint8_t *out = malloc(*n ? *n : 1);
    assert_non_null(out);
    struct iovec iov[8];
    for (uint64_t at = 0; at < *n;) {
        uint64_t want = piece < *n - at ? piece : *n - at, covered;
        size_t k = kvt_image_iov(im, at, want, iov, max, &covered);
        assert_true(k > 0 && k <= max && covered > 0 && covered <= want);
        uint64_t sum = 0;
        for (size_t i = 0; i < k; i++) {
            memcpy(out + at + sum, iov[i].iov_base, iov[i].iov_len);
            sum += iov[i].iov_len;
        }
        assert_int_equal(sum, covered);
        at += covered;
    }
    return out;
}

/* The image of @p e equals the file saved from it, however it is gathered. */
static void assert_image_is_file(const struct kvt_entry *e, const char *path)
{
    struct kvt_save_opts o = {.no_sync = true, .created_at = 1700000000123};
    assert_int_equal(kvt_file_save(path, e, &o, NULL), 0);
    size_t flen;
    uint8_t *file = read_file(path, &flen);
    assert_non_null(file);
    struct kvt_image *im;
    assert_int_equal(kvt_image_new(e, &o, &im), 0);
    static const struct {
        uint64_t piece;
        size_t max;
    } ways[] = {{1 << 20, 8}, {4096, 1}, {777, 3}, {1, 1}, {UINT64_MAX, 2}};
    for (size_t w = 0; w < sizeof(ways) / sizeof(ways[0]); w++) {
        if (ways[w].piece == 1 && flen > (1u << 20))
            continue;
        size_t n;
        uint8_t *img = gather(im, ways[w].piece, ways[w].max, &n);
        assert_int_equal(n, flen);
        assert_memory_equal(img, file, flen);
        free(img);
    }
    struct kvt_header *h;
    assert_int_equal(kvt_file_read_header(path, NULL, &h), 0);
    assert_int_equal(kvt_image_header_hash(im), h->header_hash);
    kvt_header_free(h);
    kvt_image_free(im);
    free(file);
}

static void test_image_is_the_file(void **state)
{
    (void)state;
    const char *dir = test_dir;
    int32_t tok[12];
    for (int i = 0; i < 12; i++)
        tok[i] = 40 + 3 * i;
    struct kvt_entry *e;
    assert_int_equal(synth_entry(tok, 12, SYNTH_ALL_KINDS, 6, "image", &e), 0);
    char *path = strf("%s/built.mlxkv", dir);
    assert_image_is_file(e, path);

    /* loaded: token-axis kinds have capacity, so their state views are strided */
    struct kvt_entry *loaded;
    assert_int_equal(kvt_file_load(path, NULL, &loaded, NULL), 0);
    char *again = strf("%s/loaded.mlxkv", dir);
    assert_image_is_file(loaded, again);

    /* fed to the fed loader, the image restores the same caches */
    struct kvt_image *im;
    assert_int_equal(kvt_image_new(loaded, NULL, &im), 0);
    size_t n;
    uint8_t *img = gather(im, 65536, 8, &n);
    struct kvt_feed *f;
    assert_int_equal(kvt_feed_new(n, NULL, "image", &f), 0);
    for (size_t at = 0; at < n;) {
        uint8_t *dst;
        size_t len;
        assert_int_equal(kvt_feed_next(f, &dst, &len), 0);
        memcpy(dst, img + at, len);
        assert_int_equal(kvt_feed_wrote(f, len), 0);
        at += len;
    }
    struct kvt_entry *back;
    assert_int_equal(kvt_feed_finish(f, &back, NULL), 0);
    assert_true(synth_same_caches(e, back));
    kvt_entry_free(back);
    kvt_feed_free(f);
    free(img);
    kvt_image_free(im);

    kvt_entry_free(loaded);
    kvt_entry_free(e);
    free(again);
    free(path);
}

/* A large random entry (kv layers of 1500 tokens): pieces of a chunk size, few iovecs. */
static void test_large_entry(void **state)
{
    (void)state;
    const char *dir = test_dir;
    int32_t *tok = malloc(1500 * sizeof(*tok));
    assert_non_null(tok);
    for (int i = 0; i < 1500; i++)
        tok[i] = i * 7 % 1000;
    struct kvt_entry *e = synth_random_entry(tok, 1500, 5, "m", "f", "t");
    assert_non_null(e);
    char *path = strf("%s/large.mlxkv", dir);
    assert_image_is_file(e, path);
    kvt_entry_free(e);
    free(path);
    free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_image_is_the_file, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_large_entry, test_dir_setup, test_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
