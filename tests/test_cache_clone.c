/*
 * Clones, shared views and entries (CACHES.md §13): isolation in both directions for every
 * kind (checked against control caches that never shared anything), disjoint appends staying
 * in place, copy-on-write after a trim into a shared region, sole-owner appends, views that
 * outlive later writes, wrapped engine memory, entry cloning and its failure paths, and a
 * clone read on another thread while the donor keeps appending.
 */
#include "support/support.h"

#include "tensor/alloc.h"
#include "tensor/tensor_parts.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct spec {
    const char *name;
    struct kvt_cache_info p;
    int nt;
    int dtype[KVT_MAX_CACHE_TENSORS];
    int64_t last[KVT_MAX_CACHE_TENSORS];
    int64_t b, h;
};

static const struct spec specs[] = {
    {"kv", {.kind = KVT_KIND_KV}, 2, {KVT_BFLOAT16, KVT_BFLOAT16}, {8, 4}, 1, 2},
    {"qkv",
     {.kind = KVT_KIND_QKV, .group_size = 32, .bits = 4},
     6,
     {KVT_UINT32, KVT_BFLOAT16, KVT_BFLOAT16, KVT_UINT32, KVT_BFLOAT16, KVT_BFLOAT16},
     {8, 2, 2, 8, 2, 2},
     2,
     2},
    {"turboquant",
     {.kind = KVT_KIND_TURBOQUANT, .k_bits = 8, .v_bits = 4},
     5,
     {KVT_INT8, KVT_FLOAT16, KVT_FLOAT16, KVT_UINT8, KVT_FLOAT16},
     {64, 2, 2, 32, 2},
     1,
     2},
    {"rotating",
     {.kind = KVT_KIND_ROTATING, .max_size = 8},
     2,
     {KVT_FLOAT16, KVT_FLOAT16},
     {8, 8},
     1,
     2},
    {"rotating-big",
     {.kind = KVT_KIND_ROTATING, .max_size = 400},
     2,
     {KVT_BFLOAT16, KVT_BFLOAT16},
     {4, 4},
     1,
     1},
    {"rotating-qkv",
     {.kind = KVT_KIND_ROTATING_QKV, .max_size = 16, .group_size = 64, .bits = 2},
     6,
     {KVT_UINT32, KVT_FLOAT32, KVT_FLOAT32, KVT_UINT32, KVT_FLOAT32, KVT_FLOAT32},
     {8, 2, 2, 8, 2, 2},
     1,
     2},
};
#define N_SPECS (sizeof(specs) / sizeof(specs[0]))

static bool is_step(int kind)
{
    return kind == KVT_KIND_KV || kind == KVT_KIND_QKV || kind == KVT_KIND_TURBOQUANT;
}

static uint8_t row_byte(int64_t id, int arr, int64_t b, int64_t h, int64_t k)
{
    uint64_t x = (uint64_t)id * 0x9E3779B97F4A7C15ull ^ (uint64_t)arr << 56 ^ (uint64_t)b << 48 ^
                 (uint64_t)h << 40 ^ (uint64_t)k;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (uint8_t)(x | 1);
}

static void make_input(const struct spec *s, int64_t first_id, int64_t l, struct kvt_tensor *t)
{
    for (int i = 0; i < s->nt; i++) {
        int64_t shape[4] = {s->b, s->h, l, s->last[i]};
        assert_int_equal(kvt_tensor_zeros(&t[i], s->dtype[i], 4, shape), 0);
        uint8_t *d = kvt_buf_data(t[i].buf);
        size_t rb = (size_t)s->last[i] * kvt_dtype_size(s->dtype[i]);
        for (int64_t b = 0; b < s->b; b++)
            for (int64_t h = 0; h < s->h; h++)
                for (int64_t r = 0; r < l; r++)
                    for (size_t k = 0; k < rb; k++)
                        d[(((size_t)b * s->h + h) * l + r) * rb + k] =
                            row_byte(first_id + r, i, b, h, k);
    }
}

static void release_all(struct kvt_tensor *t, int n)
{
    for (int i = 0; i < n; i++)
        kvt_tensor_release(&t[i]);
}

static int64_t next_id = 1;

