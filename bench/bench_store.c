/*
 * bench_store: store lookups and startup recovery (STORE.md §12.5, §6).
 *
 *  1. find for a 32k-token prompt over 1k, 10k and 100k indexed entries, built in memory
 *     through the index API. Workload "conversations": a shared 2k-token system prompt and
 *     a 32k-token conversation whose turns (64-512 tokens) other conversations fork from,
 *     each adding one or two turns of its own; the prompt extends the long one. Workload
 *     "cuts" is the adversarial case: every entry is a prefix of the prompt cut at a random
 *     depth plus a short divergent tail, so the prompt's path holds a node at nearly every
 *     depth. Reports the median find in µs and the ratios between sizes (flatness).
 *  2. open of a directory of 1,000 entries of 16k tokens each (tiny ssm tensors: the header
 *     tokens are what the scan parses), page cache warm and cold; median over runs; and the
 *     header reads alone, to separate the format layer's parse from the store's own work.
 *
 * Usage: bench_store [DIR]   (DIR: scratch directory for part 2, default /tmp)
 * Prints figures and ratios; a benchmark, not a test: it asserts nothing.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "kvtier.h"
#include "store/index.h"

#define PROMPT_LEN 32768
#define SYSTEM_LEN 2048
#define FIND_RUNS 301

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}

static size_t rnd(size_t n)
{
    return (size_t)(next() % n);
}

static int32_t fresh_token(void)
{
    return (int32_t)(100000 + rnd(100000));
}

/* The long conversation: system prompt, then turns; boundaries[] are the turn ends. */
static size_t make_main(int32_t *p, size_t *bounds, size_t *n_bounds)
{
    for (size_t i = 0; i < PROMPT_LEN; i++)
        p[i] = i < SYSTEM_LEN ? (int32_t)(7 + i % 5000) : fresh_token();
    size_t at = SYSTEM_LEN, nb = 0;
    bounds[nb++] = at;
    while (at < PROMPT_LEN - 1) {
        at += 64 + rnd(449);
        if (at > PROMPT_LEN - 1)
            at = PROMPT_LEN - 1;
        bounds[nb++] = at;
    }
    *n_bounds = nb;
    return PROMPT_LEN - 1; /* the stored conversation; the prompt adds one token */
}

static int build_conversations(struct kvt_index *ix, const int32_t *p, const size_t *bounds,
                               size_t nb, size_t entries, int32_t *buf)
{
    int rc = kvt_index_insert(ix, "", p, PROMPT_LEN - 1, true, 1, 0, NULL, NULL);
    for (size_t e = 1; rc == 0 && e < entries; e++) {
        size_t fork = bounds[rnd(4) ? 0 : rnd(nb)]; /* most fork at the system prompt */
        memcpy(buf, p, fork * sizeof(*buf));
        size_t n = fork, turns = 1 + rnd(2);
        for (size_t t = 0; t < turns; t++)
            for (size_t k = 32 + rnd(225); k > 0 && n < PROMPT_LEN; k--)
                buf[n++] = fresh_token();
        rc = kvt_index_insert(ix, "", buf, n, rnd(10) < 7, 1, 0, NULL, NULL);
    }
    return rc;
}

static int build_cuts(struct kvt_index *ix, const int32_t *p, size_t entries, int32_t *buf)
{
    int rc = 0;
    for (size_t e = 0; rc == 0 && e < entries; e++) {
        size_t cut = 1 + rnd(PROMPT_LEN - 1), n = cut;
        memcpy(buf, p, cut * sizeof(*buf));
        for (size_t k = rnd(17); k > 0; k--)
            buf[n++] = fresh_token();
        rc = kvt_index_insert(ix, "", buf, n, rnd(10) < 7, 1, 0, NULL, NULL);
    }
    return rc;
}

