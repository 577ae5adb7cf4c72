/*
 * bench_device: restores into device memory against limits measured in the same run.
 *
 * For each size, an entry of that many bytes (32 layers of K and V, bfloat16) is saved, then
 * per repetition, in alternating order:
 *   - kvt_file_load_to_device() of the file, page cache cold and warm;
 *   - the raw read of the same bytes (O_DIRECT, several reads in flight;
 *     bench/harness/bench_raw.c), cold, and a buffered read of the cached file, warm;
 *   - a copy of the same bytes from page-locked host memory to the device, in 16 MiB pieces
 *     on one stream (the bus's limit);
 *   - kvt_file_save() (durable) of the restored device memory, wrapped as an entry, against a
 *     raw durable write of the same bytes (O_DIRECT) and a device-to-host copy of them.
 * The limit of a restore is the slower of its read and the copy (the two overlap at best), of
 * a save the slower of the copy down and the write;
 * ratios are limit time / kvtier time, medians over the repetitions.
 *
 * Usage: bench_device [--host] [--dir D] [--size 256M,1G,4G] [--repeat N]
 *   --host  the host stand-in instead of CUDA device 0 (a smoke run on machines without one)
 * A benchmark, not a test: it prints figures and asserts nothing.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "device/device_parts.h"
#include "kvtier.h"

#define LAYERS 32
#define MAX_REPEAT 32
#define COPY_PIECE ((size_t)16 << 20)

/* One K or V tensor of layer @p l ([1, 8, n, 128] bfloat16), however the caller makes it. */
typedef int (*make_fn)(void *ud, int l, int w, const int64_t *shape, struct kvt_tensor *t);

/* An entry of about @p bytes: LAYERS kv caches of [1, 8, n, 128] bfloat16. */
static struct kvt_entry *build_entry(uint64_t bytes, make_fn make, void *ud)
{
    size_t per_token = (size_t)LAYERS * 2 * 8 * 128 * 2;
    size_t n = (size_t)(bytes / per_token);
    int32_t *tok = malloc(n * sizeof(*tok));
    kvt_cache *c[LAYERS];
    struct kvt_entry *e = NULL;
    for (size_t i = 0; i < n; i++)
        tok[i] = (int32_t)(i % 32000);
    for (int l = 0; l < LAYERS; l++) {
        const int64_t shape[4] = {1, 8, (int64_t)n, 128};
        struct kvt_tensor t[2];
        for (int w = 0; w < 2; w++)
            if (make(ud, l, w, shape, &t[w]))
                return NULL;
        struct kvt_cache_info info = {.kind = KVT_KIND_KV, .offset = (int64_t)n};
        if (kvt_cache_from_state(&info, t, 2, &c[l]))
            return NULL;
        kvt_tensor_release(&t[0]);
        kvt_tensor_release(&t[1]);
    }
    if (kvt_entry_new(tok, n, c, LAYERS, "", &e))
        e = NULL;
    free(tok);
    return e;
}

/* Random host tensors. */
static int make_host(void *ud, int l, int w, const int64_t *shape, struct kvt_tensor *t)
{
    (void)l, (void)w;
    if (kvt_tensor_zeros(t, KVT_BFLOAT16, 4, shape))
        return -1;
    bench_fill(kvt_buf_data(t->buf), kvt_tensor_nbytes(t), ud);
    return 0;
}

struct dev_mem {
    kvt_device *d;
    uint64_t addr[2 * LAYERS];
    int n;
};

static int place(void *ud, const struct kvt_header *h, uint64_t *dst)
{
    struct dev_mem *m = ud;
    int k = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++, k++) {
            if (k >= m->n) {
                int rc = kvt_device_alloc(m->d, h->caches[i].slots[j].bytes, &m->addr[k]);
                if (rc)
                    return rc;
                m->n = k + 1;
            }
            dst[k] = m->addr[k];
        }
    return 0;
}

