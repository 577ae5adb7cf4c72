/*
 * Cache kinds against straightforward models of the reference rules (CACHES.md): STEP growth
 * with the cut-to-prev rule, ring append/wrap/reorder/drop, trim and trimmability, ssm
 * updates, input and state validation, and state -> from_state -> state round trips with
 * the restore capacity. Every token row carries bytes derived from a unique id, so a
 * comparison names exactly which rows a cache holds.
 */
#include "support/support.h"

#include "tensor/tensor_parts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOK 4096

struct spec {
    const char *name;
    struct kvt_cache_info p;
    int nt;
    int dtype[KVT_MAX_CACHE_TENSORS];
    int64_t last[KVT_MAX_CACHE_TENSORS];
    int64_t b, h;
};

static const struct spec step_specs[] = {
    {"kv", {.kind = KVT_KIND_KV}, 2, {KVT_BFLOAT16, KVT_BFLOAT16}, {8, 4}, 1, 2},
    {"kv-b2", {.kind = KVT_KIND_KV}, 2, {KVT_FLOAT16, KVT_FLOAT16}, {16, 16}, 2, 3},
    {"qkv",
     {.kind = KVT_KIND_QKV, .group_size = 32, .bits = 4},
     6,
     {KVT_UINT32, KVT_BFLOAT16, KVT_BFLOAT16, KVT_UINT32, KVT_FLOAT32, KVT_FLOAT32},
     {8, 2, 2, 8, 2, 2},
     1,
     2},
    {"turboquant",
     {.kind = KVT_KIND_TURBOQUANT, .k_bits = 4, .v_bits = 3},
     5,
     {KVT_UINT8, KVT_FLOAT16, KVT_FLOAT16, KVT_UINT8, KVT_FLOAT16},
     {32, 2, 2, 24, 2},
     1,
     2},
    {"turboquant-k8",
     {.kind = KVT_KIND_TURBOQUANT, .k_bits = 8, .v_bits = 2},
     5,
     {KVT_INT8, KVT_FLOAT16, KVT_FLOAT16, KVT_UINT8, KVT_FLOAT16},
     {128, 4, 4, 32, 4},
     1,
     1},
};

static const struct spec ring_specs[] = {
    {"rotating", {.kind = KVT_KIND_ROTATING}, 2, {KVT_BFLOAT16, KVT_BFLOAT16}, {8, 8}, 1, 2},
    {"rotating-qkv",
     {.kind = KVT_KIND_ROTATING_QKV, .group_size = 64, .bits = 8},
     6,
     {KVT_UINT32, KVT_FLOAT16, KVT_FLOAT16, KVT_UINT32, KVT_FLOAT16, KVT_FLOAT16},
     {16, 1, 1, 16, 1, 1},
     2,
     1},
};

/* The byte at position k of token row @p id in array @p arr, head (b, h); zero rows: id < 0. */
static uint8_t row_byte(int64_t id, int arr, int64_t b, int64_t h, int64_t k)
{
    if (id < 0)
        return 0;
    uint64_t x = (uint64_t)id * 0x9E3779B97F4A7C15ull ^ (uint64_t)arr << 56 ^ (uint64_t)b << 48 ^
                 (uint64_t)h << 40 ^ (uint64_t)k;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (uint8_t)(x | 1); /* never 0, so a data row is never mistaken for a zero row */
}

static size_t row_bytes(const struct spec *s, int i)
{
    return (size_t)s->last[i] * kvt_dtype_size(s->dtype[i]);
}

/*
 * Input tensors for token ids[0..l): [B, H, l, last]. Odd l gets a strided view (a row slice
 * of a larger buffer) so appends copy from non-contiguous sources too.
 */
static void make_input(const struct spec *s, const int64_t *ids, int64_t l, struct kvt_tensor *t)
{
    int64_t pad = l % 2 ? 3 : 0;
    for (int i = 0; i < s->nt; i++) {
        int64_t shape[4] = {s->b, s->h, l + pad, s->last[i]};
        assert_int_equal(kvt_tensor_zeros(&t[i], s->dtype[i], 4, shape), 0);
        uint8_t *d = kvt_buf_data(t[i].buf);
        size_t rb = row_bytes(s, i);
        for (int64_t b = 0; b < s->b; b++)
            for (int64_t h = 0; h < s->h; h++)
                for (int64_t r = 0; r < l; r++) {
                    uint8_t *row =
                        d + (((size_t)b * s->h + h) * (l + pad) + r + (pad ? 1 : 0)) * rb;
                    for (size_t k = 0; k < rb; k++)
                        row[k] = row_byte(ids[r], i, b, h, k);
                }
        if (pad)
            assert_int_equal(kvt_tensor_slice(&t[i], &t[i], 2, 1, l + 1), 0);
    }
}

static void release_all(struct kvt_tensor *t, int n)
{
    for (int i = 0; i < n; i++)
        kvt_tensor_release(&t[i]);
}

/* Assert that @p t (array @p i) holds exactly rows ids[0..n). */
static void check_rows(const struct spec *s, int i, const struct kvt_tensor *t, const int64_t *ids,
                       int64_t n)
{
    assert_int_equal(t->rank, 4);
    assert_int_equal(t->dtype, s->dtype[i]);
    assert_int_equal(t->shape[0], s->b);
    assert_int_equal(t->shape[1], s->h);
    assert_int_equal(t->shape[2], n);
    assert_int_equal(t->shape[3], s->last[i]);
    size_t rb = row_bytes(s, i), nb = kvt_tensor_nbytes(t);
    uint8_t *got = malloc(nb + 1), *want = malloc(nb + 1);
    kvt_tensor_copy_out(t, got);
    for (int64_t b = 0; b < s->b; b++)
        for (int64_t h = 0; h < s->h; h++)
            for (int64_t r = 0; r < n; r++)
                for (size_t k = 0; k < rb; k++)
                    want[(((size_t)b * s->h + h) * n + r) * rb + k] = row_byte(ids[r], i, b, h, k);
    for (size_t k = 0; k < nb; k++)
        if (got[k] != want[k]) {
            size_t row = k / rb;
            fail_msg("%s tensor %d: byte %zu (row %zu of [B,H,%lld]) is %u, want %u (id %lld)",
                     s->name, i, k, row % (size_t)n, (long long)n, got[k], want[k],
                     (long long)ids[row % (size_t)n]);
        }
    free(got);
    free(want);
}

