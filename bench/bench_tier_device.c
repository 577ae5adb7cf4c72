/*
 * bench_tier_device: a prompt cache over device memory (kvt_pcache_opts.device) against limits
 * measured in the same run.
 *
 * For each size, an entry of that many bytes (32 layers of bfloat16 K and V, [1, 8, n, 128])
 * lies in device memory; per repetition:
 *   - put: kvt_pcache_put() of the device entry into the RAM tier (device to page-locked host
 *     memory), against one device-to-host copy of the same bytes into page-locked memory;
 *   - take: kvt_pcache_take_to_device() of all but its last token from the RAM tier into
 *     device memory (the cut prefix: 8 runs a tensor), against one host-to-device copy of the
 *     same bytes from page-locked memory;
 *   - disk, cold and warm: the same take by a prompt cache whose RAM is empty, streamed from the
 *     entry's file, against the slower of the raw read of the file (cold: O_DIRECT; warm: a
 *     buffered read) and the host-to-device copy;
 *   - kept: the warm take with the pool already pinned, which also queues the copy of the
 *     landed bytes back into the RAM tier, against the warm take without it.
 * Ratios are limit time / kvtier time, medians over the repetitions.
 *
 * Usage: bench_tier_device [--host] [--dir D] [--size 256M,1G,4G] [--repeat N]
 * A benchmark, not a test: it prints figures and asserts nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "device/device_parts.h"
#include "kvtier.h"

#define LAYERS 32
#define MAX_REPEAT 32
#define PIECE ((size_t)16 << 20)

static void no_release(void *ud, void *data)
{
    (void)ud;
    (void)data;
}

struct run {
    kvt_device *d;
    size_t n;                 /* tokens */
    uint64_t src[2 * LAYERS]; /* the entry's device memory */
    uint64_t dst[2 * LAYERS]; /* where takes land */
    size_t tensor;            /* bytes of one K or V */
    int32_t *tok;
    void *pinned;
    uint64_t dev;
    uint64_t bytes;
};

/* The entry over r->src (wrapped, not copied). */
static struct kvt_entry *device_entry(struct run *r)
{
    kvt_cache *c[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        const int64_t shape[4] = {1, 8, (int64_t)r->n, 128};
        struct kvt_tensor t[2];
        for (int w = 0; w < 2; w++) {
            kvt_buf *b;
            if (kvt_buf_wrap_device(r->d, r->src[2 * l + w], r->tensor, no_release, NULL, &b) ||
                kvt_tensor_init(&t[w], b, 0, KVT_BFLOAT16, 4, shape))
                return NULL;
            kvt_buf_unref(b);
        }
        struct kvt_cache_info info = {.kind = KVT_KIND_KV, .offset = (int64_t)r->n};
        if (kvt_cache_from_state(&info, t, 2, &c[l]))
            return NULL;
        kvt_tensor_release(&t[0]);
        kvt_tensor_release(&t[1]);
    }
    struct kvt_entry *e;
    if (kvt_entry_new(r->tok, r->n, c, LAYERS, "", &e))
        return NULL;
    e->meta.model_id = strdup("bench/model");
    e->meta.config_fingerprint = strdup("fp-bench-tier-device");
    e->meta.tokenizer_hash = strdup("tk");
    return e;
}

static int place(void *ud, const struct kvt_header *h, uint64_t *dst)
{
    struct run *r = ud;
    size_t k = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++, k++)
            dst[k] = r->dst[k];
    return 0;
}

/* One copy of r->bytes between page-locked memory and the device, in 16 MiB pieces queued at
 * once (the bus's limit). */
static double time_copy(struct run *r, bool up)
{
    size_t n = (size_t)((r->bytes + PIECE - 1) / PIECE);
    struct kvt_dcopy *c = calloc(n, sizeof(*c));
    for (size_t i = 0; i < n; i++) {
        uint64_t at = (uint64_t)i * PIECE;
        size_t k = r->bytes - at < PIECE ? (size_t)(r->bytes - at) : PIECE;
        c[i] = (struct kvt_dcopy){(uint8_t *)r->pinned + at, r->dev + at, k, 1, 0, 0};
    }
    double t0 = bench_now();
    int rc = kvt_device_copies(r->d, c, n, up);
    double t = bench_now() - t0;
    free(c);
    return rc ? -1 : t;
}

