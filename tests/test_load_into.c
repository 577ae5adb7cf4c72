/*
 * Restores into caller memory (kvt_file_load_into, kvt_store_restore_into): every slot lands
 * byte for byte where the placement says, at any alignment (off the 4096 grid, on it, and
 * on the file's own grid, which direct reads fill in place); skipped slots are still checked;
 * a corrupt slot fails the load; a refusal is the caller's code and leaves the store's record
 * alone, while a corrupt file is a miss that drops it. A cold load whose destinations are off
 * the block grid copies and hashes every byte out of staging in one pass: the same bytes, and
 * the same failures with the same messages, as a load in order, and as a load of the cached
 * file copied on several cores.
 */
#include "support/support.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/format.h"
#include "io/io_fault.h"
#include "io/stream.h"
#include "threads/par_for.h"

static const char *const MODEL = "test/model";
static const char *const FP = "fp-load-into";
static const char *const TOK = "tk-test";

static int32_t *tokens(size_t n, int32_t base)
{
    int32_t *t = malloc(n * sizeof(*t));
    for (size_t i = 0; i < n; i++)
        t[i] = base + (int32_t)i;
    return t;
}

/* Placement: every slot into one pool, in order, each at @p align plus @p skew bytes (a
 * @p skew of -1 puts each slot on the file's own 4096 grid); slot @p skip (or -1) is NULL. */
struct pool {
    uint8_t *mem;
    size_t size;
    size_t align;
    long skew;
    int skip;
    int refuse;
    int calls;
    uint8_t *at[16];
    uint64_t bytes[16];
    int n;
};

static int place(void *ud, const struct kvt_header *h, void **dst)
{
    struct pool *p = ud;
    p->calls++;
    if (p->refuse)
        return p->refuse;
    size_t at = 0;
    int k = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++, k++) {
            const struct kvt_slot *s = &h->caches[i].slots[j];
            at = (at + p->align - 1) / p->align * p->align;
            at += p->skew >= 0 ? (size_t)p->skew : (size_t)((h->data_start + s->off) % 4096);
            assert_true(at + s->bytes <= p->size);
            p->at[k] = p->mem + at;
            p->bytes[k] = s->bytes;
            dst[k] = k == p->skip ? NULL : p->mem + at;
            at += s->bytes;
        }
    p->n = k;
    return 0;
}

static struct pool pool_new(size_t size, size_t align, long skew)
{
    struct pool p = {.size = size, .align = align, .skew = skew, .skip = -1};
    assert_int_equal(posix_memalign((void **)&p.mem, 4096, size), 0);
    memset(p.mem, 0xee, size);
    return p;
}

/* The pool holds exactly the entry's slot bytes, in order (skipped slots untouched). */
static void assert_pool_is(const struct pool *p, const uint8_t *want, size_t total)
{
    size_t at = 0;
    for (int k = 0; k < p->n; k++) {
        if (k == p->skip) {
            for (uint64_t b = 0; b < p->bytes[k]; b++)
                assert_int_equal(p->at[k][b], 0xee);
        } else {
            assert_memory_equal(p->at[k], want + at, p->bytes[k]);
        }
        at += p->bytes[k];
    }
    assert_int_equal(at, total);
}

static char *save(const char *name, const struct kvt_entry *e)
{
    char *path = strf("%s/%s", test_dir, name);
    struct kvt_save_opts so = {.no_sync = true};
    assert_int_equal(kvt_file_save(path, e, &so, NULL), 0);
    return path;
}