/* Append the same fresh rows to every cache of @p cs (a cache and its controls). */
static void append_all(const struct spec *s, kvt_cache **cs, int n, int64_t l)
{
    struct kvt_tensor in[KVT_MAX_CACHE_TENSORS];
    make_input(s, next_id, l, in);
    next_id += l;
    for (int k = 0; k < n; k++)
        assert_int_equal(kvt_cache_append(cs[k], in, s->nt), 0);
    release_all(in, s->nt);
}

static void trim_all(kvt_cache **cs, int n, int64_t t)
{
    for (int k = 0; k < n; k++)
        assert_int_equal(kvt_cache_trim(cs[k], t), 0);
}

/* Everything observable about a cache: scalars, capacity, bytes, and a hash per tensor. */
struct snap {
    int n;
    struct kvt_cache_info info;
    int64_t cap;
    size_t bytes;
    uint64_t hash[KVT_MAX_CACHE_TENSORS];
    int64_t shape[KVT_MAX_CACHE_TENSORS][KVT_MAX_RANK];
    int dtype[KVT_MAX_CACHE_TENSORS];
};

static void take_snap(const kvt_cache *c, struct snap *s)
{
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
    memset(s, 0, sizeof(*s));
    s->n = kvt_cache_state(c, st);
    assert_true(s->n > 0);
    kvt_cache_get_info(c, &s->info);
    s->cap = kvt_cache_capacity(c);
    s->bytes = kvt_cache_bytes(c);
    for (int i = 0; i < s->n; i++) {
        size_t nb = kvt_tensor_nbytes(&st[i]);
        uint8_t *bytes = malloc(nb + 1);
        kvt_tensor_copy_out(&st[i], bytes);
        s->hash[i] = kvt_wyhash(0, bytes, nb);
        free(bytes);
        memcpy(s->shape[i], st[i].shape, sizeof(s->shape[i]));
        s->dtype[i] = st[i].dtype;
    }
    release_all(st, s->n);
}

/* Same persisted form and scalars; @p with_cap also compares capacity and bytes. */
static void assert_same(const kvt_cache *a, const kvt_cache *b, bool with_cap)
{
    struct snap x, y;
    take_snap(a, &x);
    take_snap(b, &y);
    assert_int_equal(x.n, y.n);
    assert_memory_equal(&x.info, &y.info, sizeof(x.info));
    assert_memory_equal(x.hash, y.hash, sizeof(x.hash));
    assert_memory_equal(x.shape, y.shape, sizeof(x.shape));
    assert_memory_equal(x.dtype, y.dtype, sizeof(x.dtype));
    if (with_cap) {
        assert_int_equal(x.cap, y.cap);
        assert_int_equal(x.bytes, y.bytes);
    }
}

static void assert_snap(const kvt_cache *c, const struct snap *want)
{
    struct snap s;
    take_snap(c, &s);
    assert_memory_equal(&s, want, sizeof(s));
}

/* A cache with the same state in buffers of its own (deep copy through from_state). */
static kvt_cache *deep_copy(const kvt_cache *c)
{
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS], cp[KVT_MAX_CACHE_TENSORS];
    struct kvt_cache_info info;
    kvt_cache_get_info(c, &info);
    int n = kvt_cache_state(c, st);
    assert_true(n > 0);
    for (int i = 0; i < n; i++)
        assert_int_equal(kvt_tensor_contiguous(&cp[i], &st[i]), 0);
    kvt_cache *r;
    assert_int_equal(kvt_cache_from_state(&info, cp, n, &r), 0);
    release_all(st, n);
    release_all(cp, n);
    return r;
}

/* Data pointer of tensor @p i's buffer. */
static const void *data_of(const kvt_cache *c, int i)
{
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
    int n = kvt_cache_state(c, st);
    assert_true(n > i);
    const void *p = kvt_buf_data(st[i].buf);
    release_all(st, n);
    return p;
}

/* ------------------------------------------------------------------------------------------ */

/*
 * For every kind: clone, then drive the donor (single and multi appends, trim + append) and
 * the clone, each alongside a control cache that never shared anything.
 */
