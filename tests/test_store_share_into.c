/*
 * Restores of shared entries (docs/SHARING.md §4) as one load and into memory the caller
 * owns: an entry whose files are all in the page cache is copied on several cores, a cold one
 * lands the same bytes; kvt_store_restore_into() and the device restores place the whole
 * entry's slots, every row from its file, hash-checked; a refused placement keeps the entry;
 * a bad chunk is a miss for every branch that needs it.
 */
#include "support/support.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/stream.h"
#include "threads/par_for.h"
#include "store/layout.h"
#include "store/share.h"

static const char *const MODEL = "share/into";
static const char *const FP = "fp-into";
static const char *const TOKH = "tk-into";

/* 3,000 tokens of @p b: 2,600 shared by every branch, then its own. 9 MB of kv (two layers of
 * [1, 4, n, 96] float16) and an ssm layer kept whole: eleven chunks of 768 KiB. */
#define N 3000
#define SHARED 2600

static int32_t *branch_tokens(int b)
{
    int32_t *t = malloc((N + 1) * sizeof(*t));
    assert_non_null(t);
    for (int i = 0; i <= N; i++)
        t[i] = i < SHARED ? i * 5 + 3 : 50000 * (b + 1) + i;
    return t;
}

static kvt_store *open_store(void)
{
    struct kvt_store_opts o;
    store_opts_for(&o, MODEL, FP, TOKH);
    o.share_prefixes = true;
    o.tmp_grace_ms = 0;
    kvt_store *s;
    if (kvt_store_open(test_dir, &o, &s))
        fail_msg("kvt_store_open: %s", kvt_last_error());
    return s;
}

/* Put branch @p b; its entry goes to *@p e, its tokens to *@p tok. Every branch has the same
 * random bytes: the rows of a shared prefix are the same in every branch, as a model's are. */
static void put_branch(kvt_store *s, int b, struct kvt_entry **e, int32_t **tok)
{
    *tok = branch_tokens(b);
    *e = synth_random_entry(*tok, N, 100, MODEL, FP, TOKH);
    assert_int_equal(kvt_store_put(s, *e, NULL, NULL), 0);
}

static struct kvt_hit find(kvt_store *s, const int32_t *tok)
{
    struct kvt_hit hit;
    assert_int_equal(kvt_store_find(s, tok, N + 1, "", &hit), 0);
    return hit;
}

/*
 * Bring every file of the store's namespace directory (tails and chunks) into the page cache
 * (@p warm) or drop its pages; @return whether all of them are then in the page cache.
 */
static bool set_cached(bool warm)
{
    char *cmd = strf("find '%s/%s' -type f", test_dir, FP), *out;
    run_capture(cmd, &out);
    bool all = true;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        int fd = open(line, O_RDONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        off_t size = lseek(fd, 0, SEEK_END);
        char buf[65536];
        for (off_t at = 0; warm && at < size; at += (off_t)sizeof(buf))
            assert_true(pread(fd, buf, sizeof(buf), at) > 0);
        if (!warm)
            assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
        all = all && kvt_stream_cached(fd, 0, (uint64_t)size);
        close(fd);
    }
    free(out);
    free(cmd);
    return all;
}

/*
 * A restore whose files are all in the page cache is one load over all of them: 9 MB of
 * 768 KiB chunks copied on several cores (each chunk alone is too small to be). Dropped from
 * the cache, it goes file by file and lands the same bytes.
 */
static void test_one_load(void **state)
{
    (void)state;
    kvt_store *s = open_store();
    struct kvt_entry *e;
    int32_t *tok;
    put_branch(s, 0, &e, &tok);
    bool cores = kvt_par_cpus() > 1 && kvt_stream_fast_ok();
    for (int warm = 1; warm >= 0; warm--) {
        bool cached = set_cached(warm);
        struct kvt_hit hit = find(s, tok);
        assert_int_equal(hit.prefix_len, N);
        unsigned long helpers = kvt_par_helpers_started();
        struct kvt_entry *back;
        assert_int_equal(kvt_store_restore(s, &hit, &back), 0);
        assert_non_null(back);
        if (cached)
            assert_int_equal(kvt_par_helpers_started() > helpers, cores);
        else
            assert_int_equal(kvt_par_helpers_started(), helpers);
        assert_true(synth_same_entry_bytes(back, e));
        kvt_entry_free(back);
    }
    kvt_store_close(s);
    kvt_entry_free(e);
    free(tok);
}

