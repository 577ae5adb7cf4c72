/*
 * The RAM tier with share_prefixes (docs/SHARING.md, "The RAM tier"): branches off one prompt
 * hold its 256-token chunks once and the byte count says so, to the byte; a branch that departs
 * inside a chunk shares the chunks before it, at the chunk edges too; supersession and eviction
 * under a cap never break a held entry and keep the count exact; ssm layers stay whole per entry;
 * every take is byte-equal to what was put; an evicted shared entry spills to disk whole and comes
 * back byte-equal; device entries are held shared in the page-locked pool (or past its room) and
 * land byte-equal, each chunk's rows copied straight from it, the records free to leave RAM while
 * the copies run; puts and takes from several threads.
 */
#include "support/support.h"
#include "support/synth.h"

#include "device/device_parts.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define LAYERS 4
#define HEADS 2
#define DIM 16
#define ROW_BYTES ((uint64_t)LAYERS * 2 * HEADS * DIM * 2) /* KV bytes of one token */
#define PROMPT 1024
#define OWN 64

static const char *const MODEL = "test/model";
static const char *const FP = "fp-tier-share";
static const char *const TOK = "tk-share";

/* Branch @p b's tokens: the prompt's for [0, depart), then its own; one more for takes. */
static int32_t *branch_tokens(int b, size_t n, size_t depart)
{
    int32_t *t = malloc((n + 1) * sizeof(*t));
    for (size_t i = 0; i <= n; i++)
        t[i] = i < depart ? (int32_t)(i * 7 + 3) : (int32_t)(100000 * (b + 1) + i);
    return t;
}

/* The KV of a token depends on the tokens before it: here on its own token and position, so
 * equal prefixes have equal rows, as a model's would. */
static uint16_t kv_value(int32_t tok, size_t row, int l, int j, int h, int d)
{
    uint64_t x = (uint64_t)(uint32_t)tok * 0x9e3779b97f4a7c15ull ^ row * 0xbf58476d1ce4e5b9ull ^
                 (uint64_t)(((l * 2 + j) * HEADS + h) * DIM + d) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (uint16_t)(x * 0xd6e8feb86659fd93ull >> 48);
}

/* An entry of @p n tokens whose LAYERS kv caches [1, HEADS, n, DIM] float16 follow kv_value. */
static struct kvt_entry *branch_entry(const int32_t *tok, size_t n)
{
    kvt_cache *c[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        struct kvt_tensor t[2];
        int64_t shape[4] = {1, HEADS, (int64_t)n, DIM};
        for (int j = 0; j < 2; j++) {
            assert_int_equal(kvt_tensor_zeros(&t[j], KVT_FLOAT16, 4, shape), 0);
            uint16_t *v = kvt_buf_data(t[j].buf);
            for (int h = 0; h < HEADS; h++)
                for (size_t r = 0; r < n; r++)
                    for (int d = 0; d < DIM; d++)
                        v[((size_t)h * n + r) * DIM + (size_t)d] = kv_value(tok[r], r, l, j, h, d);
        }
        struct kvt_cache_info info = {.kind = KVT_KIND_KV, .offset = (int64_t)n};
        assert_int_equal(kvt_cache_from_state(&info, t, 2, &c[l]), 0);
        kvt_tensor_release(&t[0]);
        kvt_tensor_release(&t[1]);
    }
    struct kvt_entry *e;
    assert_int_equal(kvt_entry_new(tok, n, c, LAYERS, "", &e), 0);
    e->meta.model_id = strdup(MODEL);
    e->meta.config_fingerprint = strdup(FP);
    e->meta.tokenizer_hash = strdup(TOK);
    return e;
}

static kvt_pcache *open_pc(const char *dir, uint64_t ram, bool share)
{
    struct kvt_pcache_opts o;
    kvt_pcache_opts_init(&o);
    o.ram_max_bytes = ram;
    o.share_prefixes = share;
    o.demote_idle_ms = 0;
    if (dir) {
        o.cold_dir = dir;
        store_opts_for(&o.cold, MODEL, FP, TOK);
        o.snapshot_debounce_ms = 5;
    }
    kvt_pcache *pc = NULL;
    if (kvt_pcache_open(&o, &pc))
        fail_msg("kvt_pcache_open: %s", kvt_last_error());
    return pc;
}

/* Take @p tok (@p n tokens plus the next) and check that every byte is what was put: the rows
 * of the prefix served. Returns its length (0: a miss). */