static void test_isolation_every_kind(void **state)
{
    (void)state;
    for (size_t k = 0; k < N_SPECS; k++) {
        const struct spec *s = &specs[k];
        kvt_cache *d, *ctl;
        assert_int_equal(kvt_cache_new(&s->p, &d), 0);
        assert_int_equal(kvt_cache_new(&s->p, &ctl), 0);
        kvt_cache *dc[2] = {d, ctl};
        append_all(s, dc, 2, 5);
        for (int i = 0; i < 3; i++)
            append_all(s, dc, 2, 1);
        if (s->p.max_size == 8)
            append_all(s, dc, 2, 9); /* a wrapped/over-long ring as the clone source */

        kvt_cache *kc;
        assert_int_equal(kvt_cache_clone(d, &kc), 0);
        kvt_cache *kctl = deep_copy(kc);
        struct snap ks;
        take_snap(kc, &ks);
        assert_same(kc, d, false);

        /* donor writes */
        append_all(s, dc, 2, 1);
        assert_snap(kc, &ks);
        append_all(s, dc, 2, 3);
        assert_snap(kc, &ks);
        if (kvt_cache_is_trimmable(d)) {
            trim_all(dc, 2, 2);
            append_all(s, dc, 2, 1);
            assert_snap(kc, &ks);
        }
        for (int i = 0; i < 10; i++)
            append_all(s, dc, 2, 1);
        assert_snap(kc, &ks);
        assert_same(d, ctl, true);

        /* clone writes: the donor stays put */
        struct snap ds;
        take_snap(d, &ds);
        kvt_cache *kk[2] = {kc, kctl};
        append_all(s, kk, 2, 1);
        append_all(s, kk, 2, 2);
        if (kvt_cache_is_trimmable(kc)) {
            trim_all(kk, 2, 1);
            append_all(s, kk, 2, 1);
        }
        assert_snap(d, &ds);
        assert_same(kc, kctl, false);

        /* release in either order; survivors keep working */
        if (k % 2) {
            kvt_cache_free(d);
            append_all(s, kk, 2, 1);
            assert_same(kc, kctl, false);
            kvt_cache_free(kc);
        } else {
            kvt_cache_free(kc);
            append_all(s, dc, 2, 1);
            assert_same(d, ctl, true);
            kvt_cache_free(d);
        }
        kvt_cache_free(ctl);
        kvt_cache_free(kctl);
    }
}

static void test_ssm_clone(void **state)
{
    (void)state;
    struct kvt_cache_info p = {.kind = KVT_KIND_SSM};
    kvt_cache *d, *k;
    assert_int_equal(kvt_cache_new(&p, &d), 0);
    int64_t cs[3] = {1, 3, 16}, rs[4] = {1, 2, 4, 8};
    struct kvt_tensor conv, rec;
    uint64_t rng = 11;
    synth_random_tensor(&conv, KVT_BFLOAT16, 3, cs, &rng);
    synth_random_tensor(&rec, KVT_FLOAT32, 4, rs, &rng);
    assert_int_equal(kvt_cache_ssm_update(d, &conv, &rec, 4), 0);
    const void *p0 = data_of(d, 0);
    assert_int_equal(kvt_cache_clone(d, &k), 0);
    struct snap ks;
    take_snap(k, &ks);
    assert_false(kvt_cache_is_trimmable(k));
    assert_int_equal(kvt_cache_trim(k, 1), KVT_E_STATE);

    fill_random(kvt_buf_data(conv.buf), kvt_tensor_nbytes(&conv), &rng);
    fill_random(kvt_buf_data(rec.buf), kvt_tensor_nbytes(&rec), &rng);
    assert_int_equal(kvt_cache_ssm_update(d, &conv, &rec, 1), 0);
    assert_snap(k, &ks);
    assert_ptr_not_equal(data_of(d, 0), p0); /* whole-buffer clone: the donor write moved */
    struct kvt_tensor st[2];
    assert_int_equal(kvt_cache_state(d, st), 2);
    assert_int_equal(kvt_tensor_hash(&st[0]), kvt_tensor_hash(&conv));
    assert_int_equal(kvt_tensor_hash(&st[1]), kvt_tensor_hash(&rec));
    release_all(st, 2);
    assert_int_equal(kvt_cache_offset(d), 5);

    /* alone again: the next update reuses the buffers */
    kvt_cache_free(k);
    const void *p1 = data_of(d, 0);
    assert_int_equal(kvt_cache_ssm_update(d, &conv, &rec, 1), 0);
    assert_ptr_equal(data_of(d, 0), p1);
    kvt_tensor_release(&conv);
    kvt_tensor_release(&rec);
    kvt_cache_free(d);
}

