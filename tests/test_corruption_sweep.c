/*
 * Single-byte corruption and truncation sweep over a small file holding all six kinds, written
 * through the public API (kvt_file_save of a synthetic entry, tests/progs/crash_entry.h).
 *
 * Flips. A recording io backend first finds the exact set of bytes a load reads. Every one of
 * those bytes is flipped on its own (one bit, cycling through the bit positions; all eight bits
 * in the 26-byte prefix) and the file loaded with tensor hashes checked; the outcome is known
 * from the layout: the prefix, the header JSON and every tensor byte are protected (the load
 * must fail: headerLen and dataStart by V3/V5, the JSON by its hash, the tensors by theirs),
 * anything else the load reads must not matter (identical tensors). The bytes no load reads
 * (the zero padding after the header, the gaps between tensors) cannot change a result that
 * depends only on the bytes read; each such run is flipped as a whole (every byte of it at
 * once) and must load identically without reading any of it, and every 61st of them is also
 * flipped on its own. A flipped tensor byte loaded without hash checks must come back exactly
 * as the file holds it.
 *
 * Truncations. Every length short of the file must fail as corrupt (and every 97th also
 * without hash checks). Under the address,undefined build the sweep also shows that no such
 * input makes a load read out of bounds.
 */
#include "support/support.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/io.h"
#include "progs/crash_entry.h"

#define PREFIX 26
#define UNREAD_STRIDE 61
#define UNVERIFIED_STRIDE 97

static char *dir, *path;
static uint8_t *img;           /* the intact file */
static size_t img_len;
static struct kvt_entry *ref;  /* its load */
static struct kvt_header *hdr; /* its header */

static int setup(void **state)
{
    (void)state;
    dir = scratch_dir("sweep");
    if (!dir)
        return -1;
    path = strf("%s/mixed.mlxkv", dir);
    int32_t tok[12]; /* 12 tokens: both rings (maxSize 8) have wrapped */
    for (int i = 0; i < 12; i++)
        tok[i] = 1000 + 37 * i;
    struct kvt_entry *e;
    if (synth_entry(tok, 12, SYNTH_ALL_KINDS, 6, "sweep", &e) != 0)
        return -1;
    struct kvt_save_opts o = {.no_sync = true};
    int rc = kvt_file_save(path, e, &o, NULL);
    if (rc == 0)
        rc = kvt_file_load(path, NULL, &ref, &hdr);
    if (rc == 0 && !synth_same_caches(ref, e))
        rc = -1;
    kvt_entry_free(e);
    img = read_file(path, &img_len);
    return rc == 0 && img ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvt_entry_free(ref);
    kvt_header_free(hdr);
    free(img);
    if (dir)
        rm_rf(dir);
    free(path);
    free(dir);
    return 0;
}

/* ---- a backend that records which file bytes are read -------------------------------- */

static uint8_t *read_map; /* one flag per byte of the file */
static struct kvt_io recording;

static ssize_t recording_pread(int fd, void *buf, size_t n, uint64_t off)
{
    ssize_t r = kvt_io_posix()->pread(fd, buf, n, off);
    for (ssize_t i = 0; i < r && off + (uint64_t)i < img_len; i++)
        read_map[off + (uint64_t)i] = 1;
    return r;
}

/* Load with @p x through the recording backend, OR-ing the bytes read into read_map. */
static int recorded_load(const struct kvt_expect *x, struct kvt_entry **e)
{
    recording = *kvt_io_posix();
    recording.name = "recording";
    recording.pread = recording_pread;
    kvt_io_set(&recording);
    int rc = kvt_file_load(path, x, e, NULL);
    kvt_io_set(NULL);
    return rc;
}

/* Whether a flip at @p off must make a load with hash checks fail. */
static bool is_protected(uint64_t off)
{
    if (off < PREFIX + (uint64_t)hdr->header_len)
        return true;
    for (size_t i = 0; i < hdr->n_caches; i++)
        for (int j = 0; j < hdr->caches[i].n_slots; j++) {
            const struct kvt_slot *s = &hdr->caches[i].slots[j];
            uint64_t a = (uint64_t)hdr->data_start + s->off;
            if (off >= a && off < a + s->bytes)
                return true;
        }
    return false;
}

