/*
 * Damage and failure: every byte of a small saved file flipped (header bytes are rejected,
 * tensor bytes fail the hash check, padding and gaps do not matter), every truncation
 * rejected with the check its length implies, and crash safety of the writer under injected
 * I/O failures (each call of each operation failed in turn: no .tmp left, nothing new under
 * the final name, an old file there unchanged), plus read failures during a load.
 */
#include "support/support.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/format.h"
#include "io/io.h"
#include "io/io_fault.h"
#include "tensor/alloc.h"

/* After each test, even a failed one: back to the plain backend with nothing armed. */
static int reset_io(void **state)
{
    (void)state;
    kvt_io_set(NULL);
    kvt_fault_reset();
    return 0;
}

/* @p n_layers kv layers of [1, heads, tokens, 8] bf16 random rows; the last may be empty. */
static struct kvt_entry *make_entry(int n_layers, int64_t heads, int64_t tokens, bool empty_last,
                                    uint64_t seed)
{
    uint64_t rng = seed;
    kvt_cache **caches = calloc((size_t)n_layers, sizeof(*caches));
    int32_t *tok = calloc((size_t)tokens, sizeof(*tok));
    for (int64_t i = 0; i < tokens; i++)
        tok[i] = (int32_t)(xs64(&rng) % 50000);
    for (int l = 0; l < n_layers; l++)
        caches[l] = synth_random_kv(KVT_BFLOAT16, heads, tokens, 8, &rng);
    if (empty_last)
        assert_int_equal(kvt_cache_trim(caches[n_layers - 1], tokens), 0);
    struct kvt_entry *e;
    assert_int_equal(kvt_entry_new(tok, (size_t)tokens, caches, (size_t)n_layers, "ns", &e), 0);
    free(caches);
    free(tok);
    return e;
}

static char *path_of(const char *name)
{
    return strf("%s/%s", test_dir, name);
}

static bool exists(const char *p)
{
    return access(p, F_OK) == 0;
}

/* Wyhash of each restored tensor's row-major bytes, in slot order. */
static size_t entry_hashes(const struct kvt_entry *e, uint64_t *out)
{
    size_t n = 0;
    for (size_t i = 0; i < e->n_caches; i++) {
        struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
        int k = kvt_cache_state(e->caches[i], t);
        for (int j = 0; j < k; j++) {
            struct kvt_tensor c;
            assert_int_equal(kvt_tensor_contiguous(&c, &t[j]), 0);
            out[n++] = kvt_wyhash(0, kvt_buf_data(c.buf), kvt_tensor_nbytes(&c));
            kvt_tensor_release(&c);
            kvt_tensor_release(&t[j]);
        }
    }
    return n;
}

static void flip(int fd, uint64_t off)
{
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
    b ^= 0xff;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
}

/* Which slot, if any, holds absolute byte @p off. */
static const struct kvt_slot *slot_at(const struct kvt_header *h, uint64_t off)
{
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++) {
            const struct kvt_slot *s = &h->caches[i].slots[j];
            uint64_t a = kvt_slot_abs(h, s);
            if (off >= a && off < a + s->bytes)
                return s;
        }
    return NULL;
}