/* The first file in the store's namespace directory whose name ends in @p ext (malloc'd). */
static char *first_file(const char *ext)
{
    char *cmd = strf("find '%s/%s' -type f -name '*%s' | sort | head -1", test_dir, FP, ext), *out;
    run_capture(cmd, &out);
    free(cmd);
    out[strcspn(out, "\n")] = '\0';
    assert_true(out[0] != '\0');
    return out;
}

/*
 * A chunk replaced under its name between the check of its header and its read (its entries
 * evicted and the chunk removed by another process, then the prefix put again with other
 * bytes) is a stale read, -ESTALE, not a corrupt chunk: the store would otherwise quarantine
 * the new chunk and every entry that needs it.
 */
static void test_chunk_replaced_while_restored(void **state)
{
    (void)state;
    kvt_store *s = open_store();
    struct kvt_entry *e;
    int32_t *tok;
    put_branch(s, 0, &e, &tok);
    char *tail = first_file(".kvshare"), *chunk = first_file(".kvchunk");
    struct kvt_expect x = {.model_id = MODEL, .config_fingerprint = FP, .tokenizer_hash = TOKH};
    struct kvt_share_open so;
    char *bad = NULL;
    assert_int_equal(kvt_share_open(tail, &x, &so, &bad), 0);
    char *cmd = strf("cp '%s' '%s.new' && printf '\\377' | dd of='%s.new' bs=1 seek=$(( $(stat "
                     "-c %%s '%s') - 7 )) conv=notrunc status=none && mv '%s.new' '%s'",
                     chunk, chunk, chunk, chunk, chunk, chunk);
    assert_int_equal(system(cmd), 0);
    free(cmd);
    void *none[64] = {0}; /* every slot only checked */
    struct kvt_slot_dst d[64];
    size_t slots = 0;
    for (size_t i = 0; i < so.whole->n_caches; i++)
        slots += (size_t)so.whole->caches[i].n_slots;
    assert_true(slots <= 64);
    kvt_share_placed_dsts(so.whole, none, d);
    assert_int_equal(kvt_share_read(&so, d, &x, &bad), -ESTALE);
    assert_non_null(strstr(kvt_last_error(), "replaced"));
    free(bad);
    kvt_share_close(&so);
    free(tail);
    free(chunk);
    kvt_store_close(s);
    kvt_entry_free(e);
    free(tok);
}

/* Placement into malloc'd memory, one allocation per slot; @p refuse: refuse instead. */
struct hplace {
    uint8_t *mem[8];
    uint64_t bytes[8];
    int n, refuse;
    size_t n_tokens;
};

static int hplace_fn(void *ud, const struct kvt_header *h, void **dst)
{
    struct hplace *p = ud;
    p->n_tokens = h->n_tokens;
    if (p->refuse)
        return p->refuse;
    int k = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++, k++) {
            assert_true(k < 8);
            p->bytes[k] = h->caches[i].slots[j].bytes;
            dst[k] = p->mem[k] = malloc(p->bytes[k] + 1);
            memset(p->mem[k], 0xEE, p->bytes[k]); /* nothing may be left of this */
        }
    p->n = k;
    return 0;
}

/* The placed memory holds exactly @p want, slot after slot. */
static void assert_placed_is(struct hplace *p, const uint8_t *want, size_t total)
{
    size_t at = 0;
    for (int k = 0; k < p->n; k++) {
        assert_memory_equal(p->mem[k], want + at, p->bytes[k]);
        at += p->bytes[k];
        free(p->mem[k]);
    }
    assert_int_equal(at, total);
    p->n = 0;
}

