/*
 * The stream layer: the asynchronous queue on both engines, the read-ahead stream (direct and
 * page-cache chunks, unaligned and gapped ranges, pieces delivered in order, early end of
 * file, bad ranges, the plain path under another io backend) and the write stream (staged
 * direct writes with gaps and a padded tail cut back, hashes, offset order, errors from the
 * device, the plain path). Every result is checked against the bytes themselves.
 */
#include "support/support.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "io/aq.h"
#include "io/io.h"
#include "io/io_fault.h"
#include "mem/staging.h"
#include "io/stream.h"

static char *dir;

static int setup(void **state)
{
    (void)state;
    dir = scratch_dir("stream");
    return dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvt_io_set(NULL);
    kvt_fault_reset();
    rm_rf(dir);
    free(dir);
    return 0;
}

static const char *const engines[] = {"io_uring", "threads"};

/* A file of @p n pseudo-random bytes; the bytes are returned (caller frees). */
static uint8_t *make_file(const char *path, size_t n, uint64_t seed)
{
    uint8_t *b = malloc(n ? n : 1);
    assert_non_null(b);
    fill_random(b, n, &seed);
    assert_int_equal(write_file(path, b, n), 0);
    return b;
}

static void test_aq_roundtrip(void **state)
{
    (void)state;
    char *path = strf("%s/aq.bin", dir);
    uint8_t *want = make_file(path, 1 << 20, 7);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    for (size_t e = 0; e < 2; e++) {
        struct kvt_aq q;
        int rc = kvt_aq_open(&q, 4, engines[e]);
        if (rc < 0 && e == 0)
            continue; /* no io_uring in this build or kernel */
        assert_int_equal(rc, 0);
        assert_string_equal(kvt_aq_name(&q), engines[e]);
        uint8_t *got = calloc(4, 65536);
        for (unsigned k = 0; k < 4; k++)
            assert_int_equal(
                kvt_aq_submit(&q, fd, 0, got + k * 65536, 65536, (uint64_t)(3 - k) * 65536, k), 0);
        assert_int_equal(kvt_aq_submit(&q, fd, 0, got, 1, 0, 9), -EBUSY); /* full */
        unsigned seen = 0;
        for (int i = 0; i < 4; i++) {
            uint64_t tag;
            int64_t res;
            assert_int_equal(kvt_aq_wait(&q, &tag, &res), 0);
            assert_true(tag < 4);
            assert_int_equal(res, 65536);
            seen |= 1u << tag;
        }
        assert_int_equal(seen, 15);
        for (unsigned k = 0; k < 4; k++)
            assert_memory_equal(got + k * 65536, want + (3 - k) * 65536, 65536);
        uint64_t tag;
        int64_t res;
        assert_int_equal(kvt_aq_wait(&q, &tag, &res), -EINVAL); /* nothing in flight */
        assert_int_equal(kvt_aq_poll(&q, &tag, &res), -EAGAIN);
        /* polling takes a completion without waiting for one */
        assert_int_equal(kvt_aq_submit(&q, fd, 0, got, 65536, 65536, 5), 0);
        int polled;
        while ((polled = kvt_aq_poll(&q, &tag, &res)) == -EAGAIN)
            sched_yield();
        assert_int_equal(polled, 0);
        assert_int_equal(tag, 5);
        assert_int_equal(res, 65536);
        assert_memory_equal(got, want + 65536, 65536);
        assert_int_equal(kvt_aq_poll(&q, &tag, &res), -EAGAIN);
        /* a read past the end is short, a write goes through */
        assert_int_equal(kvt_aq_submit(&q, fd, 0, got, 8192, (1 << 20) - 100, 1), 0);
        assert_int_equal(kvt_aq_wait(&q, &tag, &res), 0);
        assert_int_equal(res, 100);
        assert_int_equal(kvt_aq_submit(&q, fd, 1, want, 10, 0, 2), 0);
        assert_int_equal(kvt_aq_wait(&q, &tag, &res), 0);
        assert_int_equal(tag, 2);
        assert_int_equal(res, 10);
        assert_int_equal(kvt_aq_submit(&q, -1, 0, got, 10, 0, 3), 0);
        assert_int_equal(kvt_aq_wait(&q, &tag, &res), 0);
        assert_int_equal(res, -EBADF);
        kvt_aq_close(&q);
        free(got);
    }
    assert_int_equal(kvt_aq_open(&(struct kvt_aq){0}, 0, NULL), -EINVAL);
    close(fd);
    free(want);
    free(path);
}