/* Step kinds: disjoint appends in place, trim + append into the shared rows copies. */
static void test_step_in_place_and_cow(void **state)
{
    (void)state;
    for (size_t k = 0; k < N_SPECS; k++) {
        const struct spec *s = &specs[k];
        if (!is_step(s->p.kind))
            continue;
        kvt_cache *d, *kc;
        assert_int_equal(kvt_cache_new(&s->p, &d), 0);
        append_all(s, &d, 1, 300);
        assert_int_equal(kvt_cache_capacity(d), 512);
        const void *p[KVT_MAX_CACHE_TENSORS];
        for (int i = 0; i < s->nt; i++)
            p[i] = data_of(d, i);

        assert_int_equal(kvt_cache_clone(d, &kc), 0);
        assert_int_equal(kvt_cache_capacity(kc), 300);
        size_t per_row = kvt_cache_bytes(d) / 512;
        assert_int_equal(kvt_cache_bytes(kc), per_row * 300);
        struct snap ks;
        take_snap(kc, &ks);

        /* disjoint: rows [300, ...) are seen by nobody else */
        append_all(s, &d, 1, 1);
        append_all(s, &d, 1, 50);
        for (int i = 0; i < s->nt; i++)
            assert_ptr_equal(data_of(d, i), p[i]);
        assert_int_equal(kvt_cache_capacity(d), 512);
        assert_snap(kc, &ks);

        /* a trim into the clone's rows, then an append there: copy first */
        assert_int_equal(kvt_cache_trim(d, 200), 0);
        kvt_cache *ctl = deep_copy(d);
        kvt_cache *dc[2] = {d, ctl};
        append_all(s, dc, 2, 1);
        for (int i = 0; i < s->nt; i++)
            assert_ptr_not_equal(data_of(d, i), p[i]);
        assert_int_equal(kvt_cache_capacity(d), 512);
        assert_snap(kc, &ks);
        assert_same(d, ctl, false);

        /* the moved donor owns its new buffer alone: trim + append stays in place */
        const void *q = data_of(d, 0);
        trim_all(dc, 2, 20);
        append_all(s, dc, 2, 5);
        assert_ptr_equal(data_of(d, 0), q);
        assert_same(d, ctl, false);
        assert_snap(kc, &ks);
        kvt_cache_free(ctl);
        kvt_cache_free(kc);
        kvt_cache_free(d);
    }
}

/* After the clone is gone, the donor is alone again: writes anywhere go in place. */
static void test_step_alone_after_clone(void **state)
{
    (void)state;
    const struct spec *s = &specs[0];
    kvt_cache *d, *kc;
    assert_int_equal(kvt_cache_new(&s->p, &d), 0);
    append_all(s, &d, 1, 100);
    const void *p = data_of(d, 0);
    assert_int_equal(kvt_cache_clone(d, &kc), 0);
    kvt_cache_free(kc);
    assert_int_equal(kvt_cache_trim(d, 50), 0);
    append_all(s, &d, 1, 10);
    assert_ptr_equal(data_of(d, 0), p);
    kvt_cache_free(d);
}

/* A clone that holds the last references appends into the donor's spare rows. */
static void test_sole_owner_clone(void **state)
{
    (void)state;
    for (size_t k = 0; k < N_SPECS; k++) {
        const struct spec *s = &specs[k];
        if (!is_step(s->p.kind))
            continue;
        kvt_cache *d, *kc, *ctl;
        assert_int_equal(kvt_cache_new(&s->p, &d), 0);
        append_all(s, &d, 1, 300);
        const void *p = data_of(d, 0);
        assert_int_equal(kvt_cache_clone(d, &kc), 0);
        ctl = deep_copy(kc);
        kvt_cache_free(d);
        kvt_cache *kk[2] = {kc, ctl};
        append_all(s, kk, 2, 1);
        assert_ptr_equal(data_of(kc, 0), p);
        assert_int_equal(kvt_cache_capacity(kc), 512);
        append_all(s, kk, 2, 100);
        assert_ptr_equal(data_of(kc, 0), p);
        assert_same(kc, ctl, false);
        kvt_cache_free(kc);
        kvt_cache_free(ctl);
    }

    /* a clone that shares: its first append allocates ceil((offset + L) / 256) · 256 rows */
    static const struct {
        int64_t off, l, cap;
    } cases[] = {{100, 1, 256}, {256, 1, 512}, {300, 1, 512}, {300, 300, 768}};
    const struct spec *s = &specs[0];
    for (size_t c = 0; c < 4; c++) {
        kvt_cache *d, *kc;
        assert_int_equal(kvt_cache_new(&s->p, &d), 0);
        append_all(s, &d, 1, cases[c].off);
        const void *p = data_of(d, 0);
        struct snap ds;
        take_snap(d, &ds);
        assert_int_equal(kvt_cache_clone(d, &kc), 0);
        append_all(s, &kc, 1, cases[c].l);
        assert_int_equal(kvt_cache_capacity(kc), cases[c].cap);
        assert_ptr_not_equal(data_of(kc, 0), p);
        assert_int_equal(kvt_cache_offset(kc), cases[c].off + cases[c].l);
        assert_snap(d, &ds);
        assert_ptr_equal(data_of(d, 0), p);
        kvt_cache_free(kc);
        kvt_cache_free(d);
    }
}

