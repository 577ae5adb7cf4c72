/*
 * Restores into device memory. On the host stand-in (everywhere): every slot lands byte for
 * byte in its device allocation for staging rings of 2-4 slots and chunks of 8 KiB to 8 MiB,
 * with copies that take longer than the reads (a slot reused before its copy finished would
 * corrupt the result); unplaced slots are still checked; a corrupt slot fails the load and a
 * corrupt store file is a miss; uploads and downloads of odd sizes round-trip. CUDA: opening a
 * device where there is no driver reports "unavailable" and the CUDA case is skipped; where
 * there is one, the same restore runs on the GPU.
 */
#include "support/support.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const MODEL = "test/model";
static const char *const FP = "fp-device";
static const char *const TOK = "tk-test";

/* Placement: one device allocation per slot; slot @p skip (or -1) gets none. */
struct dplace {
    kvt_device *d;
    uint64_t addr[16];
    uint64_t bytes[16];
    int n, skip, refuse;
};

static int place(void *ud, const struct kvt_header *h, uint64_t *dst)
{
    struct dplace *p = ud;
    if (p->refuse)
        return p->refuse;
    int k = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++, k++) {
            p->bytes[k] = h->caches[i].slots[j].bytes;
            p->addr[k] = 0;
            if (k != p->skip)
                assert_int_equal(kvt_device_alloc(p->d, p->bytes[k], &p->addr[k]), 0);
            dst[k] = p->addr[k];
        }
    p->n = k;
    return 0;
}

static void dplace_free(struct dplace *p)
{
    for (int k = 0; k < p->n; k++)
        kvt_device_free(p->d, p->addr[k]);
    p->n = 0;
}

/* The device holds exactly the entry's slot bytes. */
static void assert_device_is(struct dplace *p, const uint8_t *want, size_t total)
{
    size_t at = 0;
    for (int k = 0; k < p->n; k++) {
        if (p->addr[k]) {
            uint8_t *got = malloc(p->bytes[k] + 1);
            assert_int_equal(kvt_device_download(p->d, got, p->addr[k], p->bytes[k]), 0);
            assert_memory_equal(got, want + at, p->bytes[k]);
            free(got);
        }
        at += p->bytes[k];
    }
    assert_int_equal(at, total);
}

static char *save_entry(const char *name, size_t n, uint64_t seed, uint8_t **want, size_t *total)
{
    int32_t *tok = malloc(n * sizeof(*tok));
    for (size_t i = 0; i < n; i++)
        tok[i] = (int32_t)(i * 3 + 1);
    struct kvt_entry *e = synth_random_entry(tok, n, seed, MODEL, FP, TOK);
    *want = synth_entry_bytes(e, total);
    char *path = strf("%s/%s", test_dir, name);
    struct kvt_save_opts so = {.no_sync = true};
    assert_int_equal(kvt_file_save(path, e, &so, NULL), 0);
    kvt_entry_free(e);
    free(tok);
    return path;
}

static void restore_on(kvt_device *d, const char *path, const uint8_t *want, size_t total, int skip)
{
    struct dplace p = {.d = d, .skip = skip};
    struct kvt_header *h;
    assert_int_equal(kvt_file_load_to_device(path, NULL, d, place, &p, &h), 0);
    assert_int_equal(p.n, 6);
    assert_device_is(&p, want, total);
    kvt_header_free(h);
    dplace_free(&p);
}

static void test_host_standin_restores(void **state)
{
    (void)state;
    uint8_t *want;
    size_t total;
    char *path = save_entry("a.mlxkv", 2000, 7, &want, &total);
    const struct kvt_device_opts cases[] = {
        {8192, 2, 300},     /* copies slower than reads: the ring must wait for them */
        {65536, 3, 50},     /* chunks across slot boundaries */
        {0, 0, 0},          /* the defaults: 8 MiB x 4 */
        {1 << 20, 4, 1000}, /* few, slow copies */
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        kvt_device *d;
        assert_int_equal(kvt_device_open_host(&cases[c], &d), 0);
        assert_string_equal(kvt_device_name(d), "host stand-in");
        restore_on(d, path, want, total, -1);
        restore_on(d, path, want, total, 2);
        kvt_device_close(d);
    }
    free(path);
    free(want);
}

