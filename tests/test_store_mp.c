/*
 * The store under concurrency (STORE.md §12.4): three processes (tests/progs/store_stress)
 * storing, finding, restoring, refreshing, reopening and evicting on one small-capped
 * directory, then a full check of what they left, with shared prefixes stored once
 * (docs/SHARING.md) and without; a writer process's in-flight .tmp, aged
 * past the grace period, surviving another process's open and refresh; and several threads
 * sharing one store handle.
 */
#include "support/support.h"
#include "support/synth.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *const MODEL = "stress/model";
static const char *const FP = "fp-stress";
static const char *const TOKH = "tk-stress";

/* ---- synthetic entries, as store_stress makes them ------------------------------------ */

static struct kvt_entry *synth(const int32_t *tok, size_t n, bool trimmable)
{
    struct kvt_entry *e;
    assert_int_equal(synth_entry(tok, n, "", trimmable, &e), 0);
    return e;
}

static bool same_entry(const struct kvt_entry *e)
{
    struct kvt_entry *want = synth(e->tokens, e->n_tokens, e->n_caches == 1);
    bool same = want->n_caches == e->n_caches;
    for (size_t i = 0; same && i < e->n_caches; i++)
        same = synth_same_state(e->caches[i], want->caches[i]);
    kvt_entry_free(want);
    return same;
}

static kvt_store *open_store(const char *dir, uint64_t cap, int64_t grace_ms)
{
    struct kvt_store_opts o;
    store_opts_for(&o, MODEL, FP, TOKH);
    if (cap)
        o.max_bytes = cap;
    if (grace_ms >= 0)
        o.tmp_grace_ms = grace_ms;
    kvt_store *s;
    if (kvt_store_open(dir, &o, &s))
        fail_msg("kvt_store_open: %s", kvt_last_error());
    return s;
}

/* Every file under the store root: no .tmp left, every entry, tail and chunk passes a full
 * verify. @return the entries' files (whole files and tails); *@p tails (may be NULL) the
 * tails among them. */
static int check_files_of(const char *dir, int *tails)
{
    char *root = strf("%s/%s", dir, FP);
    DIR *r = opendir(root);
    assert_non_null(r);
    int entries = 0;
    struct dirent *de;
    while ((de = readdir(r))) {
        if (de->d_name[0] == '.')
            continue;
        char *ns = strf("%s/%s", root, de->d_name);
        DIR *d = opendir(ns);
        assert_non_null(d);
        struct dirent *fe;
        while ((fe = readdir(d))) {
            if (fe->d_name[0] == '.' || !strcmp(fe->d_name, "chunks.lock"))
                continue; /* the lock of the chunks' removal, not an entry */
            size_t l = strlen(fe->d_name);
            assert_false(l > 4 && !strcmp(fe->d_name + l - 4, ".tmp"));
            char *p = strf("%s/%s", ns, fe->d_name);
            struct kvt_expect x = {
                .model_id = MODEL, .config_fingerprint = FP, .tokenizer_hash = TOKH, .ns = ""};
            int rc = kvt_file_verify(p, &x);
            if (rc)
                fail_msg("%s: %s", p, kvt_last_error());
            entries += !strstr(fe->d_name, ".kvchunk");
            if (tails)
                *tails += strstr(fe->d_name, ".kvshare") != NULL;
            free(p);
        }
        closedir(d);
        free(ns);
    }
    closedir(r);
    free(root);
    return entries;
}

static int check_files(const char *dir)
{
    return check_files_of(dir, NULL);
}