/* Collects the pieces a read hands to its callback. */
struct sink {
    uint8_t *buf;
    size_t len;
    unsigned calls;
};

static void collect(void *ud, const void *data, size_t len)
{
    struct sink *s = ud;
    memcpy(s->buf + s->len, data, len);
    s->len += len;
    s->calls++;
}

struct read_case {
    const char *engine;
    size_t chunk;
    unsigned depth;
    bool no_direct, warm, no_dst;
    bool huge; /* destinations in memory advised for transparent huge pages, as large kvt_bufs */
    /* destinations given at open: ranges packed back to back (some on the file's block grid,
     * some not), or each at its file offset (all on the grid); consumed where given, or into
     * another buffer (the stream then copies) */
    bool known, grid, elsewhere;
};

/*
 * Ranges over a 6.3 MB file: aligned and not, back to back, with small and large gaps, a
 * zero-length one, and the last reaching the end of the file exactly.
 */
static const struct kvt_range ranges[] = {
    {0, 16384, NULL, NULL},   {16384, 100000, NULL, NULL},    {116400, 3, NULL, NULL},
    {116403, 0, NULL, NULL},  {120000, 2500000, NULL, NULL},  {2700000, 4096, NULL, NULL},
    {4000000, 1, NULL, NULL}, {4001000, 2000000, NULL, NULL}, {6301000, 299, NULL, NULL},
};
#define FILE_BYTES 6301299u

/* Whether the scratch file system takes O_DIRECT (tmpfs does not). */
static bool direct_ok(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd >= 0)
        close(fd);
    return fd >= 0;
}

static void run_read_case(const char *path, const uint8_t *want, const struct read_case *c)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    /* out of the page cache: bytes it holds are read from it, never with O_DIRECT */
    assert_int_equal(fdatasync(fd), 0);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    struct kvt_stream_opts o = {
        .chunk = c->chunk, .depth = c->depth, .no_direct = c->no_direct, .engine = c->engine};
    struct kvt_rstream *s;
    size_t nr = sizeof(ranges) / sizeof(ranges[0]), total = 0;
    for (size_t i = 0; i < nr; i++)
        total += ranges[i].len;
    /* where each range goes: page-aligned memory, packed or at the file offsets */
    size_t mem_bytes = (c->grid ? FILE_BYTES : total) + 4096;
    size_t align = c->huge ? (size_t)2 << 20 : 4096;
    uint8_t *mem = aligned_alloc(align, (mem_bytes + align - 1) / align * align);
    if (c->huge)
        madvise(mem, (mem_bytes + align - 1) / align * align, MADV_HUGEPAGE);
    uint8_t *other = malloc(mem_bytes), *seen = malloc(total);
    struct kvt_range rr[sizeof(ranges) / sizeof(ranges[0])];
    uint8_t *dst[sizeof(ranges) / sizeof(ranges[0])];
    for (size_t i = 0, at = 0; i < nr; at += ranges[i].len, i++) {
        rr[i] = ranges[i];
        dst[i] = c->grid ? mem + ranges[i].off : mem + at;
        if (c->known)
            rr[i].dst = dst[i];
        if (c->elsewhere)
            dst[i] = other + (dst[i] - mem);
    }
    assert_int_equal(kvt_rstream_open(fd, rr, nr, &o, &s), 0);
    char want_engine[32];
    snprintf(want_engine, sizeof(want_engine), "%s+direct", c->engine ? c->engine : "");
    if (!kvt_stream_fast_ok())
        assert_string_equal(kvt_rstream_engine(s), "plain");
    else if (c->no_direct || !direct_ok(path))
        assert_string_equal(kvt_rstream_engine(s), "buffered");
    else if (c->engine && (strcmp(c->engine, "io_uring") || kvt_aq_uring()))
        assert_string_equal(kvt_rstream_engine(s), want_engine);
    struct sink sk = {.buf = seen};
    /* consume in uneven pieces that cut across ranges (each call within one destination) */
    size_t done = 0, step = 1, ri = 0, at = 0;
    while (done < total) {
        size_t n = total - done < step ? total - done : step;
        while (done - at >= ranges[ri].len) {
            at += ranges[ri].len;
            ri++;
        }
        if (n > at + ranges[ri].len - done)
            n = at + ranges[ri].len - done;
        uint8_t *d = c->no_dst ? NULL : dst[ri] + (done - at);
        assert_int_equal(kvt_rstream_read(s, d, n, collect, &sk, NULL), 0);
        done += n;
        step = step * 7 + 13;
    }
    assert_int_equal(kvt_rstream_read(s, mem, 1, NULL, NULL, NULL), -EINVAL); /* past the end */
    kvt_rstream_close(s);
    at = 0;
    for (size_t i = 0; i < nr; i++) {
        if (!c->no_dst)
            assert_memory_equal(dst[i], want + ranges[i].off, ranges[i].len);
        assert_memory_equal(seen + at, want + ranges[i].off, ranges[i].len);
        at += ranges[i].len;
    }
    assert_int_equal(sk.len, total);
    free(mem);
    free(other);
    free(seen);
    close(fd);
}