static void test_flip_every_byte(void **state)
{
    (void)state;
    struct kvt_entry *e = make_entry(1, 1, 2, false, 1);
    char *path = path_of("flip.mlxkv");
    struct kvt_save_opts so = {.created_at = 1751500000000LL, .no_sync = true};
    assert_int_equal(kvt_file_save(path, e, &so, NULL), 0);
    kvt_entry_free(e);

    struct kvt_header *h;
    assert_int_equal(kvt_file_read_header(path, NULL, &h), 0);
    struct kvt_entry *orig;
    struct kvt_expect keep = {.keep_cache = true};
    struct kvt_expect keep_nv = {.keep_cache = true, .no_verify = true};
    assert_int_equal(kvt_file_load(path, &keep, &orig, NULL), 0);
    uint64_t want[16], got[16];
    size_t n_hashes = entry_hashes(orig, want);
    kvt_entry_free(orig);

    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    size_t header_end = KVT_PREFIX_LEN + h->header_len;
    size_t rejected = 0, tensor_flips = 0, harmless = 0;
    for (uint64_t off = 0; off < h->file_size; off++) {
        flip(fd, off);
        struct kvt_entry *le = NULL;
        int rc = kvt_file_load(path, &keep, &le, NULL);
        const struct kvt_slot *s = slot_at(h, off);
        if (off < header_end) {
            if (rc == 0)
                fail_msg("flipped header byte %llu was accepted", (unsigned long long)off);
            assert_true(rc == KVT_E_CORRUPT || rc == KVT_E_FORMAT || rc == KVT_E_UNSUPPORTED);
            assert_null(le);
            rejected++;
        } else if (s) {
            if (rc != KVT_E_CORRUPT || !strstr(kvt_last_error(), ": L3: tensor hash mismatch"))
                fail_msg("flipped tensor byte %llu: %d %s", (unsigned long long)off, rc,
                         kvt_last_error());
            assert_int_equal(kvt_file_verify(path, NULL), KVT_E_CORRUPT);
            /* without hash checks the damaged bytes load as they are */
            assert_int_equal(kvt_file_load(path, &keep_nv, &le, NULL), 0);
            assert_int_equal(entry_hashes(le, got), n_hashes);
            assert_memory_not_equal(got, want, n_hashes * sizeof(uint64_t));
            kvt_entry_free(le);
            tensor_flips++;
        } else {
            /* padding after the header, zero gaps between tensors: not covered, not read */
            if (rc != 0)
                fail_msg("flipped padding byte %llu: %s", (unsigned long long)off,
                         kvt_last_error());
            assert_int_equal(entry_hashes(le, got), n_hashes);
            assert_memory_equal(got, want, n_hashes * sizeof(uint64_t));
            kvt_entry_free(le);
            harmless++;
        }
        flip(fd, off);
    }
    close(fd);
    assert_int_equal(rejected, header_end);
    assert_int_equal(tensor_flips, 2 * 32);
    assert_int_equal(rejected + tensor_flips + harmless, h->file_size);
    kvt_header_free(h);
    free(path);
}

static void test_truncate_every_length(void **state)
{
    (void)state;
    struct kvt_entry *e = make_entry(1, 1, 2, false, 2);
    char *path = path_of("trunc.mlxkv");
    struct kvt_save_opts so = {.no_sync = true};
    assert_int_equal(kvt_file_save(path, e, &so, NULL), 0);
    kvt_entry_free(e);
    struct kvt_header *h;
    assert_int_equal(kvt_file_read_header(path, NULL, &h), 0);
    size_t n;
    uint8_t *bytes = read_file(path, &n);
    assert_int_equal(n, h->file_size);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    struct kvt_expect keep = {.keep_cache = true};
    for (uint64_t len = h->file_size; len-- > 0;) {
        assert_int_equal(ftruncate(fd, (off_t)len), 0);
        const char *want = len < KVT_PREFIX_LEN                   ? ": V1: "
                           : len < KVT_PREFIX_LEN + h->header_len ? ": V3: "
                           : len < h->data_start                  ? ": V5: "
                                                                  : ": V17: ";
        struct kvt_entry *le = (struct kvt_entry *)1;
        int rc = kvt_file_load(path, &keep, &le, NULL);
        if (rc != KVT_E_CORRUPT || !strstr(kvt_last_error(), want))
            fail_msg("length %llu: want %s, got %d: %s", (unsigned long long)len, want, rc,
                     kvt_last_error());
        assert_null(le);
        /* the memory parser agrees on every prefix of the file */
        struct kvt_header *hm;
        assert_int_equal(kvt_header_parse(bytes, (size_t)len, len, NULL, "mem", &hm), rc);
    }
    close(fd);
    free(bytes);
    kvt_header_free(h);
    free(path);
}

