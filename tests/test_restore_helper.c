/*
 * The prefault helper: a consumer that asks for a queued range finds its pages faulted in
 * (whichever thread did it), memory never queued is left alone, contents never change, and
 * memory freed while queued is harmless; deferred pieces run once each, in order, and are all
 * done when drain (or stop) returns. Only memory with a page not yet resident wants the helper.
 */
#include "support/support.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "threads/restore_helper.h"

#define MIB ((size_t)1 << 20)

static uint8_t *map(size_t len)
{
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    return m;
}

/* Pages of [p, p + len) that are present in memory. */
static size_t resident(const uint8_t *p, size_t len)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = (len + pg - 1) / pg, count = 0;
    unsigned char *v = malloc(n);
    assert_int_equal(mincore((void *)p, len, v), 0);
    for (size_t i = 0; i < n; i++)
        count += v[i] & 1;
    free(v);
    return count;
}

static struct kvt_restore_helper *start(void)
{
    struct kvt_restore_helper *p = kvt_restore_helper_start();
    if (!p)
        skip(); /* a kernel without MADV_POPULATE_WRITE: nothing to test */
    return p;
}

/* Every piece a consumer ensures, in order, is resident when ensure returns. */
static void test_ensured_pieces_are_resident(void **state)
{
    (void)state;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), len = 64 * MIB;
    for (size_t piece = 64 << 10; piece <= 4 * MIB; piece *= 4) {
        struct kvt_restore_helper *p = start();
        uint8_t *m = map(len);
        assert_true(kvt_restore_helper_add(p, m, len));
        for (size_t off = 0; off < len; off += piece) {
            kvt_restore_helper_ensure(p, m + off, piece);
            assert_int_equal(resident(m + off, piece), piece / pg);
            memset(m + off, 0x5a, piece);
        }
        kvt_restore_helper_stop(p);
        munmap(m, len);
    }
}

/* Memory that was never queued is not touched; unaligned edges are the copy's business. */
static void test_unqueued_memory_is_left_alone(void **state)
{
    (void)state;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    struct kvt_restore_helper *p = start();
    uint8_t *queued = map(8 * MIB), *other = map(8 * MIB);
    assert_true(kvt_restore_helper_add(p, queued + 100, 8 * MIB - 200));
    kvt_restore_helper_ensure(p, other, 8 * MIB);
    assert_int_equal(resident(other, 8 * MIB), 0);
    kvt_restore_helper_ensure(p, queued, 8 * MIB);
    /* only the whole pages inside the queued range */
    assert_int_equal(resident(queued + pg, 8 * MIB - 2 * pg), 8 * MIB / pg - 2);
    kvt_restore_helper_cancel(p);
    kvt_restore_helper_stop(p);
    munmap(queued, 8 * MIB);
    munmap(other, 8 * MIB);
}

/* Populating keeps what is written and leaves untouched pages reading as zero. */
static void test_contents_are_kept(void **state)
{
    (void)state;
    size_t len = 16 * MIB;
    struct kvt_restore_helper *p = start();
    uint8_t *m = map(len);
    uint64_t rs = 9;
    for (size_t off = 0; off < len; off += 3 * MIB)
        fill_random(m + off, 4096, &rs);
    assert_true(kvt_restore_helper_add(p, m, len));
    kvt_restore_helper_ensure(p, m, len);
    rs = 9;
    uint8_t want[4096], zero[4096] = {0};
    for (size_t off = 0; off < len; off += 4096) {
        if (off % (3 * MIB) == 0) {
            fill_random(want, sizeof(want), &rs);
            assert_memory_equal(m + off, want, sizeof(want));
        } else {
            assert_memory_equal(m + off, zero, sizeof(zero));
        }
    }
    kvt_restore_helper_stop(p);
    munmap(m, len);
}

