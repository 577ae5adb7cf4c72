/*
 * The RAM tier over device entries (kvt_pcache_opts.device), on the host stand-in: a put from
 * device memory lands in page-locked host memory and frees the device memory; takes land the
 * cut prefix byte for byte in memory the placement gives, from RAM or streamed from the file
 * of a disk hit (and, for caches whose rows cannot be cut, through the host); the write-behind
 * saves the host copy; an entry the pool has no room for is saved from device memory instead.
 */
#include "support/redis_srv.h"
#include "support/support.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const MODEL = "test/model";
static const char *const FP = "fp-tier-device";
static const char *const TOK = "tk-test";

#define LAYERS 3
#define HEADS 4
#define DIM 32

static int32_t *tokens(size_t n, int32_t salt)
{
    int32_t *t = malloc((n + 1) * sizeof(*t));
    for (size_t i = 0; i <= n; i++)
        t[i] = (int32_t)(i * 5 + 1) + (i >= 600 ? salt : 0);
    return t;
}

/* A host entry of LAYERS kv caches of [1, HEADS, n, DIM] float16. */
static struct kvt_entry *kv_entry(const int32_t *tok, size_t n, uint64_t seed)
{
    kvt_cache *c[LAYERS];
    for (int l = 0; l < LAYERS; l++)
        c[l] = synth_random_kv(KVT_FLOAT16, HEADS, (int64_t)n, DIM, &seed);
    struct kvt_entry *e;
    assert_int_equal(kvt_entry_new(tok, n, c, LAYERS, "", &e), 0);
    e->meta.model_id = strdup(MODEL);
    e->meta.config_fingerprint = strdup(FP);
    e->meta.tokenizer_hash = strdup(TOK);
    return e;
}

/* Placement: one device allocation per slot, as the header sizes it. */
struct dest {
    kvt_device *d;
    uint64_t addr[64], bytes[64];
    int n, calls;
};

static int place(void *ud, const struct kvt_header *h, uint64_t *dst)
{
    struct dest *p = ud;
    p->calls++;
    int k = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++, k++) {
            p->bytes[k] = h->caches[i].slots[j].bytes;
            assert_int_equal(kvt_device_alloc(p->d, p->bytes[k], &p->addr[k]), 0);
            dst[k] = p->addr[k];
        }
    p->n = k;
    return 0;
}

static void dest_free(struct dest *p)
{
    for (int k = 0; k < p->n; k++)
        kvt_device_free(p->d, p->addr[k]);
    p->n = 0;
}

/* The device holds the first @p keep tokens of every state tensor of host entry @p e. */
static void assert_landed(struct dest *p, const struct kvt_entry *e, size_t keep)
{
    int k = 0;
    for (size_t i = 0; i < e->n_caches; i++) {
        struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
        int nt = kvt_cache_state(e->caches[i], st);
        for (int j = 0; j < nt; j++, k++) {
            size_t n = kvt_tensor_nbytes(&st[j]);
            uint8_t *full = malloc(n), *got = malloc(p->bytes[k] + 1);
            kvt_tensor_copy_out(&st[j], full);
            int64_t rows = st[j].shape[0] * st[j].shape[1], t = st[j].shape[2];
            size_t row = n / (size_t)rows, kept = row / (size_t)t * keep;
            assert_int_equal(p->bytes[k], kept * (size_t)rows);
            assert_int_equal(kvt_device_download(p->d, got, p->addr[k], p->bytes[k]), 0);
            for (int64_t r = 0; r < rows; r++)
                assert_memory_equal(got + (size_t)r * kept, full + (size_t)r * row, kept);
            free(full);
            free(got);
            kvt_tensor_release(&st[j]);
        }
    }
    assert_int_equal(k, p->n);
}

/* Take @p prompt (@p n tokens) into device memory: the prefix served, or 0. */
static size_t take(kvt_pcache *pc, struct dest *p, const int32_t *prompt, size_t n, bool *disk)
{
    struct kvt_take t;
    struct kvt_header *h;
    dest_free(p);
    assert_int_equal(kvt_pcache_take_to_device(pc, prompt, n, "", place, p, &t, &h), 0);
    assert_null(t.entry);
    assert_null(t.retain);
    if (disk)
        *disk = t.from_disk;
    size_t got = h ? h->n_tokens : 0;
    if (h) {
        for (size_t i = 0; i < h->n_caches; i++)
            assert_int_equal(h->caches[i].slots[0].shape[2], (int64_t)got);
        assert_memory_equal(h->tokens, prompt, got * sizeof(*prompt));
    }
    kvt_header_free(h);
    return got;
}