/* The path of the file of chunk @p k of tokens @p tok (namespace ""). */
static char *chunk_of(const int32_t *tok, size_t k)
{
    char ns[17];
    kvt_ns_hash("", ns);
    char *dir = strf("%s/%s/%s", test_dir, FP, ns);
    char *path = kvt_share_chunk_path_of(dir, tok, k);
    free(dir);
    return path;
}

/*
 * kvt_store_restore_into() of a shared entry: the placement gets the whole entry (3,000
 * tokens, each kv slot [1, 4, 3000, 96]), and each file's rows land in their rows of its
 * memory, warm and cold. A refused placement keeps the entry; a flipped byte of a shared chunk
 * is a miss that drops both branches needing it.
 */
static void test_restore_into(void **state)
{
    (void)state;
    kvt_store *s = open_store();
    struct kvt_entry *e[2];
    int32_t *tok[2];
    for (int b = 0; b < 2; b++)
        put_branch(s, b, &e[b], &tok[b]);
    for (int b = 0; b < 2; b++)
        for (int warm = 1; warm >= 0; warm--) {
            set_cached(warm);
            size_t total;
            uint8_t *want = synth_entry_bytes(e[b], &total);
            struct kvt_hit hit = find(s, tok[b]);
            struct hplace p = {0};
            struct kvt_header *h;
            assert_int_equal(kvt_store_restore_into(s, &hit, hplace_fn, &p, &h), 0);
            assert_non_null(h);
            assert_int_equal(h->n_tokens, N);
            assert_int_equal(h->caches[0].slots[0].shape[2], N);
            assert_int_equal(h->caches[0].info.offset, N);
            assert_int_equal(p.n, 6);
            assert_placed_is(&p, want, total);
            kvt_header_free(h);
            free(want);
        }
    struct kvt_hit hit = find(s, tok[0]);
    struct hplace no = {.refuse = -ENOSPC};
    struct kvt_header *h = (struct kvt_header *)1;
    assert_int_equal(kvt_store_restore_into(s, &hit, hplace_fn, &no, &h), -ENOSPC);
    assert_null(h);
    assert_int_equal(no.n_tokens, N);
    assert_int_equal(find(s, tok[0]).prefix_len, N); /* the entry stays */

    char *c3 = chunk_of(tok[0], 3);
    flip_slot_byte(c3, 1, 1, 4321, 0x20);
    struct hplace p = {0};
    hit = find(s, tok[1]);
    assert_int_equal(kvt_store_restore_into(s, &hit, hplace_fn, &p, &h), 0);
    assert_null(h); /* a miss */
    for (int k = 0; k < p.n; k++)
        free(p.mem[k]);
    for (int b = 0; b < 2; b++)
        assert_int_equal(find(s, tok[b]).prefix_len, 0);
    assert_int_equal(access(c3, F_OK), -1);
    free(c3);
    kvt_store_close(s);
    for (int b = 0; b < 2; b++) {
        kvt_entry_free(e[b]);
        free(tok[b]);
    }
}

/* Placement into device memory: one allocation per slot. */
struct dplace {
    kvt_device *d;
    uint64_t addr[8];
    uint64_t bytes[8];
    int n;
};

static int dplace_fn(void *ud, const struct kvt_header *h, uint64_t *dst)
{
    struct dplace *p = ud;
    int k = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++, k++) {
            assert_true(k < 8);
            p->bytes[k] = h->caches[i].slots[j].bytes;
            assert_int_equal(kvt_device_alloc(p->d, p->bytes[k], &p->addr[k]), 0);
            dst[k] = p->addr[k];
        }
    p->n = k;
    return 0;
}

/* The device memory holds exactly @p want, slot after slot; then it is freed. */
static void assert_device_is(struct dplace *p, const uint8_t *want, size_t total)
{
    size_t at = 0;
    for (int k = 0; k < p->n; k++) {
        uint8_t *got = malloc(p->bytes[k] + 1);
        assert_int_equal(kvt_device_download(p->d, got, p->addr[k], p->bytes[k]), 0);
        assert_memory_equal(got, want + at, p->bytes[k]);
        free(got);
        kvt_device_free(p->d, p->addr[k]);
        at += p->bytes[k];
    }
    assert_int_equal(at, total);
    p->n = 0;
}

