/*
 * bench_ram_share: shared prefixes held once by the RAM tier (docs/SHARING.md, "The RAM tier").
 *
 * 200 branches, each a 4,096-token prompt shared by all of them plus 256 tokens of its own,
 * 8 KiB of KV per token (4 kv layers of K and V [1, 8, n, 64] bfloat16), put into a RAM-only
 * prompt cache with share_prefixes on, and the same branches with it off. Reports:
 *  1. the RAM tier's byte count (what its cap and stats see) against the bytes of the unique
 *     tokens (4,096 + 200 x 256), and against the branches held whole (10 measured, scaled);
 *  2. put of a branch after the first (median of the last 15 puts);
 *  3. take of a whole branch from RAM (kvt_pcache_take of its tokens plus one): with sharing
 *     it joins the chunks into one buffer, without it clones (no copy); and take followed by
 *     the first appended token, which without sharing copies the clone's buffer (the donor
 *     owns it) and with sharing appends in place. Medians of 15, the same run;
 *  4. with --cuda (or --host, the stand-in device): kvt_pcache_take_to_device of a branch held
 *     from device memory (page-locked pool), sharing on and off, median of 15: landed, and
 *     until its copies are queued (the host's own work; with sharing, no join: each chunk's
 *     and the tail's rows are copied straight to theirs).
 *
 * Usage: bench_ram_share [--cuda | --host]
 * A benchmark, not a test: it asserts nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kvtier.h"

#define BRANCHES 200
#define UNSHARED_BRANCHES 10
#define PROMPT 4096
#define OWN 256
#define N (PROMPT + OWN)
#define LAYERS 4
#define HEADS 8
#define DIM 64
#define TOKEN_BYTES ((uint64_t)LAYERS * 2 * HEADS * DIM * 2)
#define RUNS 15

static double now_ms(void)
{
    return bench_now() * 1e3;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_ram_share: %s: %s\n", what, kvt_last_error());
    exit(1);
}

/* Tokens of branch @p b, plus one more token to compute for takes. */
static void branch_tokens(int b, int32_t *tok)
{
    for (int i = 0; i < N + 1; i++)
        tok[i] = i < PROMPT ? i * 3 + 1 : 1000000 * (b + 1) + i;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static void fill(uint8_t *p, size_t n)
{
    bench_fill(p, n, &rng);
}

/* The prompt's rows, the same in every branch: [LAYERS][2][HEADS][PROMPT][DIM] bfloat16. */
static uint8_t *prompt_rows;

/* A new entry of branch @p b: the prompt's rows, then 256 rows of its own. */
static struct kvt_entry *branch_entry(int b)
{
    const int64_t shape[4] = {1, HEADS, N, DIM};
    size_t row = DIM * 2, own = (size_t)OWN * row, shared = (size_t)PROMPT * row;
    kvt_cache *c[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        struct kvt_tensor t[2];
        for (int w = 0; w < 2; w++) {
            if (kvt_tensor_zeros(&t[w], KVT_BFLOAT16, 4, shape))
                die("tensor");
            uint8_t *p = kvt_buf_data(t[w].buf);
            for (int h = 0; h < HEADS; h++) {
                memcpy(p + (size_t)h * N * row,
                       prompt_rows + (((size_t)l * 2 + (size_t)w) * HEADS + (size_t)h) * shared,
                       shared);
                fill(p + (size_t)h * N * row + shared, own);
            }
        }
        struct kvt_cache_info info = {.kind = KVT_KIND_KV, .offset = N};
        if (kvt_cache_from_state(&info, t, 2, &c[l]))
            die("cache");
        kvt_tensor_release(&t[0]);
        kvt_tensor_release(&t[1]);
    }
    int32_t tok[N + 1];
    branch_tokens(b, tok);
    struct kvt_entry *e;
    if (kvt_entry_new(tok, N, c, LAYERS, "", &e))
        die("entry");
    return e;
}

static kvt_pcache *open_pc(bool share, kvt_device *d)
{
    struct kvt_pcache_opts o;
    kvt_pcache_opts_init(&o);
    o.ram_max_bytes = (uint64_t)16 << 30;
    o.spill_queue_max_bytes = 0;
    o.share_prefixes = share;
    o.device = d;
    kvt_pcache *pc;
    if (kvt_pcache_open(&o, &pc))
        die("open");
    return pc;
}

static uint64_t ram_bytes(kvt_pcache *pc)
{
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    return st.total_bytes;
}

/* Put branches [0, count) (from device memory with @p d); median ms of the last RUNS puts. */
static double put_all(kvt_pcache *pc, int count,
                      struct kvt_entry *(*twin)(kvt_device *, struct kvt_entry *), kvt_device *d)
{
    double v[BRANCHES];
    for (int b = 0; b < count; b++) {
        struct kvt_entry *e = branch_entry(b);
        if (twin)
            e = twin(d, e);
        double t0 = now_ms();
        if (kvt_pcache_put(pc, e, NULL))
            die("put");
        v[b] = now_ms() - t0;
    }
    int runs = count < RUNS ? count - 1 : RUNS;
    return bench_median(v + count - runs, (size_t)runs);
}

/* Median ms of a take of branch @p b, and of the take and one appended token. */
static void take_ms(kvt_pcache *pc, int b, double *take, double *append)
{
    int32_t tok[N + 1];
    branch_tokens(b, tok);
    double v[RUNS], w[RUNS];
    struct kvt_tensor kv[2];
    const int64_t shape[4] = {1, HEADS, 1, DIM};
    for (int i = 0; i < 2; i++)
        if (kvt_tensor_zeros(&kv[i], KVT_BFLOAT16, 4, shape))
            die("tensor");
    for (int r = 0; r < RUNS; r++) {
        for (int pass = 0; pass < 2; pass++) {
            struct kvt_take t;
            double t0 = now_ms();
            if (kvt_pcache_take(pc, tok, N + 1, "", &t) || !t.entry || t.entry->n_tokens != N)
                die("take");
            for (size_t l = 0; pass == 1 && l < t.entry->n_caches; l++)
                if (kvt_cache_append(t.entry->caches[l], kv, 2))
                    die("append");
            (pass ? w : v)[r] = now_ms() - t0;
            kvt_entry_free(t.entry);
            kvt_retain_release(t.retain);
        }
    }
    kvt_tensor_release(&kv[0]);
    kvt_tensor_release(&kv[1]);
    *take = bench_median(v, RUNS);
    *append = bench_median(w, RUNS);
}

/* The device side (--cuda): entries in device memory, takes into it. */
struct dest {
    kvt_device *d;
    uint64_t addr[2 * LAYERS];
};

static int place(void *ud, const struct kvt_header *h, uint64_t *dst)
{
    struct dest *p = ud;
    int k = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++, k++) {
            if (!p->addr[k] && kvt_device_alloc(p->d, h->caches[i].slots[j].bytes, &p->addr[k]))
                return -1;
            dst[k] = p->addr[k];
        }
    return 0;
}

