/*
 * Writer and loader round trips for every cache kind and mixed lists (CACHES.md §11): save,
 * load with hash checks, save again gives identical files, slots and scalars, also after an
 * append + trim on the restored cache; restore capacity; strided and large tensors
 * through the chunked paths; loads of files in the page cache spread over several cores; the
 * gated N + 1 write steps; argument and cap errors.
 */
#include "support/support.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "settings/settings.h"
#include "threads/par_for.h"
#include "format/format.h"
#include "io/stream.h"

#define CREATED 1751500000000LL

struct geom {
    int64_t heads, head_dim, tokens, max_size;
    int dtype;
};

/* Append @p rows random rows of @p kind's tensors (FORMAT.md §5 shapes). */
static void append_rows(kvt_cache *c, const struct geom *g, int64_t rows, uint64_t *rng)
{
    struct kvt_cache_info in;
    kvt_cache_get_info(c, &in);
    int64_t D = g->head_dim, last[6];
    int dt[6], n;
    switch (in.kind) {
    case KVT_KIND_KV:
    case KVT_KIND_ROTATING:
        n = 2;
        last[0] = D;
        last[1] = D / 2; /* Dv != Dk */
        dt[0] = dt[1] = g->dtype;
        if (in.kind == KVT_KIND_ROTATING)
            last[1] = D;
        break;
    case KVT_KIND_QKV:
    case KVT_KIND_ROTATING_QKV:
        n = 6;
        for (int k = 0; k < 6; k += 3) {
            last[k] = D * in.bits / 32;
            last[k + 1] = last[k + 2] = D / in.group_size;
            dt[k] = KVT_UINT32;
            dt[k + 1] = dt[k + 2] = g->dtype;
        }
        break;
    case KVT_KIND_TURBOQUANT:
        n = 5;
        last[0] = D * in.k_bits / 8;
        last[1] = last[2] = last[4] = D / 32;
        last[3] = D * in.v_bits / 8;
        dt[0] = in.k_bits == 8 ? KVT_INT8 : KVT_UINT8;
        dt[1] = dt[2] = dt[4] = KVT_FLOAT16;
        dt[3] = KVT_UINT8;
        break;
    default: fail_msg("append_rows: kind %d", in.kind); return;
    }
    struct kvt_tensor t[6];
    for (int k = 0; k < n; k++) {
        int64_t shape[4] = {1, g->heads, rows, last[k]};
        synth_random_tensor(&t[k], dt[k], 4, shape, rng);
    }
    int rc = kvt_cache_append(c, t, n);
    if (rc)
        fail_msg("append: %s", kvt_last_error());
    for (int k = 0; k < n; k++)
        kvt_tensor_release(&t[k]);
}

static kvt_cache *make_cache(int kind, const struct geom *g, uint64_t *rng)
{
    struct kvt_cache_info p = {.kind = kind, .max_size = g->max_size};
    if (kind == KVT_KIND_QKV || kind == KVT_KIND_ROTATING_QKV) {
        p.group_size = kind == KVT_KIND_QKV ? 32 : 64;
        p.bits = kind == KVT_KIND_QKV ? 4 : 8;
    }
    if (kind == KVT_KIND_TURBOQUANT) {
        p.k_bits = 8;
        p.v_bits = 3;
    }
    kvt_cache *c;
    assert_int_equal(kvt_cache_new(&p, &c), 0);
    if (kind == KVT_KIND_SSM) {
        struct kvt_tensor conv, rec;
        int64_t cs[3] = {1, 3, g->heads * g->head_dim}, rs[4] = {1, g->heads, 8, 16};
        synth_random_tensor(&conv, g->dtype, 3, cs, rng);
        synth_random_tensor(&rec, KVT_FLOAT32, 4, rs, rng);
        assert_int_equal(kvt_cache_ssm_update(c, &conv, &rec, g->tokens), 0);
        kvt_tensor_release(&conv);
        kvt_tensor_release(&rec);
        return c;
    }
    /* a prefill chunk, then single decode steps */
    int64_t pre = g->tokens > 3 ? g->tokens - 3 : 1;
    append_rows(c, g, pre, rng);
    for (int64_t t = pre; t < g->tokens; t++)
        append_rows(c, g, 1, rng);
    return c;
}

struct owned_entry {
    struct kvt_entry e;
    kvt_cache *caches[8];
    int32_t tokens[4096];
};

static void make_entry(struct owned_entry *o, const int *kinds, size_t n, const struct geom *g,
                       uint64_t seed)
{
    uint64_t rng = seed;
    memset(o, 0, sizeof(*o));
    for (int64_t i = 0; i < g->tokens; i++)
        o->tokens[i] = (int32_t)(xs64(&rng) % 50000);
    for (size_t i = 0; i < n; i++)
        o->caches[i] = make_cache(kinds[i], g, &rng);
    o->e = (struct kvt_entry){
        .tokens = o->tokens,
        .n_tokens = (size_t)g->tokens,
        .caches = o->caches,
        .n_caches = n,
        .meta = {"rt/model", "fp-rt", "tk-rt", "ns-a"},
    };
}

static void free_entry(struct owned_entry *o)
{
    for (size_t i = 0; i < o->e.n_caches; i++)
        kvt_cache_free(o->caches[i]);
}