static kvt_pcache *open_pc(kvt_device *d, const char *dir, uint64_t ram, int64_t spill)
{
    struct kvt_pcache_opts o;
    kvt_pcache_opts_init(&o);
    o.ram_max_bytes = ram;
    o.spill_queue_max_bytes = spill;
    o.device = d;
    o.demote_idle_ms = 0;
    if (dir) {
        o.cold_dir = dir;
        store_opts_for(&o.cold, MODEL, FP, TOK);
    }
    kvt_pcache *pc;
    assert_int_equal(kvt_pcache_open(&o, &pc), 0);
    return pc;
}

static void test_put_and_take_in_ram(void **state)
{
    (void)state;
    struct kvt_device_opts dopts = {
        .staging_chunk = 16384, .staging_depth = 3, .copy_delay_us = 50};
    kvt_device *d;
    assert_int_equal(kvt_device_open_host(&dopts, &d), 0);
    int32_t *tok = tokens(900, 0), *other = tokens(900, 7);
    struct kvt_entry *e = kv_entry(tok, 900, 3);
    int live = synth_device_live;
    kvt_pcache *pc = open_pc(d, NULL, 64 << 20, 0);

    assert_int_equal(kvt_pcache_put(pc, synth_device_twin(d, e, MODEL, FP, TOK), NULL), 0);
    assert_int_equal(synth_device_live, live); /* copied out: the device memory is free */
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    assert_int_equal(st.records, 1);
    assert_int_equal(st.total_bytes, LAYERS * 2 * HEADS * 900 * DIM * 2); /* rows held, no more */

    struct dest p = {.d = d};
    bool disk = true;
    assert_int_equal(take(pc, &p, other, 901, &disk), 600); /* diverges after 600 */
    assert_false(disk);
    assert_landed(&p, e, 600);
    assert_int_equal(take(pc, &p, tok, 901, NULL), 900); /* the whole entry; it stays in RAM */
    assert_landed(&p, e, 900);
    assert_int_equal(take(pc, &p, tok, 900, NULL), 899); /* the last token is left to compute */
    assert_landed(&p, e, 899);
    /* an entry with a cache in host memory beside those in device memory */
    struct kvt_entry *mixed = synth_device_twin(d, e, MODEL, FP, TOK);
    kvt_cache_free(mixed->caches[1]);
    assert_int_equal(kvt_cache_clone(e->caches[1], &mixed->caches[1]), 0);
    assert_int_equal(kvt_pcache_put(pc, mixed, NULL), 0); /* replaces the first: same tokens */
    kvt_pcache_get_stats(pc, &st);
    assert_int_equal(st.records, 1);
    assert_int_equal(take(pc, &p, other, 901, NULL), 600);
    assert_landed(&p, e, 600);
    int32_t miss[4] = {99, 98, 97, 96};
    assert_int_equal(take(pc, &p, miss, 4, NULL), 0);
    assert_int_equal(p.n, 0);

    /* another device's entry is refused as before; so are takes without a device */
    kvt_device *d2;
    assert_int_equal(kvt_device_open_host(NULL, &d2), 0);
    assert_int_equal(kvt_pcache_put(pc, synth_device_twin(d2, e, MODEL, FP, TOK), NULL),
                     KVT_E_UNSUPPORTED);
    assert_int_equal(synth_device_live, live);
    kvt_device_close(d2);
    kvt_pcache *plain = open_pc(NULL, NULL, 1 << 20, 0);
    struct kvt_take t;
    struct kvt_header *h = (void *)1;
    assert_int_equal(kvt_pcache_take_to_device(plain, tok, 900, "", place, &p, &t, &h), -EINVAL);
    assert_null(h);
    kvt_pcache_close(plain);

    dest_free(&p);
    kvt_pcache_close(pc);
    kvt_entry_free(e);
    free(tok);
    free(other);
    kvt_device_close(d);
}

/* The one file of the store, loaded to the host. */
static struct kvt_entry *stored(kvt_pcache *pc)
{
    struct kvt_store_record *v;
    size_t nv;
    assert_int_equal(kvt_store_list(kvt_pcache_store(pc), &v, &nv), 0);
    assert_int_equal(nv, 1);
    struct kvt_entry *back;
    assert_int_equal(kvt_file_load(v[0].path, NULL, &back, NULL), 0);
    kvt_store_list_free(v);
    return back;
}