/* Restore every indexed entry and compare it with its synthetic bytes. */
static void check_all_restore(kvt_store *s)
{
    struct kvt_store_record *v;
    size_t n;
    assert_int_equal(kvt_store_list(s, &v, &n), 0);
    for (size_t i = 0; i < n; i++) {
        struct kvt_header *h;
        assert_int_equal(kvt_file_read_header(v[i].path, NULL, &h), 0);
        int32_t *prompt = malloc((h->n_tokens + 1) * sizeof(*prompt));
        memcpy(prompt, h->tokens, h->n_tokens * sizeof(*prompt));
        prompt[h->n_tokens] = 99999;
        struct kvt_hit hit;
        assert_int_equal(kvt_store_find(s, prompt, h->n_tokens + 1, "", &hit), 0);
        assert_int_equal(hit.prefix_len, h->n_tokens);
        struct kvt_entry *e;
        assert_int_equal(kvt_store_restore(s, &hit, &e), 0);
        assert_non_null(e);
        assert_true(same_entry(e));
        kvt_entry_free(e);
        kvt_header_free(h);
        free(prompt);
    }
    kvt_store_list_free(v);
}

/* Three store_stress processes on one directory (@p share: with sharing on), then what they
 * left: complete, verified entries only, all indexed and restorable. */
static void three_processes(bool share)
{
    char *dir = scratch_dir("mp");
    char *prog = strf("%s/tests/progs/store_stress", KVT_BUILD_DIR);
    const char *cap = "1048576"; /* about twenty entries: eviction all the time */
    pid_t pids[3];
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof(id), "%d", i);
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            execl(prog, prog, dir, id, "4", cap, share ? "share" : (char *)NULL, (char *)NULL);
            _exit(127);
        }
    }
    for (int i = 0; i < 3; i++) {
        int st;
        assert_int_equal(waitpid(pids[i], &st, 0), pids[i]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    int tails = 0, files = check_files_of(dir, &tails);
    assert_int_equal(tails > 0, share); /* with sharing on, long prompts left tails */
    kvt_store *s = open_store(dir, 1048576, 0);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.corrupt_files, 0);
    assert_int_equal(st.skipped_files, 0);
    assert_int_equal(st.tmp_reaped, 0);
    assert_int_equal(st.entries + st.evictions, (uint64_t)files);
    assert_true(st.total_bytes <= 1048576);
    assert_true(st.entries > 0);
    check_all_restore(s);
    kvt_store_close(s);
    free(prog);
    rm_rf(dir);
    free(dir);
}

static void test_three_processes(void **state)
{
    (void)state;
    three_processes(false);
}

static void test_three_processes_sharing(void **state)
{
    (void)state;
    three_processes(true);
}

/* A gated writer that stops before its second step until told to go on. */
struct hold {
    int ready, go, steps;
};

static int hold_exclusive(void *engine, kvt_step_fn step, void *arg)
{
    struct hold *h = engine;
    if (++h->steps == 2) {
        char c = 0;
        if (write(h->ready, &c, 1) != 1 || read(h->go, &c, 1) != 1)
            return -EIO;
    }
    return step(arg);
}

static char *find_tmp(const char *dir)
{
    char *ns = strf("%s/%s/base", dir, FP);
    DIR *d = opendir(ns);
    char *found = NULL;
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (strstr(de->d_name, ".mlxkv.tmp"))
            found = strf("%s/%s", ns, de->d_name);
    if (d)
        closedir(d);
    free(ns);
    return found;
}