static char *save(const struct kvt_entry *e, const char *name)
{
    char *path = strf("%s/%s", test_dir, name);
    struct kvt_save_opts opts = {.created_at = CREATED, .no_sync = true};
    uint64_t bytes = 0, planned = 0;
    int rc = kvt_file_save(path, e, &opts, &bytes);
    if (rc)
        fail_msg("save %s: %s", name, kvt_last_error());
    assert_int_equal(kvt_file_plan_size(e, &planned), 0);
    assert_int_equal(bytes, planned);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal((uint64_t)st.st_size, bytes);
    return path;
}

static void expect_same_file(const char *a, const char *b)
{
    size_t na, nb;
    uint8_t *x = read_file(a, &na), *y = read_file(b, &nb);
    assert_non_null(x);
    assert_non_null(y);
    assert_int_equal(na, nb);
    if (memcmp(x, y, na))
        fail_msg("%s and %s differ", a, b);
    free(x);
    free(y);
}

/* Slots and scalars of two files agree (bytes, shape, dtype, hash). */
static void expect_same_slots(const char *a, const char *b)
{
    struct kvt_header *ha, *hb;
    assert_int_equal(kvt_file_read_header(a, NULL, &ha), 0);
    assert_int_equal(kvt_file_read_header(b, NULL, &hb), 0);
    assert_int_equal(ha->n_caches, hb->n_caches);
    for (size_t i = 0; i < ha->n_caches; i++) {
        assert_memory_equal(&ha->caches[i].info, &hb->caches[i].info, sizeof(ha->caches[i].info));
        assert_int_equal(ha->caches[i].n_slots, hb->caches[i].n_slots);
        for (int j = 0; j < ha->caches[i].n_slots; j++) {
            const struct kvt_slot *x = &ha->caches[i].slots[j], *y = &hb->caches[i].slots[j];
            assert_int_equal(x->bytes, y->bytes);
            assert_int_equal(x->dtype, y->dtype);
            assert_int_equal(x->rank, y->rank);
            assert_memory_equal(x->shape, y->shape, sizeof(x->shape));
            assert_int_equal(x->hash, y->hash);
        }
    }
    kvt_header_free(ha);
    kvt_header_free(hb);
}

static struct kvt_entry *load(const char *path)
{
    struct kvt_entry *e;
    int rc = kvt_file_load(path, NULL, &e, NULL);
    if (rc)
        fail_msg("load %s: %s", path, kvt_last_error());
    return e;
}

static bool token_axis_kind(int kind)
{
    return kind == KVT_KIND_KV || kind == KVT_KIND_QKV || kind == KVT_KIND_TURBOQUANT;
}

/* save -> load -> save, and after append 1 + trim 1 on the restored caches. */
static void roundtrip(const int *kinds, size_t n, const struct geom *g, const char *tag)
{
    struct owned_entry o;
    make_entry(&o, kinds, n, g, 77);
    char *n1 = strf("%s-a.mlxkv", tag), *n2 = strf("%s-b.mlxkv", tag),
         *n3 = strf("%s-c.mlxkv", tag);
    char *a = save(&o.e, n1);
    struct kvt_entry *e = load(a);
    char *b = save(e, n2);
    expect_same_file(a, b);
    expect_same_slots(a, b);

    bool trimmable = true;
    for (size_t i = 0; i < n; i++)
        trimmable &= token_axis_kind(kinds[i]);
    if (trimmable) {
        uint64_t rng = 5;
        for (size_t i = 0; i < e->n_caches; i++) {
            append_rows(e->caches[i], g, 1, &rng);
            assert_int_equal(kvt_cache_trim(e->caches[i], 1), 0);
        }
        char *c = save(e, n3);
        expect_same_file(a, c);
        free(c);
    }
    kvt_entry_free(e);
    free_entry(&o);
    free(a);
    free(b);
    free(n1);
    free(n2);
    free(n3);
}

static void test_each_kind(void **state)
{
    (void)state;
    static const char *const names[KVT_KIND_COUNT] = {"kv", "rot", "qkv", "rqkv", "ssm", "tq"};
    const struct geom small = {
        .heads = 2, .head_dim = 64, .tokens = 5, .max_size = 8, .dtype = KVT_BFLOAT16};
    const struct geom wrapped = {
        .heads = 3, .head_dim = 64, .tokens = 300, .max_size = 16, .dtype = KVT_FLOAT16};
    const struct geom open_ring = {
        .heads = 1, .head_dim = 128, .tokens = 20, .max_size = 512, .dtype = KVT_FLOAT32};
    for (int k = 0; k < KVT_KIND_COUNT; k++) {
        char *t1 = strf("%s-small", names[k]), *t2 = strf("%s-wrapped", names[k]),
             *t3 = strf("%s-open", names[k]);
        roundtrip(&k, 1, &small, t1);
        roundtrip(&k, 1, &wrapped, t2);
        roundtrip(&k, 1, &open_ring, t3);
        free(t1);
        free(t2);
        free(t3);
    }
}

static void test_mixed(void **state)
{
    (void)state;
    const int all[6] = {KVT_KIND_KV,         KVT_KIND_ROTATING,     KVT_KIND_QKV,
                        KVT_KIND_TURBOQUANT, KVT_KIND_ROTATING_QKV, KVT_KIND_SSM};
    const int token_kinds[5] = {KVT_KIND_TURBOQUANT, KVT_KIND_KV, KVT_KIND_QKV, KVT_KIND_KV,
                                KVT_KIND_TURBOQUANT};
    const struct geom g = {
        .heads = 2, .head_dim = 64, .tokens = 37, .max_size = 8, .dtype = KVT_BFLOAT16};
    roundtrip(all, 6, &g, "mixed");
    roundtrip(token_kinds, 5, &g, "tokens");
}