/* A kv-only (trimmable) entry of @p tok: two layers of [1, 4, N, 96] float16. */
static struct kvt_entry *kv_entry(const int32_t *tok)
{
    uint64_t rng = 77;
    kvt_cache *c[2];
    for (int l = 0; l < 2; l++)
        c[l] = synth_random_kv(KVT_FLOAT16, 4, N, 96, &rng);
    struct kvt_entry *e;
    assert_int_equal(kvt_entry_new(tok, N, c, 2, "", &e), 0);
    return e;
}

/* The first @p keep of every @p rows-row block of @p want's slots (each [1, 4, rows, 96]
 * float16), slot after slot. */
static uint8_t *cut_rows(const uint8_t *want, int slots, size_t rows, size_t keep)
{
    size_t row = 96 * 2, per = 4 * rows * row;
    uint8_t *out = malloc((size_t)slots * 4 * keep * row), *o = out;
    for (int k = 0; k < slots; k++)
        for (size_t b = 0; b < 4; b++, o += keep * row)
            memcpy(o, want + k * per + b * rows * row, keep * row);
    return out;
}

/*
 * kvt_store_restore_to_device() of a shared entry lands every byte of the whole entry in the
 * placement's device memory (host stand-in); kvt_store_restore_prefix_to_device() of 2,000 of
 * a kv entry's 3,000 tokens lands exactly those rows, across its chunks and tail.
 */
static void restore_to_device_on(kvt_device *d)
{
    kvt_store *s = open_store();
    struct kvt_entry *e;
    int32_t *tok;
    put_branch(s, 0, &e, &tok);
    size_t total;
    uint8_t *want = synth_entry_bytes(e, &total);
    struct kvt_hit hit = find(s, tok);
    struct dplace p = {.d = d};
    struct kvt_header *h;
    assert_int_equal(kvt_store_restore_to_device(s, &hit, d, dplace_fn, &p, &h), 0);
    assert_non_null(h);
    assert_int_equal(h->n_tokens, N);
    assert_int_equal(p.n, 6);
    assert_device_is(&p, want, total);
    kvt_header_free(h);
    free(want);
    kvt_entry_free(e);

    int32_t *kt = branch_tokens(7);
    for (int i = 0; i < SHARED; i++)
        kt[i] += 1; /* another prompt: its rows are other bytes */
    struct kvt_entry *k = kv_entry(kt);
    assert_int_equal(kvt_store_put(s, k, NULL, NULL), 0);
    want = synth_entry_bytes(k, &total);
    assert_int_equal(kvt_store_find(s, kt, 2001, "", &hit), 0);
    assert_int_equal(hit.prefix_len, 2000);
    assert_int_equal(kvt_store_restore_prefix_to_device(s, &hit, d, dplace_fn, &p, &h), 0);
    assert_non_null(h);
    assert_int_equal(h->n_tokens, 2000);
    uint8_t *cut = cut_rows(want, 4, N, 2000);
    assert_device_is(&p, cut, 4 * 4 * 2000 * 96 * 2);
    kvt_header_free(h);
    free(cut);
    free(want);
    kvt_entry_free(k);
    free(kt);
    kvt_store_close(s);
    free(tok);
}

static void test_restore_to_device(void **state)
{
    (void)state;
    kvt_device *d;
    assert_int_equal(kvt_device_open_host(NULL, &d), 0);
    restore_to_device_on(d);
    kvt_device_close(d);
}

/* The same on a CUDA device, where one is present (a GPU machine); skipped elsewhere. */
static void test_restore_to_cuda(void **state)
{
    (void)state;
    kvt_device *d;
    if (kvt_device_open_cuda(0, NULL, &d) == KVT_E_UNSUPPORTED) {
        print_message("skipped: %s\n", kvt_last_error());
        skip();
    }
    assert_non_null(d);
    restore_to_device_on(d);
    kvt_device_close(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_one_load, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_chunk_replaced_while_restored, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_restore_into, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_restore_to_device, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_restore_to_cuda, test_dir_setup, test_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
