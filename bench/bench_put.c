/*
 * bench_put: the cost of kvt_store_put as the store grows. A put first accounts for files
 * other processes may have written (STORE.md §12.4); that must not cost a listing of the
 * whole namespace directory each time. For 1,000 and 100,000 entries already in one
 * namespace (written with kvt_file_save, no fsync, then indexed by kvt_store_open), it times
 * PUTS puts of a small entry and prints the medians and their ratio (target <= 1.2).
 *
 * Usage: bench_put [DIR [N]]  (DIR: scratch directory, default /dev/shm: the store's own work,
 *                              not the device, is what grows with the entries; N: the larger
 *                              store, default 100000)
 * A benchmark, not a test: it asserts nothing.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "kvtier.h"

#define PUTS 201
#define WARMUP 20
#define TOKENS 16

/* A small ssm entry whose tokens are @p id's own (distinct entries, no supersession). */
static struct kvt_entry *small_entry(uint32_t id)
{
    int32_t tok[TOKENS];
    for (int k = 0; k < TOKENS; k++)
        tok[k] = (int32_t)(k == 0 ? id : (id * 2654435761u + (uint32_t)k) % 150000);
    int64_t conv_shape[3] = {1, 2, 4}, rec_shape[4] = {1, 1, 2, 2};
    struct kvt_tensor t[2];
    kvt_cache *c = NULL;
    struct kvt_entry *e = NULL;
    if (kvt_tensor_zeros(&t[0], KVT_BFLOAT16, 3, conv_shape))
        return NULL;
    if (kvt_tensor_zeros(&t[1], KVT_FLOAT32, 4, rec_shape)) {
        kvt_tensor_release(&t[0]);
        return NULL;
    }
    struct kvt_cache_info info = {.kind = KVT_KIND_SSM, .offset = TOKENS};
    if (kvt_cache_from_state(&info, t, 2, &c) == 0 && kvt_entry_new(tok, TOKENS, &c, 1, "", &e))
        kvt_cache_free(c);
    kvt_tensor_release(&t[0]);
    kvt_tensor_release(&t[1]);
    if (e) {
        e->meta.model_id = strdup("bench/model");
        e->meta.config_fingerprint = strdup("fp-bench");
        e->meta.tokenizer_hash = strdup("tk-bench");
    }
    return e;
}

/* Write @p n entries straight into the namespace directory, as other processes would have. */
static int fill(const char *ns, size_t n)
{
    struct kvt_save_opts so = {.no_sync = true};
    for (size_t i = 0; i < n; i++) {
        struct kvt_entry *e = small_entry((uint32_t)i + 1);
        char path[1200];
        snprintf(path, sizeof(path), "%s/%08zx-0000-4000-8000-%012zx.mlxkv", ns, i, i);
        int rc = e ? kvt_file_save(path, e, &so, NULL) : -ENOMEM;
        kvt_entry_free(e);
        if (rc)
            return rc;
    }
    return 0;
}

/* Median put time in µs over PUTS puts into a store of @p n entries; < 0 on failure. */
static double median_put(const char *base, size_t n)
{
    char dir[1024], cmd[1200], ns[1100];
    snprintf(dir, sizeof(dir), "%s/bench-put-%d-%zu", base, (int)getpid(), n);
    snprintf(ns, sizeof(ns), "%s/fp-bench/base", dir);
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", ns);
    double med = -1;
    if (system(cmd) != 0 || fill(ns, n) != 0) {
        fprintf(stderr, "bench_put: cannot fill %s: %s\n", ns, kvt_last_error());
        goto out;
    }
    struct kvt_store_opts o;
    kvt_store_opts_init(&o);
    o.model_id = "bench/model";
    o.config_fingerprint = "fp-bench";
    o.tokenizer_hash = "tk-bench";
    o.max_bytes = UINT64_MAX / 2; /* no eviction: the put alone is measured */
    kvt_store *s;
    double t0 = bench_now();
    if (kvt_store_open(dir, &o, &s) != 0) {
        fprintf(stderr, "bench_put: open: %s\n", kvt_last_error());
        goto out;
    }
    double open_ms = (bench_now() - t0) * 1e3;
    static double t[PUTS + WARMUP];
    for (int i = 0; i < PUTS + WARMUP; i++) { /* the first puts warm the staging up */
        struct kvt_entry *e = small_entry((uint32_t)(n + 1000 + (size_t)i));
        double a = bench_now();
        int rc = e ? kvt_store_put(s, e, NULL, NULL) : -ENOMEM;
        t[i] = (bench_now() - a) * 1e6;
        kvt_entry_free(e);
        if (rc) {
            fprintf(stderr, "bench_put: put: %s\n", kvt_last_error());
            kvt_store_close(s);
            goto out;
        }
    }
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    kvt_store_close(s);
    double *m = t + WARMUP;
    med = bench_median(m, PUTS); /* sorts m */
    printf("%7zu entries (open %.0f ms, %llu after the puts): put median %.1f us, p10 %.1f, "
           "p90 %.1f\n",
           n, open_ms, (unsigned long long)st.entries, med, m[PUTS / 10], m[PUTS * 9 / 10]);
out:
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_put: cannot remove %s\n", dir);
    return med;
}

int main(int argc, char **argv)
{
    const char *base = argc > 1 ? argv[1] : "/dev/shm";
    size_t big = argc > 2 ? (size_t)strtoul(argv[2], NULL, 10) : 100000;
    setvbuf(stdout, NULL, _IOLBF, 0);
    double small = median_put(base, 1000);
    double large = small > 0 ? median_put(base, big) : -1;
    if (small <= 0 || large <= 0)
        return 1;
    printf("put median at %zu / at 1000 entries: %.2f (target <= 1.2)\n", big, large / small);
    return 0;
}
