/*
 * The tier over a real store directory: entries written behind by the writer thread through
 * the engine gate survive close and reopen, and take restores the longest prefix from disk
 * with byte-identical tensors (trimmed where the prompt diverges); evicted entries spill to
 * disk; take_into places a disk hit in the caller's memory and falls back to RAM after one
 * refused read; a refusing gate leaves no .tmp file and no open descriptor; background_cpus
 * places the writer and timer threads; configuration errors; a failed open leaves the process's
 * memory settings alone.
 */
#include "support/support.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HEADS 2
#define HEAD_DIM 64
#define LAYERS 2

/* The engine: one exclusion that every gated step takes; optionally refuses from call k. */
struct engine {
    pthread_mutex_t excl;
    pthread_mutex_t mu;
    int calls, refuse_from;
};

static struct engine E;

static int engine_run(void *engine, kvt_step_fn step, void *arg)
{
    struct engine *en = engine;
    pthread_mutex_lock(&en->mu);
    int call = ++en->calls;
    bool refuse = en->refuse_from && call >= en->refuse_from;
    pthread_mutex_unlock(&en->mu);
    if (refuse)
        return KVT_E_REFUSED;
    pthread_mutex_lock(&en->excl);
    int rc = step(arg);
    pthread_mutex_unlock(&en->excl);
    return rc;
}

static void engine_refuse_from(int k)
{
    pthread_mutex_lock(&E.mu);
    E.refuse_from = k ? E.calls + k : 0;
    pthread_mutex_unlock(&E.mu);
}

static char logbuf[8192];
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

static void log_fn(void *ud, int level, const char *msg)
{
    (void)ud;
    (void)level;
    pthread_mutex_lock(&log_mu);
    size_t len = strlen(logbuf);
    snprintf(logbuf + len, sizeof(logbuf) - len, "%s\n", msg);
    pthread_mutex_unlock(&log_mu);
}

static bool log_has(const char *s)
{
    pthread_mutex_lock(&log_mu);
    bool r = strstr(logbuf, s) != NULL;
    pthread_mutex_unlock(&log_mu);
    return r;
}

static char *dir;

