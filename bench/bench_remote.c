/*
 * bench_remote: the remote tier against Redis on this machine, with the raw baseline in the
 * same run (REMOTE.md "Benchmark").
 *
 *  1. put and restore of one entry of each size through the remote tier (kvt_remote_put:
 *     tensors hashed, chunked SETs from the entry's memory, index record; kvt_remote_restore:
 *     chunked GETs fed to the validating loader, tensor hashes included, entry built), against a
 * raw pipelined SET / GET of the same number of bytes in the same chunk size through hiredis
 *     (redisAppendCommandArgv, replies copied out), to the same server. Medians, GB/s, ratios.
 *  2. the same entry restored from a local store directory (kvt_store_restore, page cache
 *     warm as a host's disk tier usually is), against its restore from the remote.
 *  3. find latency with 10,000 remote entries (index records of 512 tokens sharing a 256-token
 *     system prompt) merged by a fresh reader, its first sync time, and the cross-host delay:
 *     from a publish by one client to a find hit by another polling every poll_ms.
 *
 * Usage: bench_remote [--sizes 64M,256M,1G] [--reps N (4; even, so that each side reads fresh
 *                     values first equally often)] [--url redis://host:port/prefix]
 *                     [--dir DIR]   (the server's files and the local store; default /tmp)
 * Without --url it starts its own redis-server on a free port (killed at the end).
 * Prints figures and ratios; a benchmark, not a test: it asserts nothing.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvtier.h"
#include "remote/remote_parts.h"

#define MODEL "bench-model"
#define FP "bench-fp"
#define TOKH "bench-tok"
#define CHUNK ((size_t)1 << 20) /* the tier's default chunk_bytes */
#define LAYERS 8
#define HEADS 8
#define HDIM 128

static const char *g_dir = "/tmp";
static int g_port;
static pid_t g_server;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- a server of our own -------------------------------------------------------------- */

static redisContext *connect_srv(void)
{
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", g_port, tv);
    if (c && c->err) {
        redisFree(c);
        c = NULL;
    }
    return c;
}

static int start_server(void)
{
    g_port = 20000 + (int)(getpid() % 20000);
    char port[16], logf[600];
    snprintf(port, sizeof(port), "%d", g_port);
    snprintf(logf, sizeof(logf), "%s/bench-redis.log", g_dir);
    g_server = fork();
    if (g_server == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execlp("redis-server", "redis-server", "--bind", "127.0.0.1", "--port", port, "--save", "",
               "--appendonly", "no", "--dir", g_dir, "--logfile", logf, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200; i++) {
        redisContext *c = connect_srv();
        if (c) {
            redisFree(c);
            return 0;
        }
        usleep(20000);
    }
    return -1;
}

/* ---- entries ------------------------------------------------------------------------- */

static void fill(void *p, size_t n, uint64_t seed)
{
    uint64_t *q = p, s = seed | 1;
    for (size_t i = 0; i < n / 8; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        q[i] = s;
    }
}

/* An entry of about @p bytes: LAYERS kv layers of [1, HEADS, n, HDIM] float16. */
static struct kvt_entry *make_entry(size_t bytes, int32_t first)
{
    size_t per_tok = (size_t)LAYERS * 2 * HEADS * HDIM * 2;
    size_t n = bytes / per_tok;
    int32_t *tok = malloc(n * sizeof(*tok));
    for (size_t i = 0; i < n; i++)
        tok[i] = i == 0 ? first : (int32_t)(i % 30000);
    kvt_cache *c[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        const int64_t shape[4] = {1, HEADS, (int64_t)n, HDIM};
        struct kvt_tensor t[2];
        for (int w = 0; w < 2; w++) {
            kvt_tensor_zeros(&t[w], KVT_FLOAT16, 4, shape);
            fill(kvt_buf_data(t[w].buf), kvt_tensor_nbytes(&t[w]), (uint64_t)(l * 2 + w + 1));
        }
        struct kvt_cache_info info = {.kind = KVT_KIND_KV, .offset = (int64_t)n};
        kvt_cache_from_state(&info, t, 2, &c[l]);
        kvt_tensor_release(&t[0]);
        kvt_tensor_release(&t[1]);
    }
    struct kvt_entry *e = NULL;
    kvt_entry_new(tok, n, c, LAYERS, "", &e);
    free(tok);
    return e;
}

/* ---- the raw baseline: hiredis pipelined SET / GET, a window of 8 chunks ---------------- */

#define WINDOW 8

static double raw_xfer(redisContext *c, uint8_t *buf, size_t size, bool get)
{
    size_t n = (size + CHUNK - 1) / CHUNK, sent = 0, got = 0;
    double t0 = now_s();
    while (got < n) {
        for (; sent < n && sent - got < WINDOW; sent++) {
            size_t len = size - sent * CHUNK < CHUNK ? size - sent * CHUNK : CHUNK;
            char key[64];
            snprintf(key, sizeof(key), "raw:{bench}:%zu", sent);
            const char *argv[3] = {get ? "GET" : "SET", key, (const char *)buf + sent * CHUNK};
            size_t lens[3] = {3, strlen(key), len};
            redisAppendCommandArgv(c, get ? 2 : 3, argv, lens);
        }
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) {
            fprintf(stderr, "bench_remote: raw %s: %s\n", get ? "GET" : "SET", c->errstr);
            return -1;
        }
        if (get && r->type == REDIS_REPLY_STRING)
            memcpy(buf + got * CHUNK, r->str, r->len);
        freeReplyObject(r);
        got++;
    }
    return now_s() - t0;
}