/* Ring clones share every row: a donor write copies unless the donor is alone. */
static void test_ring_clone_copies(void **state)
{
    (void)state;
    const struct spec *s = &specs[3];
    kvt_cache *d, *kc;
    assert_int_equal(kvt_cache_new(&s->p, &d), 0);
    for (int i = 0; i < 12; i++)
        append_all(s, &d, 1, 1);
    const void *p = data_of(d, 0);
    append_all(s, &d, 1, 1); /* alone: in place */
    assert_ptr_equal(data_of(d, 0), p);
    assert_int_equal(kvt_cache_clone(d, &kc), 0);
    struct snap ks;
    take_snap(kc, &ks);
    append_all(s, &d, 1, 1);
    assert_ptr_not_equal(data_of(d, 0), p);
    assert_snap(kc, &ks);
    const void *q = data_of(d, 0);
    append_all(s, &d, 1, 1); /* the copy is the donor's alone */
    assert_ptr_equal(data_of(d, 0), q);
    kvt_cache_free(kc);
    kvt_cache_free(d);
}

/* Views handed out (window, state) never see later writes, even after trim + append. */
static void test_views_outlive_writes(void **state)
{
    (void)state;
    for (size_t k = 0; k < N_SPECS; k++) {
        const struct spec *s = &specs[k];
        kvt_cache *d, *ctl;
        assert_int_equal(kvt_cache_new(&s->p, &d), 0);
        assert_int_equal(kvt_cache_new(&s->p, &ctl), 0);
        kvt_cache *dc[2] = {d, ctl};
        append_all(s, dc, 2, 6);
        struct kvt_tensor w[KVT_MAX_CACHE_TENSORS], st[KVT_MAX_CACHE_TENSORS];
        uint64_t hw[KVT_MAX_CACHE_TENSORS], hs[KVT_MAX_CACHE_TENSORS];
        int n = kvt_cache_window(d, w);
        assert_int_equal(n, s->nt);
        assert_int_equal(kvt_cache_state(d, st), n);
        for (int i = 0; i < n; i++) {
            hw[i] = kvt_tensor_hash(&w[i]);
            hs[i] = kvt_tensor_hash(&st[i]);
        }
        append_all(s, dc, 2, 1);
        trim_all(dc, 2, 3);
        append_all(s, dc, 2, 2);
        append_all(s, dc, 2, 1);
        for (int i = 0; i < n; i++) {
            assert_int_equal(kvt_tensor_hash(&w[i]), hw[i]);
            assert_int_equal(kvt_tensor_hash(&st[i]), hs[i]);
        }
        assert_same(d, ctl, false);
        release_all(w, n);
        release_all(st, n);
        kvt_cache_free(d);
        kvt_cache_free(ctl);
    }
}

struct release_log {
    int calls, untouched;
    void *mem[2];
    size_t n[2];
    uint64_t hash[2];
};

/* Counts releases and checks that the wrapped bytes are still what the engine gave. */
static void on_release(void *ud, void *data)
{
    struct release_log *l = ud;
    l->calls++;
    for (int i = 0; i < 2; i++)
        if (l->mem[i] == data && kvt_wyhash(0, data, l->n[i]) == l->hash[i])
            l->untouched++;
    free(data);
}