/* Memory freed while queued (or while the helper works on it) costs nothing but the work. */
static void test_freed_memory_is_harmless(void **state)
{
    (void)state;
    for (int round = 0; round < 20; round++) {
        struct kvt_restore_helper *p = start();
        uint8_t *m = map(32 * MIB);
        assert_true(kvt_restore_helper_add(p, m, 32 * MIB));
        munmap(m, 16 * MIB);
        kvt_restore_helper_ensure(p, m, 32 * MIB);
        kvt_restore_helper_cancel(p);
        munmap(m + 16 * MIB, 16 * MIB);
        kvt_restore_helper_stop(p);
    }
    kvt_restore_helper_ensure(NULL, NULL, 1);
    kvt_restore_helper_stop(NULL);
}

struct order {
    struct kvt_wyhash_state h;
    size_t next, runs; /* the index the next piece must have; pieces run */
    const uint8_t *base;
    size_t piece;
};

/* Checks the order by the piece's address: piece k starts at base + k * piece. */
static void take_piece(void *ud, const void *data, size_t len)
{
    struct order *o = ud;
    if ((const uint8_t *)data == o->base + o->next * o->piece)
        o->next++;
    o->runs++;
    kvt_wyhash_update(&o->h, data, len);
}

/* More pieces than the queue holds, deferred while the helper also populates: each runs once,
 * in order, and the hash of the pieces is the hash of the whole. */
static void test_deferred_pieces_run_in_order(void **state)
{
    (void)state;
    size_t len = 48 * MIB, piece = 64 << 10, n = len / piece;
    uint8_t *data = map(len), *dst = map(len);
    for (size_t i = 0; i < len; i++)
        data[i] = (uint8_t)(i * 131 + (i >> 12));
    uint64_t want = kvt_wyhash(0, data, len);
    for (int round = 0; round < 3; round++) {
        struct kvt_restore_helper *p = start();
        struct order o = {.base = data, .piece = piece};
        kvt_wyhash_init(&o.h, 0);
        assert_true(kvt_restore_helper_add(p, dst, len)); /* work competing with the pieces */
        for (size_t k = 0; k < n; k++)
            assert_true(kvt_restore_helper_defer(p, take_piece, &o, data + k * piece, piece));
        if (round < 2)
            kvt_restore_helper_drain(p);
        else
            kvt_restore_helper_stop(p); /* stop runs what is still queued too */
        assert_int_equal(o.runs, n);
        assert_int_equal(o.next, n);
        assert_true(kvt_wyhash_final(&o.h) == want);
        if (round < 2) {
            kvt_restore_helper_drain(p); /* nothing left: returns at once */
            assert_int_equal(o.runs, n);
            kvt_restore_helper_stop(p);
        }
    }
    assert_false(kvt_restore_helper_defer(NULL, take_piece, NULL, data, 1));
    kvt_restore_helper_drain(NULL);
    munmap(data, len);
    munmap(dst, len);
}

static void test_wanted_only_for_missing_pages(void **state)
{
    (void)state;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), len = 8 * MIB + 3 * pg;
    uint8_t *m = map(len);
    assert_true(kvt_restore_helper_wanted(m, len)); /* nothing touched */
    memset(m, 1, len);
    assert_false(kvt_restore_helper_wanted(m, len));
    assert_false(kvt_restore_helper_wanted(m + 17, len - 40)); /* not on page boundaries */
    assert_false(kvt_restore_helper_wanted(m, 0));
    /* one page given back, far past the first mincore window of the check */
    assert_int_equal(madvise(m + 6 * MIB + pg, pg, MADV_DONTNEED), 0);
    assert_true(kvt_restore_helper_wanted(m, len));
    assert_true(kvt_restore_helper_wanted(m + 6 * MIB + pg + 100, 1));
    assert_false(kvt_restore_helper_wanted(m, 6 * MIB + pg));
    assert_false(kvt_restore_helper_wanted(m + 6 * MIB + 2 * pg, len - 6 * MIB - 2 * pg));
    munmap(m, len);
    assert_true(kvt_restore_helper_wanted(m, len)); /* unmapped: the check cannot say no */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ensured_pieces_are_resident),
        cmocka_unit_test(test_unqueued_memory_is_left_alone),
        cmocka_unit_test(test_contents_are_kept),
        cmocka_unit_test(test_freed_memory_is_harmless),
        cmocka_unit_test(test_deferred_pieces_run_in_order),
        cmocka_unit_test(test_wanted_only_for_missing_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