static int setup(void **state)
{
    (void)state;
    pthread_mutex_init(&E.excl, NULL);
    pthread_mutex_init(&E.mu, NULL);
    E.calls = E.refuse_from = 0;
    logbuf[0] = 0;
    dir = scratch_dir("tier");
    assert_non_null(dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rm_rf(dir);
    free(dir);
    pthread_mutex_destroy(&E.excl);
    pthread_mutex_destroy(&E.mu);
    return 0;
}

static void base_opts(struct kvt_pcache_opts *o)
{
    kvt_pcache_opts_init(o);
    o->cold_dir = dir;
    o->cold.model_id = "test-model";
    o->cold.config_fingerprint = "0123456789abcdef-bf16";
    o->cold.tokenizer_hash = "feedface";
    o->snapshot_debounce_ms = 10;
    o->run_exclusive = engine_run;
    o->engine = &E;
    o->log = log_fn;
}

static kvt_pcache *open_pc(const struct kvt_pcache_opts *o)
{
    kvt_pcache *pc = NULL;
    int rc = kvt_pcache_open(o, &pc);
    if (rc)
        fail_msg("kvt_pcache_open: %s", kvt_last_error());
    return pc;
}

static struct kvt_entry *make_entry(const int32_t *tok, size_t n, const char *ns, uint64_t seed)
{
    uint64_t rng = seed;
    kvt_cache *caches[LAYERS];
    for (int i = 0; i < LAYERS; i++)
        caches[i] = synth_random_kv(KVT_FLOAT16, HEADS, (int64_t)n, HEAD_DIM, &rng);
    struct kvt_entry *e;
    assert_int_equal(kvt_entry_new(tok, n, caches, LAYERS, ns, &e), 0);
    return e;
}

/* Rows [0, rows) of every tensor of every cache, concatenated in row-major order. */
static uint8_t *entry_bytes(const struct kvt_entry *e, int64_t rows, size_t *len)
{
    size_t cap = 0, used = 0;
    uint8_t *out = NULL;
    for (size_t i = 0; i < e->n_caches; i++) {
        struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
        int nt = kvt_cache_state(e->caches[i], st);
        assert_true(nt > 0);
        for (int k = 0; k < nt; k++) {
            struct kvt_tensor s;
            assert_int_equal(kvt_tensor_slice(&s, &st[k], 2, 0, rows), 0);
            size_t nb = kvt_tensor_nbytes(&s);
            if (used + nb > cap) {
                cap = (used + nb) * 2;
                out = realloc(out, cap);
            }
            kvt_tensor_copy_out(&s, out + used);
            used += nb;
            kvt_tensor_release(&s);
            kvt_tensor_release(&st[k]);
        }
    }
    *len = used;
    return out;
}

static void seq(int32_t *t, int32_t start, size_t n)
{
    for (size_t i = 0; i < n; i++)
        t[i] = start + (int32_t)i;
}

static void flush_durable(kvt_pcache *pc, uint64_t entries)
{
    struct kvt_flush_report r;
    assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
    assert_true(r.durable);
    assert_int_equal(r.pending_snapshots, 0);
    assert_int_equal(r.pending_spills, 0);
    assert_int_equal(r.entries, entries);
}

static void test_restart_restores_longest_prefix(void **state)
{
    (void)state;
    struct kvt_pcache_opts o;
    base_opts(&o);
    kvt_pcache *pc = open_pc(&o);
    char *want = strf("[ssd-cache] %s — 0 entries recovered, 0.00 GiB of 32 GiB cap", dir);
    assert_true(log_has(want));
    free(want);

    int32_t t1[100], t2[100], t3[60];
    seq(t1, 0, 100);
    seq(t2, 0, 50);
    seq(t2 + 50, 500, 50); /* shares 50 tokens with t1 */
    seq(t3, 0, 60);
    struct kvt_entry *e1 = make_entry(t1, 100, NULL, 11);
    struct kvt_entry *e2 = make_entry(t2, 100, NULL, 22);
    struct kvt_entry *e3 = make_entry(t3, 60, "lora", 33);
    size_t n_full, n_80, n_lora;
    uint8_t *full = entry_bytes(e1, 100, &n_full);
    uint8_t *first80 = entry_bytes(e1, 80, &n_80);
    uint8_t *lora = entry_bytes(e3, 59, &n_lora);
    assert_int_equal(kvt_pcache_put(pc, e1, NULL), 0);
    assert_int_equal(kvt_pcache_put(pc, e2, NULL), 0);
    assert_int_equal(kvt_pcache_put(pc, e3, NULL), 0);
    flush_durable(pc, 3);
    kvt_pcache_close(pc);

    logbuf[0] = 0;
    pc = open_pc(&o);
    want = strf("[ssd-cache] %s — 3 entries recovered", dir);
    assert_true(log_has(want));
    free(want);

    int32_t p[101];
    seq(p, 0, 100);
    p[100] = 7;
    /* the index lookups see the disk's 100 tokens where RAM has none, and change nothing */
    assert_int_equal(kvt_pcache_peek_prefix_len(pc, p, 101, ""), 0);
    assert_int_equal(kvt_pcache_peek_longest(pc, p, 101, ""), 100);
    assert_int_equal(kvt_pcache_peek_longest(pc, p, 101, "lora"), 60); /* t3, in its namespace */
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take(pc, p, 101, "", &t), 0);
    assert_non_null(t.entry);
    assert_true(t.from_disk);
    assert_int_equal(t.entry->n_tokens, 100);
    assert_memory_equal(t.entry->tokens, t1, sizeof(t1));
    size_t n;
    uint8_t *got = entry_bytes(t.entry, 100, &n);
    assert_int_equal(n, n_full);
    assert_memory_equal(got, full, n);
    free(got);
    kvt_entry_free(t.entry);
    kvt_retain_release(t.retain);

    p[80] = 999; /* diverges from t1 after 80 tokens: restored and trimmed */
    assert_int_equal(kvt_pcache_take(pc, p, 81, "", &t), 0);
    assert_true(t.from_disk);
    assert_int_equal(t.entry->n_tokens, 80);
    assert_int_equal(kvt_cache_offset(t.entry->caches[0]), 80);
    got = entry_bytes(t.entry, 80, &n);
    assert_int_equal(n, n_80);
    assert_memory_equal(got, first80, n);
    free(got);
    /* The caller extends it and puts it back: it lives in RAM from then on. */
    assert_int_equal(kvt_pcache_put(pc, t.entry, t.retain), 0);

    assert_int_equal(kvt_pcache_take(pc, t3, 60, "lora", &t), 0);
    assert_true(t.from_disk);
    assert_int_equal(t.entry->n_tokens, 59);
    got = entry_bytes(t.entry, 59, &n);
    assert_int_equal(n, n_lora);
    assert_memory_equal(got, lora, n); /* the same rows, trimmed by one */
    free(got);
    kvt_entry_free(t.entry);
    assert_int_equal(kvt_pcache_take(pc, t3, 60, "other", &t), 0);
    assert_null(t.entry);

    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    assert_true(st.has_cold);
    assert_int_equal(st.cold.restores, 3);
    assert_int_equal(st.records, 1);
    assert_int_equal(st.misses, 4); /* RAM candidacy: only disk served them */
    kvt_pcache_close(pc);
    free(full);
    free(first80);
    free(lora);
}

