/*
 * bench_share: shared prefixes stored once (docs/SHARING.md §10).
 *
 * 200 branches, each a 4,096-token prompt shared by all of them plus 256 tokens of its own,
 * 8 KiB of KV per token (4 kv layers of K and V [1, 8, n, 64] bfloat16), put into a store with
 * share_prefixes on. Reports:
 *  1. disk bytes against the bytes of the unique tokens (4,096 + 200 × 256), and against what
 *     the same branches take without sharing (measured on 10 branches, scaled to 200);
 *  2. bytes written per branch after the first (disk growth per put) against its suffix;
 *  3. restore of one branch (find + kvt_store_restore, hashes checked) against a raw read()
 *     of the same files (tail and chunks, whole) into one reused buffer, each run from the
 *     same page cache state: every file cached (warm), or every file's pages dropped first
 *     (cold); medians of 15, same run, and the mean CPU time of each (all threads);
 *  4. find of a branch's prompt with sharing on against a store of the same 200 token lists
 *     kept whole (tiny tensors: find reads only the index), median of 301.
 *
 * Usage: bench_share [DIR]   (scratch directory, default /tmp; needs ~1 GB free)
 * A benchmark, not a test: it asserts nothing.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kvtier.h"
#include "store/share.h"
#include "store/store_parts.h"

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
#define FIND_RUNS 301

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* CPU time of the process so far, every thread's (a restore's helper threads included). */
static double cpu_ms(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
           (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return v[n / 2];
}

static void die(const char *what)
{
    fprintf(stderr, "bench_share: %s: %s\n", what, kvt_last_error());
    exit(1);
}

/* Tokens of branch @p b, plus one more token to compute for finds. */
static void branch_tokens(int b, int32_t *tok)
{
    for (int i = 0; i < N + 1; i++)
        tok[i] = i < PROMPT ? i * 3 + 1 : 1000000 * (b + 1) + i;
}

/* One branch at a time: the caches' tensors are rewritten in place between puts. */
struct branch {
    struct kvt_tensor t[LAYERS][2];
    kvt_cache *c[LAYERS];
    int32_t tok[N + 1];
    struct kvt_entry e;
    int dim;
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static void fill(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        p[i] = (uint8_t)((rng * 0x2545F4914F6CDD1Dull) >> 56);
    }
}

static void branch_new(struct branch *br, int dim)
{
    const int64_t shape[4] = {1, HEADS, N, dim};
    br->dim = dim;
    for (int l = 0; l < LAYERS; l++) {
        for (int w = 0; w < 2; w++) {
            if (kvt_tensor_zeros(&br->t[l][w], KVT_BFLOAT16, 4, shape))
                die("tensor");
            fill(kvt_buf_data(br->t[l][w].buf), kvt_tensor_nbytes(&br->t[l][w]));
        }
        struct kvt_cache_info info = {.kind = KVT_KIND_KV, .offset = N};
        if (kvt_cache_from_state(&info, br->t[l], 2, &br->c[l]))
            die("cache");
    }
    br->e =
        (struct kvt_entry){.tokens = br->tok, .n_tokens = N, .caches = br->c, .n_caches = LAYERS};
}

/* Make it branch @p b: its tokens and new bytes in its own 256 rows. */
static void branch_set(struct branch *br, int b)
{
    branch_tokens(b, br->tok);
    size_t row = (size_t)br->dim * 2;
    for (int l = 0; l < LAYERS; l++)
        for (int w = 0; w < 2; w++)
            for (int h = 0; h < HEADS; h++)
                fill((uint8_t *)kvt_buf_data(br->t[l][w].buf) + ((size_t)h * N + PROMPT) * row,
                     OWN * row);
}

static void branch_free(struct branch *br)
{
    for (int l = 0; l < LAYERS; l++) {
        kvt_cache_free(br->c[l]);
        kvt_tensor_release(&br->t[l][0]);
        kvt_tensor_release(&br->t[l][1]);
    }
}

static kvt_store *open_store(const char *dir, const char *fp, bool share)
{
    struct kvt_store_opts o;
    kvt_store_opts_init(&o);
    o.model_id = "bench/share";
    o.config_fingerprint = fp;
    o.tokenizer_hash = "tk";
    o.max_bytes = (uint64_t)64 << 30;
    o.share_prefixes = share;
    kvt_store *s;
    if (kvt_store_open(dir, &o, &s))
        die("open");
    return s;
}

static uint64_t disk_bytes(kvt_store *s)
{
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    return st.total_bytes;
}

/* Put branches [0, count); the disk growth of each put after the first goes to *grow_max. */
static void put_all(kvt_store *s, struct branch *br, int count, uint64_t *grow_max)
{
    *grow_max = 0;
    for (int b = 0; b < count; b++) {
        branch_set(br, b);
        uint64_t before = disk_bytes(s);
        if (kvt_store_put(s, &br->e, NULL, NULL))
            die("put");
        uint64_t grow = disk_bytes(s) - before;
        if (b > 0 && grow > *grow_max)
            *grow_max = grow;
    }
}

/* The files a restore of the hit @p hit reads: its tail and its chunks. */
static size_t hit_files(kvt_store *s, const struct kvt_hit *hit, const int32_t *tok, char **paths)
{
    struct kvt_store_record *v;
    size_t n, np = 0;
    if (kvt_store_list(s, &v, &n))
        die("list");
    for (size_t i = 0; i < n; i++)
        if (v[i].id == hit->id)
            paths[np++] = strdup(v[i].path);
    kvt_store_list_free(v);
    if (np != 1)
        die("the hit's record");
    char *dir = strdup(paths[0]);
    *strrchr(dir, '/') = 0;
    for (size_t k = 0; kvt_is_tail(paths[0]) && k < kvt_share_chunks(N); k++)
        paths[np++] = kvt_share_chunk_path_of(dir, tok, k);
    free(dir);
    return np;
}

/* read() every file whole into @p buf; @return the bytes read. */
static uint64_t raw_read(char **paths, size_t n, uint8_t *buf, size_t cap)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
        ssize_t r;
        while (fd >= 0 && total < cap && (r = read(fd, buf + total, cap - total)) > 0)
            total += (uint64_t)r;
        if (fd >= 0)
            close(fd);
    }
    return total;
}