static kvt_pcache *open_pc(struct run *r, const char *dir, bool keep_saved)
{
    struct kvt_pcache_opts o;
    kvt_pcache_opts_init(&o);
    o.ram_max_bytes = r->bytes + r->bytes / 8;
    o.spill_queue_max_bytes = 0;
    o.write_behind = false;
    o.demote_idle_ms = 0;
    o.device = r->d;
    o.cold_dir = dir;
    o.cold.model_id = "bench/model";
    o.cold.config_fingerprint = "fp-bench-tier-device";
    o.cold.tokenizer_hash = "tk";
    o.cold.max_bytes = 4 * r->bytes + ((uint64_t)1 << 30);
    o.cold.keep_saved_cached = keep_saved;
    kvt_pcache *pc;
    return kvt_pcache_open(&o, &pc) ? NULL : pc;
}

/* kvt_pcache_take_to_device() of all but the last token; its time, or -1. */
static double time_take(kvt_pcache *pc, struct run *r, bool want_disk)
{
    struct kvt_take t;
    struct kvt_header *h = NULL;
    double t0 = bench_now();
    int rc = kvt_pcache_take_to_device(pc, r->tok, r->n, "", place, r, &t, &h);
    double s = bench_now() - t0;
    bool ok = rc == 0 && h && h->n_tokens == r->n - 1 && t.from_disk == want_disk;
    if (!ok)
        fprintf(stderr, "take: rc %d (%s), %s\n", rc, kvt_last_error(), h ? "hit" : "miss");
    kvt_header_free(h);
    return ok ? s : -1;
}

static double time_put(kvt_pcache *pc, struct run *r)
{
    kvt_pcache_clear(pc);
    struct kvt_entry *e = device_entry(r);
    double t0 = bench_now();
    int rc = e ? kvt_pcache_put(pc, e, NULL) : -1;
    double s = bench_now() - t0;
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    if (rc || st.records != 1) {
        fprintf(stderr, "put: %s\n", kvt_last_error());
        return -1;
    }
    return s;
}

static double ratio(double *lim, double *k, int n)
{
    double v[MAX_REPEAT];
    for (int i = 0; i < n; i++)
        v[i] = lim[i] / k[i];
    return bench_median(v, (size_t)n);
}

static double gbs(uint64_t bytes, double *t, int n)
{
    double v[MAX_REPEAT];
    memcpy(v, t, sizeof(double) * (size_t)n);
    return (double)bytes / 1e9 / bench_median(v, (size_t)n);
}

static void row(const char *what, uint64_t bytes, double *k, double *lim, const char *lname, int n)
{
    printf("%8.0f MiB %-12s %7.2f GB/s | %-20s %7.2f GB/s | ratio %.2f\n", (double)bytes / 1048576,
           what, gbs(bytes, k, n), lname, gbs(bytes, lim, n), ratio(lim, k, n));
}

/* The RAM tier: put and take against the copies. */
static int run_ram(struct run *r, const char *dir, int repeat)
{
    kvt_pcache *pc = open_pc(r, dir, false);
    if (!pc || time_put(pc, r) < 0) /* the first put allocates the page-locked pool */
        return -1;
    double put[MAX_REPEAT], down[MAX_REPEAT], take[MAX_REPEAT], up[MAX_REPEAT];
    for (int i = 0; i < repeat; i++) {
        down[i] = time_copy(r, false);
        put[i] = time_put(pc, r);
        take[i] = time_take(pc, r, false);
        up[i] = time_copy(r, true);
        if (down[i] < 0 || put[i] < 0 || take[i] < 0 || up[i] < 0)
            return -1;
    }
    kvt_pcache_close(pc);
    uint64_t cut = r->bytes / r->n * (r->n - 1);
    row("put", r->bytes, put, down, "device-to-host copy", repeat);
    row("take, RAM", cut, take, up, "host-to-device copy", repeat);
    return 0;
}