/* A placement into one buffer, slot after slot; refuses with @c refuse when set. */
struct placement {
    uint8_t *buf;
    size_t len;
    int calls, refuse;
};

static int place_all(void *ud, const struct kvt_header *h, void **dst)
{
    struct placement *pl = ud;
    pl->calls++;
    if (pl->refuse)
        return pl->refuse;
    size_t total = 0, k = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++)
            total += h->caches[i].slots[j].bytes;
    pl->buf = malloc(total);
    pl->len = total;
    total = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++) {
            dst[k++] = pl->buf + total;
            total += h->caches[i].slots[j].bytes;
        }
    return 0;
}

/*
 * kvt_pcache_take_into() makes take's decision and delivers a disk hit through the caller's
 * placement: the disk's longer entry is placed whole (the caller trims), and a placement that
 * refuses falls back to the RAM entry without a second disk read.
 */
static void test_take_into_places_disk_hits(void **state)
{
    (void)state;
    struct kvt_pcache_opts o;
    base_opts(&o);
    kvt_pcache *pc = open_pc(&o);
    int32_t t1[100], p[101];
    seq(t1, 0, 100);
    struct kvt_entry *e1 = make_entry(t1, 100, NULL, 11);
    size_t n_full;
    uint8_t *full = entry_bytes(e1, 100, &n_full);
    assert_int_equal(kvt_pcache_put(pc, e1, NULL), 0);
    flush_durable(pc, 1);
    kvt_pcache_close(pc);
    pc = open_pc(&o);
    assert_int_equal(kvt_pcache_put(pc, make_entry(t1, 40, NULL, 44), NULL), 0); /* RAM: 40 */

    memcpy(p, t1, sizeof(t1));
    p[90] = 999; /* the disk matches 90 tokens, RAM 40 */
    struct placement pl = {0};
    struct kvt_take_into into = {.place = place_all, .ud = &pl};
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take_into(pc, p, 101, "", &into, &t), 0);
    assert_null(t.entry);
    assert_true(t.from_disk);
    assert_non_null(into.header);
    assert_int_equal(into.header->n_tokens, 100);
    assert_int_equal(into.prefix_len, 90);
    assert_int_equal(pl.len, n_full);
    assert_memory_equal(pl.buf, full, n_full);
    kvt_header_free(into.header);
    free(pl.buf);

    pl = (struct placement){.refuse = KVT_E_MISMATCH};
    into = (struct kvt_take_into){.place = place_all, .ud = &pl};
    assert_int_equal(kvt_pcache_take_into(pc, p, 101, "", &into, &t), 0);
    assert_int_equal(pl.calls, 1); /* the disk was tried once */
    assert_null(into.header);
    assert_non_null(t.entry); /* RAM served */
    assert_false(t.from_disk);
    assert_int_equal(t.entry->n_tokens, 40);
    kvt_entry_free(t.entry);
    kvt_retain_release(t.retain);

    into.place = NULL;
    assert_int_equal(kvt_pcache_take_into(pc, p, 101, "", &into, &t), -EINVAL);
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    assert_int_equal(st.cold.restores, 1);
    kvt_pcache_close(pc);
    free(full);
}

/*
 * With shared prefixes on (docs/SHARING.md), a disk hit kept as chunks plus a tail is placed
 * in the caller's memory whole: every row from its file, as a whole file's would be.
 */