static size_t take_checked(kvt_pcache *pc, const int32_t *tok, size_t n)
{
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take(pc, tok, n + 1, "", &t), 0);
    if (!t.entry)
        return 0;
    size_t got = t.entry->n_tokens;
    assert_memory_equal(t.entry->tokens, tok, got * sizeof(*tok));
    struct kvt_entry *want = branch_entry(tok, got);
    assert_int_equal(t.entry->n_caches, LAYERS);
    for (int l = 0; l < LAYERS; l++)
        assert_true(synth_same_state(t.entry->caches[l], want->caches[l]));
    kvt_entry_free(want);
    kvt_entry_free(t.entry);
    kvt_retain_release(t.retain);
    return got;
}

static uint64_t ram_bytes(kvt_pcache *pc, uint64_t *records)
{
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    if (records)
        *records = st.records;
    return st.total_bytes;
}

static void put_branch(kvt_pcache *pc, int b, size_t n, size_t depart)
{
    int32_t *tok = branch_tokens(b, n, depart);
    assert_int_equal(kvt_pcache_put(pc, branch_entry(tok, n), NULL), 0);
    free(tok);
}

#define BRANCHES 20

static void test_branches_share_and_count(void **state)
{
    (void)state;
    kvt_pcache *pc = open_pc(NULL, 1 << 30, true), *plain = open_pc(NULL, 1 << 30, false);
    for (int b = 0; b < BRANCHES; b++) {
        put_branch(pc, b, PROMPT + OWN, PROMPT);
        put_branch(plain, b, PROMPT + OWN, PROMPT);
        /* the prompt's 4 chunks once, then each branch's 64 own rows */
        assert_int_equal(ram_bytes(pc, NULL), (PROMPT + (uint64_t)(b + 1) * OWN) * ROW_BYTES);
    }
    uint64_t records, whole = ram_bytes(plain, NULL);
    uint64_t unique = (PROMPT + BRANCHES * OWN) * ROW_BYTES;
    assert_int_equal(ram_bytes(pc, &records), unique);
    assert_int_equal(records, BRANCHES);
    assert_true(whole >= BRANCHES * (PROMPT + OWN) * ROW_BYTES); /* without: all of it each */

    /* departing inside chunk 3 shares chunks 0..2; its chunk 3 and tail are its own */
    put_branch(pc, 99, 1200, 900);
    assert_int_equal(ram_bytes(pc, NULL), unique + (256 + 1200 - 1024) * ROW_BYTES);
    for (int b = 0; b < BRANCHES; b++) {
        int32_t *tok = branch_tokens(b, PROMPT + OWN, PROMPT);
        assert_int_equal(take_checked(pc, tok, PROMPT + OWN), PROMPT + OWN);
        free(tok);
    }
    int32_t *tok = branch_tokens(99, 1200, 900);
    assert_int_equal(take_checked(pc, tok, 1200), 1200);
    tok[950] = -1; /* a prompt departing inside the branch's own chunk: its prefix, trimmed */
    assert_int_equal(take_checked(pc, tok, 1200), 950);
    free(tok);

    /* the bare prompt is held shared too, and the branches that extend it supersede it */
    kvt_pcache_clear(pc);
    assert_int_equal(ram_bytes(pc, &records), 0);
    put_branch(pc, 0, PROMPT, PROMPT);
    assert_int_equal(ram_bytes(pc, NULL), PROMPT * ROW_BYTES);
    put_branch(pc, 1, PROMPT + OWN, PROMPT);
    put_branch(pc, 2, PROMPT + OWN, PROMPT);
    assert_int_equal(ram_bytes(pc, &records), (PROMPT + 2 * OWN) * ROW_BYTES);
    assert_int_equal(records, 2);
    tok = branch_tokens(0, PROMPT, PROMPT);
    assert_int_equal(take_checked(pc, tok, PROMPT), PROMPT);
    free(tok);
    kvt_pcache_close(pc);
    kvt_pcache_close(plain);
}

/* At the chunk edges: 256 tokens are held whole (no chunk leaves a row for the tail), 257 are a
 * chunk and a row; each longer entry supersedes the last and reuses its chunks. */