static void test_write_behind_and_disk_hits(void **state)
{
    (void)state;
    kvt_device *d;
    assert_int_equal(kvt_device_open_host(NULL, &d), 0);
    char *dir = strf("%s/store", test_dir);
    int32_t *tok = tokens(900, 0), *other = tokens(900, 7);
    struct kvt_entry *e = kv_entry(tok, 900, 8);
    kvt_pcache *pc = open_pc(d, dir, 64 << 20, 16 << 20);
    assert_int_equal(kvt_pcache_put(pc, synth_device_twin(d, e, MODEL, FP, TOK), NULL), 0);
    struct kvt_flush_report r;
    assert_int_equal(kvt_pcache_flush(pc, 30000, &r), 0);
    assert_true(r.durable);
    struct kvt_entry *back = stored(pc); /* the host copy was saved: the same bytes */
    assert_true(synth_same_entry_bytes(back, e));
    kvt_entry_free(back);
    kvt_pcache_close(pc);

    /* a new process: the prefix streams from the file into device memory, cut */
    pc = open_pc(d, dir, 64 << 20, 16 << 20);
    struct dest p = {.d = d};
    bool disk = false;
    assert_int_equal(take(pc, &p, other, 901, &disk), 600);
    assert_true(disk);
    assert_landed(&p, e, 600);
    assert_int_equal(take(pc, &p, tok, 901, &disk), 900);
    assert_true(disk);
    assert_landed(&p, e, 900);
    kvt_pcache_close(pc);

    /* caches whose rows are not cut so (an ssm layer): restored to the host, then copied */
    rm_rf(dir);
    struct kvt_entry *mixed = synth_random_entry(tok, 900, 4, MODEL, FP, TOK);
    pc = open_pc(d, dir, 64 << 20, 16 << 20);
    assert_int_equal(kvt_store_put(kvt_pcache_store(pc), mixed, NULL, NULL), 0);
    dest_free(&p);
    struct kvt_take t;
    struct kvt_header *h;
    assert_int_equal(kvt_pcache_take_to_device(pc, tok, 901, "", place, &p, &t, &h), 0);
    assert_true(t.from_disk);
    assert_non_null(h);
    size_t total;
    uint8_t *want = synth_entry_bytes(mixed, &total), *got = malloc(total);
    size_t at = 0;
    for (int k = 0; k < p.n; k++) {
        assert_int_equal(kvt_device_download(d, got + at, p.addr[k], p.bytes[k]), 0);
        at += p.bytes[k];
    }
    assert_int_equal(at, total);
    assert_memory_equal(got, want, total);
    free(got);
    free(want);
    kvt_header_free(h);
    dest_free(&p);
    kvt_pcache_close(pc);
    kvt_entry_free(mixed);
    kvt_entry_free(e);
    free(tok);
    free(other);
    free(dir);
    kvt_device_close(d);
}

/* The take that landed entry @p e's 700 tokens at @p p kept a host copy in RAM: with the
 * landed memory overwritten since (the copy queued before is unaffected), the next take of
 * @p tok is a RAM hit with @p e's bytes, from the one record. */
static void assert_kept_in_ram(kvt_pcache *pc, struct dest *p, const int32_t *tok,
                               const struct kvt_entry *e)
{
    for (int k = 0; k < p->n; k++) {
        uint8_t *junk = malloc(p->bytes[k]);
        memset(junk, 0x5a, p->bytes[k]);
        assert_int_equal(kvt_device_upload(p->d, p->addr[k], junk, p->bytes[k]), 0);
        free(junk);
    }
    bool disk = true;
    assert_int_equal(take(pc, p, tok, 701, &disk), 700);
    assert_false(disk);
    assert_landed(p, e, 700);
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    assert_int_equal(st.records, 1);
}

/* A disk hit taken into device memory keeps a host copy in RAM, read back from the landed
 * memory after the take: the next take is a RAM hit with the same bytes. */