static void test_inflight_tmp_survives(void **state)
{
    (void)state;
    char *dir = scratch_dir("inflight");
    kvt_store_close(open_store(dir, 0, 0));
    int ready[2], go[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(go), 0);
    const int32_t tok[] = {4, 8, 15, 16, 23, 42};
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(ready[0]);
        close(go[1]);
        struct hold h = {ready[1], go[0], 0};
        struct kvt_store_opts o;
        store_opts_for(&o, MODEL, FP, TOKH);
        o.tmp_grace_ms = 0;
        kvt_store *s;
        if (kvt_store_open(dir, &o, &s))
            _exit(2);
        struct kvt_entry *e = synth(tok, 6, false);
        int rc = kvt_store_put(s, e, hold_exclusive, &h);
        kvt_entry_free(e);
        kvt_store_close(s);
        _exit(rc == 0 ? 0 : 1);
    }
    close(ready[1]);
    close(go[0]);
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);

    /* The writer sits between steps with its .tmp locked; age the file past any grace. */
    char *tmp = find_tmp(dir);
    assert_non_null(tmp);
    struct timespec ts[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
    assert_int_equal(utimensat(AT_FDCWD, tmp, ts, 0), 0);
    kvt_store *s = open_store(dir, 0, 0);
    assert_int_equal(kvt_store_refresh(s), 0);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.tmp_reaped, 0);
    struct stat sb;
    assert_int_equal(stat(tmp, &sb), 0);

    assert_int_equal(write(go[1], &c, 1), 1);
    int wst;
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    assert_true(WIFEXITED(wst));
    assert_int_equal(WEXITSTATUS(wst), 0);
    assert_int_equal(stat(tmp, &sb), -1);
    assert_int_equal(kvt_store_refresh(s), 0);
    check_all_restore(s);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 1);
    assert_int_equal(st.tmp_reaped, 0);
    kvt_store_close(s);
    close(ready[0]);
    close(go[1]);
    free(tmp);
    rm_rf(dir);
    free(dir);
}

/* ---- threads on one handle ------------------------------------------------------------ */

struct worker {
    kvt_store *s;
    uint64_t seed;
    double end;
    int bad, puts, restores;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void *work(void *arg)
{
    struct worker *w = arg;
    int32_t tok[40];
    while (now_s() < w->end && !w->bad) {
        size_t base = xs64(&w->seed) % 4, n = 2 + xs64(&w->seed) % 36;
        for (size_t i = 0; i < n; i++)
            tok[i] = (int32_t)(base * 100 + i);
        uint64_t what = xs64(&w->seed) % 10;
        if (what < 3) {
            struct kvt_entry *e = synth(tok, n, xs64(&w->seed) % 3 != 0);
            w->bad += kvt_store_put(w->s, e, NULL, NULL) != 0;
            kvt_entry_free(e);
            w->puts++;
        } else if (what < 8) {
            tok[n] = 7777;
            struct kvt_hit hit;
            w->bad += kvt_store_find(w->s, tok, n + 1, "", &hit) != 0;
            if (!hit.prefix_len)
                continue;
            struct kvt_entry *e;
            w->bad += kvt_store_restore(w->s, &hit, &e) != 0;
            if (e) {
                w->bad += !same_entry(e) || memcmp(e->tokens, tok, hit.prefix_len * 4) != 0;
                w->restores++;
            }
            kvt_entry_free(e);
        } else if (what < 9) {
            w->bad += kvt_store_refresh(w->s) != 0;
        } else {
            struct kvt_store_stats st;
            kvt_store_get_stats(w->s, &st);
            struct kvt_store_record *v;
            size_t nv;
            w->bad += kvt_store_list(w->s, &v, &nv) != 0;
            kvt_store_list_free(v);
            (void)kvt_store_has_durable_prefix(w->s, tok, n, "");
        }
    }
    return NULL;
}

static void test_threads_share_a_handle(void **state)
{
    (void)state;
    char *dir = scratch_dir("threads");
    kvt_store *s = open_store(dir, 600000, -1);
    struct worker w[4];
    pthread_t th[4];
    double end = now_s() + 1.5;
    for (int i = 0; i < 4; i++) {
        w[i] = (struct worker){s, 0x1234567ull * (uint64_t)(i + 1), end, 0, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, work, &w[i]), 0);
    }
    int puts = 0, restores = 0;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(w[i].bad, 0);
        puts += w[i].puts;
        restores += w[i].restores;
    }
    assert_true(puts > 0 && restores > 0);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.store_failures, 0);
    assert_true(st.total_bytes <= 600000);
    kvt_store_close(s);
    int files = check_files(dir);
    s = open_store(dir, 600000, -1);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, (uint64_t)files);
    check_all_restore(s);
    kvt_store_close(s);
    rm_rf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inflight_tmp_survives),
        cmocka_unit_test(test_threads_share_a_handle),
        cmocka_unit_test(test_three_processes),
        cmocka_unit_test(test_three_processes_sharing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