static void test_chunk_edges(void **state)
{
    (void)state;
    kvt_pcache *pc = open_pc(NULL, 1 << 30, true);
    const size_t sizes[] = {256, 257, 512, 513};
    int32_t *tok = branch_tokens(0, 513, 513);
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(kvt_pcache_put(pc, branch_entry(tok, sizes[i]), NULL), 0);
        uint64_t records, bytes = ram_bytes(pc, &records);
        assert_int_equal(records, 1);
        assert_int_equal(bytes, sizes[i] * ROW_BYTES);
        assert_int_equal(take_checked(pc, tok, sizes[i]), sizes[i]);
    }
    assert_int_equal(take_checked(pc, tok, 300), 300);
    assert_int_equal(take_checked(pc, tok, 1), 1);
    free(tok);
    kvt_pcache_close(pc);
}

/* Under a cap of a few branches, every put keeps the count equal to the rows held (the
 * prompt once, each held branch's own rows) and every held branch whole and byte-equal. */
static void test_eviction_keeps_held_entries(void **state)
{
    (void)state;
    uint64_t cap = (PROMPT + 5 * OWN) * ROW_BYTES + ROW_BYTES / 2;
    kvt_pcache *pc = open_pc(NULL, cap, true);
    for (int b = 0; b < 3 * BRANCHES; b++) {
        put_branch(pc, b, PROMPT + OWN, PROMPT);
        uint64_t records, bytes = ram_bytes(pc, &records);
        assert_true(bytes <= cap);
        assert_int_equal(bytes, (PROMPT + records * OWN) * ROW_BYTES);
        assert_int_equal(records, b < 5 ? b + 1 : 5);
    }
    for (int b = 0; b < 3 * BRANCHES; b++) {
        int32_t *tok = branch_tokens(b, PROMPT + OWN, PROMPT);
        /* the five newest whole, the others still find the prompt */
        assert_int_equal(take_checked(pc, tok, PROMPT + OWN),
                         b >= 3 * BRANCHES - 5 ? PROMPT + OWN : PROMPT);
        free(tok);
    }
    /* a branch of another prompt evicts the last holders of this one: its chunks go */
    put_branch(pc, 500, PROMPT + OWN, 0);
    uint64_t records, bytes = ram_bytes(pc, &records);
    assert_int_equal(records, 1);
    assert_int_equal(bytes, (PROMPT + OWN) * ROW_BYTES);
    kvt_pcache_clear(pc);
    assert_int_equal(ram_bytes(pc, NULL), 0);
    for (int b = 0; b < 6; b++)
        put_branch(pc, 600 + b, PROMPT + OWN, 0); /* nothing shared: PROMPT + OWN rows each */
    bytes = ram_bytes(pc, &records);
    assert_int_equal(bytes, records * (PROMPT + OWN) * ROW_BYTES);
    assert_int_equal(records, 1); /* each is over half the cap */
    kvt_pcache_close(pc);
}

/* Evicted shared entries spill whole: a fresh prompt cache on the directory serves them. */
static void test_spill_of_shared_entry(void **state)
{
    (void)state;
    const char *dir = test_dir;
    uint64_t cap = (PROMPT + 2 * OWN) * ROW_BYTES;
    kvt_pcache *pc = open_pc(dir, cap, true);
    for (int b = 0; b < 6; b++)
        put_branch(pc, b, PROMPT + OWN, PROMPT);
    struct kvt_flush_report r;
    assert_int_equal(kvt_pcache_flush(pc, 30000, &r), 0);
    assert_true(r.durable);
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    assert_int_equal(st.cold.entries, 6);
    assert_true(st.cold.shared_chunks >= 4); /* the store shares them too */
    kvt_pcache_close(pc);

    pc = open_pc(dir, cap, true);
    for (int b = 0; b < 6; b++) {
        int32_t *tok = branch_tokens(b, PROMPT + OWN, PROMPT);
        struct kvt_take t;
        assert_int_equal(kvt_pcache_take(pc, tok, PROMPT + OWN + 1, "", &t), 0);
        assert_non_null(t.entry);
        assert_true(t.from_disk);
        struct kvt_entry *want = branch_entry(tok, PROMPT + OWN);
        assert_true(synth_same_entry_bytes(t.entry, want));
        kvt_entry_free(want);
        kvt_entry_free(t.entry);
        free(tok);
    }
    kvt_pcache_close(pc);
}

/* Caches that are not cut (ssm) are held whole by each entry, which still shares its kv rows;
 * such an entry cannot be trimmed, so it serves its own prompt only. */
