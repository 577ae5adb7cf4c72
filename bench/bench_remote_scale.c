/*
 * bench_remote_scale: many hosts sharing one Redis (or a cluster) at the byte cap, uploads
 * evicting continuously (REMOTE.md "Scaling to tens of hosts").
 *
 * --hosts processes each open a kvt_remote on --url (poll_ms 100, max_bytes = --entries
 * entries), fill the index to the cap together, then each uploads one new entry of --tokens
 * tokens every 500 ms for --seconds, every upload evicting the oldest entry through the
 * index script. Each host reports the bytes it read from its sockets meanwhile (/proc/self/io
 * rchar: index syncs, its own uploads' replies and the records its evictions returned), the
 * evictions it made, and its find latency before and during the churn (median of 1001 finds).
 * Printed: bytes read per host per eviction (all hosts' evictions), the index record size,
 * the entries each view holds at the end, and find latency. With --ratio PATH (a single
 * server only), PATH (bench_remote) runs beside the churn against the same server with
 * --sizes 64M: put and restore against the raw pipelined SET / GET in that same run.
 *
 * Usage: bench_remote_scale --url redis://127.0.0.1:PORT[,seeds]/prefix [--hosts 20]
 *                           [--entries 1000] [--tokens 2000] [--seconds 10] [--ratio PATH]
 * A benchmark, not a test: it asserts nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "kvtier.h"

#define MODEL "bench-model"
#define FP "bench-fp"
#define TOKH "bench-tok"
#define DIM 8 /* small tensors: the index, not the bytes, is what this measures */

struct report {
    long long read_bytes, puts, evictions, entries;
    double find_before_us, find_during_us;
};

static long long rchar(void)
{
    long long v = -1;
    FILE *f = fopen("/proc/self/io", "r");
    if (f && fscanf(f, "rchar: %lld", &v) != 1)
        v = -1;
    if (f)
        fclose(f);
    return v;
}

/* Tokens of entry @p id: its own first token, then a pattern of its own. */
static void tokens_of(int id, int n, int32_t *tok)
{
    for (int i = 0; i < n; i++)
        tok[i] = i == 0 ? 100000 + id : (int32_t)((id * 7919u + (unsigned)i * 104729u) % 30000u);
}