struct dev_hold {
    kvt_device *d;
    uint64_t addr;
};

static void hold_release(void *ud, void *data)
{
    (void)data;
    struct dev_hold *h = ud;
    kvt_device_free(h->d, h->addr);
    free(h);
}

/* @p e (freed) copied into device memory. */
static struct kvt_entry *device_twin(kvt_device *d, struct kvt_entry *e)
{
    for (size_t i = 0; i < e->n_caches; i++) {
        struct kvt_cache_info info;
        struct kvt_tensor st[2], dt[2];
        kvt_cache_get_info(e->caches[i], &info);
        if (kvt_cache_state(e->caches[i], st) != 2)
            die("state");
        for (int k = 0; k < 2; k++) {
            size_t n = kvt_tensor_nbytes(&st[k]);
            uint8_t *flat = malloc(n);
            kvt_tensor_copy_out(&st[k], flat);
            struct dev_hold *h = malloc(sizeof(*h));
            kvt_buf *b;
            h->d = d;
            if (kvt_device_alloc(d, n, &h->addr) || kvt_device_upload(d, h->addr, flat, n) ||
                kvt_buf_wrap_device(d, h->addr, n, hold_release, h, &b) ||
                kvt_tensor_init(&dt[k], b, 0, st[k].dtype, st[k].rank, st[k].shape))
                die("device copy");
            kvt_buf_unref(b);
            kvt_tensor_release(&st[k]);
            free(flat);
        }
        kvt_cache_free(e->caches[i]);
        if (kvt_cache_from_state(&info, dt, 2, &e->caches[i]))
            die("device cache");
        kvt_tensor_release(&dt[0]);
        kvt_tensor_release(&dt[1]);
    }
    return e;
}