static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    fsync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

static void warm_cache(const char *path)
{
    size_t n;
    free(read_file(path, &n));
}

static void test_read_matrix(void **state)
{
    (void)state;
    char *path = strf("%s/read.bin", dir);
    uint8_t *want = make_file(path, FILE_BYTES, 11);
    const size_t chunks[] = {0, 8192, 65536 + 4096};
    for (size_t e = 0; e < 2; e++)
        for (size_t k = 0; k < 3; k++)
            for (int mode = 0; mode < 9; mode++) {
                struct read_case c = {.engine = engines[e],
                                      .chunk = chunks[k],
                                      .depth = k == 1 ? 3 : 0,
                                      .no_direct = mode == 1,
                                      .warm = mode == 2 || mode == 7,
                                      .no_dst = mode == 3,
                                      .huge = mode == 4,
                                      .known = mode >= 5,
                                      .grid = mode == 6 || mode == 7,
                                      .elsewhere = mode == 8};
                if (c.warm)
                    warm_cache(path);
                else
                    drop_cache(path);
                run_read_case(path, want, &c);
            }
    free(want);
    free(path);
}

/*
 * Ranges without a destination between ranges read into place (the loader leaves a buffer's
 * small-page tail without one): those on whole blocks ride in the same request, through the
 * staging slot, the others in a staging chunk of their own. Every byte lands where the
 * consumer asks, cold (direct) and warm, on both engines, with chunks that take the staged
 * range whole or cannot, into memory already resident or fresh (the prefault helper at work),
 * with the ranges without a destination naming where they are copied to or not.
 */