/* ---- 1 and 2: transfers ----------------------------------------------------------------- */

static kvt_remote *open_remote(const char *url, const char *prefix_url)
{
    struct kvt_remote_opts o;
    kvt_remote_opts_init(&o);
    o.url = prefix_url ? prefix_url : url;
    o.model_id = MODEL;
    o.config_fingerprint = FP;
    o.tokenizer_hash = TOKH;
    o.timeout_ms = 30000;
    o.max_bytes = (uint64_t)64 << 30;
    o.chunk_bytes = CHUNK;
    kvt_remote *r = NULL;
    if (kvt_remote_open(&o, &r) < 0)
        fprintf(stderr, "bench_remote: %s: %s\n", o.url, kvt_last_error());
    return r;
}

static double timed_restore(kvt_remote *r, kvt_store *s, const struct kvt_entry *e)
{
    int32_t *tok = malloc((e->n_tokens + 1) * sizeof(*tok));
    memcpy(tok, e->tokens, e->n_tokens * sizeof(*tok));
    tok[e->n_tokens] = 1;
    struct kvt_hit hit;
    struct kvt_entry *out = NULL;
    double t0 = now_s();
    if (r) {
        kvt_remote_find(r, tok, e->n_tokens + 1, "", &hit);
        kvt_remote_restore(r, &hit, &out);
    } else {
        kvt_store_find(s, tok, e->n_tokens + 1, "", &hit);
        kvt_store_restore(s, &hit, &out);
    }
    double t = now_s() - t0;
    free(tok);
    if (!out)
        return -1;
    kvt_entry_free(out);
    return t;
}

struct row {
    double put, get, get2, raw_set, raw_get, raw_get2, local;
    uint64_t bytes;
};

/* One repetition, interleaved so that both sides meet the same server state: put, raw SET,
 * restore and raw GET right after their writes (the server's first read of fresh values;
 * which side reads first alternates), then both again (reply memory warm). */
static void one_rep(kvt_remote *r, kvt_store *s, redisContext *c, uint8_t *buf, size_t size,
                    int32_t first, double *t)
{
    struct kvt_entry *e = make_entry(size, first);
    struct kvt_remote_stats a, b;
    kvt_remote_get_stats(r, &a);
    double t0 = now_s();
    kvt_remote_put(r, e);
    t[0] = now_s() - t0;
    kvt_remote_get_stats(r, &b);
    uint64_t bytes = b.put_bytes - a.put_bytes;
    t[1] = raw_xfer(c, buf, bytes, false);
    bool raw_first = first & 1; /* alternate who reads first: the first read pays the most */
    if (raw_first)
        t[3] = raw_xfer(c, buf, bytes, true);
    t[2] = timed_restore(r, NULL, e);
    if (!raw_first)
        t[3] = raw_xfer(c, buf, bytes, true);
    t[4] = timed_restore(r, NULL, e);
    t[5] = raw_xfer(c, buf, bytes, true);
    kvt_remote_gc(r, 1, false, NULL); /* delete it, outside the timings */
    for (size_t i = 0; i * CHUNK < bytes; i++)
        freeReplyObject(redisCommand(c, "DEL raw:{bench}:%d", (int)i));
    kvt_store_put(s, e, NULL, NULL);
    t[6] = timed_restore(NULL, s, e);
    t[7] = (double)bytes;
    kvt_entry_free(e);
}