static void check_state(const struct spec *s, const kvt_cache *c, const int64_t *ids, int64_t n)
{
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
    assert_int_equal(kvt_cache_state(c, st), s->nt);
    for (int i = 0; i < s->nt; i++)
        check_rows(s, i, &st[i], ids, n);
    release_all(st, s->nt);
}

static void check_window(const struct spec *s, const kvt_cache *c, const int64_t *ids, int64_t n)
{
    struct kvt_tensor w[KVT_MAX_CACHE_TENSORS];
    assert_int_equal(kvt_cache_window(c, w), s->nt);
    for (int i = 0; i < s->nt; i++)
        check_rows(s, i, &w[i], ids, n);
    release_all(w, s->nt);
}

static int64_t next_id = 1;

static int append_ids(const struct spec *s, kvt_cache *c, int64_t *ids, int64_t l)
{
    for (int64_t r = 0; r < l; r++)
        ids[r] = next_id++;
    struct kvt_tensor in[KVT_MAX_CACHE_TENSORS];
    make_input(s, ids, l, in);
    int rc = kvt_cache_append(c, in, s->nt);
    release_all(in, s->nt);
    return rc;
}

static size_t expect_step_bytes(const struct spec *s, int64_t cap)
{
    size_t sum = 0;
    for (int i = 0; i < s->nt; i++)
        sum += (size_t)(s->b * s->h * cap) * row_bytes(s, i);
    return sum;
}

/* ------------------------------------------------------------------------------------------ */

static void test_kind_table(void **state)
{
    (void)state;
    static const char *names[] = {"kv", "rotating", "qkv", "rotating-qkv", "ssm", "turboquant"};
    static const int counts[] = {2, 2, 6, 6, 2, 5};
    for (int k = 0; k < KVT_KIND_COUNT; k++) {
        assert_string_equal(kvt_kind_name(k), names[k]);
        assert_int_equal(kvt_kind_from_name(names[k]), k);
        assert_int_equal(kvt_kind_tensor_count(k), counts[k]);
    }
    assert_null(kvt_kind_name(-1));
    assert_null(kvt_kind_name(KVT_KIND_COUNT));
    assert_int_equal(kvt_kind_from_name("mla"), -1);
    assert_int_equal(kvt_kind_from_name("KV"), -1);
    assert_int_equal(kvt_kind_from_name(NULL), -1);
    assert_int_equal(kvt_kind_tensor_count(6), 0);

    /* §9 table, for offsets on both sides of maxSize */
    for (int64_t off = 0; off < 10; off++) {
        assert_true(kvt_kind_is_trimmable(KVT_KIND_KV, off, 0));
        assert_true(kvt_kind_is_trimmable(KVT_KIND_QKV, off, 0));
        assert_true(kvt_kind_is_trimmable(KVT_KIND_TURBOQUANT, off, 0));
        assert_int_equal(kvt_kind_is_trimmable(KVT_KIND_ROTATING, off, 5), off < 5);
        assert_int_equal(kvt_kind_is_trimmable(KVT_KIND_ROTATING_QKV, off, 5), off < 5);
        assert_false(kvt_kind_is_trimmable(KVT_KIND_ROTATING, off, 0));
        assert_false(kvt_kind_is_trimmable(KVT_KIND_SSM, off, 100));
        assert_false(kvt_kind_is_trimmable(6, off, 100));
        assert_false(kvt_kind_is_trimmable(-1, off, 100));
    }
}

static void test_new_params(void **state)
{
    (void)state;
    kvt_cache *c = (kvt_cache *)1;
    struct kvt_cache_info p = {.kind = 9};
    assert_int_equal(kvt_cache_new(&p, &c), -EINVAL);
    assert_null(c);
    assert_int_equal(kvt_cache_new(NULL, &c), -EINVAL);
    p = (struct kvt_cache_info){.kind = KVT_KIND_ROTATING, .max_size = 0};
    assert_int_equal(kvt_cache_new(&p, &c), -EINVAL);
    p = (struct kvt_cache_info){.kind = KVT_KIND_QKV, .group_size = 48, .bits = 4};
    assert_int_equal(kvt_cache_new(&p, &c), -EINVAL);
    p = (struct kvt_cache_info){
        .kind = KVT_KIND_ROTATING_QKV, .max_size = 4, .group_size = 64, .bits = 7};
    assert_int_equal(kvt_cache_new(&p, &c), -EINVAL);
    p = (struct kvt_cache_info){.kind = KVT_KIND_TURBOQUANT, .k_bits = 6, .v_bits = 3};
    assert_int_equal(kvt_cache_new(&p, &c), -EINVAL);
    p = (struct kvt_cache_info){.kind = KVT_KIND_TURBOQUANT, .k_bits = 4, .v_bits = 1};
    assert_int_equal(kvt_cache_new(&p, &c), -EINVAL);

    /* scalars a kind lacks are 0; offset/idx are ignored */
    p = (struct kvt_cache_info){
        .kind = KVT_KIND_KV, .offset = 7, .idx = 3, .max_size = 9, .bits = 4, .head_dim = 64};
    assert_int_equal(kvt_cache_new(&p, &c), 0);
    struct kvt_cache_info got;
    kvt_cache_get_info(c, &got);
    struct kvt_cache_info want = {.kind = KVT_KIND_KV};
    assert_memory_equal(&got, &want, sizeof(got));
    assert_int_equal(kvt_cache_offset(c), 0);
    assert_int_equal(kvt_cache_capacity(c), 0);
    assert_int_equal(kvt_cache_bytes(c), 0);
    kvt_cache_free(c);
    p = (struct kvt_cache_info){
        .kind = KVT_KIND_TURBOQUANT, .k_bits = 8, .v_bits = 3, .head_dim = 128, .max_size = 4};
    assert_int_equal(kvt_cache_new(&p, &c), 0);
    kvt_cache_get_info(c, &got);
    want = (struct kvt_cache_info){.kind = KVT_KIND_TURBOQUANT, .k_bits = 8, .v_bits = 3};
    assert_memory_equal(&got, &want, sizeof(got));
    kvt_cache_free(c);
    kvt_cache_free(NULL);
}