/* Every tensor of token-axis cache @p c holds @p cap rows, those past its offset zero. */
static void expect_zero_slack(kvt_cache *c, int64_t cap)
{
    struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
    int n = kvt_cache_state(c, t);
    assert_true(n > 0);
    size_t offset = (size_t)kvt_cache_offset(c);
    for (int j = 0; j < n; j++) {
        /* the rows past offset of every [B, H] block are zero */
        const uint8_t *p = kvt_buf_data(t[j].buf);
        size_t row = kvt_dtype_size(t[j].dtype) * (size_t)t[j].shape[3];
        size_t blocks = (size_t)(t[j].shape[0] * t[j].shape[1]);
        assert_int_equal(kvt_buf_size(t[j].buf), blocks * (size_t)cap * row);
        for (size_t b = 0; b < blocks; b++)
            for (size_t x = offset * row; x < (size_t)cap * row; x++)
                if (p[b * (size_t)cap * row + x])
                    fail_msg("slack byte %zu of block %zu is not zero", x, b);
        kvt_tensor_release(&t[j]);
    }
}

/*
 * Restore capacity: the entry's rows and an eighth (rounded up, at least one row), at most
 * up to the next 256-row step; zero slack, in-place first append.
 */
static void test_restore_capacity(void **state)
{
    (void)state;
    const int64_t offsets[] = {1, 8, 9, 255, 256, 300, 1000, 2048};
    const int64_t caps[] = {2, 9, 11, 256, 288, 338, 1024, 2304};
    const int kinds[3] = {KVT_KIND_KV, KVT_KIND_QKV, KVT_KIND_TURBOQUANT};
    for (size_t oi = 0; oi < sizeof(offsets) / sizeof(offsets[0]); oi++) {
        for (int ki = 0; ki < 3; ki++) {
            struct geom g = {
                .heads = 2, .head_dim = 64, .tokens = offsets[oi], .dtype = KVT_BFLOAT16};
            struct owned_entry o;
            make_entry(&o, &kinds[ki], 1, &g, 3);
            char *a = save(&o.e, "cap.mlxkv");
            struct kvt_entry *e = load(a);
            kvt_cache *c = e->caches[0];
            int64_t cap = caps[oi];
            assert_int_equal(kvt_cache_capacity(c), cap);
            assert_int_equal(kvt_cache_offset(c), offsets[oi]);

            struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
            int n = kvt_cache_state(c, t);
            assert_true(n > 0);
            void *before = kvt_buf_data(t[0].buf);
            for (int j = 0; j < n; j++)
                kvt_tensor_release(&t[j]);
            expect_zero_slack(c, cap);
            uint64_t rng = 11;
            append_rows(c, &g, 1, &rng);
            assert_int_equal(kvt_cache_capacity(c), cap);
            n = kvt_cache_state(c, t);
            assert_ptr_equal(kvt_buf_data(t[0].buf), before); /* written in place */
            for (int j = 0; j < n; j++)
                kvt_tensor_release(&t[j]);
            kvt_entry_free(e);
            free_entry(&o);
            free(a);
        }
    }
}

/* A kv cache trimmed to offset 0: empty slots, last tensor empty, file extended to F. */
static void test_empty_tensors(void **state)
{
    (void)state;
    struct geom g = {.heads = 2, .head_dim = 8, .tokens = 4, .dtype = KVT_BFLOAT16};
    const int kinds[2] = {KVT_KIND_KV, KVT_KIND_KV};
    struct owned_entry o;
    make_entry(&o, kinds, 2, &g, 9);
    assert_int_equal(kvt_cache_trim(o.caches[1], 4), 0);
    char *a = save(&o.e, "empty-last.mlxkv");
    struct kvt_header *h;
    assert_int_equal(kvt_file_read_header(a, NULL, &h), 0);
    const struct kvt_slot *s = &h->caches[1].slots[1];
    assert_int_equal(s->bytes, 0);
    assert_int_equal(s->off, 32768);
    assert_int_equal(h->file_size, (uint64_t)h->data_start + s->off); /* extended to F */
    assert_int_equal(s->hash, kvt_wyhash(0, NULL, 0));
    assert_false(kvt_header_is_indexable(h));
    kvt_header_free(h);
    struct kvt_entry *e = load(a);
    assert_int_equal(kvt_cache_offset(e->caches[1]), 0);
    assert_int_equal(kvt_cache_capacity(e->caches[1]), 1);
    char *b = save(e, "empty-last-2.mlxkv");
    expect_same_file(a, b);
    kvt_entry_free(e);
    free_entry(&o);
    free(a);
    free(b);
}

/* Tensors through both chunked paths: many small runs across chunk boundaries, and runs of
 * 64 KiB or more written and read in place. */
/*
 * The K and V state tensors of kv caches @p a and @p b hold the same rows (@p strided: those
 * of @p a are strided views). @return the byte size of the K tensor.
 */