static void test_disk_hit_kept_in_ram(void **state)
{
    (void)state;
    kvt_device *d;
    assert_int_equal(kvt_device_open_host(NULL, &d), 0);
    char *dir = strf("%s/store", test_dir);
    int32_t *tok = tokens(700, 0);
    struct kvt_entry *e = kv_entry(tok, 700, 5);
    kvt_pcache *pc = open_pc(d, dir, 64 << 20, 16 << 20);
    assert_int_equal(kvt_pcache_put(pc, synth_device_twin(d, e, MODEL, FP, TOK), NULL), 0);
    struct kvt_flush_report r;
    assert_int_equal(kvt_pcache_flush(pc, 30000, &r), 0);
    kvt_pcache_clear(pc); /* RAM empty, the pool allocated */
    struct dest p = {.d = d};
    bool disk = false;
    assert_int_equal(take(pc, &p, tok, 701, &disk), 700);
    assert_true(disk);
    assert_landed(&p, e, 700);
    assert_kept_in_ram(pc, &p, tok, e);
    /* a clear right after a disk take clears its host copy too: the next take is from disk */
    kvt_pcache_clear(pc);
    assert_int_equal(take(pc, &p, tok, 701, &disk), 700);
    assert_true(disk);
    kvt_pcache_clear(pc);
    assert_int_equal(take(pc, &p, tok, 701, &disk), 700);
    assert_true(disk);
    assert_landed(&p, e, 700);
    dest_free(&p);
    kvt_pcache_close(pc);

    /* a new process: the pool is pinned after the first disk hit, not in its way */
    pc = open_pc(d, dir, 64 << 20, 16 << 20);
    assert_int_equal(take(pc, &p, tok, 701, &disk), 700);
    assert_true(disk);
    assert_landed(&p, e, 700);
    dest_free(&p);
    kvt_pcache_close(pc);
    kvt_entry_free(e);
    free(tok);
    free(dir);
    kvt_device_close(d);
}

/* A remote hit taken into device memory keeps a host copy in RAM as a disk hit does: with the
 * landed memory overwritten, the next take is a RAM hit with the entry's bytes; the write-behind
 * saved the hit to the local disk (the remote's promotion), so RAM drops its copy unspilled. */
static void test_remote_hit_kept_in_ram(void **state)
{
    (void)state;
    if (!redis_available())
        skip();
    struct redis_srv srv = {0};
    assert_int_equal(redis_start(&srv, test_dir, 0, ""), 0);
    struct kvt_remote_opts ro;
    kvt_remote_opts_init(&ro);
    ro.url = redis_url(&srv, "tdev");
    ro.model_id = MODEL;
    ro.config_fingerprint = FP;
    ro.tokenizer_hash = TOK;
    kvt_remote *r;
    assert_int_equal(kvt_remote_open(&ro, &r), 0);
    int32_t *tok = tokens(700, 0), *other = tokens(700, 0);
    for (size_t i = 0; i < 700; i++)
        other[i] += 100000; /* no prefix in common */
    struct kvt_entry *e = kv_entry(tok, 700, 9);
    assert_int_equal(kvt_remote_put(r, e), 0);
    kvt_remote_close(r);

    kvt_device *d;
    assert_int_equal(kvt_device_open_host(NULL, &d), 0);
    char *dir = strf("%s/store", test_dir); /* empty */
    struct kvt_pcache_opts o;
    kvt_pcache_opts_init(&o);
    o.ram_max_bytes = 64 << 20;
    o.device = d;
    o.demote_idle_ms = 0;
    o.cold_dir = dir;
    store_opts_for(&o.cold, MODEL, FP, TOK);
    o.remote = &ro;
    kvt_pcache *pc;
    assert_int_equal(kvt_pcache_open(&o, &pc), 0);
    struct kvt_entry *b = kv_entry(other, 700, 3);
    assert_int_equal(kvt_pcache_put(pc, synth_device_twin(d, b, MODEL, FP, TOK), NULL), 0);
    kvt_pcache_clear(pc); /* RAM empty, the pool allocated */

    struct dest p = {.d = d};
    struct kvt_take t;
    struct kvt_header *h;
    assert_int_equal(kvt_pcache_take_to_device(pc, tok, 701, "", place, &p, &t, &h), 0);
    assert_non_null(h);
    assert_true(t.from_remote);
    kvt_header_free(h);
    assert_landed(&p, e, 700);
    assert_kept_in_ram(pc, &p, tok, e);
    /* the local disk holds the hit: with RAM cleared, the next take is a disk hit */
    struct kvt_flush_report fr;
    assert_int_equal(kvt_pcache_flush(pc, 30000, &fr), 0);
    kvt_pcache_clear(pc);
    dest_free(&p);
    assert_int_equal(kvt_pcache_take_to_device(pc, tok, 701, "", place, &p, &t, &h), 0);
    assert_non_null(h);
    assert_true(t.from_disk);
    assert_false(t.from_remote);
    kvt_header_free(h);
    assert_landed(&p, e, 700);
    dest_free(&p);
    kvt_pcache_close(pc);
    redis_kill(&srv);
    kvt_entry_free(e);
    kvt_entry_free(b);
    free(tok);
    free(other);
    free(dir);
    kvt_device_close(d);
}