/* Bring every file into the page cache (@p warm) or drop its pages. */
static void set_cached(char **paths, size_t n, bool warm, uint8_t *buf, size_t cap)
{
    if (warm) {
        raw_read(paths, n, buf, cap);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0)
            die("posix_fadvise");
        if (fd >= 0)
            close(fd);
    }
}

/* Medians of a find + restore of branch @p b and of a raw read of the same files into one
 * buffer reused by every run (its pages faulted in once: the strictest baseline), each from
 * the same page cache state (@p warm: every file cached; else none). */
struct timing {
    double restore_ms, raw_ms;
    double restore_cpu_ms, raw_cpu_ms; /* means over the runs */
    uint64_t raw_bytes;
};

static struct timing restore_vs_raw(kvt_store *s, int b, bool warm)
{
    int32_t tok[N + 1];
    branch_tokens(b, tok);
    struct kvt_hit hit;
    if (kvt_store_find(s, tok, N + 1, "", &hit) || hit.prefix_len != N)
        die("find");
    char *paths[64];
    size_t np = hit_files(s, &hit, tok, paths);
    size_t cap = (size_t)N * TOKEN_BYTES * 2;
    uint8_t *buf = malloc(cap);
    double r[RUNS], w[RUNS];
    struct timing t = {0};
    for (int i = 0; i < RUNS; i++) {
        set_cached(paths, np, warm, buf, cap);
        double t0 = now_ms(), c0 = cpu_ms();
        struct kvt_entry *e = NULL;
        if (kvt_store_find(s, tok, N + 1, "", &hit) || kvt_store_restore(s, &hit, &e) || !e)
            die("restore");
        r[i] = now_ms() - t0;
        t.restore_cpu_ms += (cpu_ms() - c0) / RUNS;
        kvt_entry_free(e);
        set_cached(paths, np, warm, buf, cap);
        t0 = now_ms();
        c0 = cpu_ms();
        t.raw_bytes = raw_read(paths, np, buf, cap);
        w[i] = now_ms() - t0;
        t.raw_cpu_ms += (cpu_ms() - c0) / RUNS;
    }
    t.restore_ms = median(r, RUNS);
    t.raw_ms = median(w, RUNS);
    for (size_t i = 0; i < np; i++)
        free(paths[i]);
    free(buf);
    return t;
}