static size_t expect_same_rows(kvt_cache *a, kvt_cache *b, bool strided)
{
    struct kvt_tensor src[2], dst[2];
    size_t first = 0;
    assert_int_equal(kvt_cache_state(a, src), 2);
    assert_int_equal(kvt_cache_state(b, dst), 2);
    for (int j = 0; j < 2; j++) {
        if (strided)
            assert_false(kvt_tensor_is_contiguous(&src[j]));
        struct kvt_tensor cs, cd;
        assert_int_equal(kvt_tensor_contiguous(&cs, &src[j]), 0);
        assert_int_equal(kvt_tensor_contiguous(&cd, &dst[j]), 0);
        assert_int_equal(kvt_tensor_nbytes(&cs), kvt_tensor_nbytes(&cd));
        assert_memory_equal(kvt_buf_data(cs.buf), kvt_buf_data(cd.buf), kvt_tensor_nbytes(&cs));
        if (j == 0)
            first = kvt_tensor_nbytes(&cs);
        kvt_tensor_release(&cs);
        kvt_tensor_release(&cd);
        kvt_tensor_release(&src[j]);
        kvt_tensor_release(&dst[j]);
    }
    return first;
}

static void test_strided_and_large(void **state)
{
    (void)state;
    const struct geom many = {.heads = 288, .head_dim = 32, .tokens = 250, .dtype = KVT_FLOAT32};
    const struct geom large = {.heads = 2, .head_dim = 256, .tokens = 1100, .dtype = KVT_FLOAT32};
    const int kv = KVT_KIND_KV;
    roundtrip(&kv, 1, &many, "many-runs");
    roundtrip(&kv, 1, &large, "large-runs");

    /* the restored bytes equal the source rows */
    struct owned_entry o;
    make_entry(&o, &kv, 1, &many, 21);
    char *a = save(&o.e, "many-check.mlxkv");
    struct kvt_entry *e = load(a);
    /* crosses a chunk boundary */
    assert_true(expect_same_rows(o.caches[0], e->caches[0], true) > KVT_IO_CHUNK);
    kvt_entry_free(e);
    free_entry(&o);
    free(a);
}

/* Drop a file's pages so that the next load reads the device (O_DIRECT where taken). */
static void make_cold(const char *path)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(fsync(fd), 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
}

/*
 * Cold loads read whole blocks straight into the restored buffers: a flipped byte inside such
 * a block (and one in a row block's partial edge) fails L3 with everything freed, and the
 * intact file restores the source rows exactly.
 */
static void test_cold_load_in_place(void **state)
{
    (void)state;
    /* row blocks of 1100 x 256 floats (whole blocks), and of 250 x 32 floats (edges too) */
    const struct geom aligned = {.heads = 2, .head_dim = 256, .tokens = 1100, .dtype = KVT_FLOAT32};
    const struct geom ragged = {.heads = 64, .head_dim = 32, .tokens = 250, .dtype = KVT_FLOAT32};
    const struct geom *gs[2] = {&aligned, &ragged};
    const int kv = KVT_KIND_KV;
    for (int g = 0; g < 2; g++) {
        struct owned_entry o;
        make_entry(&o, &kv, 1, gs[g], 31 + g);
        char *path = save(&o.e, "in-place.mlxkv");
        make_cold(path);
        struct kvt_entry *e = load(path);
        expect_same_rows(o.caches[0], e->caches[0], false);
        kvt_entry_free(e);

        struct kvt_header *h;
        assert_int_equal(kvt_file_read_header(path, NULL, &h), 0);
        const struct kvt_slot *v = &h->caches[0].slots[1];
        uint64_t at[2] = {kvt_slot_abs(h, v) + v->bytes / 2 / 4096 * 4096 + 100, /* a whole block */
                          kvt_slot_abs(h, v) + v->bytes - 1};                    /* the tail */
        kvt_header_free(h);
        for (int k = 0; k < 2; k++) {
            int fd = open(path, O_RDWR);
            uint8_t b;
            assert_int_equal(pread(fd, &b, 1, (off_t)at[k]), 1);
            b ^= 0x40;
            assert_int_equal(pwrite(fd, &b, 1, (off_t)at[k]), 1);
            close(fd);
            make_cold(path);
            struct kvt_entry *bad = (void *)1;
            assert_int_equal(kvt_file_load(path, NULL, &bad, NULL), KVT_E_CORRUPT);
            assert_null(bad);
            assert_non_null(strstr(kvt_last_error(), "L3"));
            fd = open(path, O_RDWR);
            b ^= 0x40;
            assert_int_equal(pwrite(fd, &b, 1, (off_t)at[k]), 1);
            close(fd);
        }
        unlink(path);
        free(path);
        free_entry(&o);
    }
}

/* Read a file so that its pages are in the page cache; whether they all are. */
static bool make_warm(const char *path)
{
    size_t n;
    free(read_file(path, &n));
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    bool cached = kvt_stream_cached(fd, 0, n);
    close(fd);
    return cached;
}

/* Whether every page of the file at @p path is in the page cache. */
static bool is_cached(const char *path)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &st), 0);
    bool cached = kvt_stream_cached(fd, 0, (uint64_t)st.st_size);
    close(fd);
    return cached;
}

/*
 * The page cache rule: a save with keep_cache (and a store with keep_saved_cached) leaves
 * the file resident; a read of resident bytes takes the page cache, never O_DIRECT (which
 * would go to the disk for bytes memory holds), and a cold one reads directly.
 */