static void wrap_inputs(struct kvt_tensor *in, struct kvt_tensor *t, struct release_log *log)
{
    for (int i = 0; i < 2; i++) {
        size_t n = kvt_tensor_nbytes(&in[i]);
        void *mem = malloc(n);
        memcpy(mem, kvt_buf_data(in[i].buf), n);
        log->mem[i] = mem;
        log->n[i] = n;
        log->hash[i] = kvt_wyhash(0, mem, n);
        kvt_buf *b;
        assert_int_equal(kvt_buf_wrap(mem, n, on_release, log, &b), 0);
        assert_int_equal(kvt_tensor_init(&t[i], b, 0, in[i].dtype, 4, in[i].shape), 0);
        kvt_buf_unref(b);
    }
}

/* Engine memory is never written: the first write moves to library buffers. */
static void test_wrapped_memory(void **state)
{
    (void)state;
    const struct spec *s = &specs[0];
    struct kvt_tensor in[2], t[2];
    make_input(s, 5000, 40, in);
    struct release_log log = {0};
    wrap_inputs(in, t, &log);
    struct kvt_cache_info info = {.kind = KVT_KIND_KV, .offset = 30};
    kvt_cache *c;
    assert_int_equal(kvt_cache_from_state(&info, t, 2, &c), 0);
    const void *mem0 = kvt_buf_data(t[0].buf);
    release_all(t, 2);
    assert_int_equal(kvt_cache_capacity(c), 40);
    assert_int_equal(kvt_cache_trim(c, 5), 0);
    append_all(s, &c, 1, 1);
    /* moved: the wrapped buffers were dropped (released once each), their bytes untouched */
    assert_int_equal(log.calls, 2);
    assert_int_equal(log.untouched, 2);
    assert_ptr_not_equal(data_of(c, 0), mem0);
    assert_int_equal(kvt_cache_offset(c), 26);
    assert_int_equal(kvt_cache_capacity(c), 40);
    kvt_cache_free(c);
    assert_int_equal(log.calls, 2);
    release_all(in, 2);

    /* a wrapped buffer shared by a clone: released once, after the last holder */
    make_input(s, 6000, 10, in);
    memset(&log, 0, sizeof(log));
    wrap_inputs(in, t, &log);
    info.offset = 10;
    assert_int_equal(kvt_cache_from_state(&info, t, 2, &c), 0);
    release_all(t, 2);
    kvt_cache *kc;
    assert_int_equal(kvt_cache_clone(c, &kc), 0);
    kvt_cache_free(c);
    assert_int_equal(log.calls, 0);
    struct snap ks;
    take_snap(kc, &ks);
    for (int i = 0; i < 2; i++)
        assert_int_equal(ks.hash[i], kvt_tensor_hash(&in[i]));
    kvt_cache_free(kc);
    assert_int_equal(log.calls, 2);
    assert_int_equal(log.untouched, 2);
    release_all(in, 2);
}

/* ------------------------------------------------------------------------------------------
 * Entries
 */

static kvt_cache *filled(const struct spec *s, int64_t l)
{
    kvt_cache *c;
    assert_int_equal(kvt_cache_new(&s->p, &c), 0);
    append_all(s, &c, 1, l);
    return c;
}

