/*
 * bench_tier_decode: does write-behind steal decode time?
 *
 * A simulated engine decodes on the calling thread: every PERIOD (5 ms) it takes its
 * exclusion (a mutex) and does about 1 ms of memory work (one "decode step"). The tier's
 * run_exclusive callback takes the same mutex for every blocking step it runs (snapshot
 * clones, the N + 1 write steps of every entry), so a write step and a decode step never
 * overlap. Run 1 keeps write-behind on while the writer thread flushes ENTRIES entries of
 * 64 MiB (1 GiB) to a store directory; run 2 is the same loop, for the same number of steps,
 * with write-behind off. The pair repeats (--repeat, default 5: the machine may be shared and
 * noisy); the program prints the p50/p99 step latency (lock wait + work) of both runs of every
 * pair, their ratios, and the medians over the pairs. --control keeps write-behind off in both
 * runs of a pair (CONTROL_STEPS steps each): the spread of its ratios is the machine's noise.
 *
 * Grant policy (TIER.md §6: "engines should grant a step between decode steps at a bounded
 * rate"): by default run_exclusive waits for the end of the next decode step, then runs the
 * write step in the idle gap that follows; --naive grants on the plain mutex, whenever the
 * writer asks.
 *
 * CPU placement: by default every thread runs wherever the scheduler puts it. --pin CPU
 * models a server that pins its decode thread: the loop runs on CPU and the tier gets the
 * other CPUs through background_cpus (the writer and timer threads, and the kernel's I/O
 * workers they start). Pick a CPU that does not take the disk's interrupts
 * (/proc/interrupts), as a latency-sensitive deployment would. --tier-cpus LIST only gives
 * the tier its CPUs (background_cpus) and leaves the decode loop to the scheduler.
 *
 * usage: bench_tier_decode [--dir DIR] [--entries N] [--repeat N] [--naive] [--control]
 *                          [--pin CPU | --tier-cpus LIST]
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "kvtier.h"

#define PERIOD_NS 5000000LL
#define STEP_TARGET_NS 1000000LL
#define LAYERS 8
#define HEADS 8
#define HEAD_DIM 128
#define TOKENS 2048       /* 8 layers x K,V x [1, 8, 2048, 128] f16 = 16 tensors of 4 MiB */
#define CONTROL_STEPS 280 /* about as many steps as a flush of 1 GiB takes here */

struct engine {
    pthread_mutex_t excl;
    pthread_mutex_t mu;
    pthread_cond_t stepped;
    uint64_t decode_seq; /* decode steps finished */
    bool decoding;
    bool naive;
    uint64_t granted;
    int64_t *step_ns; /* duration of every granted step */
    size_t n_steps, cap_steps;
};