static double time_restore(kvt_device *d, struct dev_mem *m, const char *path, bool cold)
{
    if (cold ? bench_make_cold(path) : bench_make_warm(path))
        return -1;
    struct kvt_expect x = {.keep_cache = !cold};
    struct kvt_header *h;
    double t0 = bench_now();
    int rc = kvt_file_load_to_device(path, &x, d, place, m, &h);
    double t = bench_now() - t0;
    kvt_header_free(h);
    if (rc)
        fprintf(stderr, "restore: %s\n", kvt_last_error());
    return rc ? -1 : t;
}

/* The same bytes between page-locked host memory and the device (@p up: to the device), in
 * 16 MiB pieces on one stream: the bus's limit. */
static double time_copy(kvt_device *d, void *pinned, uint64_t dev, uint64_t bytes, bool up)
{
    double t0 = bench_now();
    unsigned slot = 0;
    for (uint64_t at = 0; at < bytes; at += COPY_PIECE, slot = (slot + 1) % d->depth) {
        size_t k = bytes - at < COPY_PIECE ? (size_t)(bytes - at) : COPY_PIECE;
        uint8_t *host = (uint8_t *)pinned + at;
        if (up ? d->ops->h2d(d, dev + at, host, k, slot) : d->ops->d2h(d, host, dev + at, k, slot))
            return -1;
    }
    for (unsigned s = 0; s < d->depth; s++)
        d->ops->wait(d, s);
    return bench_now() - t0;
}

static double ratio_median(const double *lim, const double *kvt, int n)
{
    double r[MAX_REPEAT];
    for (int i = 0; i < n; i++)
        r[i] = lim[i] / kvt[i];
    return bench_median(r, (size_t)n);
}

static void no_release(void *ud, void *data)
{
    (void)ud;
    (void)data;
}

/* The restored device memory of a struct dev_mem, wrapped (not copied). */
static int make_device(void *ud, int l, int w, const int64_t *shape, struct kvt_tensor *t)
{
    const struct dev_mem *m = ud;
    size_t bytes = (size_t)(shape[0] * shape[1] * shape[2] * shape[3]) * 2;
    kvt_buf *b;
    if (kvt_buf_wrap_device(m->d, m->addr[2 * l + w], bytes, no_release, NULL, &b))
        return -1;
    int rc = kvt_tensor_init(t, b, 0, KVT_BFLOAT16, 4, shape);
    kvt_buf_unref(b);
    return rc;
}

/* kvt_file_save() of an entry in device memory: durable, like the raw write it is held to. */
static double time_save(const struct kvt_entry *e, const char *path)
{
    unlink(path);
    bench_settle_disk(path);
    double t0 = bench_now();
    int rc = kvt_file_save(path, e, NULL, NULL);
    double t = bench_now() - t0;
    if (rc)
        fprintf(stderr, "save from device: %s\n", kvt_last_error());
    return rc ? -1 : t;
}

/* A raw durable write of the same bytes (O_DIRECT where the file system takes it). */
static double time_write(const char *path, void *buf, uint64_t bytes)
{
    unlink(path);
    bench_settle_disk(path);
    struct bench_span s = {buf, 0, (size_t)bytes};
    double secs;
    return bench_raw_write(path, &s, 1, bytes, true, &secs) ? -1 : secs;
}

/* Saves from device memory against max(raw durable write, device-to-host copy). The entry is
 * built for the same @p bytes as the restored one (its tokens and tensors fill the restored
 * allocations exactly); @p file is the size of its file. */
static int run_save(kvt_device *d, const struct dev_mem *m, const char *dir, uint64_t bytes,
                    uint64_t file, void *buf, void *pinned, uint64_t dev, int repeat)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/bench-device-save.mlxkv", dir);
    struct kvt_entry *e = build_entry(bytes, make_device, (void *)m);
    if (!e)
        return fprintf(stderr, "device entry: %s\n", kvt_last_error()), -1;
    double k[MAX_REPEAT], wr[MAX_REPEAT], cp[MAX_REPEAT], lim[MAX_REPEAT];
    for (int r = 0; r < repeat; r++) {
        cp[r] = time_copy(d, pinned, dev, file, false);
        if (r % 2 == 0)
            k[r] = time_save(e, path);
        wr[r] = time_write(path, buf, file);
        if (r % 2)
            k[r] = time_save(e, path);
        if (k[r] < 0 || wr[r] < 0 || cp[r] < 0)
            return -1;
        lim[r] = wr[r] > cp[r] ? wr[r] : cp[r];
    }
    kvt_entry_free(e);
    unlink(path);
    double gb = (double)file / 1e9;
    printf("%8.0f MiB save  %6.2f GB/s | write %6.2f GB/s, copy %6.2f GB/s | ratio %.2f\n",
           (double)file / 1048576, gb / bench_median(k, (size_t)repeat),
           gb / bench_median(wr, (size_t)repeat), gb / bench_median(cp, (size_t)repeat),
           ratio_median(lim, k, repeat));
    return 0;
}

