/*
 * The report of `kvtier bench`: medians and same-run ratios of each size, the text table, the
 * JSON object and the gnuplot chart. Ratios are medians of per-repetition ratios: the kvtier
 * figure and its limit of one repetition ran back to back, which cancels the slow drift of a
 * shared machine better than a ratio of two medians would.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

/* @p s as a JSON string literal (quotes included), escaped as the CLI's JSON is. */
static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        case '\b': fputs("\\b", f); break;
        case '\f': fputs("\\f", f); break;
        default:
            if (*p < 0x20)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

#define MIB (1024.0 * 1024.0)
/* The targets hold for entries at least this large (PERFORMANCE.md). */
#define TARGET_MIN_BYTES ((uint64_t)256 << 20)

static const char *const fig_key[BF_COUNT] = {
    [BF_SAVE] = "save",
    [BF_RAW_WRITE] = "raw_write_buffered",
    [BF_RAW_WRITE_DIRECT] = "raw_write_direct",
    [BF_COLD] = "restore_cold",
    [BF_COLD_NOVERIFY] = "restore_cold_noverify",
    [BF_RAW_READ] = "raw_read",
    [BF_RAW_READ_HOT] = "raw_read_prefaulted",
    [BF_WARM] = "restore_warm",
    [BF_WARM_NOVERIFY] = "restore_warm_noverify",
    [BF_MEMCPY] = "memcpy",
    [BF_MEMCPY_HOT] = "memcpy_prefaulted",
    [BF_COLD_CHILD] = "restore_cold_fresh_process",
};

static double median_of(const double *v, int n)
{
    double tmp[BENCH_MAX_REPEAT];
    int k = 0;
    for (int i = 0; i < n; i++)
        if (v[i] > 0)
            tmp[k++] = v[i];
    return bench_median(tmp, (size_t)k);
}

/*
 * The faster of two limits over the run: the one with the lower median time (a figure of 0
 * was not measured). Not the faster of the two in each repetition: the lower of two noisy
 * times is low by the noise alone, which would hold kvtier's single time to a limit no
 * single run of either kind reaches.
 */
static int faster_fig(const struct bench_row *r, int a, int b)
{
    double x = median_of(r->secs[a], r->n), y = median_of(r->secs[b], r->n);
    return x <= 0 || (y > 0 && y < x) ? b : a;
}

/* Limits below 0 name a pair whose faster one is the limit: the raw writes, the raw reads, or
 * the memcpys. */
#define LIMIT_BEST_WRITE (-1)
#define LIMIT_BEST_READ (-2)
#define LIMIT_BEST_COPY (-3)

/* The per-repetition num[i] / den[i] of the first @p n repetitions, where both were
 * measured, into @p v; returns how many. */
static int ratios(const double *num, const double *den, int n, double *v)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if (num[i] > 0 && den[i] > 0)
            v[k++] = num[i] / den[i];
    return k;
}

/*
 * The distribution-free 95 % interval of the median of the @p k sorted values @p v: v[j] and
 * v[k-1-j] for the largest j with 1 - 2 P(Binomial(k, 1/2) <= j) >= 0.95, the chance that
 * the true median lies between them. Fewer than 6 values allow no such j: their whole range.
 */
static void median_interval(const double *v, int k, double ci[2])
{
    int j = 0;
    double below = ldexp(1.0, -k), term = below; /* P(X <= j), P(X = j) */
    for (int t = 1; t < k / 2; t++) {
        term = term * (k - t + 1) / t;
        if (1 - 2 * (below + term) < 0.95)
            break;
        below += term;
        j = t;
    }
    ci[0] = k > 0 ? v[j] : 0;
    ci[1] = k > 0 ? v[k - 1 - j] : 0;
}

/* Median over the first @p n repetitions of num[i] / den[i], and its 95 % interval in @p ci. */
static double median_ratio(const double *num, const double *den, int n, double ci[2])
{
    double v[BENCH_MAX_REPEAT];
    int k = ratios(num, den, n, v);
    double m = bench_median(v, (size_t)k); /* sorts v */
    median_interval(v, k, ci);
    return m;
}

/* Median over repetitions of limit_secs / kvtier_secs (a throughput ratio), and its 95 %
 * interval in @p ci. */