/* A layer-wise take returns before slow copies are done; each slot's wait covers its bytes,
 * and the bytes are the entry's. */
static void test_layerwise_take(void **state)
{
    (void)state;
    struct kvt_device_opts dopts = {0, 0, 20000}; /* every copy takes 20 ms */
    kvt_device *d;
    assert_int_equal(kvt_device_open_host(&dopts, &d), 0);
    int32_t *tok = tokens(300, 0);
    struct kvt_entry *e = kv_entry(tok, 300, 9);
    kvt_pcache *pc = open_pc(d, NULL, 64 << 20, 0);
    assert_int_equal(kvt_pcache_put(pc, synth_device_twin(d, e, MODEL, FP, TOK), NULL), 0);
    struct dest p = {.d = d};
    struct kvt_take t;
    struct kvt_header *h;
    kvt_dtake *pend;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(kvt_pcache_take_to_device_async(pc, tok, 301, "", place, &p, &t, &h, &pend),
                     0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_non_null(h);
    assert_non_null(pend);
    assert_false(t.from_disk);
    /* queued, not done: the copies of p.n slots take >= 20 ms each */
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    assert_true(p.n >= 2 && took < 0.02 * p.n / 2);
    assert_int_equal(kvt_dtake_wait(pend, (size_t)p.n, 0), -EINVAL);
    for (int k = 0; k < p.n; k++)
        assert_int_equal(kvt_dtake_wait(pend, (size_t)k, 0), 0);
    assert_landed(&p, e, 300);
    assert_int_equal(kvt_dtake_end(pend), 0);
    kvt_header_free(h);
    dest_free(&p);
    kvt_pcache_close(pc);
    kvt_entry_free(e);
    free(tok);
    kvt_device_close(d);
}

static void test_no_room_saves_from_device(void **state)
{
    (void)state;
    kvt_device *d;
    assert_int_equal(kvt_device_open_host(NULL, &d), 0);
    char *dir = strf("%s/store", test_dir);
    int32_t *a_tok = tokens(500, 0), *b_tok = tokens(500, 3);
    b_tok[0] = 77777; /* no shared prefix */
    struct kvt_entry *a = kv_entry(a_tok, 500, 1), *b = kv_entry(b_tok, 500, 2);
    size_t one = kvt_entry_bytes(a);
    /* the pool (RAM cap + spill cap) holds one entry: the second is saved from the device */
    kvt_pcache *pc = open_pc(d, dir, one + one / 2, 0);
    int live = synth_device_live;
    assert_int_equal(kvt_pcache_put(pc, synth_device_twin(d, a, MODEL, FP, TOK), NULL), 0);
    assert_int_equal(synth_device_live, live);
    assert_int_equal(kvt_pcache_put(pc, synth_device_twin(d, b, MODEL, FP, TOK), NULL), 0);
    struct kvt_flush_report r;
    assert_int_equal(kvt_pcache_flush(pc, 30000, &r), 0);
    assert_int_equal(synth_device_live, live); /* written, then released */
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    assert_int_equal(st.records, 1); /* a stays in RAM */
    assert_true(kvt_pcache_find_exact(pc, a_tok, 500, ""));
    assert_true(st.cold.entries >= 1);
    struct dest p = {.d = d};
    bool disk = false;
    assert_int_equal(take(pc, &p, b_tok, 501, &disk), 500);
    assert_true(disk);
    assert_landed(&p, b, 500);
    dest_free(&p);
    kvt_pcache_close(pc);
    kvt_entry_free(a);
    kvt_entry_free(b);
    free(a_tok);
    free(b_tok);
    free(dir);
    kvt_device_close(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_put_and_take_in_ram, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_write_behind_and_disk_hits, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_disk_hit_kept_in_ram, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_remote_hit_kept_in_ram, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_layerwise_take, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_no_room_saves_from_device, test_dir_setup,
                                        test_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