static void test_read_staged_between_places(void **state)
{
    (void)state;
    const uint64_t mib = (uint64_t)1 << 20;
    const struct kvt_range shape[] = {
        {0, mib, NULL, NULL},                     /* into place */
        {mib, mib / 4, NULL, NULL},               /* none, whole blocks: in the same request */
        {mib + mib / 4, 3 * mib / 4, NULL, NULL}, /* into place */
        {2 * mib, 100003, NULL, NULL},            /* none, not whole blocks: staged on its own */
        {2 * mib + 100003, mib - 100003, NULL, NULL}, /* into place from its first whole block */
        {3 * mib, mib / 2, NULL, NULL},               /* none, whole blocks */
        {3 * mib + mib / 2, 4096, NULL, NULL},        /* into place, the file's last bytes */
    };
    const bool place[] = {true, false, true, false, true, false, true};
    const size_t nr = sizeof(shape) / sizeof(shape[0]), bytes = 3 * mib + mib / 2 + 4096;
    char *path = strf("%s/staged.bin", dir);
    uint8_t *want = make_file(path, bytes, 23);
    const size_t chunks[] = {0, 512 << 10};
    for (int v = 0; v < 32; v++) {
        size_t e = v & 1, k = (v >> 1) & 1;
        bool warm = v & 4, fresh = v & 8, copy_to = v & 16;
        if (warm)
            warm_cache(path);
        else
            drop_cache(path);
        uint8_t *mem =
            fresh ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                  : aligned_alloc(4096, bytes);
        assert_true(mem != MAP_FAILED && mem != NULL);
        if (!fresh)
            memset(mem, 0xee, bytes);
        struct kvt_range rr[sizeof(shape) / sizeof(shape[0])];
        for (size_t i = 0; i < nr; i++) {
            rr[i] = shape[i];
            rr[i].dst = place[i] ? mem + shape[i].off : NULL;
            rr[i].copy_to = !place[i] && copy_to ? mem + shape[i].off : NULL;
        }
        struct kvt_stream_opts o = {.engine = engines[e], .chunk = chunks[k]};
        int fd = open(path, O_RDONLY);
        assert_true(fd >= 0);
        struct kvt_rstream *s;
        assert_int_equal(kvt_rstream_open(fd, rr, nr, &o, &s), 0);
        for (size_t i = 0; i < nr; i++) /* each range in two calls */
            for (uint64_t h = 0; h < 2; h++) {
                uint64_t a = h ? shape[i].len / 3 : 0;
                uint64_t b = h ? shape[i].len : shape[i].len / 3;
                assert_int_equal(
                    kvt_rstream_read(s, mem + shape[i].off + a, (size_t)(b - a), NULL, NULL, NULL),
                    0);
            }
        kvt_rstream_close(s);
        close(fd);
        if (memcmp(mem, want, bytes))
            fail_msg("%s, chunk %zu, %s, %s memory: bytes differ", engines[e], chunks[k],
                     warm ? "warm" : "cold", fresh ? "fresh" : "resident");
        if (fresh)
            munmap(mem, bytes);
        else
            free(mem);
    }
    free(want);
    free(path);
}

static void test_read_engine_names(void **state)
{
    (void)state;
    char *path = strf("%s/names.bin", dir);
    uint8_t *want = make_file(path, 2 << 20, 5);
    struct kvt_range r = {0, 2 << 20, NULL, NULL};
    int fd = open(path, O_RDONLY);
    struct kvt_rstream *s;
    assert_int_equal(kvt_rstream_open(fd, &r, 1, &(struct kvt_stream_opts){.no_direct = true}, &s),
                     0);
    assert_string_equal(kvt_rstream_engine(s), "buffered");
    kvt_rstream_close(s);
    /* small streams take the plain path */
    r.len = 1000;
    assert_int_equal(kvt_rstream_open(fd, &r, 1, NULL, &s), 0);
    assert_string_equal(kvt_rstream_engine(s), "plain");
    uint8_t got[1000];
    assert_int_equal(kvt_rstream_read(s, got, 1000, NULL, NULL, NULL), 0);
    assert_memory_equal(got, want, 1000);
    kvt_rstream_close(s);
    kvt_rstream_close(NULL);
    close(fd);
    free(want);
    free(path);
}

static void test_read_bad_ranges(void **state)
{
    (void)state;
    struct kvt_rstream *s = (void *)1;
    struct kvt_range overlap[] = {{0, 100, NULL, NULL}, {99, 10, NULL, NULL}};
    assert_int_equal(kvt_rstream_open(0, overlap, 2, NULL, &s), -EINVAL);
    assert_null(s);
    struct kvt_range wrap[] = {{UINT64_MAX - 5, 10, NULL, NULL}};
    assert_int_equal(kvt_rstream_open(0, wrap, 1, NULL, &s), -EINVAL);
    struct kvt_range desc[] = {{5000, 10, NULL, NULL}, {0, 10, NULL, NULL}};
    assert_int_equal(kvt_rstream_open(0, desc, 2, NULL, &s), -EINVAL);
}