static void test_load_into_any_alignment(void **state)
{
    (void)state;
    int32_t *tok = tokens(3000, 7);
    struct kvt_entry *e = synth_random_entry(tok, 3000, 11, MODEL, FP, TOK);
    size_t total;
    uint8_t *want = synth_entry_bytes(e, &total);
    char *path = save("a.mlxkv", e);
    struct {
        size_t align;
        long skew;
        int skip;
    } cases[] = {{1, 3, -1}, {64, 0, -1}, {4096, 0, -1}, {4096, -1, -1}, {16, 5, 1}, {1, 1, 4}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        for (int cold = 0; cold < 2; cold++) {
            struct pool p = pool_new(total + 16 * 8192, cases[c].align, cases[c].skew);
            p.skip = cases[c].skip;
            struct kvt_expect x = {.model_id = MODEL, .keep_cache = !cold};
            struct kvt_header *h;
            assert_int_equal(kvt_file_load_into(path, &x, place, &p, &h), 0);
            assert_int_equal(p.calls, 1);
            assert_int_equal(p.n, 6);
            assert_int_equal(h->n_tokens, 3000);
            assert_memory_equal(h->tokens, tok, 3000 * sizeof(*tok));
            assert_pool_is(&p, want, total);
            kvt_header_free(h);
            free(p.mem);
        }
    }
    free(path);
    free(want);
    kvt_entry_free(e);
    free(tok);
}

static void test_load_into_failures(void **state)
{
    (void)state;
    int32_t *tok = tokens(500, 1);
    struct kvt_entry *e = synth_random_entry(tok, 500, 5, MODEL, FP, TOK);
    size_t total;
    uint8_t *want = synth_entry_bytes(e, &total);
    char *path = save("b.mlxkv", e);
    struct pool p = pool_new(total + 16 * 8192, 64, 0);
    struct kvt_header *h = (void *)1;

    /* another model: a mismatch before the placement is asked */
    struct kvt_expect other = {.model_id = "other/model"};
    assert_int_equal(kvt_file_load_into(path, &other, place, &p, &h), KVT_E_MISMATCH);
    assert_null(h);
    assert_int_equal(p.calls, 0);

    /* a refusal comes back as the caller's code */
    p.refuse = -ENOSPC;
    assert_int_equal(kvt_file_load_into(path, NULL, place, &p, &h), -ENOSPC);
    assert_null(h);
    assert_non_null(strstr(kvt_last_error(), "refused"));
    p.refuse = 0;

    /* bad arguments */
    assert_int_equal(kvt_file_load_into(path, NULL, NULL, &p, &h), -EINVAL);
    assert_int_equal(kvt_file_load_into(path, NULL, place, &p, NULL), -EINVAL);
    char *gone = strf("%s/none.mlxkv", test_dir);
    assert_int_equal(kvt_file_load_into(gone, NULL, place, &p, &h), -ENOENT);
    free(gone);

    /* a corrupt slot fails the load, also when that slot is not delivered */
    flip_slot_byte(path, 0, 0, 1000, 0x40);
    assert_int_equal(kvt_file_load_into(path, NULL, place, &p, &h), KVT_E_CORRUPT);
    assert_null(h);
    p.skip = 0;
    assert_int_equal(kvt_file_load_into(path, NULL, place, &p, &h), KVT_E_CORRUPT);
    assert_non_null(strstr(kvt_last_error(), "L3"));

    free(p.mem);
    free(path);
    free(want);
    kvt_entry_free(e);
    free(tok);
}

/* Drop a file's pages so that the next load reads the device; false when they stay cached
 * (a file system without a page cache to drop). */
static bool make_cold(const char *path)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(fsync(fd), 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    off_t size = lseek(fd, 0, SEEK_END);
    bool cached = kvt_stream_cached(fd, 0, (uint64_t)size);
    close(fd);
    return !cached;
}

/* A cold load into @p p; whether helper threads ran it goes to *@p parallel. On failure the
 * message is copied to @p msg. */
static int cold_load(const char *path, struct pool *p, bool *parallel, char *msg, size_t n)
{
    bool cold = make_cold(path);
    unsigned long helpers = kvt_par_helpers_started();
    struct kvt_header *h = (void *)1;
    int rc = kvt_file_load_into(path, NULL, place, p, &h);
    *parallel = kvt_par_helpers_started() > helpers;
    /* only a cached file is copied on several cores; a cold one goes through one stream */
    bool cores = kvt_par_cpus() > 1 && kvt_stream_fast_ok();
    assert_int_equal(*parallel, cores && !cold);
    if (rc == 0) {
        assert_non_null(h);
        kvt_header_free(h);
    } else {
        assert_null(h);
        snprintf(msg, n, "%s", kvt_last_error());
    }
    return rc;
}