static void test_empty_cache(void **state)
{
    (void)state;
    struct kvt_cache_info ps[] = {
        {.kind = KVT_KIND_KV},
        {.kind = KVT_KIND_ROTATING, .max_size = 8},
        {.kind = KVT_KIND_QKV, .group_size = 32, .bits = 4},
        {.kind = KVT_KIND_ROTATING_QKV, .max_size = 8, .group_size = 32, .bits = 4},
        {.kind = KVT_KIND_SSM},
        {.kind = KVT_KIND_TURBOQUANT, .k_bits = 4, .v_bits = 4},
    };
    for (size_t k = 0; k < 6; k++) {
        kvt_cache *c, *cl = (kvt_cache *)1;
        struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
        assert_int_equal(kvt_cache_new(&ps[k], &c), 0);
        assert_int_equal(kvt_cache_state(c, t), KVT_E_STATE);
        assert_string_equal(kvt_last_error(), "cannot persist an empty cache");
        assert_int_equal(kvt_cache_clone(c, &cl), KVT_E_STATE);
        assert_string_equal(kvt_last_error(), "cannot clone an empty cache");
        assert_null(cl);
        assert_int_equal(kvt_cache_window(c, t), KVT_E_STATE);
        assert_int_equal(kvt_cache_bytes(c), 0);
        assert_int_equal(kvt_cache_trim(c, 0), 0);
        assert_int_equal(kvt_cache_trim(c, -1), -EINVAL);
        kvt_cache_free(c);
    }
}

/* Reference capacity rule of CACHES.md §2. */
struct step_model {
    int64_t ids[MAX_TOK];
    int64_t off, cap;
    bool has;
};

static void model_step_append(struct step_model *m, const int64_t *ids, int64_t l)
{
    if (!m->has || m->off + l > m->cap) {
        int64_t n = (l + 255) / 256 * 256;
        if (!m->has)
            m->cap = n;
        else
            m->cap = (m->off % 256 ? m->off : m->cap) + n;
        m->has = true;
    }
    memcpy(m->ids + m->off, ids, (size_t)l * sizeof(int64_t));
    m->off += l;
}

static void check_step(const struct spec *s, const kvt_cache *c, const struct step_model *m)
{
    assert_int_equal(kvt_cache_offset(c), m->off);
    assert_int_equal(kvt_cache_capacity(c), m->cap);
    assert_int_equal(kvt_cache_bytes(c), expect_step_bytes(s, m->cap));
    assert_true(kvt_cache_is_trimmable(c));
    check_state(s, c, m->ids, m->off);
    check_window(s, c, m->ids, m->off);
}

static void test_step_growth_fixed(void **state)
{
    (void)state;
    /* (append L | trim n) sequences with the capacities the reference gives */
    const struct spec *s = &step_specs[0];
    kvt_cache *c;
    assert_int_equal(kvt_cache_new(&s->p, &c), 0);
    struct step_model *m = calloc(1, sizeof(*m));
    int64_t ids[1024];
    struct {
        int64_t l, trim, cap;
    } steps[] = {
        {1, 0, 256},     {254, 0, 256}, {1, 0, 256}, /* 256 rows, exactly full */
        {1, 0, 512},                                 /* prev 256 aligned: 256 + 256 */
        {300, 0, 769},                               /* prev 257 misaligned: cut, 257 + 512 */
        {0, 500, 769},                               /* offset 57 */
        {700, 0, 769},                               /* 757 fits */
        {20, 0, 1013},                               /* prev 757 misaligned: 757 + 256 */
        {0, 1000, 1013},                             /* offset 0 */
        {256, 0, 1013},                              /* fits */
        {800, 0, 2037},                              /* prev 256 aligned: 1013 + 1024 */
    };
    for (size_t k = 0; k < sizeof(steps) / sizeof(steps[0]); k++) {
        if (steps[k].trim) {
            assert_int_equal(kvt_cache_trim(c, steps[k].trim), 0);
            m->off = m->off > steps[k].trim ? m->off - steps[k].trim : 0;
        } else {
            assert_int_equal(append_ids(s, c, ids, steps[k].l), 0);
            model_step_append(m, ids, steps[k].l);
        }
        assert_int_equal(m->cap, steps[k].cap);
        check_step(s, c, m);
    }
    free(m);
    kvt_cache_free(c);
}

static void test_step_growth_random(void **state)
{
    (void)state;
    static const int64_t lens[] = {1, 1, 1, 2, 7, 100, 255, 256, 257, 511};
    uint64_t rng = 77;
    for (size_t k = 0; k < sizeof(step_specs) / sizeof(step_specs[0]); k++) {
        const struct spec *s = &step_specs[k];
        kvt_cache *c;
        assert_int_equal(kvt_cache_new(&s->p, &c), 0);
        struct step_model *m = calloc(1, sizeof(*m));
        int64_t ids[512];
        for (int op = 0; op < 60; op++) {
            uint64_t r = xs64(&rng) % 10;
            if (r < 7 || m->off == 0) {
                int64_t l = lens[xs64(&rng) % 10];
                if (m->off + l > MAX_TOK - 600) {
                    assert_int_equal(kvt_cache_trim(c, m->off), 0);
                    m->off = 0;
                }
                assert_int_equal(append_ids(s, c, ids, l), 0);
                model_step_append(m, ids, l);
            } else {
                int64_t n = (int64_t)(xs64(&rng) % (uint64_t)(m->off + 3));
                assert_int_equal(kvt_cache_trim(c, n), 0);
                m->off = m->off > n ? m->off - n : 0;
            }
            check_step(s, c, m);
        }
        struct kvt_cache_info info;
        kvt_cache_get_info(c, &info);
        if (s->p.kind == KVT_KIND_TURBOQUANT)
            assert_int_equal(info.head_dim, s->last[1] * 32);
        free(m);
        kvt_cache_free(c);
    }
}