static void test_read_short_file(void **state)
{
    (void)state;
    char *path = strf("%s/short.bin", dir);
    uint8_t *want = make_file(path, 3 << 20, 3);
    for (int mode = 0; mode < 4; mode++) {
        /* the ranges promise 4 MiB, the file has 3 (mode 3: read straight into place) */
        uint8_t *dst = aligned_alloc(4096, 4 << 20);
        struct kvt_range r[] = {{0, 1 << 20, NULL, NULL}, {1 << 20, 3 << 20, NULL, NULL}};
        if (mode == 3) {
            r[0].dst = dst;
            r[1].dst = dst + (1 << 20);
        }
        int fd = open(path, O_RDONLY);
        drop_cache(path);
        if (mode == 2) {
            kvt_fault_reset();
            kvt_io_set(kvt_io_fault()); /* the plain path */
        }
        struct kvt_rstream *s;
        assert_int_equal(
            kvt_rstream_open(fd, r, 2, &(struct kvt_stream_opts){.no_direct = mode == 1}, &s), 0);
        assert_int_equal(kvt_rstream_read(s, dst, 1 << 20, NULL, NULL, NULL), 0);
        assert_memory_equal(dst, want, 1 << 20);
        uint64_t at = 0;
        assert_int_equal(kvt_rstream_read(s, dst + (1 << 20), 3 << 20, NULL, NULL, &at), -EIO);
        assert_true(at >= (1u << 20) && at <= (3u << 20));
        at = 0;
        assert_int_equal(kvt_rstream_read(s, dst, 1, NULL, NULL, &at), -EIO); /* broken */
        kvt_rstream_close(s);
        kvt_io_set(NULL);
        free(dst);
        close(fd);
    }
    free(want);
    free(path);
}

static void test_read_fault_backend(void **state)
{
    (void)state;
    char *path = strf("%s/fault.bin", dir);
    uint8_t *want = make_file(path, FILE_BYTES, 13);
    kvt_fault_reset();
    kvt_io_set(kvt_io_fault());
    assert_false(kvt_stream_fast_ok());
    run_read_case(path, want, &(struct read_case){0});
    assert_true(kvt_fault_calls(KVT_FAULT_PREAD) > 0); /* every byte came through the vtable */
    /* an injected EIO surfaces with its offset */
    int fd = open(path, O_RDONLY);
    struct kvt_fault_rule rule = {.op = KVT_FAULT_PREAD, .nth = 2, .err = EIO};
    assert_int_equal(kvt_fault_arm(&rule), 0);
    struct kvt_rstream *s;
    assert_int_equal(kvt_rstream_open(fd, ranges, sizeof(ranges) / sizeof(ranges[0]), NULL, &s), 0);
    uint8_t *dst = malloc(FILE_BYTES);
    uint64_t at = 0;
    assert_int_equal(kvt_rstream_read(s, dst, 16384, NULL, NULL, &at), 0);
    assert_int_equal(kvt_rstream_read(s, dst, 100000, NULL, NULL, &at), -EIO);
    assert_int_equal(at, 16384);
    kvt_rstream_close(s);
    kvt_io_set(NULL);
    kvt_fault_reset();
    close(fd);
    free(dst);
    free(want);
    free(path);
}

struct wpiece {
    uint64_t off;
    size_t len;
};

/* Pieces the way the format writes: slots at 16 KiB multiples, some split into runs. */
static const struct wpiece wpieces[] = {
    {16384, 5000},   {21384, 70000},   {98304, 1},       {114688, 3000000},
    {3129344, 4096}, {3145728, 12345}, {3158073, 77777}, {3276800, 1234567},
};

/* @p gated: the way a gated save writes: room made before each write, the tail flushed
 * before the wait for the device. */