static struct engine E = {
    .excl = PTHREAD_MUTEX_INITIALIZER,
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .stepped = PTHREAD_COND_INITIALIZER,
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int run_exclusive(void *engine, kvt_step_fn step, void *arg)
{
    struct engine *en = engine;
    if (!en->naive) {
        /* Wait for the end of the next decode step (bounded, so a stopped loop never
         * stalls the writer), then take the gap before the following one. */
        pthread_mutex_lock(&en->mu);
        uint64_t seq = en->decode_seq;
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += 20 * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        while (en->decoding && en->decode_seq == seq)
            if (pthread_cond_timedwait(&en->stepped, &en->mu, &dl) == ETIMEDOUT)
                break;
        pthread_mutex_unlock(&en->mu);
    }
    pthread_mutex_lock(&en->excl);
    int64_t t0 = now_ns();
    int rc = step(arg);
    int64_t dt = now_ns() - t0;
    en->granted++;
    if (en->n_steps < en->cap_steps)
        en->step_ns[en->n_steps++] = dt;
    pthread_mutex_unlock(&en->excl);
    return rc;
}

/* The decode step's memory work: copies between two buffers larger than the caches. */
static uint8_t *work_a, *work_b;
static size_t work_bytes;
static int work_reps = 1;

static void decode_work(void)
{
    for (int r = 0; r < work_reps; r++) {
        memcpy(work_b, work_a, work_bytes);
        work_a[r % work_bytes] ^= work_b[(r * 7919) % work_bytes];
    }
}

static void calibrate(void)
{
    work_bytes = 4u << 20;
    work_a = malloc(work_bytes);
    work_b = malloc(work_bytes);
    memset(work_a, 1, work_bytes);
    memset(work_b, 2, work_bytes);
    for (int i = 0; i < 3; i++)
        decode_work();
    int64_t best = INT64_MAX;
    for (int i = 0; i < 10; i++) {
        int64_t t0 = now_ns();
        decode_work();
        int64_t dt = now_ns() - t0;
        if (dt < best)
            best = dt;
    }
    work_reps = (int)(STEP_TARGET_NS / (best > 0 ? best : 1));
    if (work_reps < 1)
        work_reps = 1;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

struct lat {
    double p50, p99, max, mean;
};

static struct lat summarize(int64_t *v, size_t n)
{
    if (n == 0)
        return (struct lat){0};
    qsort(v, n, sizeof(*v), cmp_i64);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)v[i];
    struct lat l = {
        .p50 = (double)v[n / 2] / 1e3,
        .p99 = (double)v[(n * 99) / 100] / 1e3,
        .max = (double)v[n - 1] / 1e3,
        .mean = sum / (double)n / 1e3,
    };
    return l;
}

/* One decode step on the schedule; returns its latency (wait for the exclusion + work). */
static int64_t decode_step(int64_t *next)
{
    struct timespec ts = {*next / 1000000000LL, *next % 1000000000LL};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    int64_t t0 = now_ns();
    pthread_mutex_lock(&E.excl);
    decode_work();
    pthread_mutex_unlock(&E.excl);
    int64_t dt = now_ns() - t0;
    pthread_mutex_lock(&E.mu);
    E.decode_seq++;
    pthread_cond_broadcast(&E.stepped);
    pthread_mutex_unlock(&E.mu);
    *next += PERIOD_NS;
    return dt;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static void fill(uint8_t *p, size_t n)
{
    uint64_t x = rng_state;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        uint64_t v = x * 0x2545f4914f6cdd1dull;
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++)
        p[i] = (uint8_t)(x >> (i % 8));
    rng_state = x;
}

static struct kvt_entry *make_entry(int32_t first)
{
    kvt_cache *caches[LAYERS];
    int32_t *tok = malloc(TOKENS * sizeof(*tok));
    for (int i = 0; i < TOKENS; i++)
        tok[i] = first + i;
    for (int l = 0; l < LAYERS; l++) {
        struct kvt_cache_info p = {.kind = KVT_KIND_KV};
        if (kvt_cache_new(&p, &caches[l]))
            goto fail;
        struct kvt_tensor t[2];
        int64_t shape[4] = {1, HEADS, TOKENS, HEAD_DIM};
        for (int k = 0; k < 2; k++) {
            if (kvt_tensor_zeros(&t[k], KVT_FLOAT16, 4, shape))
                goto fail;
            fill((uint8_t *)kvt_buf_data(t[k].buf) + t[k].offset, kvt_tensor_nbytes(&t[k]));
        }
        int rc = kvt_cache_append(caches[l], t, 2);
        kvt_tensor_release(&t[0]);
        kvt_tensor_release(&t[1]);
        if (rc)
            goto fail;
    }
    struct kvt_entry *e;
    if (kvt_entry_new(tok, TOKENS, caches, LAYERS, NULL, &e))
        goto fail;
    free(tok);
    return e;
fail:
    fprintf(stderr, "bench_tier_decode: cannot build an entry: %s\n", kvt_last_error());
    exit(2);
}

static char background_cpus[4096]; /* --pin: every allowed CPU but the decode one */
static const char *tier_cpus;      /* --tier-cpus, or background_cpus after --pin */

/* Pin this (the decode) thread to @p cpu and list the other allowed CPUs for the tier. */
static void pin_decode(int cpu)
{
    cpu_set_t all, one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_getaffinity(0, sizeof(all), &all) || !CPU_ISSET(cpu, &all) ||
        sched_setaffinity(0, sizeof(one), &one)) {
        fprintf(stderr, "bench_tier_decode: cannot run on CPU %d\n", cpu);
        exit(2);
    }
    size_t len = 0;
    for (int c = 0; c < CPU_SETSIZE && len + 16 < sizeof(background_cpus); c++)
        if (c != cpu && CPU_ISSET(c, &all))
            len += (size_t)snprintf(background_cpus + len, sizeof(background_cpus) - len, "%s%d",
                                    len ? "," : "", c);
    if (len == 0) {
        fprintf(stderr, "bench_tier_decode: --pin needs a second CPU for the tier\n");
        exit(2);
    }
    tier_cpus = background_cpus;
}