static double paired_ratio(const struct bench_row *r, int kvt, int limit, double ci[2])
{
    int fig = limit == LIMIT_BEST_WRITE  ? faster_fig(r, BF_RAW_WRITE, BF_RAW_WRITE_DIRECT)
              : limit == LIMIT_BEST_READ ? faster_fig(r, BF_RAW_READ, BF_RAW_READ_HOT)
              : limit == LIMIT_BEST_COPY ? faster_fig(r, BF_MEMCPY, BF_MEMCPY_HOT)
                                         : limit;
    return median_ratio(r->secs[fig], r->secs[kvt], r->n, ci);
}

/* Median over repetitions of 1 - throughput(with hash check) / throughput(without), and its
 * 95 % interval in @p ci. */
static double paired_cost(const struct bench_row *r, int with, int without, double ci[2])
{
    double m = paired_ratio(r, with, without, ci), lo = ci[0];
    ci[0] = 1 - ci[1];
    ci[1] = 1 - lo;
    return m > 0 ? 1.0 - m : 0;
}

/* Whether the peer ran in every repetition (its ratios pair repetition by repetition). */
static bool bench_peer_complete(const struct bench_row *r)
{
    return !r->peer.failed && r->n > 0 && r->peer.n == r->n;
}

void bench_summarize(const struct bench_row *r, struct bench_summary *s)
{
    memset(s, 0, sizeof(*s));
    for (int f = 0; f < BF_COUNT; f++) {
        double m = median_of(r->secs[f], r->n);
        s->gbps[f] = m > 0 ? (double)r->file_bytes / m / 1e9 : 0;
    }
    double unused[2];
    s->save_ratio = paired_ratio(r, BF_SAVE, LIMIT_BEST_WRITE, s->save_ci);
    s->cold_ratio = paired_ratio(r, BF_COLD, LIMIT_BEST_READ, s->cold_ci);
    s->cold_ratio_hot = paired_ratio(r, BF_COLD, BF_RAW_READ_HOT, unused);
    s->warm_ratio = paired_ratio(r, BF_WARM, LIMIT_BEST_COPY, s->warm_ci);
    s->warm_ratio_hot = paired_ratio(r, BF_WARM, BF_MEMCPY_HOT, unused);
    s->verify_cost = paired_cost(r, BF_COLD, BF_COLD_NOVERIFY, s->verify_ci);
    s->verify_cost_warm = paired_cost(r, BF_WARM, BF_WARM_NOVERIFY, unused);
    double tmp[BENCH_MAX_REPEAT];
    memcpy(tmp, r->rss_save, sizeof(tmp));
    s->rss_save = bench_median(tmp, (size_t)r->n);
    memcpy(tmp, r->rss_restore, sizeof(tmp));
    s->rss_restore = bench_median(tmp, (size_t)r->n);
    const struct bench_peer *p = &r->peer;
    if (bench_peer_complete(r)) {
        double ps = median_of(p->save_s, p->n), pc = median_of(p->cold_s, p->n),
               pw = median_of(p->warm_s, p->n);
        s->has_peer = true;
        s->peer_save_gbps = ps > 0 ? (double)r->file_bytes / ps / 1e9 : 0;
        s->peer_cold_gbps = pc > 0 ? (double)r->file_bytes / pc / 1e9 : 0;
        s->peer_warm_gbps = pw > 0 ? (double)r->file_bytes / pw / 1e9 : 0;
        /* kvtier's throughput over the peer's: peer seconds over kvtier's */
        s->peer_save_ratio = median_ratio(p->save_s, r->secs[BF_SAVE], r->n, s->peer_save_ci);
        s->peer_cold_ratio = median_ratio(p->cold_s, r->secs[BF_COLD], r->n, s->peer_cold_ci);
        s->peer_warm_ratio = median_ratio(p->warm_s, r->secs[BF_WARM], r->n, s->peer_warm_ci);
    }
}

static void size_label(char *buf, size_t n, uint64_t bytes)
{
    if (bytes >= ((uint64_t)1 << 30) && bytes % ((uint64_t)1 << 30) == 0)
        snprintf(buf, n, "%llu GiB", (unsigned long long)(bytes >> 30));
    else if (bytes >= ((uint64_t)1 << 20))
        snprintf(buf, n, "%.0f MiB", (double)bytes / MIB);
    else
        snprintf(buf, n, "%.0f KiB", (double)bytes / 1024.0);
}

/* One line of a table section: row @p r, labelled @p label, summarized in @p s. */
typedef void (*row_line_fn)(FILE *f, const char *label, const struct bench_row *r,
                            const struct bench_summary *s);