/* Reference ring rules of CACHES.md §4, on row ids (-1 = zero row). */
struct ring_model {
    int64_t ids[MAX_TOK], tmp[MAX_TOK];
    int64_t s, idx, off, max;
    bool has, last_multi;
};

static void model_ring_one(struct ring_model *m, int64_t id)
{
    if (!m->has || (m->off >= m->s && m->s < m->max)) {
        int64_t g = m->max - m->off < 256 ? m->max - m->off : 256;
        for (int64_t r = 0; r < g; r++)
            m->ids[m->s + r] = -1;
        m->s += g;
        m->idx = m->off;
        m->has = true;
    }
    if (m->s > m->max) {
        int64_t d = m->s - m->max;
        memmove(m->ids, m->ids + d, (size_t)m->max * sizeof(int64_t));
        m->s = m->max;
        m->idx = m->max;
    }
    if (m->idx == m->max)
        m->idx = 0;
    m->ids[m->idx] = id;
    m->off++;
    m->idx++;
    m->last_multi = false;
}

static void model_ring_many(struct ring_model *m, const int64_t *ids, int64_t l)
{
    int64_t n = 0;
    if (m->has) {
        if (m->idx == m->s) {
            memcpy(m->tmp, m->ids, (size_t)m->s * sizeof(int64_t));
            n = m->s;
        } else if (m->idx < m->off) {
            memcpy(m->tmp, m->ids + m->idx, (size_t)(m->s - m->idx) * sizeof(int64_t));
            memcpy(m->tmp + m->s - m->idx, m->ids, (size_t)m->idx * sizeof(int64_t));
            n = m->s;
        } else {
            memcpy(m->tmp, m->ids, (size_t)m->idx * sizeof(int64_t));
            n = m->idx;
        }
        int64_t trim = n - m->max + 1;
        if (trim > 0) {
            memmove(m->tmp, m->tmp + trim, (size_t)(n - trim) * sizeof(int64_t));
            n -= trim;
        }
        memcpy(m->ids, m->tmp, (size_t)n * sizeof(int64_t));
    }
    memcpy(m->ids + n, ids, (size_t)l * sizeof(int64_t));
    m->s = n + l;
    m->off += l;
    m->idx = m->s;
    m->has = true;
    m->last_multi = true;
}

static void check_ring(const struct spec *s, const kvt_cache *c, const struct ring_model *m)
{
    struct kvt_cache_info info;
    kvt_cache_get_info(c, &info);
    if (!m->has) {
        struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
        assert_int_equal(kvt_cache_state(c, st), KVT_E_STATE);
        assert_int_equal(info.offset, 0);
        return;
    }
    assert_int_equal(info.offset, m->off);
    assert_int_equal(info.idx, m->idx);
    assert_int_equal(info.max_size, m->max);
    assert_int_equal(kvt_cache_capacity(c), m->s);
    assert_int_equal(kvt_cache_bytes(c), expect_step_bytes(s, m->s));
    assert_int_equal(kvt_cache_is_trimmable(c), m->off < m->max);
    check_state(s, c, m->ids, m->s);
    if (!m->last_multi && m->off < m->max)
        check_window(s, c, m->ids, m->off);
    else
        check_window(s, c, m->ids, m->s);
}

static void test_ring_vs_model(void **state)
{
    (void)state;
    static const int64_t maxes[] = {1, 3, 7, 300};
    uint64_t rng = 4242;
    for (size_t k = 0; k < 2; k++) {
        for (size_t mi = 0; mi < 4; mi++) {
            struct spec s = ring_specs[k];
            s.p.max_size = maxes[mi];
            kvt_cache *c;
            assert_int_equal(kvt_cache_new(&s.p, &c), 0);
            struct ring_model *m = calloc(1, sizeof(*m));
            m->max = maxes[mi];
            int64_t ids[1024];
            int ops = maxes[mi] == 300 ? 700 : 150;
            for (int op = 0; op < ops; op++) {
                uint64_t r = xs64(&rng) % 100;
                if (r < 70) {
                    assert_int_equal(append_ids(&s, c, ids, 1), 0);
                    model_ring_one(m, ids[0]);
                } else if (r < 80) {
                    int64_t l = 2 + (int64_t)(xs64(&rng) % (uint64_t)(2 * m->max + 2));
                    assert_int_equal(append_ids(&s, c, ids, l), 0);
                    model_ring_many(m, ids, l);
                } else {
                    int64_t n = 1 + (int64_t)(xs64(&rng) % 5);
                    int rc = kvt_cache_trim(c, n);
                    if (m->off < m->max) {
                        assert_int_equal(rc, 0);
                        int64_t t = n < m->off ? n : m->off;
                        m->off -= t;
                        m->idx -= t;
                    } else {
                        assert_int_equal(rc, KVT_E_STATE);
                    }
                }
                check_ring(&s, c, m);
            }
            free(m);
            kvt_cache_free(c);
        }
    }
}