static void test_page_cache_rule(void **state)
{
    (void)state;
    const struct geom g = {.heads = 8, .head_dim = 128, .tokens = 1100, .dtype = KVT_FLOAT32};
    const int kinds[2] = {KVT_KIND_KV, KVT_KIND_KV};
    struct owned_entry o;
    make_entry(&o, kinds, 2, &g, 43);
    char *path = strf("%s/kept.mlxkv", test_dir);
    struct kvt_save_opts keep = {.no_sync = true, .keep_cache = true, .drop_cache = true};
    assert_int_equal(kvt_file_save(path, &o.e, &keep, NULL), 0);
    bool probe = kvt_stream_fast_ok() && make_warm(path); /* cachestat works here */
    if (probe) {
        make_cold(path);
        unlink(path);
        assert_int_equal(kvt_file_save(path, &o.e, &keep, NULL), 0);
        assert_true(is_cached(path));
    }
    int fd = open(path, O_RDONLY);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    struct kvt_range r = {0, (uint64_t)st.st_size, NULL, NULL};
    if (probe) {
        assert_false(kvt_read_choose(fd, &r, 1, NULL, NULL).direct);
        make_cold(path);
        assert_int_equal(kvt_read_choose(fd, &r, 1, NULL, NULL).direct, kvt_mem_direct());
    }
    close(fd);

    /* through a store */
    struct kvt_store_opts so;
    store_opts_for(&so, "m", "fp-kept", "tk");
    so.keep_saved_cached = true;
    kvt_store *s;
    char *dir = strf("%s/kept-store", test_dir);
    assert_int_equal(kvt_store_open(dir, &so, &s), 0);
    assert_int_equal(kvt_store_put(s, &o.e, NULL, NULL), 0);
    struct kvt_store_record *v;
    size_t nv;
    assert_int_equal(kvt_store_list(s, &v, &nv), 0);
    assert_int_equal(nv, 1);
    if (probe)
        assert_true(is_cached(v[0].path));
    kvt_store_list_free(v);
    kvt_store_close(s);
    free(dir);
    unlink(path);
    free(path);
    free_entry(&o);
}

static void flip_byte(const char *path, uint64_t at)
{
    int fd = open(path, O_RDWR);
    uint8_t b;
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &b, 1, (off_t)at), 1);
    b ^= 0x21;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)at), 1);
    close(fd);
}

/*
 * A file entirely in the page cache loads on several cores (helper threads start; not with
 * no_parallel, nor for a cold file) and restores the same state either way; a corrupt
 * file fails with the message of the first bad slot in header order, as a load in order
 * does; a load that does not keep the cache drops the file's pages.
 */
static void test_warm_load_parallel(void **state)
{
    (void)state;
    const struct geom g = {.heads = 8, .head_dim = 128, .tokens = 1100, .dtype = KVT_FLOAT32};
    const int kinds[4] = {KVT_KIND_KV, KVT_KIND_QKV, KVT_KIND_KV, KVT_KIND_SSM};
    struct owned_entry o;
    make_entry(&o, kinds, 4, &g, 41);
    char *path = save(&o.e, "warm.mlxkv");
    struct kvt_expect keep = {.keep_cache = true};
    bool cores = kvt_par_cpus() > 1 && kvt_stream_fast_ok();
    char msg[2][512];
    for (int mode = 0; mode < 3; mode++) { /* warm; warm without parallel loads; cold */
        if (mode == 1)
            set_mem(false, true);
        bool cached = make_warm(path);
        if (mode == 2) {
            make_cold(path);
            cached = false;
        }
        unsigned long helpers = kvt_par_helpers_started();
        struct kvt_entry *e;
        if (kvt_file_load(path, &keep, &e, NULL))
            fail_msg("load: %s", kvt_last_error());
        bool parallel = kvt_par_helpers_started() > helpers;
        assert_int_equal(parallel, mode == 0 && cores && cached);
        expect_same_rows(o.caches[0], e->caches[0], false);
        char *again = save(e, "warm-again.mlxkv");
        expect_same_file(path, again);
        unlink(again);
        free(again);
        kvt_entry_free(e);
        set_mem(false, false);
    }

    struct kvt_header *h;
    assert_int_equal(kvt_file_read_header(path, NULL, &h), 0);
    const struct kvt_slot *first = &h->caches[0].slots[1], *later = &h->caches[2].slots[0];
    flip_byte(path, kvt_slot_abs(h, later) + 7);
    flip_byte(path, kvt_slot_abs(h, first) + first->bytes - 3);
    kvt_header_free(h);
    for (int mode = 0; mode < 2; mode++) {
        if (mode == 1)
            set_mem(false, true);
        make_warm(path);
        struct kvt_entry *bad = (void *)1;
        assert_int_equal(kvt_file_load(path, &keep, &bad, NULL), KVT_E_CORRUPT);
        assert_null(bad);
        snprintf(msg[mode], sizeof(msg[mode]), "%s", kvt_last_error());
        set_mem(false, false);
    }
    assert_non_null(strstr(msg[0], "L3: tensor hash mismatch"));
    assert_non_null(strstr(msg[0], "caches[0].tensors[1]"));
    assert_string_equal(msg[0], msg[1]);

    /* a load leaves the pages of a resident file resident (the next restore reads them at
     * memory speed too); after a cold load, the pages it read are not kept */
    char *drop = save(&o.e, "warm-drop.mlxkv");
    if (make_warm(drop)) {
        kvt_entry_free(load(drop));
        assert_true(is_cached(drop));
        make_cold(drop);
        kvt_entry_free(load(drop));
        assert_false(is_cached(drop));
    }
    unlink(drop);
    free(drop);
    unlink(path);
    free(path);
    free_entry(&o);
}