static kvt_pcache *open_tier(const char *dir, bool write_behind)
{
    struct kvt_pcache_opts o;
    kvt_pcache_opts_init(&o);
    o.cold_dir = dir;
    o.cold.model_id = "bench-model";
    o.cold.config_fingerprint = "bench0000000000-bf16";
    o.cold.tokenizer_hash = "bench";
    o.cold.max_bytes = 64ull << 30;
    o.ram_max_bytes = 64ull << 30;
    o.write_behind = write_behind;
    o.snapshot_debounce_ms = 20;
    o.demote_idle_ms = 0;
    o.run_exclusive = run_exclusive;
    o.engine = &E;
    o.background_cpus = tier_cpus;
    kvt_pcache *pc;
    if (kvt_pcache_open(&o, &pc)) {
        fprintf(stderr, "bench_tier_decode: open %s: %s\n", dir, kvt_last_error());
        exit(2);
    }
    return pc;
}

/* Put clones of the prepared entries (they share the bytes, as engine snapshots do). */
static void fill_tier(kvt_pcache *pc, struct kvt_entry **src, int entries)
{
    for (int i = 0; i < entries; i++) {
        struct kvt_entry *e;
        if (kvt_entry_clone(src[i], &e) || kvt_pcache_put(pc, e, NULL)) {
            fprintf(stderr, "bench_tier_decode: put: %s\n", kvt_last_error());
            exit(2);
        }
    }
}

static bool flushed(kvt_pcache *pc, int entries)
{
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    return st.cold.entries >= (uint64_t)entries && st.pending_snapshots == 0 &&
           st.pending_spills == 0;
}

/* One pair of runs: decode while the writer flushes every entry, then the same number of
 * steps with write-behind off. Returns the flush time; *on and *off get the latencies. */
static double run_pair(bool control, const char *dir, struct kvt_entry **src, int entries,
                       struct lat *on_lat, struct lat *off_lat, struct lat *gated, size_t *n_steps,
                       struct kvt_pcache_stats *st)
{
    size_t cap = 1 << 20, n_on = 0;
    int64_t *on = malloc(cap * sizeof(*on));
    pthread_mutex_lock(&E.excl);
    E.n_steps = 0;
    E.granted = 0;
    pthread_mutex_unlock(&E.excl);
    kvt_pcache *pc = open_tier(dir, !control);
    pthread_mutex_lock(&E.mu);
    E.decoding = true;
    pthread_mutex_unlock(&E.mu);
    fill_tier(pc, src, entries);
    int64_t t0 = now_ns(), next = t0;
    while ((control ? n_on < CONTROL_STEPS : !flushed(pc, entries)) && n_on < cap)
        on[n_on++] = decode_step(&next);
    double flush_s = (double)(now_ns() - t0) / 1e9;
    pthread_mutex_lock(&E.mu);
    E.decoding = false;
    pthread_mutex_unlock(&E.mu);
    pthread_mutex_lock(&E.excl);
    *gated = summarize(E.step_ns, E.n_steps);
    pthread_mutex_unlock(&E.excl);
    kvt_pcache_get_stats(pc, st);
    kvt_pcache_close(pc);

    char dir2[4200];
    snprintf(dir2, sizeof(dir2), "%s-off", dir);
    int64_t *off = malloc(n_on * sizeof(*off));
    pc = open_tier(dir2, false);
    fill_tier(pc, src, entries);
    next = now_ns();
    for (size_t i = 0; i < n_on; i++)
        off[i] = decode_step(&next);
    kvt_pcache_close(pc);

    *on_lat = summarize(on, n_on);
    *off_lat = summarize(off, n_on);
    *n_steps = n_on;
    char cmd[9000];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", dir, dir2);
    if (system(cmd) != 0)
        fprintf(stderr, "bench_tier_decode: could not remove %s\n", dir);
    free(on);
    free(off);
    return flush_s;
}