static uint8_t *file_bytes(const char *p, size_t *n)
{
    uint8_t *b = read_file(p, n);
    assert_non_null(b);
    return b;
}

/* The file at @p p holds exactly @p want_n bytes equal to @p want. */
static void assert_file_is(const char *p, const uint8_t *want, size_t want_n)
{
    size_t n;
    uint8_t *b = file_bytes(p, &n);
    assert_int_equal(n, want_n);
    assert_memory_equal(b, want, n);
    free(b);
}

/* Sees every call that is let through; a rename among them means the file was published. */
static int saw_rename_hook(void *ud, enum kvt_fault_op op, uint64_t count, const char *path)
{
    (void)count;
    (void)path;
    if (op == KVT_FAULT_RENAME)
        *(bool *)ud = true;
    return 0;
}

/*
 * Fail call N of @p op for N = 1, 2, ... until the save succeeds. After each failure there is
 * no .tmp and the final name is as before (absent, or the old bytes); a failed directory fsync
 * comes after the rename, so the new file is then complete in place.
 */
static void fail_each_call(enum kvt_fault_op op, int err, bool with_old)
{
    struct kvt_entry *e = make_entry(2, 2, 3, true, 3);
    char *path = path_of("atomic.mlxkv"), *tmp = strf("%s.tmp", path);
    struct kvt_save_opts so = {.created_at = 1751500000000LL};
    unlink(path);
    /* the reference bytes, written without faults */
    assert_int_equal(kvt_file_save(path, e, &so, NULL), 0);
    size_t want_n, old_n = 0;
    uint8_t *want = file_bytes(path, &want_n), *old = NULL;
    unlink(path);
    if (with_old) {
        assert_int_equal(write_file(path, "old contents", 12), 0);
        old = file_bytes(path, &old_n);
    }

    kvt_io_set(kvt_io_fault());
    int failures = 0;
    for (uint64_t nth = 1;; nth++) {
        kvt_fault_reset();
        bool published = false;
        kvt_fault_set_hook(saw_rename_hook, &published);
        struct kvt_fault_rule r = {.op = op, .nth = nth, .err = err};
        assert_int_equal(kvt_fault_arm(&r), 0);
        int rc = kvt_file_save(path, e, &so, NULL);
        bool injected = kvt_fault_injected() > 0;
        if (rc == 0) {
            assert_false(injected);
            break;
        }
        assert_true(injected);
        assert_int_equal(rc, -err);
        failures++;
        assert_false(exists(tmp));
        if (published) {
            /* only the directory fsync (or opening the directory for it) follows the rename */
            assert_true(op == KVT_FAULT_DIR_FSYNC || op == KVT_FAULT_OPEN || op == KVT_FAULT_ANY);
            assert_file_is(path, want, want_n);
        } else if (with_old) {
            assert_file_is(path, old, old_n);
        } else {
            assert_false(exists(path));
        }
        if (published) {
            /* restore the starting state for the next round */
            unlink(path);
            if (with_old)
                assert_int_equal(write_file(path, old, old_n), 0);
        }
        assert_true(nth < 1000);
    }
    kvt_io_set(NULL);
    assert_true(failures >= 1);
    assert_file_is(path, want, want_n);
    free(want);
    free(old);
    unlink(path);
    free(path);
    free(tmp);
    kvt_entry_free(e);
}