struct gate {
    int calls, refuse_at, fail_at;
    char *tmp, *final;
    bool tmp_seen_after_first;
};

/* Fill every tensor buffer of @p e with @p byte and free it; returns the bytes they held. */
static size_t scribble_and_free(struct kvt_entry *e, int byte)
{
    size_t bytes = 0;
    for (size_t i = 0; i < e->n_caches; i++) {
        struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
        int n = kvt_cache_state(e->caches[i], t);
        for (int j = 0; j < n; j++) {
            memset(kvt_buf_data(t[j].buf), byte, kvt_buf_size(t[j].buf));
            bytes += kvt_buf_size(t[j].buf);
            kvt_tensor_release(&t[j]);
        }
    }
    kvt_entry_free(e);
    return bytes;
}

/* Load @p path with its pages in the page cache (@p warm) or dropped first. */
static struct kvt_entry *load_warm_or_cold(const char *path, bool warm)
{
    struct kvt_expect x = {.keep_cache = warm};
    struct kvt_entry *e;
    if (warm)
        make_warm(path);
    else
        make_cold(path);
    if (kvt_file_load(path, &x, &e, NULL))
        fail_msg("load: %s", kvt_last_error());
    return e;
}

/*
 * A restore whose tensors come from the buffer cache (the memory a freed entry left, full of
 * other bytes) gives the same state as one into fresh memory: the file's rows, zero slack.
 * Cold (the read stream) and warm (whole slots on several cores).
 */
static void test_restore_into_kept_buffers(void **state)
{
    (void)state;
    /* capacity 1280 rows: K tensors of 8 x 1280 x 256 x 4 bytes = 10 MiB, V of 5 MiB */
    const struct geom g = {.heads = 8, .head_dim = 256, .tokens = 1200, .dtype = KVT_FLOAT32};
    const int kinds[2] = {KVT_KIND_KV, KVT_KIND_KV};
    struct owned_entry o;
    make_entry(&o, kinds, 2, &g, 43);
    char *path = save(&o.e, "kept.mlxkv");
    size_t old = kvt_buf_cache_limit(0);
    kvt_buf_cache_limit((size_t)256 << 20);
    for (int warm = 0; warm < 2; warm++) {
        struct kvt_expect x = {.keep_cache = warm};
        struct kvt_entry *e;
        if (kvt_file_load(path, &x, &e, NULL))
            fail_msg("load: %s", kvt_last_error());
        size_t bytes = scribble_and_free(e, 0xa5);
        assert_int_equal(bytes, (size_t)30 << 20);
        assert_int_equal(kvt_buf_cache_bytes(), bytes);
        e = load_warm_or_cold(path, warm);
        assert_int_equal(kvt_buf_cache_bytes(), 0); /* every tensor took a kept buffer */
        for (int i = 0; i < 2; i++) {
            expect_zero_slack(e->caches[i], 1280);
            expect_same_rows(o.caches[i], e->caches[i], false);
        }
        char *again = save(e, "kept-again.mlxkv");
        expect_same_file(path, again);
        unlink(again);
        free(again);
        size_t before = kvt_buf_cache_bytes(); /* the comparisons' copies went there too */
        kvt_entry_free(e);
        assert_int_equal(kvt_buf_cache_bytes(), before + bytes);
        kvt_buf_cache_limit(0);
        kvt_buf_cache_limit((size_t)256 << 20);
    }
    kvt_buf_cache_limit(old);
    unlink(path);
    free(path);
    free_entry(&o);
}

/* Whole pages of the slack rows of cache @p c (capacity @p cap) that are resident. */
static size_t resident_slack_pages(kvt_cache *c, int64_t cap)
{
    struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
    int n = kvt_cache_state(c, t);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), offset = (size_t)kvt_cache_offset(c), count = 0;
    for (int j = 0; j < n; j++) {
        uintptr_t p = (uintptr_t)kvt_buf_data(t[j].buf);
        size_t row = kvt_dtype_size(t[j].dtype) * (size_t)t[j].shape[3];
        size_t blocks = (size_t)(t[j].shape[0] * t[j].shape[1]);
        for (size_t b = 0; b < blocks; b++) {
            uintptr_t lo = p + b * (size_t)cap * row + offset * row,
                      hi = lo - offset * row + cap * row;
            lo = (lo + pg - 1) & ~(uintptr_t)(pg - 1);
            hi &= ~(uintptr_t)(pg - 1);
            unsigned char v[1024];
            for (; lo < hi; lo += pg) {
                assert_int_equal(mincore((void *)lo, pg, v), 0);
                count += v[0] & 1;
            }
        }
        kvt_tensor_release(&t[j]);
    }
    return count;
}

/*
 * A restore into fresh memory (an empty buffer cache) leaves the capacity slack untouched:
 * the fresh pages are zero already, and faulting them in would only cost time and memory.
 * On 4 KiB pages (with huge pages the slack shares pages with the rows), cold and warm.
 */