static void test_entry_basics(void **state)
{
    (void)state;
    int32_t tok[5] = {1, 2, 3, 4, 5};
    kvt_cache *cs[2] = {filled(&specs[0], 5), filled(&specs[3], 5)};
    size_t bytes = kvt_cache_bytes(cs[0]) + kvt_cache_bytes(cs[1]);
    struct kvt_entry *e;
    assert_int_equal(kvt_entry_new(tok, 5, cs, 2, "ns-a", &e), 0);
    tok[0] = 99;
    assert_int_equal(e->tokens[0], 1);
    assert_int_equal(e->n_tokens, 5);
    assert_int_equal(e->n_caches, 2);
    assert_string_equal(e->meta.ns, "ns-a");
    assert_null(e->meta.model_id);
    assert_int_equal(e->created_at, -1);
    assert_int_equal(kvt_entry_bytes(e), bytes);
    assert_true(kvt_entry_is_trimmable(e));
    for (int i = 0; i < 4; i++) /* ring of 8 reaches offset 9: wrapped */
        append_all(&specs[3], &e->caches[1], 1, 1);
    assert_false(kvt_entry_is_trimmable(e));

    struct kvt_entry *cl;
    assert_int_equal(kvt_entry_clone(e, &cl), 0);
    assert_ptr_not_equal(cl->tokens, e->tokens);
    assert_memory_equal(cl->tokens, e->tokens, 5 * sizeof(int32_t));
    assert_string_equal(cl->meta.ns, "ns-a");
    assert_int_equal(cl->created_at, -1);
    assert_false(kvt_entry_is_trimmable(cl));
    assert_int_equal(kvt_entry_bytes(cl),
                     kvt_cache_bytes(cl->caches[0]) + kvt_cache_bytes(cl->caches[1]));
    /* a kv clone counts the rows it references, not the donor's capacity */
    assert_int_equal(kvt_cache_bytes(cl->caches[0]), kvt_cache_bytes(e->caches[0]) / 256 * 5);
    struct snap s0;
    take_snap(cl->caches[0], &s0);
    append_all(&specs[0], &e->caches[0], 1, 3);
    assert_snap(cl->caches[0], &s0);
    kvt_entry_free(e); /* clones outlive the donor */
    assert_snap(cl->caches[0], &s0);
    kvt_entry_free(cl);
    kvt_entry_free(NULL);

    /* empty entries, meta copies */
    assert_int_equal(kvt_entry_new(NULL, 0, NULL, 0, NULL, &e), 0);
    assert_null(e->meta.ns);
    assert_true(kvt_entry_is_trimmable(e));
    assert_int_equal(kvt_entry_bytes(e), 0);
    e->meta.model_id = strdup("model");
    e->meta.tokenizer_hash = strdup("tok");
    e->created_at = 1234;
    assert_int_equal(kvt_entry_clone(e, &cl), 0);
    assert_string_equal(cl->meta.model_id, "model");
    assert_string_equal(cl->meta.tokenizer_hash, "tok");
    assert_null(cl->meta.config_fingerprint);
    assert_int_equal(cl->created_at, 1234);
    kvt_entry_free(cl);
    kvt_entry_free(e);
    assert_int_equal(kvt_entry_new(NULL, 3, NULL, 0, NULL, &e), -EINVAL);
    assert_null(e);
}

/* Reference counts of every buffer of @p c's state, minus the views taken to read them. */
static void refcounts(const kvt_cache *c, int *out)
{
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
    int n = kvt_cache_state(c, st);
    for (int i = 0; i < n; i++)
        out[i] = kvt_buf_refcount(st[i].buf) - 1;
    release_all(st, n);
}