static void run_write_case(const char *engine, size_t chunk, bool no_direct, bool plain, bool gated)
{
    char *path = strf("%s/write.bin", dir);
    unlink(path);
    size_t np = sizeof(wpieces) / sizeof(wpieces[0]);
    uint64_t end = wpieces[np - 1].off + wpieces[np - 1].len;
    uint8_t *src = malloc(end), *want = calloc(1, end);
    uint64_t seed = 99;
    fill_random(src, end, &seed);
    for (size_t i = 0; i < np; i++)
        memcpy(want + wpieces[i].off, src + wpieces[i].off, wpieces[i].len);
    if (plain) {
        kvt_fault_reset();
        kvt_io_set(kvt_io_fault());
    }
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0644);
    assert_true(fd >= 0);
    /* the header block, written first through the vtable as the format does it last */
    assert_int_equal(kvt_io_write_full(fd, src, 16384, 0), 0);
    memcpy(want, src, 16384);
    struct kvt_wstream *w;
    struct kvt_stream_opts o = {
        .chunk = chunk, .depth = 3, .no_direct = no_direct, .engine = engine};
    assert_int_equal(kvt_wstream_open(fd, &o, &w), 0);
    struct kvt_wyhash_state h;
    kvt_wyhash_init(&h, 0);
    for (size_t i = 0; i < np; i++) {
        if (gated)
            assert_int_equal(kvt_wstream_room(w, wpieces[i].len), 0);
        assert_int_equal(
            kvt_wstream_write(w, wpieces[i].off, src + wpieces[i].off, wpieces[i].len, &h, NULL),
            0);
    }
    assert_int_equal(kvt_wstream_write(w, 0, src, 1, NULL, NULL), -EINVAL); /* backwards */
    if (gated)
        assert_int_equal(kvt_wstream_flush(w, NULL), 0);
    assert_int_equal(kvt_wstream_finish(w, NULL), 0);
    assert_int_equal(kvt_wstream_end(w), end);
    kvt_wstream_free(w);
    close(fd);
    kvt_io_set(NULL);
    /* the hash covers exactly the written bytes, in order */
    struct kvt_wyhash_state h2;
    kvt_wyhash_init(&h2, 0);
    for (size_t i = 0; i < np; i++)
        kvt_wyhash_update(&h2, src + wpieces[i].off, wpieces[i].len);
    assert_true(kvt_wyhash_final(&h) == kvt_wyhash_final(&h2));
    size_t n;
    uint8_t *got = read_file(path, &n);
    assert_non_null(got);
    assert_int_equal(n, end);
    assert_memory_equal(got, want, end);
    free(got);
    free(src);
    free(want);
    free(path);
}

static void test_write_matrix(void **state)
{
    (void)state;
    const size_t chunks[] = {0, 8192, 65536 + 4096};
    for (size_t k = 0; k < 3; k++)
        for (int gated = 0; gated < 2; gated++)
            run_write_case(NULL, chunks[k], false, false, gated);
    /* an engine asked for is accepted; the writes still go through the threads */
    run_write_case("io_uring", 0, false, false, true);
    for (int gated = 0; gated < 2; gated++) {
        run_write_case(NULL, 0, true, false, gated);
        run_write_case(NULL, 0, false, true, gated);
    }
}

static void test_write_errors(void **state)
{
    (void)state;
    char *path = strf("%s/efbig.bin", dir);
    /* the device refuses bytes past a file-size limit: EFBIG must come back, with an offset */
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    for (int direct = 0; direct < 2; direct++) {
        unlink(path);
        int fd = open(path, O_CREAT | O_WRONLY, 0644);
        struct kvt_wstream *w;
        assert_int_equal(
            kvt_wstream_open(fd, &(struct kvt_stream_opts){.no_direct = !direct, .chunk = 65536},
                             &w),
            0);
        lim = old;
        lim.rlim_cur = 1 << 20;
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
        uint8_t *src = calloc(1, 4 << 20);
        int rc = kvt_wstream_write(w, 0, src, 4 << 20, NULL, NULL);
        uint64_t at = 0;
        if (rc == 0)
            rc = kvt_wstream_finish(w, &at);
        else
            assert_int_equal(kvt_wstream_finish(w, &at), rc); /* sticky */
        assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
        assert_int_equal(rc, -EFBIG);
        /* direct: whichever request past the limit completed first (8 in flight) */
        assert_true(direct ? at >= (1u << 20) - 65536 && at <= (1u << 20) + 8 * 65536
                           : at <= (1u << 20));
        assert_int_equal(kvt_wstream_write(w, 8 << 20, src, 1, NULL, NULL), -EFBIG);
        kvt_wstream_free(w);
        free(src);
        close(fd);
    }
    signal(SIGXFSZ, prev);
    kvt_wstream_free(NULL);
    free(path);
}