/* The slot whose bytes hold @p off, or false. */
static bool slot_at(uint64_t off, size_t *ci, int *sj)
{
    for (size_t i = 0; i < hdr->n_caches; i++)
        for (int j = 0; j < hdr->caches[i].n_slots; j++) {
            const struct kvt_slot *s = &hdr->caches[i].slots[j];
            uint64_t a = (uint64_t)hdr->data_start + s->off;
            if (off >= a && off < a + s->bytes) {
                *ci = i;
                *sj = j;
                return true;
            }
        }
    return false;
}

static void put_byte(int fd, uint64_t off, uint8_t v)
{
    assert_int_equal(pwrite(fd, &v, 1, (off_t)off), 1);
}

/* Without hash checks, the flipped slot must hold exactly the file's (flipped) bytes. */
static void check_unverified(uint64_t off)
{
    size_t ci = 0;
    int sj = 0;
    assert_true(slot_at(off, &ci, &sj));
    struct kvt_expect x = {.no_verify = true, .keep_cache = true};
    struct kvt_entry *e = NULL;
    int rc = kvt_file_load(path, &x, &e, NULL);
    if (rc != 0)
        fail_msg("offset %llu: load without hash checks: %s", (unsigned long long)off,
                 kvt_last_error());
    const struct kvt_slot *s = &hdr->caches[ci].slots[sj];
    struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
    int nt = kvt_cache_state(e->caches[ci], t);
    assert_int_equal(nt, hdr->caches[ci].n_slots);
    assert_int_equal(kvt_tensor_nbytes(&t[sj]), s->bytes);
    uint8_t *got = malloc(s->bytes);
    assert_non_null(got);
    kvt_tensor_copy_out(&t[sj], got);
    uint64_t a = (uint64_t)hdr->data_start + s->off;
    assert_int_equal(got[off - a], img[off] ^ (uint8_t)(1u << (off % 8)));
    got[off - a] = img[off];
    assert_memory_equal(got, img + a, s->bytes);
    free(got);
    for (int k = 0; k < nt; k++)
        kvt_tensor_release(&t[k]);
    kvt_entry_free(e);
}

struct flip_counts {
    long loads, failed, identical, unverified, by_code[4]; /* corrupt, format, unsupported, other */
};

/* Load the (damaged) file with hash checks; @p protected_ says whether it must fail. */
static void expect_load(bool protected_, uint64_t off, struct flip_counts *c)
{
    struct kvt_expect x = {.keep_cache = true};
    struct kvt_entry *e = NULL;
    int rc = kvt_file_load(path, &x, &e, NULL);
    c->loads++;
    if (rc != 0) {
        c->failed++;
        assert_null(e);
        c->by_code[rc == KVT_E_CORRUPT       ? 0
                   : rc == KVT_E_FORMAT      ? 1
                   : rc == KVT_E_UNSUPPORTED ? 2
                                             : 3]++;
        if (!protected_)
            fail_msg("flip at %llu (does not matter) failed the load: %s",
                     (unsigned long long)off, kvt_last_error());
        if (rc != KVT_E_CORRUPT && rc != KVT_E_FORMAT && rc != KVT_E_UNSUPPORTED)
            fail_msg("flip at %llu: unexpected error %d: %s", (unsigned long long)off, rc,
                     kvt_last_error());
        return;
    }
    if (protected_)
        fail_msg("flip at %llu (protected) loaded", (unsigned long long)off);
    if (!synth_same_caches(e, ref))
        fail_msg("flip at %llu loaded different tensors", (unsigned long long)off);
    c->identical++;
    kvt_entry_free(e);
}