static int run_disk(struct run *r, const char *dir, int repeat)
{
    kvt_pcache *pc = open_pc(r, dir, false);
    struct kvt_entry *e = device_entry(r);
    if (!pc || !e || kvt_store_put(kvt_pcache_store(pc), e, NULL, NULL))
        return fprintf(stderr, "store: %s\n", kvt_last_error()), -1;
    kvt_entry_free(e);
    struct kvt_store_record *v;
    size_t nv;
    if (kvt_store_list(kvt_pcache_store(pc), &v, &nv) || nv != 1)
        return -1;
    char *path = strdup(v[0].path);
    kvt_store_list_free(v);
    kvt_pcache_close(pc);
    uint64_t file = r->bytes + ((uint64_t)1 << 20);
    void *buf = bench_map(file, true);
    double k[2][MAX_REPEAT], rd[2][MAX_REPEAT], cp[MAX_REPEAT], lim[2][MAX_REPEAT];
    double kept[MAX_REPEAT];
    for (int i = 0; i < repeat; i++) {
        /* warm, the pool pinned (by a put, then RAM cleared): the take queues its host copy */
        if (!(pc = open_pc(r, dir, false)) || time_put(pc, r) < 0 || bench_make_warm(path))
            return -1;
        kvt_pcache_clear(pc);
        kept[i] = time_take(pc, r, true);
        kvt_pcache_close(pc);
        if (kept[i] < 0)
            return -1;
        cp[i] = time_copy(r, true);
        for (int w = 0; w < 2; w++) { /* 0 cold, 1 warm */
            rd[w][i] = bench_read_limit(path, buf, r->bytes, w == 0);
            if ((w == 0 ? bench_make_cold(path) : bench_make_warm(path)) ||
                !(pc = open_pc(r, dir, false)))
                return -1;
            k[w][i] = time_take(pc, r, true);
            kvt_pcache_close(pc);
            if (k[w][i] < 0 || rd[w][i] < 0 || cp[i] < 0)
                return -1;
            lim[w][i] = rd[w][i] > cp[i] ? rd[w][i] : cp[i];
        }
    }
    row("take, cold", r->bytes, k[0], lim[0], "read or copy, slower", repeat);
    row("take, warm", r->bytes, k[1], lim[1], "read or copy, slower", repeat);
    row("take, kept", r->bytes, kept, k[1], "take, warm", repeat);
    bench_unmap(buf, file);
    unlink(path);
    free(path);
    return 0;
}

static int run_size(kvt_device *d, const char *dir, uint64_t bytes, int repeat)
{
    struct run r = {.d = d};
    r.n = (size_t)(bytes / (LAYERS * 2 * 8 * 128 * 2));
    r.tensor = r.n * 8 * 128 * 2;
    r.bytes = (uint64_t)r.tensor * 2 * LAYERS;
    r.tok = malloc(r.n * sizeof(*r.tok));
    uint8_t *fill = malloc(r.tensor);
    uint64_t rng = 7;
    for (size_t i = 0; i < r.n; i++)
        r.tok[i] = (int32_t)(i % 32000);
    for (int k = 0; k < 2 * LAYERS; k++) {
        bench_fill(fill, r.tensor, &rng);
        if (kvt_device_alloc(d, r.tensor, &r.src[k]) || kvt_device_alloc(d, r.tensor, &r.dst[k]) ||
            kvt_device_upload(d, r.src[k], fill, r.tensor))
            return fprintf(stderr, "device memory: %s\n", kvt_last_error()), -1;
    }
    free(fill);
    if (d->ops->host_alloc(d, (size_t)r.bytes, &r.pinned) ||
        kvt_device_alloc(d, (size_t)r.bytes, &r.dev))
        return -1;
    memset(r.pinned, 1, (size_t)r.bytes);
    int rc = run_ram(&r, dir, repeat);
    if (rc == 0)
        rc = run_disk(&r, dir, repeat);
    for (int k = 0; k < 2 * LAYERS; k++) {
        kvt_device_free(d, r.src[k]);
        kvt_device_free(d, r.dst[k]);
    }
    kvt_device_free(d, r.dev);
    d->ops->host_free(d, r.pinned);
    free(r.tok);
    return rc;
}

static void header(kvt_device *d, int repeat)
{
    printf("bench_tier_device: %s, %d repetitions (medians; ratio = limit time / kvtier time)\n",
           kvt_device_name(d), repeat);
}

int main(int argc, char **argv)
{
    const struct bench_device_prog p = {"bench_tier_device", "/tmp/bench-tier-device", MAX_REPEAT,
                                        header, run_size};
    return bench_device_main(argc, argv, &p);
}