static int run_size(kvt_device *d, const char *dir, uint64_t bytes, int repeat)
{
    uint64_t rng = 42;
    struct kvt_entry *e = build_entry(bytes, make_host, &rng);
    char path[4096];
    snprintf(path, sizeof(path), "%s/bench-device.mlxkv", dir);
    uint64_t file;
    if (!e || kvt_file_save(path, e, NULL, &file)) {
        fprintf(stderr, "save: %s\n", kvt_last_error());
        return -1;
    }
    kvt_entry_free(e);
    void *buf = bench_map(file, true), *pinned;
    uint64_t dev;
    struct dev_mem m = {.d = d};
    if (!buf || d->ops->host_alloc(d, (size_t)file, &pinned) ||
        kvt_device_alloc(d, (size_t)file, &dev))
        return -1;
    memset(pinned, 1, (size_t)file);
    double k[2][MAX_REPEAT], rd[2][MAX_REPEAT], cp[MAX_REPEAT], lim[2][MAX_REPEAT];
    for (int r = 0; r < repeat; r++) {
        cp[r] = time_copy(d, pinned, dev, file, true);
        for (int w = 0; w < 2; w++) { /* w = 0 cold, 1 warm */
            bool kvt_first = (r + w) % 2 == 0;
            if (kvt_first)
                k[w][r] = time_restore(d, &m, path, w == 0);
            rd[w][r] = bench_read_limit(path, buf, file, w == 0);
            if (!kvt_first)
                k[w][r] = time_restore(d, &m, path, w == 0);
            if (k[w][r] < 0 || rd[w][r] < 0 || cp[r] < 0)
                return -1;
            lim[w][r] = rd[w][r] > cp[r] ? rd[w][r] : cp[r];
        }
    }
    double gb = (double)file / 1e9;
    for (int w = 0; w < 2; w++) {
        double kk[MAX_REPEAT], rr[MAX_REPEAT], cc[MAX_REPEAT];
        memcpy(kk, k[w], sizeof(kk));
        memcpy(rr, rd[w], sizeof(rr));
        memcpy(cc, cp, sizeof(cc));
        printf("%8.0f MiB %-5s restore %6.2f GB/s | read %6.2f GB/s, copy %6.2f GB/s | "
               "ratio %.2f\n",
               (double)file / 1048576, w ? "warm" : "cold", gb / bench_median(kk, (size_t)repeat),
               gb / bench_median(rr, (size_t)repeat), gb / bench_median(cc, (size_t)repeat),
               ratio_median(lim[w], k[w], repeat));
    }
    if (run_save(d, &m, dir, bytes, file, buf, pinned, dev, repeat))
        return -1;
    for (int i = 0; i < m.n; i++)
        kvt_device_free(d, m.addr[i]);
    kvt_device_free(d, dev);
    d->ops->host_free(d, pinned);
    bench_unmap(buf, file);
    unlink(path);
    return 0;
}

static void header(kvt_device *d, int repeat)
{
    printf("bench_device: %s, staging %zu MiB x %u, %d repetitions (medians; ratio = limit "
           "time / kvtier time, limit = slower of the read or write and the copy)\n",
           kvt_device_name(d), d->chunk >> 20, d->depth, repeat);
}

int main(int argc, char **argv)
{
    const struct bench_device_prog p = {"bench_device", "/tmp", MAX_REPEAT, header, run_size};
    return bench_device_main(argc, argv, &p);
}