static void test_take_into_places_shared_hits(void **state)
{
    (void)state;
    struct kvt_pcache_opts o;
    base_opts(&o);
    o.cold.share_prefixes = true;
    kvt_pcache *pc = open_pc(&o);
    int32_t t1[600], p[601];
    seq(t1, 0, 600);
    struct kvt_entry *e1 = make_entry(t1, 600, NULL, 12);
    size_t n_full;
    uint8_t *full = entry_bytes(e1, 600, &n_full);
    assert_int_equal(kvt_pcache_put(pc, e1, NULL), 0);
    flush_durable(pc, 1);
    kvt_pcache_close(pc);
    pc = open_pc(&o); /* RAM empty: the disk serves */
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    assert_int_equal(st.cold.shared_chunks, 2);

    memcpy(p, t1, sizeof(t1));
    p[600] = 999;
    struct placement pl = {0};
    struct kvt_take_into into = {.place = place_all, .ud = &pl};
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take_into(pc, p, 601, "", &into, &t), 0);
    assert_true(t.from_disk);
    assert_non_null(into.header);
    assert_int_equal(into.header->n_tokens, 600);
    assert_int_equal(into.prefix_len, 600);
    assert_int_equal(pl.len, n_full);
    assert_memory_equal(pl.buf, full, n_full);
    kvt_header_free(into.header);
    free(pl.buf);
    kvt_pcache_close(pc);
    free(full);
}

static void test_eviction_spills_to_disk(void **state)
{
    (void)state;
    struct kvt_pcache_opts o;
    base_opts(&o);
    o.write_behind = false;
    int32_t t1[100], t2[100];
    seq(t1, 0, 100);
    seq(t2, 1000, 100);
    struct kvt_entry *e1 = make_entry(t1, 100, NULL, 1);
    o.ram_max_bytes = kvt_entry_bytes(e1) + 1; /* room for one entry */
    kvt_pcache *pc = open_pc(&o);
    size_t n_full;
    uint8_t *full = entry_bytes(e1, 100, &n_full);
    assert_int_equal(kvt_pcache_put(pc, e1, NULL), 0);
    assert_int_equal(kvt_pcache_put(pc, make_entry(t2, 100, NULL, 2), NULL), 0);
    flush_durable(pc, 1); /* e1, evicted, went to disk; e2 is only in RAM */

    int32_t p[101];
    memcpy(p, t1, sizeof(t1));
    p[100] = 5;
    struct kvt_take t;
    assert_int_equal(kvt_pcache_take(pc, p, 101, "", &t), 0);
    assert_true(t.from_disk);
    size_t n;
    uint8_t *got = entry_bytes(t.entry, 100, &n);
    assert_int_equal(n, n_full);
    assert_memory_equal(got, full, n);
    free(got);
    free(full);
    kvt_entry_free(t.entry);

    /* Steps ran inside the engine gate: 4 tensors + 1 = 5 write steps. */
    pthread_mutex_lock(&E.mu);
    assert_int_equal(E.calls, 5);
    pthread_mutex_unlock(&E.mu);
    kvt_pcache_close(pc);
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    for (struct dirent *de; (de = readdir(d));)
        n++;
    closedir(d);
    return n;
}

static int count_tmp(const char *root)
{
    DIR *d = opendir(root);
    int n = 0;
    if (!d)
        return 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (de->d_name[0] == '.')
            continue;
        char *sub = strf("%s/%s", root, de->d_name);
        DIR *s = opendir(sub);
        for (struct dirent *f; s && (f = readdir(s));)
            if (strstr(f->d_name, ".tmp"))
                n++;
        if (s)
            closedir(s);
        free(sub);
    }
    closedir(d);
    return n;
}

static void test_refusing_gate_leaves_nothing(void **state)
{
    (void)state;
    struct kvt_pcache_opts o;
    base_opts(&o);
    o.snapshot_debounce_ms = 600000;
    o.snapshot_busy_retry_ms = 600000;
    kvt_pcache *pc = open_pc(&o);
    int fds = count_fds();
    int32_t t1[100];
    seq(t1, 0, 100);
    assert_int_equal(kvt_pcache_put(pc, make_entry(t1, 100, NULL, 3), NULL), 0);

    for (int k = 2; k <= 6; k++) { /* refuse write step k - 1 (1 = the snapshot clone) */
        engine_refuse_from(k);
        struct kvt_flush_report r;
        assert_int_equal(kvt_pcache_flush(pc, -1, &r), 0);
        assert_false(r.durable);
        assert_int_equal(r.failed, 1);
        assert_int_equal(r.pending_snapshots, 1);
        assert_int_equal(r.entries, 0);
        assert_int_equal(count_tmp(kvt_store_root(kvt_pcache_store(pc))), 0);
        assert_int_equal(count_fds(), fds);
    }
    engine_refuse_from(0);
    flush_durable(pc, 1);
    assert_int_equal(count_fds(), fds);
    struct kvt_pcache_stats st;
    kvt_pcache_get_stats(pc, &st);
    assert_int_equal(st.failed_spills, 5);
    assert_int_equal(st.cold.entries, 1);
    kvt_pcache_close(pc);
}