/* Median ms of a take into device memory, landed; *@p queued: until its copies are queued
 * (kvt_pcache_take_to_device_async() returning), the host's own work. */
static double device_take_ms(kvt_device *d, bool share, double *queued)
{
    kvt_pcache *pc = open_pc(share, d);
    put_all(pc, UNSHARED_BRANCHES, device_twin, d);
    int32_t tok[N + 1];
    branch_tokens(UNSHARED_BRANCHES / 2, tok);
    struct dest p = {.d = d};
    double v[RUNS], q[RUNS];
    for (int r = 0; r < RUNS; r++) {
        struct kvt_take t;
        struct kvt_header *h = NULL;
        kvt_dtake *pend = NULL;
        double t0 = now_ms();
        if (kvt_pcache_take_to_device_async(pc, tok, N + 1, "", place, &p, &t, &h, &pend) || !h)
            die("device take");
        q[r] = now_ms() - t0;
        if (kvt_dtake_end(pend))
            die("device take's copies");
        v[r] = now_ms() - t0;
        kvt_header_free(h);
    }
    *queued = bench_median(q, RUNS);
    for (int k = 0; k < 2 * LAYERS; k++)
        kvt_device_free(d, p.addr[k]);
    kvt_pcache_close(pc);
    return bench_median(v, RUNS);
}

int main(int argc, char **argv)
{
    bool cuda = argc > 1 && !strcmp(argv[1], "--cuda"),
         host = argc > 1 && !strcmp(argv[1], "--host");
    size_t prompt_bytes = (size_t)PROMPT * TOKEN_BYTES;
    prompt_rows = malloc(prompt_bytes);
    fill(prompt_rows, prompt_bytes);
    uint64_t unique = (uint64_t)(PROMPT + BRANCHES * OWN) * TOKEN_BYTES;

    kvt_pcache *whole = open_pc(false, NULL);
    double put_whole = put_all(whole, UNSHARED_BRANCHES, NULL, NULL);
    uint64_t whole_per = ram_bytes(whole) / UNSHARED_BRANCHES;
    double take_whole, append_whole;
    take_ms(whole, UNSHARED_BRANCHES / 2, &take_whole, &append_whole);
    kvt_pcache_close(whole);

    kvt_pcache *shared = open_pc(true, NULL);
    double put_shared = put_all(shared, BRANCHES, NULL, NULL);
    uint64_t held = ram_bytes(shared);
    double take_shared, append_shared;
    take_ms(shared, BRANCHES / 2, &take_shared, &append_shared);
    kvt_pcache_close(shared);

    printf("branches %d x (%d shared + %d own tokens), %llu B/token, RAM tier\n", BRANCHES, PROMPT,
           OWN, (unsigned long long)TOKEN_BYTES);
    printf("held, sharing on:      %8.1f MiB = %.3f x unique tokens' %.1f MiB\n", held / 1048576.0,
           (double)held / (double)unique, unique / 1048576.0);
    printf("held, sharing off:     %8.1f MiB = %.2f x unique (%d branches measured, x %d)\n",
           (double)whole_per * BRANCHES / 1048576.0, (double)whole_per * BRANCHES / (double)unique,
           UNSHARED_BRANCHES, BRANCHES);
    printf("put of a branch:       %8.2f ms shared; %.3f ms whole\n", put_shared, put_whole);
    printf("take of a branch:      %8.2f ms shared (joined, %.1f MiB); %.3f ms whole (clone)\n",
           take_shared, (double)N * TOKEN_BYTES / 1048576.0, take_whole);
    printf("take + 1 appended:     %8.2f ms shared; %.2f ms whole\n", append_shared, append_whole);
    if (cuda || host) {
        kvt_device *d;
        if (cuda ? kvt_device_open_cuda(0, NULL, &d) : kvt_device_open_host(NULL, &d))
            die("device");
        double qon, qoff, on = device_take_ms(d, true, &qon), off = device_take_ms(d, false, &qoff);
        printf("take to %s: %8.2f ms shared (%.2f ms to queue its copies); %.2f ms whole "
               "(%.2f ms)\n",
               kvt_device_name(d), on, qon, off, qoff);
        kvt_device_close(d);
    }
    free(prompt_rows);
    return 0;
}