static void test_every_byte_flipped(void **state)
{
    (void)state;
    read_map = calloc(img_len, 1);
    assert_non_null(read_map);
    struct kvt_entry *e = NULL;
    struct kvt_expect on = {.keep_cache = true}, off_ = {.keep_cache = true, .no_verify = true};
    assert_int_equal(recorded_load(&on, &e), 0);
    kvt_entry_free(e);
    assert_int_equal(recorded_load(&off_, &e), 0);
    kvt_entry_free(e);
    long n_read = 0;
    for (uint64_t off = 0; off < img_len; off++) {
        n_read += read_map[off];
        if (is_protected(off) && !read_map[off])
            fail_msg("the load never reads protected byte %llu", (unsigned long long)off);
    }

    int fd = open(path, O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    struct flip_counts c = {0};
    long unread_runs = 0, unread_single = 0;
    for (uint64_t off = 0; off < img_len; off++) {
        if (!read_map[off]) {
            /* a run of bytes no load reads: all of it flipped at once */
            uint64_t end = off;
            while (end < img_len && !read_map[end])
                end++;
            uint8_t *junk = malloc(end - off);
            assert_non_null(junk);
            for (uint64_t i = off; i < end; i++)
                junk[i - off] = img[i] ^ (uint8_t)(1u << (i % 8));
            assert_int_equal(pwrite(fd, junk, end - off, (off_t)off), (ssize_t)(end - off));
            assert_int_equal(recorded_load(&on, &e), 0);
            c.loads++;
            c.identical++;
            assert_true(synth_same_caches(e, ref));
            kvt_entry_free(e);
            for (uint64_t i = off; i < end; i++)
                if (read_map[i])
                    fail_msg("a load read byte %llu only after it was damaged",
                             (unsigned long long)i);
            assert_int_equal(pwrite(fd, img + off, end - off, (off_t)off), (ssize_t)(end - off));
            /* and every UNREAD_STRIDE-th byte of it on its own */
            for (uint64_t i = off + (off % UNREAD_STRIDE ? UNREAD_STRIDE - off % UNREAD_STRIDE : 0);
                 i < end; i += UNREAD_STRIDE) {
                put_byte(fd, i, junk[i - off]);
                expect_load(false, i, &c);
                put_byte(fd, i, img[i]);
                unread_single++;
            }
            free(junk);
            unread_runs++;
            off = end - 1;
            continue;
        }
        int bits = off < PREFIX ? 8 : 1;
        for (int b = 0; b < bits; b++) {
            uint8_t mask = (uint8_t)(1u << (off < PREFIX ? b : (int)(off % 8)));
            put_byte(fd, off, img[off] ^ mask);
            expect_load(is_protected(off), off, &c);
            if (off >= hdr->data_start && is_protected(off)) {
                check_unverified(off);
                c.unverified++;
            }
        }
        put_byte(fd, off, img[off]);
    }
    close(fd);
    free(read_map);
    read_map = NULL;
    print_message("sweep: %zu-byte file, %ld bytes read by a load, each flipped: %ld loads, "
                  "%ld failed (%ld corrupt, %ld format, %ld unsupported, %ld other), %ld "
                  "identical; %ld tensor flips exact without hash checks; %ld unread runs "
                  "flipped whole, %ld unread bytes flipped alone\n",
                  img_len, n_read, c.loads, c.failed, c.by_code[0], c.by_code[1], c.by_code[2],
                  c.by_code[3], c.identical, c.unverified, unread_runs, unread_single);
    assert_int_equal(c.by_code[3], 0);
    assert_true(c.identical > 0 && c.failed > 0 && c.unverified > 0 && unread_runs > 0);
}

static void test_every_truncation(void **state)
{
    (void)state;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    struct kvt_expect on = {.keep_cache = true};
    struct kvt_expect off = {.keep_cache = true, .no_verify = true};
    long loads = 0;
    for (size_t len = img_len; len-- > 0;) {
        assert_int_equal(ftruncate(fd, (off_t)len), 0);
        for (int v = 0; v < (len % UNVERIFIED_STRIDE ? 1 : 2); v++) {
            struct kvt_entry *e = NULL;
            int rc = kvt_file_load(path, v ? &off : &on, &e, NULL);
            loads++;
            if (rc != KVT_E_CORRUPT)
                fail_msg("truncated to %zu bytes: load returned %d (%s)", len, rc,
                         kvt_last_error());
            assert_null(e);
        }
        if (len % 4096 == 0) {
            struct kvt_expect x = {.keep_cache = true};
            assert_int_equal(kvt_file_verify(path, &x), KVT_E_CORRUPT);
        }
    }
    /* back to the intact file */
    assert_int_equal(pwrite(fd, img, img_len, 0), (ssize_t)img_len);
    close(fd);
    struct kvt_entry *e = NULL;
    assert_int_equal(kvt_file_load(path, NULL, &e, NULL), 0);
    assert_true(synth_same_caches(e, ref));
    kvt_entry_free(e);
    print_message("sweep: %zu truncation lengths, %ld loads, all corrupt\n", img_len, loads);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_byte_flipped),
        cmocka_unit_test(test_every_truncation),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