int main(int argc, char **argv)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    const char *dir_arg = NULL;
    int entries = 16, repeat = 5;
    bool control = false;
    int pin = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            dir_arg = argv[++i];
        else if (!strcmp(argv[i], "--entries") && i + 1 < argc)
            entries = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--naive"))
            E.naive = true;
        else if (!strcmp(argv[i], "--control"))
            control = true;
        else if (!strcmp(argv[i], "--pin") && i + 1 < argc && !tier_cpus)
            pin = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tier-cpus") && i + 1 < argc && pin < 0)
            tier_cpus = argv[++i];
        else {
            fprintf(stderr, "usage: bench_tier_decode [--dir DIR] [--entries N] [--repeat N] "
                            "[--naive] [--control] [--pin CPU | --tier-cpus LIST]\n");
            return 2;
        }
    }
    if (entries < 1 || repeat < 1 || repeat > 100) {
        fprintf(stderr, "bench_tier_decode: --entries and --repeat take 1 or more (repeat <= "
                        "100)\n");
        return 2;
    }

    if (pin >= 0)
        pin_decode(pin);
    calibrate();
    double entry_mib = (double)LAYERS * 2 * HEADS * TOKENS * HEAD_DIM * 2 / (1 << 20);
    printf("decode step: %d x %zu-byte memcpy (~1 ms) every %lld ms; %d entries x %.0f MiB "
           "(%d tensors of %.0f MiB each); grant: %s; %d repetitions%s",
           work_reps, work_bytes, PERIOD_NS / 1000000, entries, entry_mib, 2 * LAYERS,
           entry_mib / (2 * LAYERS), E.naive ? "plain mutex" : "between decode steps", repeat,
           control ? "; control: write-behind off in both runs" : "");
    if (pin >= 0)
        printf("; decode on CPU %d, tier threads on %s", pin, tier_cpus);
    else if (tier_cpus)
        printf("; tier threads on %s, decode anywhere", tier_cpus);
    printf("\n");

    struct kvt_entry **src = calloc((size_t)entries, sizeof(*src));
    for (int i = 0; i < entries; i++)
        src[i] = make_entry(1000000 * (i + 1));
    E.cap_steps = 1 << 20;
    E.step_ns = malloc(E.cap_steps * sizeof(*E.step_ns));

    double m[8]
            [100]; /* per repetition: on p50, p99, off p50, p99, ratios p50, p99, gated p99, max */
    printf("%4s %9s %8s %8s %8s %8s %8s %8s %8s %8s %8s\n", "rep", "flush_s", "steps", "on_p50",
           "on_p99", "off_p50", "off_p99", "r_p50", "r_p99", "gate_p99", "gate_max");
    for (int r = 0; r < repeat; r++) {
        char dir[4096];
        snprintf(dir, sizeof(dir), "%s/kvt-bench-decode-%d-%d", dir_arg ? dir_arg : base,
                 (int)getpid(), r);
        struct lat a, b, g;
        struct kvt_pcache_stats st;
        size_t n;
        double flush_s = run_pair(control, dir, src, entries, &a, &b, &g, &n, &st);
        if (!control && (st.cold.spills < (uint64_t)entries || st.failed_spills)) {
            fprintf(stderr, "bench_tier_decode: %llu of %d entries stored, %llu failed\n",
                    (unsigned long long)st.cold.spills, entries,
                    (unsigned long long)st.failed_spills);
            return 1;
        }
        double v[8] = {a.p50, a.p99, b.p50, b.p99, a.p50 / b.p50, a.p99 / b.p99, g.p99, g.max};
        for (int k = 0; k < 8; k++)
            m[k][r] = v[k];
        printf("%4d %9.2f %8zu %8.0f %8.0f %8.0f %8.0f %8.3f %8.3f %8.0f %8.0f\n", r + 1, flush_s,
               n, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
        fflush(stdout);
    }
    double med[8];
    for (int k = 0; k < 8; k++)
        med[k] = bench_median(m[k], (size_t)repeat);
    printf("medians (us): write-behind on p50 %.0f p99 %.0f; off p50 %.0f p99 %.0f; gated steps "
           "p99 %.0f, max %.0f\n",
           med[0], med[1], med[2], med[3], med[6], med[7]);
    printf("ratio on/off (median of the per-repetition ratios): p50 %.3f  p99 %.3f  (target p99 "
           "<= 1.05)\n",
           med[4], med[5]);

    for (int i = 0; i < entries; i++)
        kvt_entry_free(src[i]);
    free(src);
    free(E.step_ns);
    return 0;
}