static void one_size(kvt_remote *r, kvt_store *s, redisContext *c, size_t size, int reps,
                     struct row *row)
{
    double v[8][16];
    uint8_t *buf = malloc(size + CHUNK); /* the file adds its header and alignment */
    fill(buf, size + CHUNK, 99);
    for (int k = 0; k < reps; k++) {
        double t[8];
        one_rep(r, s, c, buf, size, 50000 + k, t);
        for (int j = 0; j < 8; j++)
            v[j][k] = t[j];
    }
    row->put = median(v[0], reps), row->raw_set = median(v[1], reps);
    row->get = median(v[2], reps), row->raw_get = median(v[3], reps);
    row->get2 = median(v[4], reps), row->raw_get2 = median(v[5], reps);
    row->local = median(v[6], reps);
    row->bytes = (uint64_t)v[7][0];
    free(buf);
}

static void print_row(size_t size, const struct row *w)
{
    double gb = (double)w->bytes / 1e9;
    printf("%5zu MiB  put %5.3f GB/s  raw SET %5.3f  ratio %.2f | restore %5.3f GB/s  raw GET "
           "%5.3f  ratio %.2f | again: restore %5.3f  raw GET %5.3f  ratio %.2f\n",
           size >> 20, gb / w->put, gb / w->raw_set, w->raw_set / w->put, gb / w->get,
           gb / w->raw_get, w->raw_get / w->get, gb / w->get2, gb / w->raw_get2,
           w->raw_get2 / w->get2);
    printf("           cross-host restore %.1f ms (again %.1f ms) vs local disk restore %.1f ms "
           "(page cache warm)\n",
           w->get * 1e3, w->get2 * 1e3, w->local * 1e3);
}

/* ---- 3: find with 10,000 remote entries, cross-host delay ------------------------------- */

#define N_FIND 10000
#define FIND_TOK 512
#define SYS_TOK 256

static void find_tokens(int k, int32_t *tok)
{
    for (int i = 0; i < FIND_TOK; i++)
        tok[i] = i < SYS_TOK ? 7 + i : 100000 + (int32_t)((k * 7919 + i * 31) % 900000);
    tok[SYS_TOK] = 100000 + k; /* distinct from the first token after the system prompt */
}

static int publish(struct kvt_rclient *rc, const struct kvt_rkeys *k, int id)
{
    int32_t tok[FIND_TOK];
    find_tokens(id, tok);
    struct kvt_rrec rec = {.ns = "",
                           .bytes = 1 << 20,
                           .chunk = 4 << 20,
                           .n_chunks = 1,
                           .tokens = tok,
                           .n_tokens = FIND_TOK,
                           .trimmable = true};
    snprintf(rec.uuid, sizeof(rec.uuid), "%032x", id);
    kvt_rclient_arm(rc, 0);
    return kvt_rindex_publish(rc, k, &rec);
}