static void test_whole_layers_per_entry(void **state)
{
    (void)state;
    const uint64_t kv_row = 2 * SYNTH_HEAD_DIM * 2, ssm = 2 * 4 * 2 + 2 * 2 * 4;
    kvt_pcache *pc = open_pc(NULL, 1 << 30, true);
    for (int b = 0; b < 5; b++) {
        int32_t *tok = branch_tokens(b, PROMPT + OWN, PROMPT);
        struct kvt_entry *e;
        assert_int_equal(synth_entry(tok, PROMPT + OWN, "", false, &e), 0);
        assert_int_equal(kvt_pcache_put(pc, e, NULL), 0);
        free(tok);
        assert_int_equal(ram_bytes(pc, NULL), (PROMPT + (b + 1) * OWN) * kv_row + (b + 1) * ssm);
    }
    for (int b = 0; b < 5; b++) {
        int32_t *tok = branch_tokens(b, PROMPT + OWN, PROMPT);
        struct kvt_take t;
        assert_int_equal(kvt_pcache_take(pc, tok, PROMPT + OWN + 1, "", &t), 0);
        assert_non_null(t.entry);
        struct kvt_entry *want;
        assert_int_equal(synth_entry(tok, PROMPT + OWN, "", false, &want), 0);
        assert_true(synth_same_entry_bytes(t.entry, want));
        kvt_entry_free(want);
        kvt_entry_free(t.entry);
        kvt_retain_release(t.retain);
        free(tok);
    }
    kvt_pcache_close(pc);
}

/* Placement: one device allocation per slot, as the header sizes it. */
struct dest {
    kvt_device *d;
    uint64_t addr[64], bytes[64];
    int n;
};