/* Median find time in µs for @p prompt over @p entries of a workload. */
static double bench_find(int workload, size_t entries, const int32_t *prompt, size_t *plen_out,
                         double *build_s)
{
    static int32_t buf[PROMPT_LEN + 600];
    static size_t bounds[PROMPT_LEN];
    static int32_t main_conv[PROMPT_LEN];
    size_t nb;
    rng = 0x9e3779b97f4a7c15ull + entries;
    make_main(main_conv, bounds, &nb);
    struct kvt_index *ix;
    if (kvt_index_new(&ix))
        return -1;
    double t0 = bench_now();
    int rc = workload == 0 ? build_conversations(ix, prompt, bounds, nb, entries, buf)
                           : build_cuts(ix, prompt, entries, buf);
    *build_s = bench_now() - t0;
    if (rc) {
        fprintf(stderr, "bench_store: index build failed: %d\n", rc);
        kvt_index_free(ix);
        return -1;
    }
    double t[FIND_RUNS];
    size_t plen = 0;
    for (int i = 0; i < 20; i++)
        kvt_index_find(ix, "", prompt, PROMPT_LEN, &plen);
    for (int i = 0; i < FIND_RUNS; i++) {
        double a = bench_now();
        struct kvt_rec *r = kvt_index_find(ix, "", prompt, PROMPT_LEN, &plen);
        t[i] = (bench_now() - a) * 1e6;
        if (!r)
            plen = 0;
    }
    *plen_out = plen;
    kvt_index_free(ix);
    return bench_median(t, FIND_RUNS);
}

static void part_find(void)
{
    static int32_t prompt[PROMPT_LEN];
    static size_t bounds[PROMPT_LEN];
    size_t nb;
    /* The adversarial index takes minutes to build past ~30k entries (every insert walks a
     * node per token of its prefix), so it stops there. */
    const size_t sizes[2][3] = {{1000, 10000, 100000}, {1000, 10000, 30000}};
    static const char *const names[2] = {"conversations", "cuts (adversarial)"};
    printf("find: %d-token prompt, median of %d finds\n", PROMPT_LEN, FIND_RUNS);
    for (int w = 0; w < 2; w++) {
        double med[3];
        for (int i = 0; i < 3; i++) {
            rng = 0x9e3779b97f4a7c15ull + sizes[w][i];
            make_main(prompt, bounds, &nb);
            prompt[PROMPT_LEN - 1] = 42; /* the new token after the stored conversation */
            size_t plen;
            double build;
            med[i] = bench_find(w, sizes[w][i], prompt, &plen, &build);
            printf("  %-20s %6zu entries: median %8.2f us  (prefix %zu, index built in %.2f s)\n",
                   names[w], sizes[w][i], med[i], plen, build);
        }
        printf("  %-20s flatness: %zuk/%zuk %.2f, %zuk/%zuk %.2f\n", names[w], sizes[w][1] / 1000,
               sizes[w][0] / 1000, med[1] / med[0], sizes[w][2] / 1000, sizes[w][1] / 1000,
               med[2] / med[1]);
    }
}

/* ---- open --------------------------------------------------------------------------- */

#define OPEN_ENTRIES 1000
#define OPEN_TOKENS 16384
#define OPEN_RUNS 3

static struct kvt_entry *ssm_entry(const int32_t *tok, size_t n)
{
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
    struct kvt_cache_info info = {.kind = KVT_KIND_SSM, .offset = (int64_t)n};
    if (kvt_cache_from_state(&info, t, 2, &c) == 0 && kvt_entry_new(tok, n, &c, 1, "", &e))
        kvt_cache_free(c);
    kvt_tensor_release(&t[0]);
    kvt_tensor_release(&t[1]);
    return e;
}

static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd >= 0) {
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

static void rm_tree(const char *root, const char *ns, char **paths, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unlink(paths[i]);
        free(paths[i]);
    }
    rmdir(ns);
    rmdir(root);
}