/* An entry of 9 MB in six slots: big enough for the stream's fast path (and, cached, for a
 * copy on several cores). */
static struct kvt_entry *big_entry(int32_t **tok)
{
    *tok = tokens(3000, 7);
    return synth_random_entry(*tok, 3000, 23, MODEL, FP, TOK);
}

/*
 * Cold loads into destinations off the block grid (copied and hashed out of staging in one
 * pass) land the same bytes as a load with no_parallel and as one onto the file's grid; a
 * slot left NULL is checked, not written.
 */
static void test_cold_off_grid_lands_every_byte(void **state)
{
    (void)state;
    int32_t *tok;
    struct kvt_entry *e = big_entry(&tok);
    size_t total;
    uint8_t *want = synth_entry_bytes(e, &total);
    char *path = save("off-grid.mlxkv", e);
    struct {
        size_t align;
        long skew;
        int skip;
    } cases[] = {{1, 12, -1}, {16, 5, 1}, {1, 3, 5}, {4096, -1, -1}, {64, 0, 0}, {4096, -1, 2}};
    for (int serial = 0; serial < 2; serial++) {
        set_mem(false, serial == 1);
        for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
            struct pool p = pool_new(total + 16 * 8192, cases[c].align, cases[c].skew);
            p.skip = cases[c].skip;
            bool parallel;
            char msg[512];
            if (serial) { /* no_parallel: one stream, in order */
                make_cold(path);
                struct kvt_header *h;
                unsigned long helpers = kvt_par_helpers_started();
                assert_int_equal(kvt_file_load_into(path, NULL, place, &p, &h), 0);
                assert_int_equal(kvt_par_helpers_started(), helpers);
                kvt_header_free(h);
            } else {
                assert_int_equal(cold_load(path, &p, &parallel, msg, sizeof(msg)), 0);
            }
            assert_int_equal(p.n, 6);
            assert_pool_is(&p, want, total);
            free(p.mem);
        }
    }
    set_mem(false, false);
    free(path);
    free(want);
    kvt_entry_free(e);
    free(tok);
}

/* The message of a cold load of @p path into an off-grid pool, with the default settings
 * (@p serial false) or no_parallel; the load must fail with @p want. */
static void failed_load(const char *path, size_t total, bool serial, int skip, int want, char *msg,
                        size_t n)
{
    struct pool p = pool_new(total + 16 * 8192, 1, 12);
    p.skip = skip;
    bool parallel;
    set_mem(false, serial);
    if (serial) {
        make_cold(path);
        struct kvt_header *h = (void *)1;
        assert_int_equal(kvt_file_load_into(path, NULL, place, &p, &h), want);
        assert_null(h);
        snprintf(msg, n, "%s", kvt_last_error());
    } else {
        assert_int_equal(cold_load(path, &p, &parallel, msg, n), want);
    }
    set_mem(false, false);
    free(p.mem);
}

/* A cold load of the intact file at @p path into the offset pool lands every byte. */
static void assert_cold_load_intact(const char *path, const uint8_t *want, size_t total)
{
    struct pool p = pool_new(total + 16 * 8192, 1, 12);
    bool parallel;
    char msg[512];
    assert_int_equal(cold_load(path, &p, &parallel, msg, sizeof(msg)), 0);
    assert_pool_is(&p, want, total);
    free(p.mem);
}

/*
 * A corrupt slot fails a cold off-grid load with the message a load with no_parallel gives: a
 * late slot alone, an early and a late one (the first in header order is reported), and a
 * corrupt slot left NULL (checked only).
 */