/* The CPU list of the first thread named @p name, from /proc; NULL when there is none. */
static char *thread_cpus(const char *name)
{
    DIR *d = opendir("/proc/self/task");
    char *cpus = NULL;
    for (struct dirent *de; !cpus && (de = readdir(d));) {
        if (de->d_name[0] == '.')
            continue;
        char *path = strf("/proc/self/task/%s/comm", de->d_name);
        char comm[64] = "";
        FILE *f = fopen(path, "r");
        free(path);
        if (!f)
            continue; /* the thread has just exited */
        bool match = fgets(comm, sizeof(comm), f) && strcmp(strtok(comm, "\n"), name) == 0;
        fclose(f);
        if (!match)
            continue;
        path = strf("/proc/self/task/%s/status", de->d_name);
        f = fopen(path, "r");
        free(path);
        char line[256];
        while (f && !cpus && fgets(line, sizeof(line), f))
            if (strncmp(line, "Cpus_allowed_list:", 18) == 0)
                cpus = strdup(strtok(line + 18, " \t\n"));
        if (f)
            fclose(f);
    }
    closedir(d);
    return cpus;
}

static void test_background_cpus_place_the_threads(void **state)
{
    (void)state;
    cpu_set_t mine;
    assert_int_equal(sched_getaffinity(0, sizeof(mine), &mine), 0);
    int last = -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &mine))
            last = c;
    char *want = strf("%d", last);
    struct kvt_pcache_opts o;
    base_opts(&o);
    o.background_cpus = want;
    kvt_pcache *pc = open_pc(&o);
    char *writer = thread_cpus("kvt-writer"), *timer = thread_cpus("kvt-timer");
    assert_non_null(writer);
    assert_non_null(timer);
    assert_string_equal(writer, want);
    assert_string_equal(timer, want);
    free(writer);
    free(timer);
    /* The caller keeps its CPUs, and writes behind still land. */
    cpu_set_t now;
    assert_int_equal(sched_getaffinity(0, sizeof(now), &now), 0);
    assert_true(CPU_EQUAL(&now, &mine));
    int32_t t1[100];
    seq(t1, 0, 100);
    assert_int_equal(kvt_pcache_put(pc, make_entry(t1, 100, NULL, 4), NULL), 0);
    flush_durable(pc, 1);
    kvt_pcache_close(pc);
    free(want);

    /* Without the option the threads run wherever the caller may. */
    base_opts(&o);
    pc = open_pc(&o);
    writer = thread_cpus("kvt-writer");
    char *caller = thread_cpus(program_invocation_short_name);
    assert_non_null(writer);
    if (caller) /* the main thread's name is the program's, cut to 15 characters */
        assert_string_equal(writer, caller);
    free(writer);
    free(caller);
    kvt_pcache_close(pc);
}

/* A gate that holds the writer thread's steps until opened; other threads pass. */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static bool gate_open;

static int writer_gate(void *engine, kvt_step_fn step, void *arg)
{
    (void)engine;
    char name[16] = "";
    pthread_getname_np(pthread_self(), name, sizeof(name));
    if (!strcmp(name, "kvt-writer")) {
        pthread_mutex_lock(&gate_mu);
        while (!gate_open)
            pthread_cond_wait(&gate_cond, &gate_mu);
        pthread_mutex_unlock(&gate_mu);
    }
    return step(arg);
}

static void *open_gate_later(void *arg)
{
    (void)arg;
    usleep(200 * 1000); /* close has stopped the timer thread and is waiting for the writer */
    pthread_mutex_lock(&gate_mu);
    gate_open = true;
    pthread_cond_broadcast(&gate_cond);
    pthread_mutex_unlock(&gate_mu);
    return NULL;
}