static struct kvt_entry *make_entry(int id, int n)
{
    int32_t *tok = malloc((size_t)n * sizeof(*tok));
    tokens_of(id, n, tok);
    kvt_cache *c[2];
    for (int l = 0; l < 2; l++) {
        const int64_t shape[4] = {1, 1, n, DIM};
        struct kvt_tensor t[2];
        for (int w = 0; w < 2; w++)
            kvt_tensor_zeros(&t[w], KVT_FLOAT16, 4, shape);
        struct kvt_cache_info info = {.kind = KVT_KIND_KV, .offset = n};
        kvt_cache_from_state(&info, t, 2, &c[l]);
        kvt_tensor_release(&t[0]);
        kvt_tensor_release(&t[1]);
    }
    struct kvt_entry *e = NULL;
    kvt_entry_new(tok, (size_t)n, c, 2, "", &e);
    free(tok);
    return e;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median µs of 1001 finds of entries @p lo .. lo + @p n - 1 (the live ones: hits). */
static double find_us(kvt_remote *r, int lo, int n, int n_tok)
{
    static double t[1001];
    int32_t *tok = malloc((size_t)(n_tok + 1) * sizeof(*tok));
    for (int i = 0; i < 1001; i++) {
        tokens_of(lo + i % n, n_tok, tok);
        tok[n_tok] = 1;
        struct kvt_hit hit;
        double t0 = bench_now();
        kvt_remote_find(r, tok, (size_t)n_tok + 1, "", &hit);
        t[i] = (bench_now() - t0) * 1e6;
    }
    free(tok);
    qsort(t, 1001, sizeof(*t), cmp_d);
    return t[500];
}

struct cfg {
    const char *url;
    int hosts, entries, tokens, seconds;
    uint64_t entry_bytes;
};

static kvt_remote *open_host(const struct cfg *c)
{
    struct kvt_remote_opts o;
    kvt_remote_opts_init(&o);
    o.url = c->url;
    o.model_id = MODEL, o.config_fingerprint = FP, o.tokenizer_hash = TOKH;
    o.poll_ms = 100;
    o.timeout_ms = 10000;
    o.max_bytes = c->entry_bytes * (uint64_t)c->entries + c->entry_bytes / 2;
    kvt_remote *r = NULL;
    if (kvt_remote_open(&o, &r) < 0)
        fprintf(stderr, "bench_remote_scale: %s\n", kvt_last_error());
    return r;
}

/* One host: its share of the fill, a byte to @p up, the go byte from @p down, the churn. */
static int host(const struct cfg *c, int id, int up, int down)
{
    kvt_remote *r = open_host(c);
    if (!r)
        return 2;
    for (int e = id; e < c->entries; e += c->hosts) {
        struct kvt_entry *x = make_entry(e, c->tokens);
        kvt_remote_put(r, x);
        kvt_entry_free(x);
    }
    char b = 'f';
    if (write(up, &b, 1) != 1 || read(down, &b, 1) != 1)
        return 2;
    usleep(300000); /* every view has the full index */
    struct report rep = {0};
    struct kvt_remote_stats st0, st1;
    kvt_remote_get_stats(r, &st0);
    rep.find_before_us = find_us(r, 0, c->entries, c->tokens);
    long long r0 = rchar();
    double end = bench_now() + c->seconds, next = bench_now();
    for (int k = 0; bench_now() < end; k++) {
        struct kvt_entry *x = make_entry(c->entries + id + k * c->hosts, c->tokens);
        kvt_remote_put(r, x);
        kvt_entry_free(x);
        rep.puts++;
        if (k == 2) /* about 2 * hosts of the oldest are gone by now, and as many more came */
            rep.find_during_us = find_us(r, 3 * c->hosts, c->entries - 3 * c->hosts, c->tokens);
        next += 0.5;
        if (next > bench_now())
            usleep((useconds_t)((next - bench_now()) * 1e6));
    }
    usleep(500000); /* the last syncs */
    rep.read_bytes = rchar() - r0;
    kvt_remote_get_stats(r, &st1);
    rep.evictions = (long long)(st1.evictions - st0.evictions);
    rep.entries = (long long)st1.entries;
    kvt_remote_close(r);
    return write(up, &rep, sizeof(rep)) == sizeof(rep) ? 0 : 2;
}

static void print_reports(const struct cfg *c, const struct report *v, uint64_t rec_bytes)
{
    long long ev = 0, puts = 0, bytes = 0, ent_min = 1LL << 60, ent_max = 0;
    double *fb = calloc((size_t)c->hosts, sizeof(double)), *fd = calloc((size_t)c->hosts, 8);
    for (int i = 0; i < c->hosts; i++) {
        ev += v[i].evictions, puts += v[i].puts, bytes += v[i].read_bytes;
        ent_min = v[i].entries < ent_min ? v[i].entries : ent_min;
        ent_max = v[i].entries > ent_max ? v[i].entries : ent_max;
        fb[i] = v[i].find_before_us, fd[i] = v[i].find_during_us;
    }
    qsort(fb, (size_t)c->hosts, sizeof(*fb), cmp_d);
    qsort(fd, (size_t)c->hosts, sizeof(*fd), cmp_d);
    printf("%d hosts, %d entries of %d tokens at the cap, %d s of churn\n", c->hosts, c->entries,
           c->tokens, c->seconds);
    printf("uploads %lld, evictions %lld (all hosts)\n", puts, ev);
    printf("bytes read per host: %.0f; per host per upload: %.0f; per host per eviction: %.0f "
           "(an index record: %llu)\n",
           (double)bytes / c->hosts, puts ? (double)bytes / c->hosts / (double)puts : 0.0,
           ev ? (double)bytes / c->hosts / (double)ev : 0.0, (unsigned long long)rec_bytes);
    printf("entries per view at the end: %lld-%lld\n", ent_min, ent_max);
    printf("find median (host medians' median): %.2f us before, %.2f us during the churn\n",
           fb[c->hosts / 2], fd[c->hosts / 2]);
    free(fb);
    free(fd);
}

static pid_t ratio_child(const char *path, const char *url)
{
    char rurl[600];
    snprintf(rurl, sizeof(rurl), "%s-ratio", url);
    pid_t p = fork();
    if (p == 0) {
        execl(path, path, "--url", rurl, "--sizes", "64M", "--reps", "2", (char *)NULL);
        _exit(127);
    }
    return p;
}

static int run(const struct cfg *c, const char *ratio)
{
    int up[2], down[2];
    if (pipe(up) || pipe(down))
        return 2;
    pid_t *kids = calloc((size_t)c->hosts, sizeof(*kids));
    for (int i = 0; i < c->hosts; i++)
        if ((kids[i] = fork()) == 0)
            _exit(host(c, i, up[1], down[0]));
    char b;
    for (int i = 0; i < c->hosts; i++)
        if (read(up[0], &b, 1) != 1)
            return 2;
    for (int i = 0; i < c->hosts; i++)
        if (write(down[1], &b, 1) != 1)
            return 2;
    pid_t rp = ratio ? ratio_child(ratio, c->url) : 0;
    struct report *v = calloc((size_t)c->hosts, sizeof(*v));
    for (int i = 0; i < c->hosts; i++)
        if (read(up[0], &v[i], sizeof(v[i])) != sizeof(v[i]))
            return 2;
    for (int i = 0; i < c->hosts; i++)
        waitpid(kids[i], NULL, 0);
    if (rp > 0)
        waitpid(rp, NULL, 0);
    print_reports(c, v, 76 + 1 + 4 * (uint64_t)c->tokens);
    free(v);
    free(kids);
    return 0;
}

int main(int argc, char **argv)
{
    struct cfg c = {NULL, 20, 1000, 2000, 10, 0};
    const char *ratio = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--url"))
            c.url = argv[i + 1];
        else if (!strcmp(argv[i], "--hosts") && v > 0 && v <= 200)
            c.hosts = v;
        else if (!strcmp(argv[i], "--entries") && v > 0)
            c.entries = v;
        else if (!strcmp(argv[i], "--tokens") && v > 0 && v <= 100000)
            c.tokens = v;
        else if (!strcmp(argv[i], "--seconds") && v > 0)
            c.seconds = v;
        else if (!strcmp(argv[i], "--ratio"))
            ratio = argv[i + 1];
    }
    if (!c.url) {
        fprintf(stderr, "usage: bench_remote_scale --url redis://127.0.0.1:PORT/prefix "
                        "[--hosts N] [--entries N] [--tokens N] [--seconds N] [--ratio PATH]\n");
        return 2;
    }
    c.entry_bytes = 1 << 30; /* a probe upload, removed again, gives an entry's file size */
    kvt_remote *r = open_host(&c);
    struct kvt_entry *e = make_entry(-1, c.tokens);
    struct kvt_remote_stats st;
    if (!r || kvt_remote_put(r, e) < 0)
        return 2;
    kvt_remote_get_stats(r, &st);
    c.entry_bytes = st.put_bytes;
    kvt_remote_gc(r, 1, false, NULL);
    kvt_remote_close(r); /* no library thread is left when the hosts fork */
    kvt_entry_free(e);
    return run(&c, ratio);
}
