/*
 * Restores into device memory. On the host stand-in (everywhere): every slot lands byte for
 * byte in its device allocation for staging rings of 2-16 slots and chunks of 8 KiB to 8 MiB,
 * loaded by one thread or several sharing the ring, with copies that take longer than the reads (a
 * slot reused before its copy finished would corrupt the result); unplaced slots are still checked;
 * a corrupt slot fails the load and a corrupt store file is a miss; uploads and downloads of odd
 * sizes round-trip. CUDA: opening a device where there is no driver reports "unavailable" and the
 * CUDA case is skipped; where there is one, the same restore and a save from device memory run on
 * the GPU. Saves from device memory (stand-in) write exactly the bytes of the host twin, through a
 * file or a store; device caches refuse appends; the RAM tier and the in-memory file image (what
 * remote uploads send) refuse device entries.
 */
#include "support/support.h"

#include "format/format.h"
#include "threads/par_for.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
        {8192, 8, 200},     /* several threads, each with its run of slots, sharing the ring */
        {16384, 16, 0},
    };
    unsigned long helpers = kvt_par_helpers_started();
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        kvt_device *d;
        assert_int_equal(kvt_device_open_host(&cases[c], &d), 0);
        assert_string_equal(kvt_device_name(d), "host stand-in");
        restore_on(d, path, want, total, -1);
        restore_on(d, path, want, total, 2);
        kvt_device_close(d);
    }
    if (kvt_par_cpus() > 1)
        assert_true(kvt_par_helpers_started() > helpers); /* the parallel loads ran */
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
    /* the same through several threads: the corrupt slot's message comes back */
    struct kvt_device_opts par = {.staging_chunk = 4096, .staging_depth = 8};
    kvt_device *dp;
    assert_int_equal(kvt_device_open_host(&par, &dp), 0);
    p = (struct dplace){.d = dp, .skip = -1};
    assert_int_equal(kvt_file_load_to_device(path, NULL, dp, place, &p, &h), KVT_E_CORRUPT);
    assert_non_null(strstr(kvt_last_error(), "caches[1].tensors[0]"));
    dplace_free(&p);
    kvt_device_close(dp);

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

/* Placement that only checks: every slot 0, their count in *@p ud. */
static int place_none(void *ud, const struct kvt_header *h, uint64_t *dst)
{
    int *n = ud;
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++)
            dst[(*n)++] = 0;
    return 0;
}

/* A file of many empty tensors (40 kv caches of no rows: no bytes at all to split) loads: the
 * split over threads never makes more runs than threads, whatever the slots weigh. */