static void test_host_standin_failures(void **state)
{
    (void)state;
    uint8_t *want;
    size_t total;
    char *path = save_entry("b.mlxkv", 700, 3, &want, &total);
    struct kvt_device_opts o = {.staging_chunk = 16384, .staging_depth = 2, .copy_delay_us = 100};
    kvt_device *d;
    assert_int_equal(kvt_device_open_host(&o, &d), 0);
    struct kvt_header *h = (void *)1;
    struct dplace p = {.d = d, .skip = -1, .refuse = KVT_E_MISMATCH};
    assert_int_equal(kvt_file_load_to_device(path, NULL, d, place, &p, &h), KVT_E_MISMATCH);
    assert_null(h);
    p.refuse = 0;
    struct kvt_expect other = {.model_id = "other"};
    assert_int_equal(kvt_file_load_to_device(path, &other, d, place, &p, &h), KVT_E_MISMATCH);
    assert_int_equal(kvt_file_load_to_device(path, NULL, NULL, place, &p, &h), -EINVAL);
    assert_int_equal(kvt_file_load_to_device(path, NULL, d, NULL, &p, &h), -EINVAL);

    flip_slot_byte(path, 1, 0, 77, 0x01);
    assert_int_equal(kvt_file_load_to_device(path, NULL, d, place, &p, &h), KVT_E_CORRUPT);
    assert_non_null(strstr(kvt_last_error(), "L3"));
    assert_null(h);
    dplace_free(&p);
    p.skip = 2; /* the corrupt slot is only checked: still a failure */
    assert_int_equal(kvt_file_load_to_device(path, NULL, d, place, &p, &h), KVT_E_CORRUPT);
    dplace_free(&p);

    /* odd sizes up and down, across several staging slots */
    for (size_t n = 1; n < 100000; n = n * 7 + 3) {
        uint8_t *src = malloc(n), *back = malloc(n);
        uint64_t seed = n, addr;
        fill_random(src, n, &seed);
        assert_int_equal(kvt_device_alloc(d, n, &addr), 0);
        assert_int_equal(kvt_device_upload(d, addr, src, n), 0);
        assert_int_equal(kvt_device_download(d, back, addr, n), 0);
        assert_memory_equal(src, back, n);
        kvt_device_free(d, addr);
        free(src);
        free(back);
    }
    kvt_device_close(d);
    free(path);
    free(want);
}

static void test_store_restore_to_device(void **state)
{
    (void)state;
    int32_t tok[301];
    for (int i = 0; i < 301; i++)
        tok[i] = i + 5;
    struct kvt_entry *e = synth_random_entry(tok, 300, 11, MODEL, FP, TOK);
    size_t total;
    uint8_t *want = synth_entry_bytes(e, &total);
    struct kvt_store_opts so;
    store_opts_for(&so, MODEL, FP, TOK);
    kvt_store *s;
    assert_int_equal(kvt_store_open(test_dir, &so, &s), 0);
    assert_int_equal(kvt_store_put(s, e, NULL, NULL), 0);
    kvt_device *d;
    assert_int_equal(kvt_device_open_host(NULL, &d), 0);
    struct kvt_hit hit;
    assert_int_equal(kvt_store_find(s, tok, 301, "", &hit), 0); /* the entry and one more */
    assert_int_equal(hit.prefix_len, 300);
    struct dplace p = {.d = d, .skip = -1};
    struct kvt_header *h;
    assert_int_equal(kvt_store_restore_to_device(s, &hit, d, place, &p, &h), 0);
    assert_non_null(h);
    assert_device_is(&p, want, total);
    kvt_header_free(h);
    dplace_free(&p);

    struct kvt_store_record *v;
    size_t n;
    assert_int_equal(kvt_store_list(s, &v, &n), 0);
    flip_slot_byte(v[0].path, 0, 1, 77, 0x01);
    kvt_store_list_free(v);
    assert_int_equal(kvt_store_restore_to_device(s, &hit, d, place, &p, &h), 0);
    assert_null(h); /* a miss, and the record is gone */
    dplace_free(&p);
    assert_int_equal(kvt_store_find(s, tok, 301, "", &hit), 0);
    assert_int_equal(hit.prefix_len, 0);
    kvt_device_close(d);
    kvt_store_close(s);
    kvt_entry_free(e);
    free(want);
}

static void test_cuda(void **state)
{
    (void)state;
    kvt_device *d;
    int rc = kvt_device_open_cuda(0, NULL, &d);
    if (rc == KVT_E_UNSUPPORTED) {
        assert_null(d);
        assert_non_null(strstr(kvt_last_error(), "unavailable"));
        print_message("skipped: %s\n", kvt_last_error());
        skip();
    }
    assert_int_equal(rc, 0);
    uint8_t *want;
    size_t total;
    char *path = save_entry("cuda.mlxkv", 5000, 21, &want, &total);
    restore_on(d, path, want, total, -1);
    kvt_device_close(d);
    free(path);
    free(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_host_standin_restores, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_host_standin_failures, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_store_restore_to_device, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_cuda, test_dir_setup, test_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