static void test_restore_leaves_fresh_slack_untouched(void **state)
{
    (void)state;
    /* capacity 1280 rows: 80 slack rows of 1 KiB after each of 8 blocks of each tensor */
    const struct geom g = {.heads = 8, .head_dim = 256, .tokens = 1200, .dtype = KVT_FLOAT32};
    const int kinds[1] = {KVT_KIND_KV};
    struct owned_entry o;
    make_entry(&o, kinds, 1, &g, 47);
    char *path = save(&o.e, "fresh.mlxkv");
    size_t old = kvt_buf_cache_limit(0);
    set_mem(true, false);
    for (int warm = 0; warm < 2; warm++) {
        struct kvt_entry *e = load_warm_or_cold(path, warm);
        assert_int_equal(resident_slack_pages(e->caches[0], 1280), 0);
        expect_zero_slack(e->caches[0], 1280);
        expect_same_rows(o.caches[0], e->caches[0], false);
        kvt_entry_free(e);
    }
    set_mem(false, false);
    kvt_buf_cache_limit(old);
    unlink(path);
    free(path);
    free_entry(&o);
}

static int gate_run(void *engine, kvt_step_fn step, void *arg)
{
    struct gate *g = engine;
    g->calls++;
    if (g->calls == g->refuse_at)
        return KVT_E_REFUSED;
    int rc = step(arg);
    if (g->calls == 1)
        g->tmp_seen_after_first = access(g->tmp, F_OK) == 0 && access(g->final, F_OK) != 0;
    if (g->calls == g->fail_at)
        return 1; /* the engine reports a failure of its own after running the step */
    return rc;
}

static void test_gated_steps(void **state)
{
    (void)state;
    struct geom g = {.heads = 2, .head_dim = 64, .tokens = 6, .max_size = 8, .dtype = KVT_BFLOAT16};
    const int kinds[3] = {KVT_KIND_KV, KVT_KIND_QKV, KVT_KIND_SSM};
    struct owned_entry o;
    make_entry(&o, kinds, 3, &g, 4);
    const int n_tensors = 2 + 6 + 2;
    char *plain = save(&o.e, "plain.mlxkv");

    struct gate gt = {.tmp = strf("%s/gated.mlxkv.tmp", test_dir),
                      .final = strf("%s/gated.mlxkv", test_dir)};
    struct kvt_save_opts opts = {
        .created_at = CREATED, .no_sync = true, .run_exclusive = gate_run, .engine = &gt};
    assert_int_equal(kvt_file_save(gt.final, &o.e, &opts, NULL), 0);
    assert_int_equal(gt.calls, n_tensors + 1);
    assert_true(gt.tmp_seen_after_first);
    expect_same_file(plain, gt.final);

    for (int k = 1; k <= n_tensors + 1; k++) {
        unlink(gt.final);
        gt = (struct gate){.tmp = gt.tmp, .final = gt.final, .refuse_at = k};
        uint64_t bytes = 7;
        assert_int_equal(kvt_file_save(gt.final, &o.e, &opts, &bytes), KVT_E_REFUSED);
        assert_int_equal(bytes, 0);
        assert_int_equal(gt.calls, k);
        assert_int_not_equal(access(gt.tmp, F_OK), 0);
        assert_int_not_equal(access(gt.final, F_OK), 0);

        gt = (struct gate){.tmp = gt.tmp, .final = gt.final, .fail_at = k};
        int rc = kvt_file_save(gt.final, &o.e, &opts, NULL);
        assert_int_equal(rc, KVT_E_REFUSED);
        assert_int_not_equal(access(gt.tmp, F_OK), 0);
        /* publishing runs after the last gated step, so any gate failure leaves nothing */
        assert_int_not_equal(access(gt.final, F_OK), 0);
    }
    free(gt.tmp);
    free(gt.final);
    free(plain);
    free_entry(&o);
}