static int place(void *ud, const struct kvt_header *h, uint64_t *dst)
{
    struct dest *p = ud;
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

/* Every slot of @p p holds the state of @p want, as header @p h says, to the byte; then the
 * device memory is freed. */
static void assert_landed(struct dest *p, const struct kvt_header *h, const struct kvt_entry *want)
{
    assert_int_equal(h->n_tokens, want->n_tokens);
    assert_int_equal(h->n_caches, want->n_caches);
    for (size_t i = 0, k = 0; i < want->n_caches; i++) {
        struct kvt_cache_info info;
        kvt_cache_get_info(want->caches[i], &info);
        assert_int_equal(h->caches[i].info.offset, info.offset);
        struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
        int nt = kvt_cache_state(want->caches[i], st);
        assert_int_equal(h->caches[i].n_slots, nt);
        for (int j = 0; j < nt; j++, k++) {
            size_t bytes = kvt_tensor_nbytes(&st[j]);
            uint8_t *w = malloc(bytes), *g = malloc(bytes);
            kvt_tensor_copy_out(&st[j], w);
            assert_int_equal(p->bytes[k], bytes);
            assert_memory_equal(h->caches[i].slots[j].shape, st[j].shape, sizeof(st[j].shape));
            assert_int_equal(kvt_device_download(p->d, g, p->addr[k], bytes), 0);
            assert_memory_equal(g, w, bytes);
            free(w);
            free(g);
            kvt_tensor_release(&st[j]);
            kvt_device_free(p->d, p->addr[k]);
        }
    }
}

/* Take @p tok into device memory: every slot holds the rows of the prefix served. */
static size_t take_to_device(kvt_pcache *pc, kvt_device *d, const int32_t *tok, size_t n)
{
    struct dest p = {.d = d};
    struct kvt_take t;
    struct kvt_header *h;
    assert_int_equal(kvt_pcache_take_to_device(pc, tok, n + 1, "", place, &p, &t, &h), 0);
    size_t got = h ? h->n_tokens : 0;
    if (got) {
        struct kvt_entry *want = branch_entry(tok, got);
        assert_landed(&p, h, want);
        kvt_entry_free(want);
    }
    kvt_header_free(h);
    return got;
}

/* A device prompt cache holding shared prefixes, its page-locked pool @p ram bytes. */
static kvt_pcache *open_device_pc(kvt_device *d, uint64_t ram)
{
    struct kvt_pcache_opts o;
    kvt_pcache_opts_init(&o);
    o.ram_max_bytes = ram;
    o.spill_queue_max_bytes = 0;
    o.device = d;
    o.share_prefixes = true;
    kvt_pcache *pc;
    assert_int_equal(kvt_pcache_open(&o, &pc), 0);
    return pc;
}

/* Put the device twins of branches [0, n) of the prompt, each of PROMPT + OWN tokens. */
static void put_device_branches(kvt_pcache *pc, kvt_device *d, int n)
{
    for (int b = 0; b < n; b++) {
        int32_t *tok = branch_tokens(b, PROMPT + OWN, PROMPT);
        struct kvt_entry *e = branch_entry(tok, PROMPT + OWN);
        assert_int_equal(kvt_pcache_put(pc, synth_device_twin(d, e, MODEL, FP, TOK), NULL), 0);
        kvt_entry_free(e);
        free(tok);
    }
}

/* Whole takes and prefixes of 4 branches held shared in a pool of @p ram bytes, on @p d. */
static void takes_on(kvt_device *d, uint64_t ram)
{
    kvt_pcache *pc = open_device_pc(d, ram);
    put_device_branches(pc, d, 4);
    assert_int_equal(ram_bytes(pc, NULL), (PROMPT + 4 * OWN) * ROW_BYTES);
    for (int b = 0; b < 4; b++) {
        int32_t *tok = branch_tokens(b, PROMPT + OWN, PROMPT);
        assert_int_equal(take_to_device(pc, d, tok, PROMPT + OWN), PROMPT + OWN);
        tok[900] = -1;
        assert_int_equal(take_to_device(pc, d, tok, PROMPT + OWN), 900);
        tok[700] = -1;
        assert_int_equal(take_to_device(pc, d, tok, PROMPT + OWN), 700);
        tok[256] = -1;
        assert_int_equal(take_to_device(pc, d, tok, PROMPT + OWN), 256);
        free(tok);
    }
    kvt_pcache_close(pc);
}

static void test_device_entries_shared(void **state)
{
    (void)state;
    kvt_device *d;
    assert_int_equal(kvt_device_open_host(NULL, &d), 0);
    takes_on(d, 64 << 20);
    kvt_device_close(d);
}

static int refuse(void *ud, const struct kvt_header *h, uint64_t *dst)
{
    (void)ud, (void)h, (void)dst;
    return -ENOSPC;
}

/* A placement whose last slot is half the size the header says: its copies fail. */
static int place_short(void *ud, const struct kvt_header *h, uint64_t *dst)
{
    struct dest *p = ud;
    place(ud, h, dst);
    kvt_device_free(p->d, p->addr[p->n - 1]);
    assert_int_equal(kvt_device_alloc(p->d, p->bytes[p->n - 1] / 2, &p->addr[p->n - 1]), 0);
    dst[p->n - 1] = p->addr[p->n - 1];
    return 0;
}

/* A take into device memory reads a shared record's chunks where they lie: the copies in flight
 * read the tail and the chunks themselves (no joined entry), which outlive the records that held
 * them; a refused placement or copy leaves the RAM tier as it was. */
static void test_device_take_reads_chunks_in_place(void **state)
{
    (void)state;
    struct kvt_device_opts dopts = {.copy_delay_us = 200};
    kvt_device *d;
    assert_int_equal(kvt_device_open_host(&dopts, &d), 0);
    kvt_pcache *pc = open_device_pc(d, 64 << 20);
    put_device_branches(pc, d, 4);
    uint64_t held = ram_bytes(pc, NULL);
    int32_t *tok = branch_tokens(2, PROMPT + OWN, PROMPT);
    struct kvt_take t;
    struct kvt_header *h;
    assert_int_equal(kvt_pcache_take_to_device(pc, tok, PROMPT + OWN + 1, "", refuse, NULL, &t, &h),
                     -ENOSPC);
    assert_null(h);
    assert_int_equal(ram_bytes(pc, NULL), held);
    struct dest shortp = {.d = d}; /* a copy the device refuses: an error, the rest finished */
    assert_int_equal(
        kvt_pcache_take_to_device(pc, tok, PROMPT + OWN + 1, "", place_short, &shortp, &t, &h),
        -EINVAL);
    assert_null(h);
    for (int k = 0; k < shortp.n; k++)
        kvt_device_free(d, shortp.addr[k]);
    assert_int_equal(ram_bytes(pc, NULL), held);
    for (size_t keep = PROMPT + OWN; keep >= 700; keep -= PROMPT + OWN - 700) {
        tok[keep] = -1;
        struct dest p = {.d = d};
        kvt_dtake *pend;
        assert_int_equal(
            kvt_pcache_take_to_device_async(pc, tok, keep + 1, "", place, &p, &t, &h, &pend), 0);
        assert_int_equal(h->n_tokens, keep);
        assert_non_null(pend->src); /* the tail, its own rows only: nothing was joined */
        assert_int_equal(kvt_cache_offset(pend->src->caches[0]), OWN);
        kvt_pcache_clear(pc); /* the chunks leave RAM while their copies run */
        assert_int_equal(ram_bytes(pc, NULL), 0);
        assert_int_equal(kvt_dtake_end(pend), 0);
        struct kvt_entry *want = branch_entry(tok, keep);
        assert_landed(&p, h, want);
        kvt_entry_free(want);
        kvt_header_free(h);
        put_device_branches(pc, d, 4);
    }
    free(tok);
    kvt_pcache_close(pc);
    kvt_device_close(d);
}

/* A pool too small for every chunk and tail: those past its room are in ordinary memory, and
 * their rows land beside the page-locked ones, whole takes and prefixes alike. */
static void test_device_take_past_the_pool(void **state)
{
    (void)state;
    kvt_device *d;
    assert_int_equal(kvt_device_open_host(NULL, &d), 0);
    takes_on(d, 1904 * ROW_BYTES); /* the first put's twin and 3 chunks */
    kvt_device_close(d);
}

/* The same takes on a CUDA device (its strided copies), where one is present; skipped
 * elsewhere. */
static void test_device_takes_on_cuda(void **state)
{
    (void)state;
    kvt_device *d;
    if (kvt_device_open_cuda(0, NULL, &d) == KVT_E_UNSUPPORTED) {
        print_message("skipped: %s\n", kvt_last_error());
        skip();
    }
    assert_non_null(d);
    takes_on(d, 64 << 20);
    takes_on(d, 1904 * ROW_BYTES);
    kvt_device_close(d);
}

/* Uncut (ssm) layers beside cut kv ones land whole, each from its own record's tail. */
static void test_device_take_uncut_layers(void **state)
{
    (void)state;
    kvt_device *d;
    assert_int_equal(kvt_device_open_host(NULL, &d), 0);
    kvt_pcache *pc = open_device_pc(d, 64 << 20);
    for (int b = 0; b < 3; b++) {
        int32_t *tok = branch_tokens(b, PROMPT + OWN, PROMPT);
        struct kvt_entry *e;
        assert_int_equal(synth_entry(tok, PROMPT + OWN, "", false, &e), 0);
        assert_int_equal(kvt_pcache_put(pc, synth_device_twin(d, e, MODEL, FP, TOK), NULL), 0);
        kvt_entry_free(e);
        free(tok);
    }
    for (int b = 0; b < 3; b++) {
        int32_t *tok = branch_tokens(b, PROMPT + OWN, PROMPT);
        struct dest p = {.d = d};
        struct kvt_take t;
        struct kvt_header *h;
        assert_int_equal(
            kvt_pcache_take_to_device(pc, tok, PROMPT + OWN + 1, "", place, &p, &t, &h), 0);
        struct kvt_entry *want;
        assert_int_equal(synth_entry(tok, PROMPT + OWN, "", false, &want), 0);
        assert_landed(&p, h, want);
        kvt_entry_free(want);
        kvt_header_free(h);
        free(tok);
    }
    kvt_pcache_close(pc);
    kvt_device_close(d);
}

struct worker {
    kvt_pcache *pc;
    int id;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    for (int i = 0; i < 12; i++) {
        int b = w->id * 100 + i;
        size_t depart = i % 3 == 0 ? 600 : PROMPT;
        put_branch(w->pc, b, PROMPT + OWN, depart);
        int32_t *tok = branch_tokens(b - (i > 0), PROMPT + OWN, depart);
        size_t got = take_checked(w->pc, tok, PROMPT + OWN);
        assert_true(got >= 600);
        free(tok);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    kvt_pcache *pc = open_pc(NULL, (PROMPT + 8 * OWN) * ROW_BYTES, true);
    pthread_t t[4];
    struct worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct worker){pc, i};
        assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    uint64_t records, bytes = ram_bytes(pc, &records);
    assert_true(bytes <= (PROMPT + 8 * OWN) * ROW_BYTES || records == 1);
    kvt_pcache_clear(pc);
    assert_int_equal(ram_bytes(pc, NULL), 0);
    kvt_pcache_close(pc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_branches_share_and_count),
        cmocka_unit_test(test_chunk_edges),
        cmocka_unit_test(test_eviction_keeps_held_entries),
        cmocka_unit_test(test_whole_layers_per_entry),
        cmocka_unit_test_setup_teardown(test_spill_of_shared_entry, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test(test_device_entries_shared),
        cmocka_unit_test(test_device_take_reads_chunks_in_place),
        cmocka_unit_test(test_device_take_past_the_pool),
        cmocka_unit_test(test_device_take_uncut_layers),
        cmocka_unit_test(test_device_takes_on_cuda),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