static void test_ring_fixed(void **state)
{
    (void)state;
    /* maxSize 300 decode from empty: grows by 256, then by 44, then wraps in place */
    struct spec s = ring_specs[0];
    s.p.max_size = 300;
    kvt_cache *c;
    assert_int_equal(kvt_cache_new(&s.p, &c), 0);
    int64_t id[1];
    assert_int_equal(append_ids(&s, c, id, 1), 0);
    assert_int_equal(kvt_cache_capacity(c), 256);
    for (int i = 1; i < 256; i++)
        assert_int_equal(append_ids(&s, c, id, 1), 0);
    assert_int_equal(kvt_cache_capacity(c), 256);
    assert_int_equal(append_ids(&s, c, id, 1), 0);
    assert_int_equal(kvt_cache_capacity(c), 300);
    for (int i = 257; i < 300; i++)
        assert_int_equal(append_ids(&s, c, id, 1), 0);
    struct kvt_cache_info info;
    kvt_cache_get_info(c, &info);
    assert_int_equal(info.idx, 300);
    assert_true(kvt_cache_is_trimmable(c) == false);
    assert_int_equal(kvt_cache_trim(c, 1), KVT_E_STATE);
    assert_int_equal(append_ids(&s, c, id, 1), 0); /* wraps: idx 0 -> 1 */
    kvt_cache_get_info(c, &info);
    assert_int_equal(info.idx, 1);
    assert_int_equal(info.offset, 301);
    assert_int_equal(kvt_cache_capacity(c), 300);
    kvt_cache_free(c);

    /* a prefill chunk larger than maxSize: S = L, then the next token shrinks it to maxSize */
    s.p.max_size = 4;
    assert_int_equal(kvt_cache_new(&s.p, &c), 0);
    int64_t ids[10];
    assert_int_equal(append_ids(&s, c, ids, 10), 0);
    assert_int_equal(kvt_cache_capacity(c), 10);
    check_state(&s, c, ids, 10);
    check_window(&s, c, ids, 10);
    int64_t one[1];
    assert_int_equal(append_ids(&s, c, one, 1), 0);
    assert_int_equal(kvt_cache_capacity(c), 4);
    int64_t want[4] = {one[0], ids[7], ids[8], ids[9]};
    check_state(&s, c, want, 4);
    kvt_cache_get_info(c, &info);
    assert_int_equal(info.idx, 1);
    assert_int_equal(info.offset, 11);
    /* multi after wrap: temporal order [idx, S) ++ [0, idx), keep maxSize - 1, then append */
    int64_t two[2];
    assert_int_equal(append_ids(&s, c, two, 2), 0);
    int64_t want2[5] = {ids[8], ids[9], one[0], two[0], two[1]};
    check_state(&s, c, want2, 5);
    kvt_cache_free(c);
}

static void test_ssm(void **state)
{
    (void)state;
    struct kvt_cache_info p = {.kind = KVT_KIND_SSM};
    kvt_cache *c;
    assert_int_equal(kvt_cache_new(&p, &c), 0);
    assert_false(kvt_cache_is_trimmable(c));
    int64_t cs[3] = {1, 3, 40}, rs[4] = {1, 4, 8, 16};
    struct kvt_tensor conv, rec, st[2];
    uint64_t rng = 5;
    for (int round = 0; round < 3; round++) {
        synth_random_tensor(&conv, KVT_BFLOAT16, 3, cs, &rng);
        synth_random_tensor(&rec, KVT_FLOAT32, 4, rs, &rng);
        assert_int_equal(kvt_cache_ssm_update(c, &conv, &rec, 5 + round), 0);
        assert_int_equal(kvt_cache_state(c, st), 2);
        assert_int_equal(kvt_tensor_hash(&st[0]), kvt_tensor_hash(&conv));
        assert_int_equal(kvt_tensor_hash(&st[1]), kvt_tensor_hash(&rec));
        assert_int_equal(st[0].rank, 3);
        assert_int_equal(st[1].dtype, KVT_FLOAT32);
        assert_ptr_not_equal(st[0].buf, conv.buf); /* copied, not shared */
        release_all(st, 2);
        kvt_tensor_release(&conv);
        kvt_tensor_release(&rec);
    }
    assert_int_equal(kvt_cache_offset(c), 5 + 6 + 7);
    assert_int_equal(kvt_cache_bytes(c), 3 * 40 * 2 + 4 * 8 * 16 * 4);
    assert_int_equal(kvt_cache_capacity(c), 0);
    assert_int_equal(kvt_cache_trim(c, 0), 0);
    assert_int_equal(kvt_cache_trim(c, 1), KVT_E_STATE);
    assert_string_equal(kvt_last_error(), "SSMCache is not trimmable");
    assert_int_equal(kvt_cache_offset(c), 18);

    /* wrong shapes, dtypes, counts */
    int64_t cs2[3] = {1, 3, 41};
    assert_int_equal(kvt_tensor_zeros(&conv, KVT_BFLOAT16, 3, cs2), 0);
    assert_int_equal(kvt_tensor_zeros(&rec, KVT_FLOAT32, 4, rs), 0);
    assert_int_equal(kvt_cache_ssm_update(c, &conv, &rec, 1), -EINVAL);
    assert_int_equal(kvt_cache_ssm_update(c, &rec, &conv, 1), -EINVAL);
    assert_int_equal(kvt_cache_ssm_update(c, &conv, &rec, -1), -EINVAL);
    kvt_tensor_release(&conv);
    assert_int_equal(kvt_tensor_zeros(&conv, KVT_INT32, 3, cs), 0);
    assert_int_equal(kvt_cache_ssm_update(c, &conv, &rec, 1), -EINVAL);
    assert_int_equal(kvt_cache_append(c, &conv, 2), -EINVAL);
    kvt_tensor_release(&conv);
    kvt_tensor_release(&rec);
    assert_int_equal(kvt_cache_offset(c), 18);

    /* ssm_update on another kind */
    kvt_cache *kv;
    struct kvt_cache_info pk = {.kind = KVT_KIND_KV};
    assert_int_equal(kvt_cache_new(&pk, &kv), 0);
    assert_int_equal(kvt_tensor_zeros(&conv, KVT_BFLOAT16, 3, cs), 0);
    assert_int_equal(kvt_tensor_zeros(&rec, KVT_FLOAT32, 4, rs), 0);
    assert_int_equal(kvt_cache_ssm_update(kv, &conv, &rec, 1), -EINVAL);
    kvt_tensor_release(&conv);
    kvt_tensor_release(&rec);
    kvt_cache_free(kv);
    kvt_cache_free(c);
}