static void print_rows(FILE *f, const struct bench_row *rows, size_t n, row_line_fn line)
{
    for (size_t i = 0; i < n; i++) {
        struct bench_summary s;
        char label[32];
        bench_summarize(&rows[i], &s);
        size_label(label, sizeof(label), rows[i].target_bytes);
        line(f, label, &rows[i], &s);
    }
}

static void main_line(FILE *f, const char *label, const struct bench_row *r,
                      const struct bench_summary *s)
{
    fprintf(f,
            "%-8s %6zu | %6.2f %6.2f %6.2f | %6.2f %6.2f %6.2f | %6.2f %6.2f %6.2f |"
            " %4.1f%% %5.1f%% | %7.0f %7.0f\n",
            label, r->tokens, s->gbps[BF_SAVE],
            fmax(s->gbps[BF_RAW_WRITE], s->gbps[BF_RAW_WRITE_DIRECT]), s->save_ratio,
            s->gbps[BF_COLD], fmax(s->gbps[BF_RAW_READ], s->gbps[BF_RAW_READ_HOT]), s->cold_ratio,
            s->gbps[BF_WARM], fmax(s->gbps[BF_MEMCPY], s->gbps[BF_MEMCPY_HOT]), s->warm_ratio,
            100 * s->verify_cost, 100 * s->verify_cost_warm, s->rss_restore / MIB,
            (double)r->restored_bytes / MIB);
}

static void interval_line(FILE *f, const char *label, const struct bench_row *r,
                          const struct bench_summary *s)
{
    (void)r;
    fprintf(f,
            "%-8s save %.2f-%.2f   cold %.2f-%.2f   warm %.2f-%.2f   hash check cold "
            "%.1f%% to %.1f%%\n",
            label, s->save_ci[0], s->save_ci[1], s->cold_ci[0], s->cold_ci[1], s->warm_ci[0],
            s->warm_ci[1], 100 * s->verify_ci[0], 100 * s->verify_ci[1]);
}

static void limits_line(FILE *f, const char *label, const struct bench_row *r,
                        const struct bench_summary *s)
{
    fprintf(f,
            "%-8s write %5.2f / %5.2f   read %5.2f / %5.2f%s   memcpy %5.2f / %5.2f   "
            "ratios vs prefaulted: cold %.2f, warm %.2f   cold restore in a new process "
            "%.2f\n",
            label, s->gbps[BF_RAW_WRITE], s->gbps[BF_RAW_WRITE_DIRECT], s->gbps[BF_RAW_READ],
            s->gbps[BF_RAW_READ_HOT], r->direct_read ? "" : " (buffered)", s->gbps[BF_MEMCPY],
            s->gbps[BF_MEMCPY_HOT], s->cold_ratio_hot, s->warm_ratio_hot, s->gbps[BF_COLD_CHILD]);
}

static void peer_line(FILE *f, const char *label, const struct bench_row *r,
                      const struct bench_summary *s)
{
    (void)r;
    if (s->has_peer)
        fprintf(f,
                "%-8s save %5.2f (x%.2f)   cold load %5.2f (x%.2f)   warm load %5.2f "
                "(x%.2f)\n",
                label, s->peer_save_gbps, s->peer_save_ratio, s->peer_cold_gbps, s->peer_cold_ratio,
                s->peer_warm_gbps, s->peer_warm_ratio);
}

