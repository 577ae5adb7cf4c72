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
 *  4. with --share (only this): 200 branches of a 4,096-token prompt plus 256 tokens of their
 *     own, 8 KiB of KV per token, put through a remote with share_prefixes on: the bytes the
 *     server received per branch after the first against its suffix, the server's memory
 *     growth against the unique tokens' bytes (both also for 10 branches put whole, scaled),
 *     and the restore of a branch (tail and prefix objects) against the restore of the same
 *     entry uploaded whole and against raw GETs of as many bytes, same run.
 *
 * Usage: bench_remote [--sizes 64M,256M,1G] [--reps N (4; even, so that each side reads fresh
 *                     values first equally often)] [--url redis://host:port/prefix]
 *                     [--dir DIR]   (the server's files and the local store; default /tmp)
 *                     [--share]
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

#include "bench.h"
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

static void stop_server(void)
{
    if (g_server > 0) {
        kill(g_server, SIGKILL);
        waitpid(g_server, NULL, 0);
    }
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
    double t0 = bench_now();
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
    return bench_now() - t0;
}

/* ---- 1 and 2: transfers ----------------------------------------------------------------- */

/* A remote on @p url; @p chunk 0: the default chunk size. */
static kvt_remote *open_remote(const char *url, uint64_t chunk, bool share)
{
    struct kvt_remote_opts o;
    kvt_remote_opts_init(&o);
    o.url = url;
    o.model_id = MODEL;
    o.config_fingerprint = FP;
    o.tokenizer_hash = TOKH;
    o.timeout_ms = 30000;
    o.max_bytes = (uint64_t)64 << 30;
    o.chunk_bytes = chunk ? chunk : o.chunk_bytes;
    o.share_prefixes = share;
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
    double t0 = bench_now();
    if (r) {
        kvt_remote_find(r, tok, e->n_tokens + 1, "", &hit);
        kvt_remote_restore(r, &hit, &out);
    } else {
        kvt_store_find(s, tok, e->n_tokens + 1, "", &hit);
        kvt_store_restore(s, &hit, &out);
    }
    double t = bench_now() - t0;
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
    double t0 = bench_now();
    kvt_remote_put(r, e);
    t[0] = bench_now() - t0;
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
    kvt_remote *w = open_remote(purl, CHUNK, false); /* the writer: its client publishes records */
    struct kvt_rcfg cfg = {.host = "127.0.0.1", .port = g_port, .timeout_ms = 5000};
    struct kvt_rclient rc;
    struct kvt_rkeys keys;
    kvt_rclient_init(&rc, &cfg);
    const char *pre = strrchr(purl, '/') + 1;
    kvt_rkeys_init(&keys, pre, MODEL, FP, TOKH);
    double t0 = bench_now();
    for (int i = 0; i < N_FIND; i++)
        publish(&rc, &keys, i);
    double t_pub = bench_now() - t0;
    t0 = bench_now();
    kvt_remote *r =
        open_remote(purl, CHUNK, false); /* the reader: a fresh host, first sync at open */
    double t_open = bench_now() - t0;
    double lat[1001];
    int32_t tok[FIND_TOK + 1];
    int hits = 0;
    for (int j = 0; j < 1001; j++) {
        find_tokens((j * 7) % N_FIND, tok);
        tok[FIND_TOK] = 3;
        struct kvt_hit hit;
        double a = bench_now();
        kvt_remote_find(r, tok, FIND_TOK + 1, "", &hit);
        lat[j] = (bench_now() - a) * 1e6;
        hits += hit.prefix_len == FIND_TOK;
    }
    double delay[5];
    for (int t = 0; t < 5; t++) {
        find_tokens(N_FIND + t, tok);
        tok[FIND_TOK] = 3;
        struct kvt_hit hit = {0};
        double a = bench_now();
        publish(&rc, &keys, N_FIND + t);
        while (hit.prefix_len != FIND_TOK && bench_now() - a < 10) {
            usleep(1000);
            kvt_remote_find(r, tok, FIND_TOK + 1, "", &hit);
        }
        delay[t] = (bench_now() - a) * 1e3;
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

/* ---- 4: shared prefixes (SHARING.md "The remote tier") --------------------------------- */

#define SH_BRANCHES 200
#define SH_WHOLE 10 /* branches put without sharing (scaled to 200) */
#define SH_PROMPT 4096
#define SH_OWN 256
#define SH_N (SH_PROMPT + SH_OWN)
#define SH_LAYERS 4
#define SH_HEADS 8
#define SH_DIM 64
#define SH_TOKEN ((uint64_t)SH_LAYERS * 2 * SH_HEADS * SH_DIM * 2) /* 8 KiB of KV */
#define SH_REPS 9

/* One branch at a time: its tensors are rewritten in place between puts. */
struct sh_branch {
    struct kvt_tensor t[SH_LAYERS][2];
    kvt_cache *c[SH_LAYERS];
    int32_t tok[SH_N + 1];
    struct kvt_entry e;
};

static void sh_new(struct sh_branch *br)
{
    const int64_t shape[4] = {1, SH_HEADS, SH_N, SH_DIM};
    for (int l = 0; l < SH_LAYERS; l++) {
        for (int w = 0; w < 2; w++) {
            kvt_tensor_zeros(&br->t[l][w], KVT_BFLOAT16, 4, shape);
            fill(kvt_buf_data(br->t[l][w].buf), kvt_tensor_nbytes(&br->t[l][w]),
                 (uint64_t)(l * 2 + w + 7));
        }
        struct kvt_cache_info info = {.kind = KVT_KIND_KV, .offset = SH_N};
        kvt_cache_from_state(&info, br->t[l], 2, &br->c[l]);
    }
    br->e = (struct kvt_entry){
        .tokens = br->tok, .n_tokens = SH_N, .caches = br->c, .n_caches = SH_LAYERS};
}

/* Make it branch @p b: the prompt's tokens, then its own, with new bytes in its own rows. */
static void sh_set(struct sh_branch *br, int b)
{
    for (int i = 0; i < SH_N + 1; i++)
        br->tok[i] = i < SH_PROMPT ? i * 3 + 1 : 1000000 * (b + 1) + i;
    size_t row = SH_DIM * 2;
    for (int l = 0; l < SH_LAYERS; l++)
        for (int w = 0; w < 2; w++)
            for (int h = 0; h < SH_HEADS; h++)
                fill((uint8_t *)kvt_buf_data(br->t[l][w].buf) +
                         ((size_t)h * SH_N + SH_PROMPT) * row,
                     SH_OWN * row, (uint64_t)(b * 64 + l * 8 + w * 4 + h + 1));
}

static void sh_free(struct sh_branch *br)
{
    for (int l = 0; l < SH_LAYERS; l++) {
        kvt_cache_free(br->c[l]);
        kvt_tensor_release(&br->t[l][0]);
        kvt_tensor_release(&br->t[l][1]);
    }
}

/* A number of the server's INFO (e.g. "total_net_input_bytes", "used_memory"). */
static uint64_t info_u64(redisContext *c, const char *field)
{
    redisReply *r = redisCommand(c, "INFO");
    uint64_t v = 0;
    size_t fl = strlen(field);
    for (const char *p = r && r->type == REDIS_REPLY_STRING ? r->str : ""; p && *p;
         p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, field, fl) && p[fl] == ':')
            v = strtoull(p + fl + 1, NULL, 10);
    freeReplyObject(r);
    return v;
}

struct sh_puts {
    uint64_t first, max, sum; /* wire bytes of the first put, the largest and sum of the rest */
    uint64_t mem;             /* the server's memory growth */
};

/* Put branches [0, @p count) through @p r, measuring the wire from the server's side. */
static void sh_put_all(kvt_remote *r, redisContext *c, struct sh_branch *br, int count,
                       struct sh_puts *m)
{
    *m = (struct sh_puts){0};
    uint64_t mem0 = info_u64(c, "used_memory");
    for (int b = 0; b < count; b++) {
        sh_set(br, b);
        uint64_t in0 = info_u64(c, "total_net_input_bytes");
        if (kvt_remote_put(r, &br->e) < 0)
            fprintf(stderr, "bench_remote: put: %s\n", kvt_last_error());
        uint64_t in = info_u64(c, "total_net_input_bytes") - in0;
        if (b == 0)
            m->first = in;
        else
            m->sum += in, m->max = in > m->max ? in : m->max;
    }
    m->mem = info_u64(c, "used_memory") - mem0;
}

/* Restore branch @p b (hashes checked) once; seconds, and the bytes it moved in *@p moved. */
static double sh_restore(kvt_remote *r, struct sh_branch *br, int b, uint64_t *moved)
{
    sh_set(br, b);
    struct kvt_remote_stats a, z;
    kvt_remote_get_stats(r, &a);
    double t = timed_restore(r, NULL, &br->e);
    kvt_remote_get_stats(r, &z);
    *moved = z.restore_bytes - a.restore_bytes;
    return t;
}

/* Restores of branch 5 shared and whole, and raw GETs of as many bytes, interleaved. */
static void sh_restores(kvt_remote *rs, kvt_remote *rw, redisContext *c, struct sh_branch *br)
{
    double ts[SH_REPS], tw[SH_REPS], rgs[SH_REPS], rgw[SH_REPS];
    uint64_t bs = 0, bw = 0;
    uint8_t *buf = malloc((size_t)SH_N * SH_TOKEN * 2);
    for (int k = 0; k < SH_REPS; k++) {
        ts[k] = sh_restore(rs, br, 5, &bs);
        tw[k] = sh_restore(rw, br, 5, &bw);
        raw_xfer(c, buf, bs, false);
        rgs[k] = raw_xfer(c, buf, bs, true);
        raw_xfer(c, buf, bw, false);
        rgw[k] = raw_xfer(c, buf, bw, true);
    }
    double s = median(ts, SH_REPS), w = median(tw, SH_REPS);
    double gs = median(rgs, SH_REPS), gw = median(rgw, SH_REPS);
    printf("restore of a branch, hashes checked (median of %d): shared %.1f ms (%.1f MiB, "
           "raw GET of as many bytes %.1f ms, ratio %.2f) | whole entry %.1f ms (%.1f MiB, raw "
           "GET %.1f ms, ratio %.2f) | shared vs whole: speed ratio %.2f\n",
           SH_REPS, s * 1e3, (double)bs / (1 << 20), gs * 1e3, gs / s, w * 1e3,
           (double)bw / (1 << 20), gw * 1e3, gw / w, w / s);
    free(buf);
}

static void bench_share(const char *url)
{
    char us[300], uw[300];
    snprintf(us, sizeof(us), "%s-shared", url);
    snprintf(uw, sizeof(uw), "%s-whole", url);
    kvt_remote *rs = open_remote(us, 0, true), *rw = open_remote(uw, 0, false);
    redisContext *c = connect_srv();
    struct sh_branch *br = calloc(1, sizeof(*br));
    if (!rs || !rw || !c || !br)
        return;
    sh_new(br);
    struct sh_puts ms, mw;
    sh_put_all(rs, c, br, SH_BRANCHES, &ms);
    sh_put_all(rw, c, br, SH_WHOLE, &mw);
    double suffix = (double)SH_OWN * SH_TOKEN;
    double unique = ((double)SH_PROMPT + (double)SH_BRANCHES * SH_OWN) * SH_TOKEN;
    struct kvt_remote_stats st;
    kvt_remote_get_stats(rs, &st);
    printf("%d branches of a %d-token prompt + %d own tokens, %llu KiB of KV per token:\n",
           SH_BRANCHES, SH_PROMPT, SH_OWN, (unsigned long long)(SH_TOKEN >> 10));
    printf("  bytes received by the server per branch after the first / its suffix: mean %.3f, "
           "max %.3f (whole entries: %.2f); the first branch %.1f MiB\n",
           (double)ms.sum / (SH_BRANCHES - 1) / suffix, (double)ms.max / suffix,
           (double)mw.sum / (SH_WHOLE - 1) / suffix, (double)ms.first / (1 << 20));
    printf("  server memory growth / unique tokens' bytes: %.3f (whole entries, %d scaled to "
           "%d: %.2f); index byte total / unique: %.3f (%llu shared objects)\n",
           (double)ms.mem / unique, SH_WHOLE, SH_BRANCHES,
           (double)mw.mem * SH_BRANCHES / SH_WHOLE / unique, (double)st.bytes / unique,
           (unsigned long long)st.shared_objects);
    sh_restores(rs, rw, c, br);
    kvt_remote_gc(rs, 1, false, NULL);
    kvt_remote_gc(rw, 1, false, NULL);
    sh_free(br);
    free(br);
    redisFree(c);
    kvt_remote_close(rs);
    kvt_remote_close(rw);
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
    bool share = false;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--share"))
            share = true;
        else if (v && !strcmp(argv[i], "--sizes"))
            sizes = argv[++i];
        else if (v && !strcmp(argv[i], "--reps"))
            reps = atoi(v) > 0 && atoi(v) <= 16 ? atoi(argv[++i]) : (++i, 4);
        else if (v && !strcmp(argv[i], "--url"))
            url = argv[++i];
        else if (v && !strcmp(argv[i], "--dir"))
            g_dir = argv[++i];
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
    if (share) {
        bench_share(url);
        stop_server();
        return 0;
    }
    char sdir[600];
    snprintf(sdir, sizeof(sdir), "%s/bench-remote-store", g_dir);
    struct kvt_store_opts so;
    kvt_store_opts_init(&so);
    so.model_id = MODEL, so.config_fingerprint = FP, so.tokenizer_hash = TOKH;
    so.max_bytes = (uint64_t)2 << 30; /* keeps the disk use of the local store bounded */
    kvt_store *s = NULL;
    kvt_remote *r = open_remote(url, CHUNK, false);
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
    stop_server();
    return 0;
}