/* Build inputs for @p s, then break one property and expect -EINVAL. */
static void expect_bad_input(const struct spec *s, kvt_cache *c, int tensor, int what)
{
    int64_t ids[3] = {1, 2, 3};
    struct kvt_tensor in[KVT_MAX_CACHE_TENSORS];
    make_input(s, ids, 2, in);
    struct kvt_tensor saved = in[tensor];
    switch (what) {
    case 0: in[tensor].rank = 3; break;            /* rank */
    case 1: in[tensor].shape[2] = 1; break;        /* L disagrees */
    case 2: in[tensor].shape[1] = 0; break;        /* H disagrees */
    case 3: in[tensor].dtype = KVT_INT32; break;   /* dtype role */
    case 4: in[tensor].shape[3] -= 1; break;       /* last dim */
    case 5: in[tensor].buf = NULL; break;          /* not a view */
    default: in[tensor].shape[3] = 1 << 20; break; /* outside its buffer */
    }
    assert_int_equal(kvt_cache_append(c, in, s->nt), -EINVAL);
    in[tensor] = saved;
    assert_int_equal(kvt_cache_append(c, in, s->nt - 1), -EINVAL);
    release_all(in, s->nt);
}

static void test_input_validation(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof(step_specs) / sizeof(step_specs[0]); k++) {
        const struct spec *s = &step_specs[k];
        kvt_cache *c;
        assert_int_equal(kvt_cache_new(&s->p, &c), 0);
        for (int t = 0; t < s->nt; t++)
            for (int w = 0; w < 7; w++) {
                if (w == 4 && s->p.kind == KVT_KIND_KV)
                    continue; /* kv last dims are free */
                expect_bad_input(s, c, t, w);
            }
        assert_int_equal(kvt_cache_offset(c), 0);
        assert_int_equal(kvt_cache_capacity(c), 0);
        int64_t ids[4];
        assert_int_equal(append_ids(s, c, ids, 4), 0);
        /* after the first append the layout is fixed: another last dim is refused */
        struct spec other = *s;
        for (int i = 0; i < s->nt; i++)
            other.last[i] *= 2;
        if (s->p.kind == KVT_KIND_TURBOQUANT) /* a different headDim */
            assert_int_equal(append_ids(&other, c, ids, 1), -EINVAL);
        other = *s;
        other.h = s->h + 1;
        assert_int_equal(append_ids(&other, c, ids, 1), -EINVAL);
        assert_int_equal(kvt_cache_offset(c), 4);
        kvt_cache_free(c);
    }
    /* kv: V of another dtype, K of a non-activation dtype, zero tokens */
    struct spec s = step_specs[0];
    kvt_cache *c;
    assert_int_equal(kvt_cache_new(&s.p, &c), 0);
    int64_t ids[2];
    s.dtype[1] = KVT_FLOAT16;
    assert_int_equal(append_ids(&s, c, ids, 1), -EINVAL);
    s.dtype[0] = s.dtype[1] = KVT_INT16;
    assert_int_equal(append_ids(&s, c, ids, 1), -EINVAL);
    s = step_specs[0];
    assert_int_equal(append_ids(&s, c, ids, 0), -EINVAL);
    s.dtype[0] = s.dtype[1] = KVT_FLOAT32; /* a valid first append fixes the dtype */
    assert_int_equal(append_ids(&s, c, ids, 1), 0);
    s.dtype[0] = s.dtype[1] = KVT_BFLOAT16;
    assert_int_equal(append_ids(&s, c, ids, 1), -EINVAL);
    assert_int_equal(kvt_cache_append(NULL, NULL, 0), -EINVAL);
    assert_int_equal(kvt_cache_append(c, NULL, 2), -EINVAL);
    kvt_cache_free(c);

    /* turboquant: headDim outside {64, 128, 256, 512} at the first append; kIdx dtype role */
    struct spec tq = step_specs[3];
    assert_int_equal(kvt_cache_new(&tq.p, &c), 0);
    struct spec tq96 = tq;
    tq96.last[0] = 96 * 4 / 8;
    tq96.last[1] = tq96.last[2] = tq96.last[4] = 3;
    tq96.last[3] = 96 * 3 / 8;
    assert_int_equal(append_ids(&tq96, c, ids, 1), -EINVAL);
    struct spec tqi8 = tq;
    tqi8.dtype[0] = KVT_INT8; /* int8 only when kBits = 8 */
    assert_int_equal(append_ids(&tqi8, c, ids, 1), -EINVAL);
    struct kvt_cache_info info;
    kvt_cache_get_info(c, &info);
    assert_int_equal(info.head_dim, 0);
    assert_int_equal(append_ids(&tq, c, ids, 1), 0);
    kvt_cache_get_info(c, &info);
    assert_int_equal(info.head_dim, 64);
    kvt_cache_free(c);
    struct spec tq8 = step_specs[4];
    tq8.dtype[0] = KVT_UINT8;
    assert_int_equal(kvt_cache_new(&tq8.p, &c), 0);
    assert_int_equal(append_ids(&tq8, c, ids, 1), -EINVAL);
    kvt_cache_free(c);

    /* rings validate the same roles */
    struct spec r = ring_specs[1];
    r.p.max_size = 8;
    assert_int_equal(kvt_cache_new(&r.p, &c), 0);
    for (int t = 0; t < r.nt; t++)
        for (int w = 0; w < 7; w++)
            expect_bad_input(&r, c, t, w);
    kvt_cache_free(c);
}

/* ------------------------------------------------------------------------------------------
 * from_state round trips
 */

struct snap {
    int n;
    struct kvt_cache_info info;
    uint64_t hash[KVT_MAX_CACHE_TENSORS];
    size_t bytes[KVT_MAX_CACHE_TENSORS];
    int dtype[KVT_MAX_CACHE_TENSORS], rank[KVT_MAX_CACHE_TENSORS];
    int64_t shape[KVT_MAX_CACHE_TENSORS][KVT_MAX_RANK];
};