static void bench_find(const char *url)
{
    char purl[300];
    snprintf(purl, sizeof(purl), "%s-find", url);
    kvt_remote *w = open_remote(purl, NULL); /* the writer: its client publishes records */
    struct kvt_rcfg cfg = {.host = "127.0.0.1", .port = g_port, .timeout_ms = 5000};
    struct kvt_rclient rc;
    struct kvt_rkeys keys;
    kvt_rclient_init(&rc, &cfg);
    const char *pre = strrchr(purl, '/') + 1;
    kvt_rkeys_init(&keys, pre, MODEL, FP, TOKH);
    double t0 = now_s();
    for (int i = 0; i < N_FIND; i++)
        publish(&rc, &keys, i);
    double t_pub = now_s() - t0;
    t0 = now_s();
    kvt_remote *r = open_remote(purl, NULL); /* the reader: a fresh host, first sync at open */
    double t_open = now_s() - t0;
    double lat[1001];
    int32_t tok[FIND_TOK + 1];
    int hits = 0;
    for (int j = 0; j < 1001; j++) {
        find_tokens((j * 7) % N_FIND, tok);
        tok[FIND_TOK] = 3;
        struct kvt_hit hit;
        double a = now_s();
        kvt_remote_find(r, tok, FIND_TOK + 1, "", &hit);
        lat[j] = (now_s() - a) * 1e6;
        hits += hit.prefix_len == FIND_TOK;
    }
    double delay[5];
    for (int t = 0; t < 5; t++) {
        find_tokens(N_FIND + t, tok);
        tok[FIND_TOK] = 3;
        struct kvt_hit hit = {0};
        double a = now_s();
        publish(&rc, &keys, N_FIND + t);
        while (hit.prefix_len != FIND_TOK && now_s() - a < 10) {
            usleep(1000);
            kvt_remote_find(r, tok, FIND_TOK + 1, "", &hit);
        }
        delay[t] = (now_s() - a) * 1e3;
        usleep(137000); /* another phase of the poll period */
    }
    printf("find over %d remote entries: median %.1f us (%d/1001 hits); first sync at open "
           "%.0f ms; %d publishes in %.2f s\n",
           N_FIND, median(lat, 1001), hits, t_open * 1e3, N_FIND, t_pub);
    double dmax = 0;
    for (int t = 0; t < 5; t++)
        dmax = delay[t] > dmax ? delay[t] : dmax;
    printf("cross-host delay (publish -> find hit, poll_ms 500): median %.0f ms, max %.0f ms\n",
           median(delay, 5), dmax);
    kvt_remote_gc(r, 1, false, NULL);
    kvt_remote_close(r);
    kvt_remote_close(w);
    kvt_rkeys_free(&keys);
    kvt_rclient_free(&rc);
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    size_t m = *end == 'G' ? 1u << 30 : *end == 'K' ? 1u << 10 : 1u << 20;
    return (size_t)(v * (double)m);
}

int main(int argc, char **argv)
{
    const char *sizes = "64M,256M", *url = NULL;
    int reps = 4; /* even: each side reads fresh values first in half the repetitions */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--sizes"))
            sizes = argv[i + 1];
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]) > 0 && atoi(argv[i + 1]) <= 16 ? atoi(argv[i + 1]) : 4;
        else if (!strcmp(argv[i], "--url"))
            url = argv[i + 1];
        else if (!strcmp(argv[i], "--dir"))
            g_dir = argv[i + 1];
    }
    char own[128];
    if (!url) {
        if (start_server() < 0) {
            fprintf(stderr, "bench_remote: cannot start redis-server\n");
            return 2;
        }
        snprintf(own, sizeof(own), "redis://127.0.0.1:%d/bench", g_port);
        url = own;
    } else if (sscanf(url, "redis://%*[^:]:%d", &g_port) != 1) {
        fprintf(stderr, "bench_remote: --url must be redis://127.0.0.1:PORT/prefix\n");
        return 2;
    }
    char sdir[600];
    snprintf(sdir, sizeof(sdir), "%s/bench-remote-store", g_dir);
    struct kvt_store_opts so;
    kvt_store_opts_init(&so);
    so.model_id = MODEL, so.config_fingerprint = FP, so.tokenizer_hash = TOKH;
    so.max_bytes = (uint64_t)2 << 30; /* keeps the disk use of the local store bounded */
    kvt_store *s = NULL;
    kvt_remote *r = open_remote(url, NULL);
    redisContext *c = connect_srv();
    if (!r || !c || kvt_store_open(sdir, &so, &s) < 0)
        return 2;
    printf("remote tier vs raw hiredis pipelined SET/GET, chunks of %zu MiB, median of %d\n",
           CHUNK >> 20, reps);
    for (const char *p = sizes; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        struct row w = {0};
        size_t size = parse_size(p);
        one_size(r, s, c, size, reps, &w);
        print_row(size, &w);
        fflush(stdout);
    }
    bench_find(url);
    kvt_store_close(s);
    kvt_remote_close(r);
    redisFree(c);
    char *rm = malloc(strlen(sdir) + 16);
    sprintf(rm, "rm -rf '%s'", sdir);
    if (system(rm) != 0)
        fprintf(stderr, "bench_remote: could not remove %s\n", sdir);
    free(rm);
    if (g_server > 0) {
        kill(g_server, SIGKILL);
        waitpid(g_server, NULL, 0);
    }
    return 0;
}