void bench_print_table(FILE *f, const struct bench_run_info *ri, const struct bench_row *rows,
                       size_t n)
{
    const struct bench_model *m = ri->model;
    fprintf(f, "kvtier bench: %s, raw I/O engine %s, %d repetitions, medians\n", ri->dir,
            bench_raw_engine(), ri->repeat);
    fprintf(f, "entry: %d layers x %d KV heads x %d head dim, %s, %zu KiB per token\n\n", m->layers,
            m->kv_heads, m->head_dim, kvt_dtype_name(m->dtype), bench_token_bytes(m) / 1024);
    fprintf(f, "%-8s %6s | %-20s | %-20s | %-20s | %-12s | %s\n", "", "", "save (GB/s)",
            "cold restore (GB/s)", "warm restore (GB/s)", "hash check", "peak RSS (MiB)");
    fprintf(f, "%-8s %6s | %6s %6s %6s | %6s %6s %6s | %6s %6s %6s | %5s %6s | %7s %7s\n", "size",
            "tokens", "kvtier", "raw", "ratio", "kvtier", "raw", "ratio", "kvtier", "memcpy",
            "ratio", "cold", "warm", "restore", "entry");
    print_rows(f, rows, n, main_line);
    fprintf(f, "\n95 %% intervals of the medians above (of the per-repetition ratios, assuming"
               " nothing about the noise)\n");
    print_rows(f, rows, n, interval_line);
    fprintf(f, "\nlimits in detail (GB/s): raw write buffered / O_DIRECT, raw read into fresh"
               " buffers / prefaulted memory, memcpy into fresh buffers / prefaulted memory\n");
    print_rows(f, rows, n, limits_line);
    bool peers = false;
    for (size_t i = 0; i < n; i++)
        peers |= bench_peer_complete(&rows[i]);
    if (peers) {
        fprintf(f, "\nnumpy peer (np.save + fsync, np.load): GB/s, and kvtier / numpy\n");
        print_rows(f, rows, n, peer_line);
    }
    fprintf(f,
            "\nratio = kvtier / same-run limit (save: the faster raw write; cold: the faster raw"
            " read; warm: the faster memcpy; faster by median),\nmedian of per-repetition ratios"
            " to it; hash check = 1 - throughput with / without; wall %.0f s\n",
            ri->wall_s);
}

static void json_value(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fprintf(f, "null");
}

static void json_num(FILE *f, const char *key, double v, bool comma)
{
    fprintf(f, "\"%s\": ", key);
    json_value(f, v);
    fprintf(f, "%s", comma ? ", " : "");
}

static void json_interval(FILE *f, const char *key, const double ci[2])
{
    fprintf(f, "\"%s\": [", key);
    json_value(f, ci[0]);
    fprintf(f, ", ");
    json_value(f, ci[1]);
    fprintf(f, "], ");
}

/* "key": [v0, v1, ...] at full precision (seconds of every repetition). */
static void json_list(FILE *f, const char *key, const double *v, int n, bool comma)
{
    fprintf(f, "\"%s\": [", key);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%.9g", i ? ", " : "", v[i]);
    fprintf(f, "]%s", comma ? ", " : "");
}

static void json_summary(FILE *f, const struct bench_row *r, const struct bench_summary *s)
{
    fprintf(f,
            "\"entry_bytes\": %llu, \"file_bytes\": %llu, \"restored_bytes\": %llu, "
            "\"tokens\": %zu, ",
            (unsigned long long)r->entry_bytes, (unsigned long long)r->file_bytes,
            (unsigned long long)r->restored_bytes, r->tokens);
    json_num(f, "save_ratio", s->save_ratio, true);
    json_num(f, "restore_cold_ratio", s->cold_ratio, true);
    json_num(f, "restore_warm_ratio", s->warm_ratio, true);
    json_num(f, "verify_cost", s->verify_cost, true);
    json_num(f, "verify_cost_warm", s->verify_cost_warm, true);
    json_interval(f, "save_ratio_ci95", s->save_ci);
    json_interval(f, "restore_cold_ratio_ci95", s->cold_ci);
    json_interval(f, "restore_warm_ratio_ci95", s->warm_ci);
    json_interval(f, "verify_cost_ci95", s->verify_ci);
    json_num(f, "restore_cold_ratio_prefaulted", s->cold_ratio_hot, true);
    json_num(f, "restore_warm_ratio_prefaulted", s->warm_ratio_hot, true);
    fprintf(f, "\"peak_rss_extra_bytes\": %.0f, \"save_peak_rss_extra_bytes\": %.0f, ",
            s->rss_restore, s->rss_save);
    json_num(f, "raw_write_gbps", fmax(s->gbps[BF_RAW_WRITE], s->gbps[BF_RAW_WRITE_DIRECT]), true);
    json_num(f, "raw_read_best_gbps", fmax(s->gbps[BF_RAW_READ], s->gbps[BF_RAW_READ_HOT]), true);
    json_num(f, "memcpy_best_gbps", fmax(s->gbps[BF_MEMCPY], s->gbps[BF_MEMCPY_HOT]), true);
    for (int k = 0; k < BF_COUNT; k++) {
        char key[64];
        snprintf(key, sizeof(key), "%s_gbps", fig_key[k]);
        json_num(f, key, s->gbps[k], true);
    }
    fprintf(f, "\"raw_read_direct\": %s", r->direct_read ? "true" : "false");
    if (s->has_peer) {
        fprintf(f, ", \"peer\": {\"name\": \"numpy\", \"version\": ");
        json_string(f, r->peer.version);
        fprintf(f, ", ");
        json_num(f, "save_gbps", s->peer_save_gbps, true);
        json_num(f, "load_cold_gbps", s->peer_cold_gbps, true);
        json_num(f, "load_warm_gbps", s->peer_warm_gbps, true);
        json_num(f, "save_ratio", s->peer_save_ratio, true);
        json_num(f, "load_cold_ratio", s->peer_cold_ratio, true);
        json_num(f, "load_warm_ratio", s->peer_warm_ratio, true);
        json_interval(f, "save_ratio_ci95", s->peer_save_ci);
        json_interval(f, "load_cold_ratio_ci95", s->peer_cold_ci);
        json_interval(f, "load_warm_ratio_ci95", s->peer_warm_ci);
        fprintf(f, "\"secs\": {");
        json_list(f, "save", r->peer.save_s, r->peer.n, true);
        json_list(f, "load_cold", r->peer.cold_s, r->peer.n, true);
        json_list(f, "load_warm", r->peer.warm_s, r->peer.n, false);
        fprintf(f, "}}");
    }
}