static void take_snap(const kvt_cache *c, struct snap *s)
{
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
    memset(s, 0, sizeof(*s));
    s->n = kvt_cache_state(c, st);
    assert_true(s->n > 0);
    kvt_cache_get_info(c, &s->info);
    for (int i = 0; i < s->n; i++) {
        s->hash[i] = kvt_tensor_hash(&st[i]);
        s->bytes[i] = kvt_tensor_nbytes(&st[i]);
        s->dtype[i] = st[i].dtype;
        s->rank[i] = st[i].rank;
        memcpy(s->shape[i], st[i].shape, sizeof(s->shape[i]));
    }
    release_all(st, s->n);
}

static void assert_snap_equal(const struct snap *a, const struct snap *b)
{
    assert_int_equal(a->n, b->n);
    assert_memory_equal(&a->info, &b->info, sizeof(a->info));
    for (int i = 0; i < a->n; i++) {
        assert_int_equal(a->hash[i], b->hash[i]);
        assert_int_equal(a->bytes[i], b->bytes[i]);
        assert_int_equal(a->dtype[i], b->dtype[i]);
        assert_int_equal(a->rank[i], b->rank[i]);
        assert_memory_equal(a->shape[i], b->shape[i], sizeof(a->shape[i]));
    }
}

/* What a loader builds: contiguous tensors, with STEP capacity for the step kinds. */
static void load_like(const kvt_cache *c, struct kvt_tensor *out, int *n)
{
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
    struct kvt_cache_info info;
    kvt_cache_get_info(c, &info);
    *n = kvt_cache_state(c, st);
    assert_true(*n > 0);
    bool step =
        info.kind == KVT_KIND_KV || info.kind == KVT_KIND_QKV || info.kind == KVT_KIND_TURBOQUANT;
    for (int i = 0; i < *n; i++) {
        int64_t shape[KVT_MAX_RANK];
        memcpy(shape, st[i].shape, sizeof(shape));
        if (step)
            shape[2] = (info.offset + 256) / 256 * 256;
        assert_int_equal(kvt_tensor_zeros(&out[i], st[i].dtype, st[i].rank, shape), 0);
        struct kvt_tensor dst;
        if (step)
            assert_int_equal(kvt_tensor_slice(&dst, &out[i], 2, 0, info.offset), 0);
        else
            kvt_tensor_share(&dst, &out[i]);
        assert_int_equal(kvt_tensor_copy(&dst, &st[i]), 0);
        kvt_tensor_release(&dst);
    }
    release_all(st, *n);
}

static void roundtrip(const kvt_cache *c, const struct spec *s)
{
    struct snap a, b;
    take_snap(c, &a);
    struct kvt_cache_info info;
    kvt_cache_get_info(c, &info);

    /* straight from the (possibly strided) state views */
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
    int n = kvt_cache_state(c, st);
    kvt_cache *r;
    assert_int_equal(kvt_cache_from_state(&info, st, n, &r), 0);
    release_all(st, n);
    take_snap(r, &b);
    assert_snap_equal(&a, &b);
    kvt_cache_free(r);

    /* as a loader does: capacity beyond offset for the step kinds */
    struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
    load_like(c, t, &n);
    assert_int_equal(kvt_cache_from_state(&info, t, n, &r), 0);
    const void *p0 = kvt_buf_data(t[0].buf);
    release_all(t, n);
    take_snap(r, &b);
    assert_snap_equal(&a, &b);
    bool step =
        info.kind == KVT_KIND_KV || info.kind == KVT_KIND_QKV || info.kind == KVT_KIND_TURBOQUANT;
    if (step) {
        int64_t cap = (info.offset + 256) / 256 * 256;
        assert_int_equal(kvt_cache_capacity(r), cap);
        assert_int_equal(kvt_cache_bytes(r), expect_step_bytes(s, cap));
        /* one token goes in place, and trimming it restores the persisted form */
        int64_t id[1];
        assert_int_equal(append_ids(s, r, id, 1), 0);
        struct kvt_tensor w[KVT_MAX_CACHE_TENSORS];
        assert_int_equal(kvt_cache_window(r, w), n);
        assert_ptr_equal(kvt_buf_data(w[0].buf), p0);
        release_all(w, n);
        assert_int_equal(kvt_cache_capacity(r), cap);
        assert_int_equal(kvt_cache_trim(r, 1), 0);
        take_snap(r, &b);
        assert_snap_equal(&a, &b);
    } else if (info.kind != KVT_KIND_SSM) {
        assert_int_equal(kvt_cache_capacity(r), a.shape[0][2]);
    }
    kvt_cache_free(r);
}

static void test_from_state_roundtrip(void **state)
{
    (void)state;
    static const int64_t offs[] = {1, 8, 255, 256, 300};
    for (size_t k = 0; k < sizeof(step_specs) / sizeof(step_specs[0]); k++) {
        for (size_t o = 0; o < 5; o++) {
            const struct spec *s = &step_specs[k];
            kvt_cache *c;
            assert_int_equal(kvt_cache_new(&s->p, &c), 0);
            int64_t ids[512];
            assert_int_equal(append_ids(s, c, ids, offs[o]), 0);
            roundtrip(c, s);
            assert_int_equal(kvt_cache_trim(c, offs[o]), 0); /* offset 0 with a buffer */
            roundtrip(c, s);
            kvt_cache_free(c);
        }
    }
    for (size_t k = 0; k < 2; k++) {
        struct spec s = ring_specs[k];
        s.p.max_size = 6;
        kvt_cache *c;
        assert_int_equal(kvt_cache_new(&s.p, &c), 0);
        int64_t ids[16];
        assert_int_equal(append_ids(&s, c, ids, 1), 0);
        roundtrip(c, &s); /* pre-wrap, slack rows */
        assert_int_equal(append_ids(&s, c, ids, 9), 0);
        roundtrip(c, &s); /* S > maxSize */
        for (int i = 0; i < 3; i++)
            assert_int_equal(append_ids(&s, c, ids, 1), 0);
        roundtrip(c, &s); /* wrapped */
        kvt_cache_free(c);
    }
    struct kvt_cache_info p = {.kind = KVT_KIND_SSM};
    kvt_cache *c;
    assert_int_equal(kvt_cache_new(&p, &c), 0);
    int64_t cs[3] = {1, 3, 8}, rs[4] = {1, 2, 4, 4};
    struct kvt_tensor conv, rec;
    uint64_t rng = 3;
    synth_random_tensor(&conv, KVT_FLOAT16, 3, cs, &rng);
    synth_random_tensor(&rec, KVT_FLOAT32, 4, rs, &rng);
    assert_int_equal(kvt_cache_ssm_update(c, &conv, &rec, 12), 0);
    kvt_tensor_release(&conv);
    kvt_tensor_release(&rec);
    roundtrip(c, NULL);
    kvt_cache_free(c);
}