static void part_open(const char *base)
{
    char dir[4096], root[4200], ns[4300];
    snprintf(dir, sizeof(dir), "%s/bench-store-%d", base, (int)getpid());
    snprintf(root, sizeof(root), "%s/fp-bench", dir);
    snprintf(ns, sizeof(ns), "%s/base", root);
    if ((mkdir(dir, 0755) && errno != EEXIST) || (mkdir(root, 0755) && errno != EEXIST) ||
        (mkdir(ns, 0755) && errno != EEXIST)) {
        fprintf(stderr, "bench_store: cannot create %s: %s\n", ns, strerror(errno));
        return;
    }
    static int32_t tok[OPEN_TOKENS];
    char **paths = calloc(OPEN_ENTRIES, sizeof(*paths));
    uint64_t total = 0;
    double t0 = bench_now();
    for (size_t i = 0; i < OPEN_ENTRIES; i++) {
        for (size_t k = 0; k < OPEN_TOKENS; k++) /* a shared 4k prefix, then its own */
            tok[k] = (int32_t)(k < 4096 ? k * 7 % 150000 : rnd(150000));
        struct kvt_entry *e = ssm_entry(tok, OPEN_TOKENS);
        if (!e) {
            fprintf(stderr, "bench_store: cannot build an entry\n");
            rm_tree(dir, ns, paths, i);
            free(paths);
            return;
        }
        e->meta.model_id = strdup("bench/model");
        e->meta.config_fingerprint = strdup("fp-bench");
        e->meta.tokenizer_hash = strdup("tk-bench");
        char name[64];
        snprintf(name, sizeof(name), "%08zx-0000-4000-8000-%012zx.mlxkv", i, i);
        size_t len = strlen(ns) + strlen(name) + 2;
        paths[i] = malloc(len);
        snprintf(paths[i], len, "%s/%s", ns, name);
        struct kvt_save_opts so = {.no_sync = true};
        uint64_t bytes = 0;
        int rc = kvt_file_save(paths[i], e, &so, &bytes);
        kvt_entry_free(e);
        if (rc) {
            fprintf(stderr, "bench_store: save: %s\n", kvt_last_error());
            rm_tree(dir, ns, paths, i + 1);
            free(paths);
            return;
        }
        total += bytes;
    }
    double write_s = bench_now() - t0;
    printf("open: %d entries of %d tokens, %.1f MB on disk (written in %.2f s)\n", OPEN_ENTRIES,
           OPEN_TOKENS, (double)total / 1e6, write_s);

    /* The format layer's share: reading and validating every header on one thread. */
    double hr[OPEN_RUNS];
    for (int r = 0; r < OPEN_RUNS; r++) {
        double h0 = bench_now();
        for (size_t i = 0; i < OPEN_ENTRIES; i++) {
            struct kvt_header *h = NULL;
            if (kvt_file_read_header(paths[i], NULL, &h) == 0)
                kvt_header_free(h);
        }
        hr[r] = (bench_now() - h0) * 1e3;
    }
    double header_ms = bench_median(hr, OPEN_RUNS);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    printf("  kvt_file_read_header alone, one thread, all %d files: median %.1f ms (%.1f us per "
           "header)\n",
           OPEN_ENTRIES, header_ms, header_ms * 1e3 / OPEN_ENTRIES);

    struct kvt_store_opts o;
    kvt_store_opts_init(&o);
    o.model_id = "bench/model";
    o.config_fingerprint = "fp-bench";
    o.tokenizer_hash = "tk-bench";
    for (int cold = 0; cold < 2; cold++) {
        double t[OPEN_RUNS];
        uint64_t entries = 0;
        for (int r = 0; r < OPEN_RUNS; r++) {
            if (cold)
                for (size_t i = 0; i < OPEN_ENTRIES; i++)
                    drop_cache(paths[i]);
            kvt_store *s;
            double a = bench_now();
            int rc = kvt_store_open(dir, &o, &s);
            t[r] = (bench_now() - a) * 1e3;
            if (rc) {
                fprintf(stderr, "bench_store: open: %s\n", kvt_last_error());
                break;
            }
            struct kvt_store_stats st;
            kvt_store_get_stats(s, &st);
            entries = st.entries;
            kvt_store_close(s);
        }
        double med = bench_median(t, OPEN_RUNS);
        printf("  %s page cache: median open %.1f ms for %llu entries (%.1f us per entry; "
               "open / 1 s target %.2f)\n",
               cold ? "cold" : "warm", med, (unsigned long long)entries, med * 1e3 / OPEN_ENTRIES,
               med / 1000.0);
        if (!cold)
            printf("  warm: open / one-thread header reads %.2f (scan on up to %ld threads)\n",
                   med / header_ms, cpus < 8 ? cpus : 8);
    }
    rm_tree(dir, ns, paths, OPEN_ENTRIES);
    free(paths);
}

int main(int argc, char **argv)
{
    const char *base = argc > 1 ? argv[1] : "/tmp";
    setvbuf(stdout, NULL, _IOLBF, 0);
    part_open(base);
    part_find();
    return 0;
}