static void print_timing(const char *what, const struct timing *t)
{
    printf("%-22s %7.2f ms; raw read of its %.1f MiB: %.2f ms; ratio %.2f; CPU %.2f vs %.2f ms\n",
           what, t->restore_ms, t->raw_bytes / 1048576.0, t->raw_ms, t->raw_ms / t->restore_ms,
           t->restore_cpu_ms, t->raw_cpu_ms);
}

static double find_us(kvt_store *s, int b)
{
    int32_t tok[N + 1];
    branch_tokens(b, tok);
    double v[FIND_RUNS];
    for (int i = 0; i < FIND_RUNS; i++) {
        struct kvt_hit hit;
        double t0 = now_ms();
        kvt_store_find(s, tok, N + 1, "", &hit);
        v[i] = (now_ms() - t0) * 1e3;
    }
    return median(v, FIND_RUNS);
}

int main(int argc, char **argv)
{
    char *dir = strdup(argc > 1 ? argv[1] : "/tmp");
    char tmpl[4096];
    snprintf(tmpl, sizeof(tmpl), "%s/bench-share-XXXXXX", dir);
    if (!mkdtemp(tmpl))
        return perror("mkdtemp"), 1;
    struct branch br;
    branch_new(&br, DIM);

    kvt_store *shared = open_store(tmpl, "fp-shared", true);
    uint64_t grow_shared, grow_whole;
    put_all(shared, &br, BRANCHES, &grow_shared);
    uint64_t unique = (uint64_t)(PROMPT + BRANCHES * OWN) * TOKEN_BYTES;
    uint64_t disk = disk_bytes(shared);
    kvt_store *whole = open_store(tmpl, "fp-whole", false);
    put_all(whole, &br, UNSHARED_BRANCHES, &grow_whole);
    uint64_t whole_per = disk_bytes(whole) / UNSHARED_BRANCHES;
    struct timing whole_warm = restore_vs_raw(whole, UNSHARED_BRANCHES / 2, true);
    struct timing whole_cold = restore_vs_raw(whole, UNSHARED_BRANCHES / 2, false);
    kvt_store_close(whole);

    struct timing warm = restore_vs_raw(shared, BRANCHES / 2, true);
    struct timing cold = restore_vs_raw(shared, BRANCHES / 2, false);
    double find_shared = find_us(shared, BRANCHES / 2);
    kvt_store_close(shared);
    branch_free(&br);

    struct branch tiny; /* the same token lists, kept whole, bytes negligible */
    branch_new(&tiny, 1);
    kvt_store *index_only = open_store(tmpl, "fp-tiny", false);
    uint64_t grow_tiny;
    put_all(index_only, &tiny, BRANCHES, &grow_tiny);
    double find_whole = find_us(index_only, BRANCHES / 2);
    kvt_store_close(index_only);
    branch_free(&tiny);

    printf("branches %d x (%d shared + %d own tokens), %llu B/token\n", BRANCHES, PROMPT, OWN,
           (unsigned long long)TOKEN_BYTES);
    printf("disk, sharing on:      %8.1f MiB = %.3f x unique tokens' %.1f MiB\n", disk / 1048576.0,
           (double)disk / (double)unique, unique / 1048576.0);
    printf("disk, sharing off:     %8.1f MiB = %.2f x unique (%d branches measured, x %d)\n",
           (double)whole_per * BRANCHES / 1048576.0, (double)whole_per * BRANCHES / (double)unique,
           UNSHARED_BRANCHES, BRANCHES);
    printf("written per branch:    %8.3f MiB max = %.3f x its suffix (off: %.3f x)\n",
           grow_shared / 1048576.0, (double)grow_shared / (double)(OWN * TOKEN_BYTES),
           (double)grow_whole / (double)(OWN * TOKEN_BYTES));
    print_timing("restore, warm:", &warm);
    print_timing("restore, cold:", &cold);
    print_timing("kept whole, warm:", &whole_warm);
    print_timing("kept whole, cold:", &whole_cold);
    printf("find (median):         %8.2f us shared; %.2f us whole\n", find_shared, find_whole);
    char *cmd = malloc(strlen(tmpl) + 16);
    sprintf(cmd, "rm -rf '%s'", tmpl);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_share: could not remove %s\n", tmpl);
    free(cmd);
    free(dir);
    return 0;
}