static void test_from_state_validation(void **state)
{
    (void)state;
    const struct spec *s = &step_specs[2]; /* qkv */
    kvt_cache *c, *r = (kvt_cache *)1;
    assert_int_equal(kvt_cache_new(&s->p, &c), 0);
    int64_t ids[20];
    assert_int_equal(append_ids(s, c, ids, 20), 0);
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
    struct kvt_cache_info info;
    kvt_cache_get_info(c, &info);
    assert_int_equal(kvt_cache_state(c, st), 6);

    assert_int_equal(kvt_cache_from_state(&info, st, 5, &r), -EINVAL);
    assert_null(r);
    struct kvt_cache_info bad = info;
    bad.offset = 21; /* more tokens than rows */
    assert_int_equal(kvt_cache_from_state(&bad, st, 6, &r), -EINVAL);
    /* the message names the operation: building a cache, not restoring one */
    assert_string_equal(kvt_last_error(),
                        "qkv cache from tensors: 20 rows hold fewer than offset 21 tokens");
    bad = info;
    bad.bits = 3; /* packed last dim no longer matches */
    assert_int_equal(kvt_cache_from_state(&bad, st, 6, &r), -EINVAL);
    bad = info;
    bad.offset = -1;
    assert_int_equal(kvt_cache_from_state(&bad, st, 6, &r), -EINVAL);
    assert_string_equal(kvt_last_error(), "qkv cache from tensors: offset -1 < 0");
    struct kvt_tensor keep = st[2];
    st[2].dtype = KVT_FLOAT16; /* biases differ from scales */
    assert_int_equal(kvt_cache_from_state(&info, st, 6, &r), -EINVAL);
    st[2] = keep;
    keep = st[3];
    st[3] = st[0]; /* two tensors over the same bytes */
    assert_int_equal(kvt_cache_from_state(&info, st, 6, &r), -EINVAL);
    st[3] = keep;
    st[3].rank = 3;
    assert_int_equal(kvt_cache_from_state(&info, st, 6, &r), -EINVAL);
    st[3] = keep;
    assert_int_equal(kvt_cache_from_state(&info, st, 6, &r), 0);
    kvt_cache_free(r);
    release_all(st, 6);
    kvt_cache_free(c);

    /* rings: idx within [0, S], S >= offset before wrapping */
    struct spec rs = ring_specs[0];
    rs.p.max_size = 10;
    assert_int_equal(kvt_cache_new(&rs.p, &c), 0);
    assert_int_equal(append_ids(&rs, c, ids, 4), 0);
    kvt_cache_get_info(c, &info);
    assert_int_equal(kvt_cache_state(c, st), 2);
    bad = info;
    bad.idx = 5;
    assert_int_equal(kvt_cache_from_state(&bad, st, 2, &r), -EINVAL);
    bad = info;
    bad.offset = 5; /* 4 rows cannot hold 5 tokens before the ring wrapped */
    assert_int_equal(kvt_cache_from_state(&bad, st, 2, &r), -EINVAL);
    bad.offset = 12; /* after wrapping any S is allowed */
    assert_int_equal(kvt_cache_from_state(&bad, st, 2, &r), 0);
    assert_false(kvt_cache_is_trimmable(r));
    kvt_cache_free(r);
    bad = info;
    bad.max_size = 0;
    assert_int_equal(kvt_cache_from_state(&bad, st, 2, &r), -EINVAL);
    st[1].dtype = KVT_FLOAT16; /* K and V must agree */
    assert_int_equal(kvt_cache_from_state(&info, st, 2, &r), -EINVAL);
    st[1].dtype = st[0].dtype;
    release_all(st, 2);
    kvt_cache_free(c);

    /* turboquant: headDim must be given and match the tensors */
    const struct spec *tq = &step_specs[3];
    assert_int_equal(kvt_cache_new(&tq->p, &c), 0);
    assert_int_equal(append_ids(tq, c, ids, 3), 0);
    kvt_cache_get_info(c, &info);
    assert_int_equal(kvt_cache_state(c, st), 5);
    bad = info;
    bad.head_dim = 0;
    assert_int_equal(kvt_cache_from_state(&bad, st, 5, &r), -EINVAL);
    bad.head_dim = 128;
    assert_int_equal(kvt_cache_from_state(&bad, st, 5, &r), -EINVAL);
    bad = info;
    bad.k_bits = 8;
    assert_int_equal(kvt_cache_from_state(&bad, st, 5, &r), -EINVAL);
    assert_int_equal(kvt_cache_from_state(&info, st, 5, &r), 0);
    kvt_cache_free(r);
    release_all(st, 5);
    kvt_cache_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kind_table),
        cmocka_unit_test(test_new_params),
        cmocka_unit_test(test_empty_cache),
        cmocka_unit_test(test_step_growth_fixed),
        cmocka_unit_test(test_step_growth_random),
        cmocka_unit_test(test_ring_vs_model),
        cmocka_unit_test(test_ring_fixed),
        cmocka_unit_test(test_ssm),
        cmocka_unit_test(test_input_validation),
        cmocka_unit_test(test_from_state_roundtrip),
        cmocka_unit_test(test_from_state_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