static void json_secs(FILE *f, const struct bench_row *r)
{
    fprintf(f, "\"secs\": {");
    for (int k = 0; k < BF_COUNT; k++)
        json_list(f, fig_key[k], r->secs[k], r->n, k + 1 < BF_COUNT);
    fprintf(f, "}");
}

void bench_print_json(FILE *f, const struct bench_run_info *ri, const struct bench_row *rows,
                      size_t n)
{
    const struct bench_model *m = ri->model;
    size_t top = 0;
    for (size_t i = 1; i < n; i++)
        if (rows[i].target_bytes > rows[top].target_bytes)
            top = i;
    fprintf(f,
            "{\"tool\": \"kvtier bench\", \"version\": \"%d.%d.%d\", \"dir\": ", KVT_VERSION_MAJOR,
            KVT_VERSION_MINOR, KVT_VERSION_PATCH);
    json_string(f, ri->dir);
    fprintf(f, ", \"raw_engine\": \"%s\", \"repeat\": %d, \"cpus\": %ld, \"wall_s\": %.1f, ",
            bench_raw_engine(), ri->repeat, sysconf(_SC_NPROCESSORS_ONLN), ri->wall_s);
    fprintf(f,
            "\"model\": {\"layers\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"dtype\": "
            "\"%s\", \"token_bytes\": %zu}, ",
            m->layers, m->kv_heads, m->head_dim, kvt_dtype_name(m->dtype), bench_token_bytes(m));
    if (n > 0) {
        struct bench_summary s;
        bench_summarize(&rows[top], &s);
        fprintf(f, "\"size_bytes\": %llu, ", (unsigned long long)rows[top].target_bytes);
        json_summary(f, &rows[top], &s);
        fprintf(f, ", ");
    }
    /* The targets over every size of at least TARGET_MIN_BYTES: the worst row counts. */
    double worst[5] = {INFINITY, INFINITY, INFINITY, -INFINITY, -INFINITY};
    int counted = 0;
    for (size_t i = 0; i < n; i++) {
        struct bench_summary s;
        if (rows[i].target_bytes < TARGET_MIN_BYTES)
            continue;
        bench_summarize(&rows[i], &s);
        worst[0] = fmin(worst[0], s.save_ratio);
        worst[1] = fmin(worst[1], s.cold_ratio);
        worst[2] = fmin(worst[2], s.warm_ratio);
        worst[3] = fmax(worst[3], s.verify_cost);
        worst[4] = fmax(worst[4], s.rss_restore - (double)rows[i].restored_bytes);
        counted++;
    }
    fprintf(f, "\"targets\": {\"min_entry_bytes\": %llu, \"sizes\": %d",
            (unsigned long long)TARGET_MIN_BYTES, counted);
    if (counted) {
        fprintf(f, ", ");
        json_num(f, "save_ratio_min", worst[0], true);
        json_num(f, "restore_cold_ratio_min", worst[1], true);
        json_num(f, "restore_warm_ratio_min", worst[2], true);
        json_num(f, "verify_cost_max", worst[3], true);
        json_num(f, "rss_over_entry_max_bytes", worst[4], true);
        fprintf(f,
                "\"met\": {\"save\": %s, \"restore_cold\": %s, \"restore_warm\": %s, "
                "\"verify\": %s, \"rss\": %s}",
                worst[0] >= 0.9 ? "true" : "false", worst[1] >= 0.9 ? "true" : "false",
                worst[2] >= 0.8 ? "true" : "false", worst[3] <= 0.10 ? "true" : "false",
                worst[4] <= 64 * MIB ? "true" : "false");
    }
    fprintf(f, "}, \"sizes\": [");
    for (size_t i = 0; i < n; i++) {
        struct bench_summary s;
        bench_summarize(&rows[i], &s);
        fprintf(f, "%s{\"size_bytes\": %llu, ", i ? ", " : "",
                (unsigned long long)rows[i].target_bytes);
        json_summary(f, &rows[i], &s);
        fprintf(f, ", ");
        json_secs(f, &rows[i]);
        fprintf(f, "}");
    }
    fprintf(f, "]}\n");
}