static void test_atomic_save(void **state)
{
    (void)state;
    const struct {
        enum kvt_fault_op op;
        int err;
    } cases[] = {
        {KVT_FAULT_OPEN, EACCES},   {KVT_FAULT_FLOCK, ENOLCK},     {KVT_FAULT_PWRITE, ENOSPC},
        {KVT_FAULT_FTRUNCATE, EIO}, {KVT_FAULT_FSYNC, EIO},        {KVT_FAULT_RENAME, EXDEV},
        {KVT_FAULT_DIR_FSYNC, EIO}, {KVT_FAULT_FALLOCATE, ENOSPC}, {KVT_FAULT_ANY, EIO},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        fail_each_call(cases[i].op, cases[i].err, false);
        fail_each_call(cases[i].op, cases[i].err, true);
    }
}

static int run_step(void *engine, kvt_step_fn step, void *arg)
{
    (void)engine;
    return step(arg);
}

static void test_disk_full_and_short_writes(void **state)
{
    (void)state;
    struct kvt_entry *e = make_entry(3, 2, 40, false, 4);
    char *path = path_of("full.mlxkv"), *tmp = strf("%s.tmp", path);
    struct kvt_save_opts so = {.created_at = 1751500000000LL, .no_sync = true};
    assert_int_equal(kvt_file_save(path, e, &so, NULL), 0);
    size_t want_n;
    uint8_t *want = file_bytes(path, &want_n);
    unlink(path);

    kvt_io_set(kvt_io_fault());
    kvt_fault_reset();
    struct kvt_fault_rule full = {.op = KVT_FAULT_PWRITE, .nth = 2, .err = ENOSPC, .sticky = true};
    assert_int_equal(kvt_fault_arm(&full), 0);
    assert_int_equal(kvt_file_save(path, e, &so, NULL), -ENOSPC);
    assert_non_null(strstr(kvt_last_error(), "No space left"));
    assert_false(exists(path));
    assert_false(exists(tmp));

    /* a disk too full for the planned file fails before the tensor writes go out */
    kvt_fault_reset();
    struct kvt_fault_rule no_room = {.op = KVT_FAULT_FALLOCATE, .nth = 1, .err = ENOSPC};
    assert_int_equal(kvt_fault_arm(&no_room), 0);
    assert_int_equal(kvt_file_save(path, e, &so, NULL), -ENOSPC);
    assert_non_null(strstr(kvt_last_error(), "allocating"));
    assert_int_equal(kvt_fault_calls(KVT_FAULT_PWRITE), 0);
    assert_false(exists(path));
    assert_false(exists(tmp));
    /* a file system that cannot preallocate writes the file all the same */
    kvt_fault_reset();
    struct kvt_fault_rule no_support = {.op = KVT_FAULT_FALLOCATE, .nth = 1, .err = EOPNOTSUPP};
    assert_int_equal(kvt_fault_arm(&no_support), 0);
    assert_int_equal(kvt_file_save(path, e, &so, NULL), 0);
    assert_file_is(path, want, want_n);
    unlink(path);

    /* short writes are retried until complete */
    kvt_fault_reset();
    struct kvt_fault_rule shrt = {
        .op = KVT_FAULT_PWRITE, .nth = 1, .short_max = 333, .sticky = true};
    assert_int_equal(kvt_fault_arm(&shrt), 0);
    assert_int_equal(kvt_file_save(path, e, &so, NULL), 0);
    assert_true(kvt_fault_calls(KVT_FAULT_PWRITE) > want_n / 16384);
    kvt_io_set(NULL);
    assert_file_is(path, want, want_n);
    free(want);

    /* a fault inside a gated step comes back through run_exclusive and cleans up */
    unlink(path);
    kvt_io_set(kvt_io_fault());
    kvt_fault_reset();
    struct kvt_fault_rule once = {.op = KVT_FAULT_PWRITE, .nth = 3, .err = EIO};
    assert_int_equal(kvt_fault_arm(&once), 0);
    so.run_exclusive = run_step;
    assert_int_equal(kvt_file_save(path, e, &so, NULL), -EIO);
    kvt_io_set(NULL);
    assert_false(exists(path));
    assert_false(exists(tmp));
    free(path);
    free(tmp);
    kvt_entry_free(e);
}