static int count_files(void)
{
    char *cmd = strf("ls -A '%s' | wc -l", test_dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    assert_int_equal(fscanf(p, "%d", &n), 1);
    pclose(p);
    free(cmd);
    return n;
}

/*
 * A header may claim huge heads and head dims at offset 0 (zero bytes in the file): the
 * restore slack is then bounded, so a 16 KiB file never makes a load allocate gigabytes.
 */
static void test_restore_slack_bounded_by_file(void **state)
{
    (void)state;
    const char *path = KVT_TEST_DIR "/../fuzz/corpus/load/bug-empty-kv-restore-capacity-8gib";
    struct kvt_header *h;
    assert_int_equal(kvt_file_read_header(path, NULL, &h), 0);
    uint64_t file_size = h->file_size;
    kvt_header_free(h);
    struct kvt_entry *e;
    assert_int_equal(kvt_file_load(path, NULL, &e, NULL), 0);
    assert_true(kvt_entry_bytes(e) <= 2 * file_size + (64u << 20));
    kvt_entry_free(e);

    /* an ordinary small layer (one row) still gets restore capacity: one row more */
    struct geom g = {.heads = 8, .head_dim = 128, .tokens = 0, .dtype = KVT_BFLOAT16};
    const int kinds[1] = {KVT_KIND_KV};
    struct owned_entry o;
    make_entry(&o, kinds, 1, &g, 9);
    char *saved = save(&o.e, "empty-layer.mlxkv");
    assert_int_equal(kvt_file_load(saved, NULL, &e, NULL), 0);
    assert_int_equal(kvt_cache_capacity(e->caches[0]), 2);
    kvt_entry_free(e);
    free(saved);
    free_entry(&o);
}

static void test_save_errors(void **state)
{
    (void)state;
    struct geom g = {.heads = 1, .head_dim = 8, .tokens = 3, .dtype = KVT_BFLOAT16};
    const int kv = KVT_KIND_KV;
    struct owned_entry o;
    make_entry(&o, &kv, 1, &g, 8);
    char *path = strf("%s/err.mlxkv", test_dir);
    uint64_t planned;
    assert_int_equal(kvt_file_plan_size(&o.e, &planned), 0);
    int before = count_files();

    struct kvt_save_opts opts = {.max_file_bytes = planned - 1, .no_sync = true};
    assert_int_equal(kvt_file_save(path, &o.e, &opts, NULL), KVT_E_TOO_LARGE);
    assert_int_equal(count_files(), before);
    opts.max_file_bytes = planned;
    assert_int_equal(kvt_file_save(path, &o.e, &opts, NULL), 0);
    unlink(path);

    /* an empty cache cannot be persisted */
    struct kvt_cache_info p = {.kind = KVT_KIND_KV};
    kvt_cache *empty;
    assert_int_equal(kvt_cache_new(&p, &empty), 0);
    struct kvt_entry e = o.e;
    kvt_cache *list[2] = {o.caches[0], empty};
    e.caches = list;
    e.n_caches = 2;
    assert_int_equal(kvt_file_save(path, &e, NULL, NULL), KVT_E_STATE);
    assert_int_equal(kvt_file_plan_size(&e, &planned), KVT_E_STATE);
    kvt_cache_free(empty);

    e = o.e;
    e.meta.model_id = "bad \xe2\x82";
    assert_int_equal(kvt_file_save(path, &e, NULL, NULL), -EINVAL);
    assert_non_null(strstr(kvt_last_error(), "modelId is not valid UTF-8"));
    e = o.e;
    e.n_caches = 0;
    assert_int_equal(kvt_file_save(path, &e, NULL, NULL), -EINVAL);
    e = o.e;
    o.tokens[1] = -3;
    assert_int_equal(kvt_file_save(path, &e, NULL, NULL), -EINVAL);
    o.tokens[1] = 3;
    assert_int_equal(count_files(), before);

    /* another writer's .tmp is never touched */
    char *tmp = strf("%s.tmp", path);
    assert_int_equal(write_file(tmp, "other", 5), 0);
    assert_int_equal(kvt_file_save(path, &o.e, NULL, NULL), -EEXIST);
    size_t n;
    uint8_t *b = read_file(tmp, &n);
    assert_int_equal(n, 5);
    free(b);
    unlink(tmp);
    free(tmp);

    char *nodir = strf("%s/missing/x.mlxkv", test_dir);
    assert_int_equal(kvt_file_save(nodir, &o.e, NULL, NULL), -ENOENT);
    free(nodir);
    assert_int_equal(kvt_file_save(NULL, &o.e, NULL, NULL), -EINVAL);
    assert_int_equal(kvt_file_save(path, NULL, NULL, NULL), -EINVAL);
    assert_int_equal(count_files(), before);

    /* absent metadata keys are omitted and read back as absent */
    e = o.e;
    e.meta = (struct kvt_meta){0};
    struct kvt_save_opts synced = {.drop_cache = true};
    assert_int_equal(kvt_file_save(path, &e, &synced, NULL), 0);
    struct kvt_header *h;
    assert_int_equal(kvt_file_read_header(path, NULL, &h), 0);
    assert_null(h->model_id);
    assert_null(h->ns);
    assert_true(h->created_at > 0);
    kvt_header_free(h);
    struct kvt_expect x = {.ns = ""};
    struct kvt_entry *le;
    assert_int_equal(kvt_file_load(path, &x, &le, NULL), 0); /* an absent ns reads as "" */
    kvt_entry_free(le);
    x = (struct kvt_expect){.model_id = "m"};
    assert_int_equal(kvt_file_load(path, &x, &le, NULL), KVT_E_MISMATCH);
    assert_non_null(strstr(kvt_last_error(), "L1: modelId mismatch (file (absent), expected"));

    /* replacing an existing file */
    assert_int_equal(kvt_file_save(path, &o.e, NULL, NULL), 0);
    assert_int_equal(kvt_file_verify(path, NULL), 0);
    unlink(path);
    free(path);
    free_entry(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_kind),
        cmocka_unit_test(test_mixed),
        cmocka_unit_test(test_restore_capacity),
        cmocka_unit_test(test_empty_tensors),
        cmocka_unit_test(test_strided_and_large),
        cmocka_unit_test(test_cold_load_in_place),
        cmocka_unit_test(test_warm_load_parallel),
        cmocka_unit_test(test_page_cache_rule),
        cmocka_unit_test(test_restore_into_kept_buffers),
        cmocka_unit_test(test_restore_leaves_fresh_slack_untouched),
        cmocka_unit_test(test_gated_steps),
        cmocka_unit_test(test_save_errors),
        cmocka_unit_test(test_restore_slack_bounded_by_file),
    };
    return cmocka_run_group_tests(tests, test_dir_setup, test_dir_teardown);
}