int bench_plot(const char *path, const struct bench_row *rows, size_t n)
{
    const char *ext = strrchr(path, '.');
    const char *term;
    if (ext && !strcasecmp(ext, ".svg"))
        term = "svg size 900,560 dynamic noenhanced background '#ffffff'";
    else if (ext && !strcasecmp(ext, ".png"))
        term = "png size 900,560 noenhanced"; /* titles are plain text: O_DIRECT */
    else
        return -EINVAL;
    char data[] = "/tmp/kvtier-plot-XXXXXX";
    int fd = mkstemp(data);
    if (fd < 0)
        return -errno;
    FILE *df = fdopen(fd, "w");
    if (!df) {
        close(fd);
        unlink(data);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        struct bench_summary s;
        bench_summarize(&rows[i], &s);
        fprintf(df, "%.3f %.4f %.4f %.4f %.4f %.4f %.4f\n", (double)rows[i].target_bytes / MIB,
                s.gbps[BF_SAVE], fmax(s.gbps[BF_RAW_WRITE], s.gbps[BF_RAW_WRITE_DIRECT]),
                s.gbps[BF_COLD], fmax(s.gbps[BF_RAW_READ], s.gbps[BF_RAW_READ_HOT]),
                s.gbps[BF_WARM], fmax(s.gbps[BF_MEMCPY], s.gbps[BF_MEMCPY_HOT]));
    }
    fclose(df);
    int p[2];
    if (pipe(p) != 0) {
        unlink(data);
        return -errno;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[0], STDIN_FILENO);
        close(p[0]);
        close(p[1]);
        execlp("gnuplot", "gnuplot", (char *)NULL);
        _exit(127);
    }
    close(p[0]);
    FILE *g = pid > 0 ? fdopen(p[1], "w") : NULL;
    if (!g) {
        close(p[1]);
        unlink(data);
        return pid < 0 ? -errno : -ENOMEM;
    }
    fprintf(g, "set terminal %s\nset output '%s'\n", term, path);
    fprintf(g, "set title 'kvtier bench: throughput vs entry size (medians, same run)'\n"
               "set xlabel 'entry size (MiB)'\nset ylabel 'GB/s'\nset logscale x 2\n"
               "set logscale y 2\nset grid\nset key below\n");
    if (n == 1)
        fprintf(g, "set xrange [%.3f:%.3f]\n", (double)rows[0].target_bytes / MIB / 2,
                (double)rows[0].target_bytes / MIB * 2);
    fprintf(g,
            "plot '%s' u 1:2 w lp lw 2 lc rgb '#1f77b4' pt 7 t 'save (kvtier)', "
            "'' u 1:3 w lp dt 2 lc rgb '#1f77b4' pt 6 t 'raw write + fsync', "
            "'' u 1:4 w lp lw 2 lc rgb '#d62728' pt 7 t 'cold restore (kvtier)', "
            "'' u 1:5 w lp dt 2 lc rgb '#d62728' pt 6 t 'raw O_DIRECT read (best)', "
            "'' u 1:6 w lp lw 2 lc rgb '#2ca02c' pt 7 t 'warm restore (kvtier)', "
            "'' u 1:7 w lp dt 2 lc rgb '#2ca02c' pt 6 t 'memcpy (best)'\n",
            data);
    fclose(g);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    unlink(data);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return WIFEXITED(status) && WEXITSTATUS(status) == 127 ? -ENOENT : -EIO;
    return 0;
}