static void test_cold_off_grid_corrupt(void **state)
{
    (void)state;
    int32_t *tok;
    struct kvt_entry *e = big_entry(&tok);
    size_t total;
    uint8_t *want = synth_entry_bytes(e, &total);
    char *path = save("off-grid-bad.mlxkv", e);
    char msg[2][512];
    struct kvt_header *h;
    assert_int_equal(kvt_file_read_header(path, NULL, &h), 0);
    int last = h->caches[1].n_slots - 1;
    kvt_header_free(h);

    /* the last slot of the second kv layer */
    flip_slot_byte(path, 1, last, 4097, 0x10);
    for (int serial = 0; serial < 2; serial++)
        failed_load(path, total, serial, -1, KVT_E_CORRUPT, msg[serial], sizeof(msg[serial]));
    assert_non_null(strstr(msg[0], "L3: tensor hash mismatch"));
    char name[64];
    snprintf(name, sizeof(name), "caches[1].tensors[%d]", last);
    assert_non_null(strstr(msg[0], name));
    assert_string_equal(msg[0], msg[1]);

    /* and the first slot, reported first */
    flip_slot_byte(path, 0, 0, 77, 0x01);
    for (int serial = 0; serial < 2; serial++)
        failed_load(path, total, serial, -1, KVT_E_CORRUPT, msg[serial], sizeof(msg[serial]));
    assert_non_null(strstr(msg[0], "caches[0].tensors[0]"));
    assert_string_equal(msg[0], msg[1]);

    /* the first slot left NULL: still checked, and still reported first */
    for (int serial = 0; serial < 2; serial++)
        failed_load(path, total, serial, 0, KVT_E_CORRUPT, msg[serial], sizeof(msg[serial]));
    assert_non_null(strstr(msg[0], "caches[0].tensors[0]"));
    assert_string_equal(msg[0], msg[1]);

    /* intact again: the load succeeds */
    flip_slot_byte(path, 0, 0, 77, 0x01);
    flip_slot_byte(path, 1, last, 4097, 0x10);
    assert_cold_load_intact(path, want, total);

    free(path);
    free(want);
    kvt_entry_free(e);
    free(tok);
}

/*
 * A read that fails under a cold off-grid load fails it: with every read failing, with the
 * message of a load with no_parallel; with one read failing (whichever it is), a read error,
 * never success with stale bytes; a later load of the intact device succeeds.
 */
static void test_cold_off_grid_read_error(void **state)
{
    (void)state;
    int32_t *tok;
    struct kvt_entry *e = big_entry(&tok);
    size_t total;
    uint8_t *want = synth_entry_bytes(e, &total);
    char *path = save("off-grid-eio.mlxkv", e);
    char msg[2][512];
    /* the reads of the header come first: the faults below fall on the slots' reads */
    kvt_fault_reset();
    kvt_io_set(kvt_io_fault_fast());
    struct kvt_header *h;
    assert_int_equal(kvt_file_read_header(path, NULL, &h), 0);
    kvt_header_free(h);
    uint64_t head = kvt_fault_calls(KVT_FAULT_PREAD);
    kvt_io_set(NULL);

    for (int serial = 0; serial < 2; serial++) {
        kvt_fault_reset();
        struct kvt_fault_rule r = {
            .op = KVT_FAULT_PREAD, .nth = head + 1, .err = EIO, .sticky = true};
        assert_int_equal(kvt_fault_arm(&r), 0);
        kvt_io_set(kvt_io_fault_fast());
        failed_load(path, total, serial, -1, -EIO, msg[serial], sizeof(msg[serial]));
        kvt_io_set(NULL);
        kvt_fault_reset();
    }
    assert_non_null(strstr(msg[0], "read at offset"));
    assert_string_equal(msg[0], msg[1]);

    /* one read fails, somewhere among the slots' reads */
    for (uint64_t nth = 1; nth <= 12; nth += 3) {
        kvt_fault_reset();
        struct kvt_fault_rule r = {.op = KVT_FAULT_PREAD, .nth = head + nth, .err = EIO};
        assert_int_equal(kvt_fault_arm(&r), 0);
        kvt_io_set(kvt_io_fault_fast());
        struct pool p = pool_new(total + 16 * 8192, 1, 12);
        bool parallel;
        int rc = cold_load(path, &p, &parallel, msg[0], sizeof(msg[0]));
        bool hit = kvt_fault_injected() > 0;
        kvt_io_set(NULL);
        kvt_fault_reset();
        if (hit) {
            assert_int_equal(rc, -EIO);
            assert_non_null(strstr(msg[0], "read at offset"));
        } else {
            assert_int_equal(rc, 0);
            assert_pool_is(&p, want, total);
        }
        free(p.mem);
    }

    assert_cold_load_intact(path, want, total);
    free(path);
    free(want);
    kvt_entry_free(e);
    free(tok);
}