static void test_host_standin_empty_tensors(void **state)
{
    (void)state;
    kvt_cache *c[40];
    for (int l = 0; l < 40; l++) {
        const int64_t shape[4] = {1, 2, 0, 4};
        struct kvt_tensor t[2];
        for (int w = 0; w < 2; w++)
            assert_int_equal(kvt_tensor_zeros(&t[w], KVT_BFLOAT16, 4, shape), 0);
        struct kvt_cache_info info = {.kind = KVT_KIND_KV};
        assert_int_equal(kvt_cache_from_state(&info, t, 2, &c[l]), 0);
        kvt_tensor_release(&t[0]);
        kvt_tensor_release(&t[1]);
    }
    int32_t tok[1] = {9};
    struct kvt_entry *e;
    assert_int_equal(kvt_entry_new(tok, 1, c, 40, "", &e), 0);
    char *path = strf("%s/empty.mlxkv", test_dir);
    assert_int_equal(kvt_file_save(path, e, NULL, NULL), 0);
    kvt_entry_free(e);
    const struct kvt_device_opts cases[] = {{8192, 4, 0}, {4096, 16, 0}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        kvt_device *d;
        assert_int_equal(kvt_device_open_host(&cases[k], &d), 0);
        int n = 0;
        struct kvt_header *h;
        assert_int_equal(kvt_file_load_to_device(path, NULL, d, place_none, &n, &h), 0);
        assert_int_equal(n, 80);
        assert_int_equal(h->n_caches, 40);
        kvt_header_free(h);
        kvt_device_close(d);
    }
    free(path);
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

    /* a refusal is the caller's: the record stays */
    p.refuse = KVT_E_MISMATCH;
    assert_int_equal(kvt_store_restore_to_device(s, &hit, d, place, &p, &h), KVT_E_MISMATCH);
    assert_null(h);
    assert_int_equal(kvt_store_find(s, tok, 301, "", &hit), 0);
    assert_int_equal(hit.prefix_len, 300);
    p.refuse = 0;

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

/* A twin of host entry @p e whose tensors live in device memory of @p d. */
/* The saved file holds exactly the host twin's bytes. */
static void assert_file_is(const char *path, const uint8_t *want, size_t total)
{
    struct kvt_entry *back;
    assert_int_equal(kvt_file_load(path, NULL, &back, NULL), 0);
    size_t n;
    uint8_t *got = synth_entry_bytes(back, &n);
    assert_int_equal(n, total);
    assert_memory_equal(got, want, total);
    free(got);
    kvt_entry_free(back);
}

static void test_save_from_device(void **state)
{
    (void)state;
    int32_t tok[901];
    for (int i = 0; i < 901; i++)
        tok[i] = i * 7 + 2;
    struct kvt_entry *e = synth_random_entry(tok, 900, 5, MODEL, FP, TOK);
    size_t total;
    uint8_t *want = synth_entry_bytes(e, &total);
    const struct kvt_device_opts cases[] = {{8192, 2, 300}, {65536, 5, 20}, {0, 0, 0}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        kvt_device *d;
        assert_int_equal(kvt_device_open_host(&cases[c], &d), 0);
        struct kvt_entry *de = synth_device_twin(d, e, MODEL, FP, TOK);
        char *path = strf("%s/dev%zu.mlxkv", test_dir, c);
        struct kvt_save_opts so = {.no_sync = true};
        assert_int_equal(kvt_file_save(path, de, &so, NULL), 0);
        assert_file_is(path, want, total);
        free(path);

        /* through a store, found and restored like any other entry */
        struct kvt_store_opts sto;
        store_opts_for(&sto, MODEL, FP, TOK);
        kvt_store *s;
        char *dir = strf("%s/store%zu", test_dir, c);
        assert_int_equal(kvt_store_open(dir, &sto, &s), 0);
        assert_int_equal(kvt_store_put(s, de, NULL, NULL), 0);
        struct kvt_hit hit;
        assert_int_equal(kvt_store_find(s, tok, 901, "", &hit), 0); /* the entry and one more */
        assert_int_equal(hit.prefix_len, 900);
        struct kvt_store_record *v;
        size_t nv;
        assert_int_equal(kvt_store_list(s, &v, &nv), 0);
        assert_int_equal(nv, 1);
        assert_file_is(v[0].path, want, total);
        kvt_store_list_free(v);
        kvt_store_close(s);
        free(dir);

        /* device caches are saved, never changed */
        struct kvt_tensor in[2];
        const int64_t shape[4] = {1, 4, 1, 96};
        for (int w = 0; w < 2; w++)
            assert_int_equal(kvt_tensor_zeros(&in[w], KVT_FLOAT16, 4, shape), 0);
        assert_int_equal(kvt_cache_append(de->caches[0], in, 2), KVT_E_UNSUPPORTED);
        assert_non_null(strstr(kvt_last_error(), "device memory"));
        kvt_tensor_release(&in[0]);
        kvt_tensor_release(&in[1]);
        kvt_entry_free(de);
        kvt_device_close(d);
    }
    kvt_entry_free(e);
    free(want);
}

static void test_device_entries_refused(void **state)
{
    (void)state;
    kvt_device *d;
    assert_int_equal(kvt_device_open_host(NULL, &d), 0);
    int32_t tok[64];
    for (int i = 0; i < 64; i++)
        tok[i] = i;
    struct kvt_entry *e = synth_random_entry(tok, 64, 9, MODEL, FP, TOK);
    struct kvt_entry *de = synth_device_twin(d, e, MODEL, FP, TOK);

    /* there is no image of its file bytes in memory (what remote uploads send) */
    struct kvt_image *im = (void *)1;
    assert_int_equal(kvt_image_new(de, NULL, &im), KVT_E_UNSUPPORTED);
    assert_null(im);

    /* the RAM tier holds host memory only: the entry is refused (and freed) */
    struct kvt_pcache_opts po;
    kvt_pcache_opts_init(&po);
    po.ram_max_bytes = 1 << 20;
    kvt_pcache *pc;
    assert_int_equal(kvt_pcache_open(&po, &pc), 0);
    assert_int_equal(kvt_pcache_put(pc, de, NULL), KVT_E_UNSUPPORTED);
    kvt_pcache_close(pc);

    /* a strided view of device memory cannot be made into a cache */
    uint64_t addr;
    assert_int_equal(kvt_device_alloc(d, 4 * 8 * 16 * 2, &addr), 0);
    kvt_buf *b = synth_device_buf(d, addr, 4 * 8 * 16 * 2);
    uint64_t where = 0;
    assert_ptr_equal(kvt_buf_device(b, &where), d);
    assert_int_equal(where, addr);
    assert_int_equal(kvt_device_ordinal(d), -1);
    struct kvt_tensor host[KVT_MAX_CACHE_TENSORS];
    assert_int_equal(kvt_cache_state(e->caches[0], host), 2);
    assert_null(kvt_buf_device(host[0].buf, &where)); /* host memory */
    kvt_tensor_release(&host[0]);
    kvt_tensor_release(&host[1]);
    struct kvt_tensor t[2];
    const int64_t shape[4] = {1, 4, 8, 16};
    assert_int_equal(kvt_tensor_init(&t[0], b, 0, KVT_FLOAT16, 4, shape), 0);
    t[1] = t[0];
    kvt_buf_ref(b);
    t[1].shape[2] = 4; /* rows 0..3 of 8: not contiguous */
    struct kvt_cache_info info = {.kind = KVT_KIND_KV, .offset = 4};
    kvt_cache *c;
    assert_int_equal(kvt_cache_from_state(&info, t, 2, &c), -EINVAL);
    kvt_tensor_release(&t[0]);
    kvt_tensor_release(&t[1]);
    kvt_buf_unref(b);
    assert_int_equal(kvt_buf_wrap_device(NULL, 1, 8, NULL, NULL, &b), -EINVAL);
    assert_null(b);

    /* memory past the end of its allocation: refused at the wrap (released), and a copy that
     * would run past it fails, as CUDA's does */
    assert_int_equal(kvt_device_alloc(d, 1000, &addr), 0);
    b = (kvt_buf *)1;
    int live = synth_device_live;
    assert_int_equal(kvt_buf_wrap_device(d, addr + 8, 1000, synth_device_release,
                                         synth_device_hold(d, addr), &b),
                     -EINVAL);
    assert_int_equal(synth_device_live, live); /* released, and the allocation freed */
    assert_null(b);
    assert_non_null(strstr(kvt_last_error(), "run past the end of their device allocation"));
    assert_int_equal(kvt_device_alloc(d, 1000, &addr), 0);
    uint8_t back[1001];
    assert_int_equal(kvt_device_download(d, back, addr, 1001), -EINVAL);
    assert_non_null(strstr(kvt_last_error(), "invalid argument"));
    assert_int_equal(kvt_device_download(d, back, addr + 1, 999), 0);
    kvt_device_free(d, addr);
    kvt_entry_free(e);
    kvt_device_close(d);
}

/* Device memory of @p n bytes with @p mark at its start, middle and end (the rest untouched:
 * the stand-in's pages stay unmade). */
static uint64_t marked_alloc(kvt_device *d, size_t n, uint8_t mark)
{
    uint64_t addr;
    assert_int_equal(kvt_device_alloc(d, n, &addr), 0);
    uint8_t m[4096];
    memset(m, mark, sizeof(m));
    const size_t at[3] = {0, n / 2, n - sizeof(m)};
    for (int i = 0; i < 3; i++)
        assert_int_equal(kvt_device_upload(d, addr + at[i], m, sizeof(m)), 0);
    return addr;
}

/* An entry over 4 GiB (one layer, K and V of 2.1 GB each) saved from device memory: every
 * byte lands where the header says, the hashes check, and V lies past 4 GiB in the file. */
static void test_save_over_4gib(void **state)
{
    (void)state;
    kvt_device *d;
    assert_int_equal(kvt_device_open_host(NULL, &d), 0);
    const int64_t n = 16400, shape[4] = {1, 1, n, 65536};
    const size_t bytes = (size_t)n * 65536 * 2;
    struct kvt_tensor t[2];
    for (int w = 0; w < 2; w++) {
        kvt_buf *b = synth_device_buf(d, marked_alloc(d, bytes, (uint8_t)(0xA0 + w)), bytes);
        assert_int_equal(kvt_tensor_init(&t[w], b, 0, KVT_BFLOAT16, 4, shape), 0);
        kvt_buf_unref(b);
    }
    struct kvt_cache_info info = {.kind = KVT_KIND_KV, .offset = n};
    kvt_cache *c;
    assert_int_equal(kvt_cache_from_state(&info, t, 2, &c), 0);
    kvt_tensor_release(&t[0]);
    kvt_tensor_release(&t[1]);
    int32_t *tok = malloc((size_t)n * sizeof(*tok));
    for (int64_t i = 0; i < n; i++)
        tok[i] = (int32_t)(i % 30000);
    struct kvt_entry *e;
    assert_int_equal(kvt_entry_new(tok, (size_t)n, &c, 1, "", &e), 0);
    free(tok);
    char *path = strf("%s/big.mlxkv", test_dir);
    struct kvt_save_opts so = {.no_sync = true};
    uint64_t file;
    assert_int_equal(kvt_file_save(path, e, &so, &file), 0);
    kvt_entry_free(e);
    assert_true(file > ((uint64_t)4 << 30));

    struct kvt_header *h;
    assert_int_equal(kvt_file_read_header(path, NULL, &h), 0);
    assert_int_equal(h->caches[0].n_slots, 2);
    FILE *f = fopen(path, "rb");
    for (int w = 0; w < 2; w++) {
        const struct kvt_slot *sl = &h->caches[0].slots[w];
        assert_int_equal(sl->bytes, bytes);
        const uint64_t at[4] = {0, bytes / 2, bytes - 4096, 4096};
        for (int i = 0; i < 4; i++) {
            uint8_t got[4096], want[4096];
            memset(want, i < 3 ? 0xA0 + w : 0, sizeof(want)); /* unwritten memory reads 0 */
            assert_int_equal(fseeko(f, (off_t)(kvt_slot_abs(h, sl) + at[i]), SEEK_SET), 0);
            assert_int_equal(fread(got, 1, sizeof(got), f), sizeof(got));
            assert_memory_equal(got, want, sizeof(got));
        }
    }
    assert_true(kvt_slot_abs(h, &h->caches[0].slots[1]) + bytes > ((uint64_t)4 << 30));
    fclose(f);
    kvt_header_free(h);
    unlink(path);
    free(path);
    kvt_device_close(d);
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
    free(path);
    free(want);

    int32_t tok[3000];
    for (int i = 0; i < 3000; i++)
        tok[i] = i + 1;
    struct kvt_entry *e = synth_random_entry(tok, 3000, 4, MODEL, FP, TOK);
    want = synth_entry_bytes(e, &total);
    struct kvt_entry *de = synth_device_twin(d, e, MODEL, FP, TOK);
    path = strf("%s/from-cuda.mlxkv", test_dir);
    struct kvt_save_opts so = {.no_sync = true};
    assert_int_equal(kvt_file_save(path, de, &so, NULL), 0);
    assert_file_is(path, want, total);
    kvt_entry_free(de);
    kvt_entry_free(e);
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
        cmocka_unit_test_setup_teardown(test_host_standin_empty_tensors, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_store_restore_to_device, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_save_from_device, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_device_entries_refused, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_save_over_4gib, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_cuda, test_dir_setup, test_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