static void test_load_faults(void **state)
{
    (void)state;
    struct kvt_entry *e = make_entry(2, 2, 5, false, 5);
    char *path = path_of("loadfault.mlxkv");
    struct kvt_save_opts so = {.no_sync = true};
    assert_int_equal(kvt_file_save(path, e, &so, NULL), 0);
    kvt_entry_free(e);

    kvt_io_set(kvt_io_fault());
    const enum kvt_fault_op ops[] = {KVT_FAULT_OPEN, KVT_FAULT_FSTAT, KVT_FAULT_PREAD};
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        for (uint64_t nth = 1;; nth++) {
            kvt_fault_reset();
            struct kvt_fault_rule r = {.op = ops[i], .nth = nth, .err = EIO};
            assert_int_equal(kvt_fault_arm(&r), 0);
            struct kvt_entry *le = (struct kvt_entry *)1;
            struct kvt_header *lh = (struct kvt_header *)1;
            int rc = kvt_file_load(path, NULL, &le, &lh);
            if (kvt_fault_injected() == 0) {
                assert_int_equal(rc, 0);
                kvt_entry_free(le);
                kvt_header_free(lh);
                break;
            }
            assert_int_equal(rc, -EIO);
            assert_null(le);
            assert_null(lh);
        }
    }
    kvt_io_set(NULL);
    struct kvt_entry *le;
    assert_int_equal(kvt_file_load(path, NULL, &le, NULL), 0);
    kvt_entry_free(le);
    assert_int_equal(kvt_file_load("/nonexistent/x.mlxkv", NULL, &le, NULL), -ENOENT);
    assert_null(le);
    assert_int_equal(kvt_file_verify(test_dir, NULL), -EISDIR);
    free(path);
}

/* Every allocation of a load failed in turn: -ENOMEM, nothing returned, nothing leaked. */
static void test_alloc_failures(void **state)
{
    (void)state;
    long n = 0;
    for (;; n++) {
        struct kvt_entry *e = (struct kvt_entry *)1;
        struct kvt_header *h = (struct kvt_header *)1;
        kvt_alloc_fail_after(n);
        int rc = kvt_file_load(golden_path("mixed.mlxkv"), NULL, &e, &h);
        kvt_alloc_fail_after(-1);
        if (rc == 0) {
            kvt_header_free(h);
            kvt_entry_free(e);
            break;
        }
        assert_int_equal(rc, -ENOMEM);
        assert_null(e);
        assert_null(h);
        assert_true(n < 10000);
    }
    assert_true(n > 6); /* at least one buffer per layer was allocated */

    struct kvt_entry *e;
    assert_int_equal(kvt_file_load(golden_path("mixed.mlxkv"), NULL, &e, NULL), 0);
    char *path = path_of("alloc.mlxkv"), *tmp = strf("%s.tmp", path);
    struct kvt_save_opts so = {.no_sync = true};
    for (n = 0;; n++) {
        kvt_alloc_fail_after(n);
        int rc = kvt_file_save(path, e, &so, NULL);
        kvt_alloc_fail_after(-1);
        if (rc == 0)
            break;
        assert_int_equal(rc, -ENOMEM);
        assert_false(exists(path));
        assert_false(exists(tmp));
    }
    assert_int_equal(kvt_file_verify(path, NULL), 0);
    kvt_entry_free(e);
    free(path);
    free(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_flip_every_byte, reset_io),
        cmocka_unit_test_teardown(test_truncate_every_length, reset_io),
        cmocka_unit_test_teardown(test_atomic_save, reset_io),
        cmocka_unit_test_teardown(test_disk_full_and_short_writes, reset_io),
        cmocka_unit_test_teardown(test_load_faults, reset_io),
        cmocka_unit_test(test_alloc_failures),
    };
    return cmocka_run_group_tests(tests, test_dir_setup, test_dir_teardown);
}