static kvt_store *open_store(void)
{
    struct kvt_store_opts o;
    store_opts_for(&o, MODEL, FP, TOK);
    kvt_store *s;
    assert_int_equal(kvt_store_open(test_dir, &o, &s), 0);
    return s;
}

static void test_store_restore_into(void **state)
{
    (void)state;
    int32_t *tok = tokens(800, 100);
    struct kvt_entry *e = synth_random_entry(tok, 800, 9, MODEL, FP, TOK);
    size_t total;
    uint8_t *want = synth_entry_bytes(e, &total);
    kvt_store *s = open_store();
    assert_int_equal(kvt_store_put(s, e, NULL, NULL), 0);

    /* a hit lands in the caller's memory */
    int32_t *prompt = tokens(801, 100);
    struct kvt_hit hit;
    assert_int_equal(kvt_store_find(s, prompt, 801, "", &hit), 0);
    assert_int_equal(hit.prefix_len, 800);
    struct pool p = pool_new(total + 16 * 8192, 4096, 0);
    struct kvt_header *h;
    assert_int_equal(kvt_store_restore_into(s, &hit, place, &p, &h), 0);
    assert_non_null(h);
    assert_pool_is(&p, want, total);
    kvt_header_free(h);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.restores, 1);

    /* a refusal is the caller's: the record stays */
    p.refuse = KVT_E_MISMATCH;
    assert_int_equal(kvt_store_restore_into(s, &hit, place, &p, &h), KVT_E_MISMATCH);
    assert_null(h);
    assert_int_equal(kvt_store_find(s, prompt, 801, "", &hit), 0);
    assert_int_equal(hit.prefix_len, 800);
    p.refuse = 0;

    /* a corrupt file is a miss that drops the record */
    struct kvt_store_record *v;
    size_t n;
    assert_int_equal(kvt_store_list(s, &v, &n), 0);
    assert_int_equal(n, 1);
    flip_slot_byte(v[0].path, 0, 0, 1000, 0x40);
    kvt_store_list_free(v);
    assert_int_equal(kvt_store_restore_into(s, &hit, place, &p, &h), 0);
    assert_null(h);
    assert_int_equal(kvt_store_find(s, prompt, 801, "", &hit), 0);
    assert_int_equal(hit.prefix_len, 0);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.restore_misses, 1);
    assert_int_equal(st.corrupt_files, 1);

    /* a miss hit and bad arguments */
    assert_int_equal(kvt_store_restore_into(s, &hit, place, &p, &h), 0);
    assert_null(h);
    assert_int_equal(kvt_store_restore_into(s, &hit, NULL, &p, &h), -EINVAL);
    assert_int_equal(kvt_store_restore_into(NULL, &hit, place, &p, &h), -EINVAL);

    kvt_store_close(s);
    free(p.mem);
    free(prompt);
    free(want);
    kvt_entry_free(e);
    free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_load_into_any_alignment, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_load_into_failures, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_store_restore_into, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_cold_off_grid_lands_every_byte, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_cold_off_grid_corrupt, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_cold_off_grid_read_error, test_dir_setup,
                                        test_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