/*
 * Staging sits on huge pages (a 2 MiB boundary, VmFlags "hg"), so that a direct request over
 * it is a few physically contiguous segments, not one per 4 KiB page; with huge pages off it
 * does not ask. Unusual sizes, so that the staging cache has no block of them yet.
 */
static void test_staging_huge_pages(void **state)
{
    (void)state;
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", R_OK) != 0)
        skip(); /* a kernel without transparent huge pages */
    const size_t sizes[2] = {(size_t)6 << 20, (size_t)10 << 20};
    for (int off = 0; off < 2; off++) {
        if (off)
            set_mem(true, false);
        uint8_t *p = kvt_staging_get(sizes[off]);
        set_mem(false, false);
        assert_non_null(p);
        char flags[512];
        vma_flags(p, flags, sizeof(flags));
        assert_true(flags[0] != '\0');
        if (!off)
            assert_int_equal((uintptr_t)p % ((uintptr_t)2 << 20), 0);
        if (off ? strstr(flags, " hg") != NULL : strstr(flags, " hg") == NULL)
            fail_msg("staging, huge pages %s: %s", off ? "0" : "unset", flags);
        memset(p, 0x3c, sizes[off]); /* every byte is usable */
        assert_int_equal(p[sizes[off] - 1], 0x3c);
        kvt_staging_put(p, sizes[off]);
    }
}

/* Under another io backend, short row blocks are gathered: one call per buffer-full. */
static void test_plain_gathers_small_pieces(void **state)
{
    (void)state;
    char *path = strf("%s/gather.bin", dir);
    uint8_t *want = make_file(path, 200000, 17);
    kvt_fault_reset();
    kvt_io_set(kvt_io_fault());
    int fd = open(path, O_RDWR);
    struct kvt_range r = {1000, 100000, NULL, NULL};
    struct kvt_rstream *s;
    assert_int_equal(kvt_rstream_open(fd, &r, 1, NULL, &s), 0);
    uint8_t got[100];
    for (int i = 0; i < 1000; i++) {
        assert_int_equal(kvt_rstream_read(s, got, 100, NULL, NULL, NULL), 0);
        assert_memory_equal(got, want + 1000 + i * 100, 100);
    }
    kvt_rstream_close(s);
    assert_true(kvt_fault_calls(KVT_FAULT_PREAD) <= 2);
    struct kvt_wstream *w;
    assert_int_equal(kvt_wstream_open(fd, NULL, &w), 0);
    uint64_t before = kvt_fault_calls(KVT_FAULT_PWRITE);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(
            kvt_wstream_write(w, 16384 + (uint64_t)i * 100, want + i * 100, 100, NULL, NULL), 0);
    assert_int_equal(kvt_wstream_finish(w, NULL), 0);
    kvt_wstream_free(w);
    assert_int_equal(kvt_fault_calls(KVT_FAULT_PWRITE) - before, 1);
    kvt_io_set(NULL);
    close(fd);
    size_t n;
    uint8_t *back = read_file(path, &n);
    assert_memory_equal(back + 16384, want, 100000);
    free(back);
    free(want);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_aq_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_matrix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_staged_between_places, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_engine_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_bad_ranges, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_short_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_fault_backend, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_matrix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_staging_huge_pages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plain_gathers_small_pieces, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