/* Closing with snapshots still queued discards them after the timer thread is gone; their
 * failed outcome must not wake that thread (a use-after-free under AddressSanitizer). */
static void test_close_with_queued_snapshots(void **state)
{
    (void)state;
    struct kvt_pcache_opts o;
    base_opts(&o);
    o.snapshot_debounce_ms = 0;
    o.run_exclusive = writer_gate;
    gate_open = false;
    kvt_pcache *pc = open_pc(&o);
    int32_t tok[64];
    for (int i = 0; i < 4; i++) {
        seq(tok, i * 1000, 64);
        assert_int_equal(kvt_pcache_put(pc, make_entry(tok, 64, "", (uint64_t)i + 1), NULL), 0);
    }
    struct kvt_pcache_stats st;
    for (int tries = 0; tries < 500; tries++) { /* one snapshot in flight, three queued */
        kvt_pcache_get_stats(pc, &st);
        if (st.pending_spills == 4)
            break;
        usleep(2000);
    }
    assert_int_equal(st.pending_spills, 4);
    pthread_t opener;
    assert_int_equal(pthread_create(&opener, NULL, open_gate_later, NULL), 0);
    kvt_pcache_close(pc);
    pthread_join(opener, NULL);
}

static void test_configuration_errors(void **state)
{
    (void)state;
    struct kvt_pcache_opts o;
    base_opts(&o);
    kvt_pcache *pc = (kvt_pcache *)&o;
    o.ram_max_bytes = 0;
    assert_int_equal(kvt_pcache_open(&o, &pc), -EINVAL);
    assert_null(pc);
    assert_string_equal(kvt_last_error(),
                        "cold_dir requires the RAM prompt cache (ram_max_bytes is 0)");
    base_opts(&o);
    o.spill_queue_max_bytes = -1;
    assert_int_equal(kvt_pcache_open(&o, &pc), -EINVAL);
    base_opts(&o);
    o.demote_idle_ms = -5;
    assert_int_equal(kvt_pcache_open(&o, &pc), -EINVAL);
    const char *bad_cpus[] = {"", "x", "3-1", "1,", "0-", "-1", "0,,1", "99999", "1023"};
    for (size_t i = 0; i < sizeof(bad_cpus) / sizeof(*bad_cpus); i++) {
        base_opts(&o);
        o.background_cpus = bad_cpus[i];
        assert_int_equal(kvt_pcache_open(&o, &pc), -EINVAL);
        assert_null(pc);
        assert_non_null(strstr(kvt_last_error(), "background_cpus"));
    }

    /* RAM only: cold options are ignored with a warning; a 0 cap is legal. */
    base_opts(&o);
    o.cold_dir = NULL;
    o.spill_queue_max_bytes = 0;
    logbuf[0] = 0;
    pc = open_pc(&o);
    assert_true(log_has("cold-tier options ignored"));
    assert_null(kvt_pcache_store(pc));
    kvt_pcache_close(pc);
}

/* An open that fails after its store opened (a bad remote URL) leaves the process's memory
 * settings as they were; one that succeeds applies them (the control). */
static void test_failed_open_changes_nothing(void **state)
{
    (void)state;
    struct mem_probe mp;
    mem_probe_init(&mp);
    struct kvt_remote_opts ro;
    kvt_remote_opts_init(&ro);
    ro.url = "ftp://nowhere";
    struct kvt_pcache_opts o;
    base_opts(&o);
    o.cold.mem = &mp.m;
    o.remote = &ro;
    kvt_pcache *pc = (kvt_pcache *)&o;
    assert_int_equal(kvt_pcache_open(&o, &pc), -EINVAL);
    assert_null(pc);
    assert_non_null(strstr(kvt_last_error(), "redis://"));
    mem_probe_check(&mp, false);

    o.remote = NULL;
    pc = open_pc(&o);
    kvt_pcache_close(pc);
    mem_probe_check(&mp, true);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_restart_restores_longest_prefix), T(test_take_into_places_disk_hits),
        T(test_take_into_places_shared_hits),    T(test_eviction_spills_to_disk),
        T(test_refusing_gate_leaves_nothing),    T(test_background_cpus_place_the_threads),
        T(test_close_with_queued_snapshots),     T(test_configuration_errors),
        T(test_failed_open_changes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