static void test_entry_clone_failures(void **state)
{
    (void)state;
    struct kvt_cache_info kvp = {.kind = KVT_KIND_KV};
    kvt_cache *empty;
    assert_int_equal(kvt_cache_new(&kvp, &empty), 0);
    kvt_cache *cs[3] = {filled(&specs[0], 7), filled(&specs[1], 7), empty};
    int32_t tok[7] = {0};
    /* a caller-filled entry of borrowed caches */
    struct kvt_entry e = {
        .tokens = tok, .n_tokens = 7, .caches = cs, .n_caches = 3, .created_at = -1};
    int rc0[KVT_MAX_CACHE_TENSORS], rc1[KVT_MAX_CACHE_TENSORS], now[KVT_MAX_CACHE_TENSORS];
    refcounts(cs[0], rc0);
    refcounts(cs[1], rc1);
    struct kvt_entry *cl = (struct kvt_entry *)1;
    assert_int_equal(kvt_entry_clone(&e, &cl), KVT_E_STATE);
    assert_null(cl);
    assert_non_null(strstr(kvt_last_error(), "cannot clone an empty cache"));
    refcounts(cs[0], now);
    assert_memory_equal(now, rc0, 2 * sizeof(int));
    refcounts(cs[1], now);
    assert_memory_equal(now, rc1, 6 * sizeof(int));

    /* every allocation failing in turn: -ENOMEM, nothing held, until one succeeds */
    e.n_caches = 2;
    e.meta.ns = "ns";
    e.meta.model_id = "m";
    int failures = 0;
    for (long n = 0;; n++) {
        kvt_alloc_fail_after(n);
        int rc = kvt_entry_clone(&e, &cl);
        kvt_alloc_fail_after(-1);
        if (rc == 0)
            break;
        failures++;
        assert_int_equal(rc, -ENOMEM);
        assert_null(cl);
        refcounts(cs[0], now);
        assert_memory_equal(now, rc0, 2 * sizeof(int));
        refcounts(cs[1], now);
        assert_memory_equal(now, rc1, 6 * sizeof(int));
        assert_true(n < 100);
    }
    assert_true(failures >= 4);
    assert_string_equal(cl->meta.model_id, "m");
    kvt_entry_free(cl);

    /* kvt_entry_new failing leaves the caches with the caller */
    struct kvt_entry *ne = (struct kvt_entry *)1;
    kvt_alloc_fail_after(1);
    int rc = kvt_entry_new(tok, 7, cs, 3, "x", &ne);
    kvt_alloc_fail_after(-1);
    assert_int_equal(rc, -ENOMEM);
    assert_null(ne);
    assert_int_equal(kvt_cache_offset(cs[0]), 7);
    for (int i = 0; i < 3; i++)
        kvt_cache_free(cs[i]);

    /* a failing clone allocation of a single cache */
    kvt_cache *c = filled(&specs[3], 3), *k = (kvt_cache *)1;
    kvt_alloc_fail_after(0);
    rc = kvt_cache_clone(c, &k);
    kvt_alloc_fail_after(-1);
    assert_int_equal(rc, -ENOMEM);
    assert_null(k);
    refcounts(c, now);
    assert_int_equal(now[0], 1);
    /* and a failing growth leaves the cache as it was */
    struct snap before;
    take_snap(c, &before);
    struct kvt_tensor in[2];
    make_input(&specs[3], 1, 4, in);
    kvt_alloc_fail_after(0);
    rc = kvt_cache_append(c, in, 2);
    kvt_alloc_fail_after(-1);
    assert_int_equal(rc, -ENOMEM);
    assert_snap(c, &before);
    release_all(in, 2);
    kvt_cache_free(c);
}

/* ------------------------------------------------------------------------------------------
 * A writer thread reads a clone while the donor keeps decoding.
 */

struct reader {
    kvt_cache *clone;
    uint64_t want[KVT_MAX_CACHE_TENSORS];
    int n, rounds, bad;
};

static void *read_clone(void *p)
{
    struct reader *r = p;
    for (int k = 0; k < r->rounds; k++) {
        struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
        int n = kvt_cache_state(r->clone, st);
        for (int i = 0; i < n; i++)
            r->bad += kvt_tensor_hash(&st[i]) != r->want[i];
        for (int i = 0; i < n; i++)
            kvt_tensor_release(&st[i]);
    }
    kvt_cache_free(r->clone);
    return NULL;
}

static void test_clone_on_another_thread(void **state)
{
    (void)state;
    for (size_t k = 0; k < N_SPECS; k++) {
        const struct spec *s = &specs[k];
        kvt_cache *d = filled(s, 200);
        struct reader r = {.rounds = 200};
        assert_int_equal(kvt_cache_clone(d, &r.clone), 0);
        struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
        r.n = kvt_cache_state(r.clone, st);
        for (int i = 0; i < r.n; i++)
            r.want[i] = kvt_tensor_hash(&st[i]);
        release_all(st, r.n);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, read_clone, &r), 0);
        for (int i = 0; i < 300; i++) {
            append_all(s, &d, 1, 1);
            if (i % 50 == 49 && kvt_cache_is_trimmable(d))
                assert_int_equal(kvt_cache_trim(d, 30), 0);
        }
        pthread_join(th, NULL);
        assert_int_equal(r.bad, 0);
        kvt_cache_free(d);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_isolation_every_kind),
        cmocka_unit_test(test_ssm_clone),
        cmocka_unit_test(test_step_in_place_and_cow),
        cmocka_unit_test(test_step_alone_after_clone),
        cmocka_unit_test(test_sole_owner_clone),
        cmocka_unit_test(test_ring_clone_copies),
        cmocka_unit_test(test_views_outlive_writes),
        cmocka_unit_test(test_wrapped_memory),
        cmocka_unit_test(test_entry_basics),
        cmocka_unit_test(test_entry_clone_failures),
        cmocka_unit_test(test_clone_on_another_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
