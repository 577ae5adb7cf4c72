/*
 * kill -9 crash loop: runs tests/progs/crash_writer, which puts entries into a store and logs
 * each acknowledged put, and SIGKILLs it after a random delay (seeded, so a failure replays;
 * for a third of the kills counted from the writer's first acknowledged put, so a slow writer
 * still gets that far), KVT_CRASH_KILLS times (default 200). After every kill, before anything
 * recovers the directory, every published file must pass kvt_file_verify; then the store must
 * reopen, reap the dead writer's .tmp (tmp_grace_ms 0: the writer is gone), and every acknowledged
 * entry must be found and restore with exactly the bytes the writer stored (they derive from
 * the entry's id: tests/progs/crash_entry.h). The default cap never evicts here. A loop in
 * which no put was acknowledged over a path it ran fails: it would have checked nothing.
 *
 * Each store directory serves ten kills (later writers recover what earlier ones left), then a
 * new one starts, which keeps each check small; every other directory's writers save over the
 * plain path instead of the fast one. KVT_CRASH_SEED changes the kill moments. A
 * second test runs two writers on one directory and kills and restarts them in turn. Both run
 * again with the writers' store sharing prefixes (docs/SHARING.md): branches off three
 * prompts, whose chunks every writer reuses, and tails and chunks verified after each kill.
 */
#include "support/support.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "progs/crash_entry.h"

#define KILLS_PER_DIR 10
#define MAX_DELAY_US 60000
/* Recovery next to a live writer needs a grace period for the create-to-lock instant. */
#define TWO_WRITER_GRACE_MS 2000
/* How long a writer may take to acknowledge its first put. */
#define ACK_WAIT_MS 30000

struct counts {
    long kills, acked, acked_plain, checks, tmp_seen, visible, corrupt, lost, tmp_left, mismatched,
        scan_corrupt;
};

static long env_long(const char *name, long def)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : def;
}

static char *writer_path(void)
{
    const char *b = getenv("KVT_BUILD_DIR");
    return strf("%s/tests/progs/crash_writer", b && *b ? b : KVT_BUILD_DIR);
}

static void sleep_us(long us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Call @p fn on every file of every namespace directory under @p root ending in @p suffix. */
static long for_each_file(const char *root, const char *suffix,
                          void (*fn)(const char *path, void *ud), void *ud)
{
    long count = 0;
    DIR *d = opendir(root);
    if (!d)
        return 0;
    struct dirent *ns;
    while ((ns = readdir(d))) {
        if (ns->d_name[0] == '.')
            continue;
        char *sub = strf("%s/%s", root, ns->d_name);
        DIR *e = opendir(sub);
        struct dirent *f;
        while (e && (f = readdir(e))) {
            size_t len = strlen(f->d_name), sl = strlen(suffix);
            if (len <= sl || strcmp(f->d_name + len - sl, suffix) != 0)
                continue;
            count++;
            if (fn) {
                char *path = strf("%s/%s", sub, f->d_name);
                fn(path, ud);
                free(path);
            }
        }
        if (e)
            closedir(e);
        free(sub);
    }
    closedir(d);
    return count;
}

static const struct kvt_expect EXPECT = {
    .model_id = SYNTH_MODEL,
    .config_fingerprint = SYNTH_FP,
    .tokenizer_hash = SYNTH_TOK,
    .keep_cache = true,
};

static void verify_file(const char *path, void *ud)
{
    struct counts *c = ud;
    c->visible++;
    int rc = kvt_file_verify(path, &EXPECT);
    if (rc != 0) {
        c->corrupt++;
        print_error("crash: corrupt visible file %s: %s\n", path, kvt_last_error());
    }
}

/* Append the ids of the complete lines of the acknowledgement log @p path to @p ids. */
static void read_acks(const char *path, uint32_t **ids, size_t *n, size_t *cap)
{
    size_t len = 0;
    char *text = (char *)read_file(path, &len);
    if (!text)
        return; /* no put acknowledged yet */
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] != '\n')
            continue;
        if (*n == *cap) {
            *cap = *cap ? *cap * 2 : 256;
            *ids = realloc(*ids, *cap * sizeof(**ids));
            assert_non_null(*ids);
        }
        (*ids)[(*n)++] = (uint32_t)strtoul(text + start, NULL, 10);
        start = i + 1;
    }
    free(text);
}

/* Whether the writers run with the store's share_prefixes on (docs/SHARING.md). */
static bool writer_share;

/* Find and restore entry @p id; it must be exactly what the writer stored. */
static void check_acked(kvt_store *s, uint32_t id, struct counts *c)
{
    struct kvt_entry *want;
    assert_int_equal(writer_share ? synth_shared_entry(id, &want) : synth_id_entry(id, &want), 0);
    int32_t prompt[SYNTH_SHARED_PREFIX + 65];
    memcpy(prompt, want->tokens, want->n_tokens * sizeof(*prompt));
    prompt[want->n_tokens] = 7; /* one more token to compute, so the whole entry is usable */
    struct kvt_hit hit;
    const char *ns = writer_share ? "" : synth_id_ns(id);
    assert_int_equal(kvt_store_find(s, prompt, want->n_tokens + 1, ns, &hit), 0);
    if (hit.prefix_len != want->n_tokens || hit.n_tokens != want->n_tokens) {
        c->lost++;
        print_error("crash: acknowledged entry %u is missing (hit %zu of %zu tokens)\n", id,
                    hit.prefix_len, want->n_tokens);
        kvt_entry_free(want);
        return;
    }
    struct kvt_entry *got = NULL;
    assert_int_equal(kvt_store_restore(s, &hit, &got), 0);
    if (!got) {
        c->lost++;
        print_error("crash: acknowledged entry %u does not restore: %s\n", id, kvt_last_error());
    } else if (!synth_same_caches(got, want)) {
        c->mismatched++;
        print_error("crash: acknowledged entry %u restores with different bytes\n", id);
    }
    kvt_entry_free(got);
    kvt_entry_free(want);
}

/* Writers still running, killed by the group teardown when a check fails mid-test. */
static pid_t live[2] = {-1, -1};

static void track(pid_t pid, pid_t gone)
{
    for (int i = 0; i < 2; i++)
        if (live[i] == gone) {
            live[i] = pid;
            return;
        }
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++)
        if (live[i] > 0) {
            kill(live[i], SIGKILL);
            waitpid(live[i], NULL, 0);
            live[i] = -1;
        }
    return 0;
}

/* The path the writers' saves take: the fast one (O_DIRECT, the asynchronous queue) or, for
 * every other directory of the kill loop, the plain one. */
static bool writer_plain;

/* Start a writer; @p grace_ms is its store's tmp_grace_ms. */
static pid_t start_writer(const char *exe, const char *dir, const char *ack, uint32_t first,
                          long grace_ms)
{
    char first_s[16], grace_s[24];
    snprintf(first_s, sizeof(first_s), "%u", first);
    snprintf(grace_s, sizeof(grace_s), "%ld", grace_ms);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl(exe, exe, dir, ack, first_s, grace_s, writer_plain ? "plain" : "fast",
              writer_share ? "share" : "whole", (char *)NULL);
        _exit(127);
    }
    track(pid, -1);
    return pid;
}

/* SIGKILL @p pid and require that the kill is what ended it. */
static void kill_writer(pid_t pid)
{
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        assert_int_equal(errno, EINTR);
    track(-1, pid);
    if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL))
        fail_msg("crash_writer ended by itself before the kill (%s %d)",
                 WIFEXITED(status) ? "exit" : "signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

/* Lines in the acknowledgement log @p path (complete or not: a line is written at once). */
static size_t ack_lines(const char *path)
{
    size_t len = 0, n = 0;
    char *text = (char *)read_file(path, &len);
    for (size_t i = 0; i < len; i++)
        n += text[i] == '\n';
    free(text);
    return n;
}

/* Wait until writer @p pid has acknowledged a put: its log @p ack holds more than @p lines
 * lines. A writer slowed down (a sanitizer build, a loaded machine) takes longer than the kill
 * delays to get there, and a loop that never waits would check nothing. */
static void wait_for_ack(pid_t pid, const char *ack, size_t lines)
{
    for (int ms = 0; ack_lines(ack) <= lines; ms++) {
        int status;
        if (ms == ACK_WAIT_MS || waitpid(pid, &status, WNOHANG) != 0)
            fail_msg("crash_writer acknowledged no put within %d ms (%s)", ms,
                     ms == ACK_WAIT_MS ? "still running" : "it ended by itself");
        sleep_us(1000);
    }
}

/* Start the writer and kill it @p delay_us after its start or, with @p after_ack, after its
 * first acknowledged put (the log held @p lines lines before it started). */
static void run_and_kill(const char *exe, const char *dir, const char *ack, uint32_t first,
                         long delay_us, bool after_ack, size_t lines)
{
    pid_t pid = start_writer(exe, dir, ack, first, 0);
    if (after_ack)
        wait_for_ack(pid, ack, lines);
    sleep_us(delay_us);
    kill_writer(pid);
}

/* Every published file: whole entries, and with sharing tails and chunks too. */
static void verify_published(const char *root, struct counts *c)
{
    for_each_file(root, ".mlxkv", verify_file, c);
    for_each_file(root, ".kvshare", verify_file, c);
    for_each_file(root, ".kvchunk", verify_file, c);
}

static void kill_loop(bool share)
{
    writer_share = share;
    long kills = env_long("KVT_CRASH_KILLS", 200);
    uint64_t rng = (uint64_t)env_long("KVT_CRASH_SEED", 20250701);
    char *exe = writer_path();
    if (access(exe, X_OK) != 0)
        fail_msg("%s is missing: build it with `make tests`", exe);
    struct counts c = {0};
    long kills_plain = 0;
    uint32_t *ids = NULL;
    size_t n_ids = 0, cap_ids = 0;
    char *dir = NULL, *root = NULL, *ack = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    for (long k = 0; k < kills; k++) {
        if (k % KILLS_PER_DIR == 0) {
            c.acked += (long)n_ids;
            c.acked_plain += writer_plain ? (long)n_ids : 0;
            n_ids = 0;
            if (dir)
                rm_rf(dir);
            free(dir);
            free(root);
            free(ack);
            dir = scratch_dir("crash");
            root = strf("%s/%s", dir, SYNTH_FP);
            ack = strf("%s.ack", dir);
            unlink(ack);
            writer_plain = (k / KILLS_PER_DIR) % 2 == 1;
        }
        kills_plain += writer_plain;
        /* a third of the kills land early (during open and recovery), a third anywhere, a
         * third anywhere after the writer's first acknowledged put */
        uint64_t r = xs64(&rng);
        long delay = r % 3 == 0 ? (long)(xs64(&rng) % 5000) : (long)(xs64(&rng) % MAX_DELAY_US);
        run_and_kill(exe, dir, ack, (uint32_t)(k * 1000 + 1), delay, r % 3 == 2, n_ids);
        c.kills++;
        /* every id acknowledged by the writers of this directory so far */
        n_ids = 0;
        read_acks(ack, &ids, &n_ids, &cap_ids);

        /* published files, before anything recovers the directory */
        verify_published(root, &c);
        c.tmp_seen += for_each_file(root, ".tmp", NULL, NULL); /* kills that hit a write */

        struct kvt_store_opts o;
        store_opts_for(&o, SYNTH_MODEL, SYNTH_FP, SYNTH_TOK);
        o.tmp_grace_ms = 0;
        kvt_store *s;
        if (kvt_store_open(dir, &o, &s) != 0)
            fail_msg("reopen after kill %ld: %s", k, kvt_last_error());
        struct kvt_store_stats st;
        kvt_store_get_stats(s, &st);
        c.scan_corrupt += (long)st.corrupt_files;
        long tmp = for_each_file(root, ".tmp", NULL, NULL);
        if (tmp)
            print_error("crash: %ld .tmp left after reopen (kill %ld)\n", tmp, k);
        c.tmp_left += tmp;
        for (size_t i = 0; i < n_ids; i++)
            check_acked(s, ids[i], &c);
        c.checks += (long)n_ids;
        kvt_store_close(s);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    c.acked += (long)n_ids;
    c.acked_plain += writer_plain ? (long)n_ids : 0;
    printf("crash%s: %ld kills (%ld left a .tmp), %ld acknowledged puts (%ld over the plain path; "
           "%ld restores checked), "
           "%ld visible files verified, %ld corrupt, %ld corrupt at scan, %ld lost, %ld restored "
           "with different bytes, %ld .tmp left (%.1f s); %ld kills over the fast path, %ld over "
           "the plain one\n",
           share ? " (sharing on)" : "", c.kills, c.tmp_seen, c.acked, c.acked_plain, c.checks,
           c.visible, c.corrupt, c.scan_corrupt, c.lost, c.mismatched, c.tmp_left,
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9,
           c.kills - kills_plain, kills_plain);
    if (dir)
        rm_rf(dir);
    free(dir);
    free(root);
    free(ack);
    free(ids);
    free(exe);
    assert_int_equal(c.kills, kills);
    /* writers killed before any put was acknowledged leave nothing to check: over each path
     * that ran, some puts must have been acknowledged (and so restored and compared) */
    if (c.acked - c.acked_plain == 0 || (kills_plain > 0 && c.acked_plain == 0))
        fail_msg("no put acknowledged over the %s path: the loop checked nothing",
                 c.acked - c.acked_plain == 0 ? "fast" : "plain");
    assert_int_equal(c.corrupt, 0);
    assert_int_equal(c.scan_corrupt, 0);
    assert_int_equal(c.lost, 0);
    assert_int_equal(c.mismatched, 0);
    assert_int_equal(c.tmp_left, 0);
}

/*
 * Two writers on one directory: each is killed and restarted in turn while the other keeps
 * writing, so every restart runs recovery (and every put a refresh) next to a live writer's
 * .tmp, with a short grace period. A recovery that reaped a file still being written would
 * fail that writer's put, and the writer would exit by itself. At the end every published file
 * verifies and every entry either writer acknowledged restores exactly.
 */
static void two_writers(bool share)
{
    writer_share = share;
    writer_plain = false; /* the fast path, whatever the kill loop ended on */
    long rounds = env_long("KVT_CRASH_KILLS", 200) / 5;
    if (rounds < 20)
        rounds = 20;
    uint64_t rng = (uint64_t)env_long("KVT_CRASH_SEED", 20250701) ^ 0x5bd1e995;
    char *exe = writer_path();
    char *dir = scratch_dir("crash-two");
    char *root = strf("%s/%s", dir, SYNTH_FP);
    char *ack[2] = {strf("%s.ack0", dir), strf("%s.ack1", dir)};
    pid_t pid[2];
    uint32_t next = 1;
    for (int w = 0; w < 2; w++) {
        pid[w] = start_writer(exe, dir, ack[w], next, TWO_WRITER_GRACE_MS);
        next += 100000;
    }
    struct counts c = {0};
    for (long r = 0; r < rounds; r++) {
        sleep_us((long)(xs64(&rng) % MAX_DELAY_US));
        int w = (int)(r % 2);
        int status;
        if (waitpid(pid[1 - w], &status, WNOHANG) != 0) {
            track(-1, pid[1 - w]);
            fail_msg("the other writer ended by itself (status 0x%x)", status);
        }
        kill_writer(pid[w]);
        c.kills++;
        pid[w] = start_writer(exe, dir, ack[w], next, TWO_WRITER_GRACE_MS);
        next += 100000;
    }
    /* the last writers run until each acknowledges one more put, so there are puts to check */
    for (int w = 0; w < 2; w++)
        wait_for_ack(pid[w], ack[w], ack_lines(ack[w]));
    sleep_us((long)(xs64(&rng) % MAX_DELAY_US));
    for (int w = 0; w < 2; w++) {
        kill_writer(pid[w]);
        c.kills++;
    }

    verify_published(root, &c);
    uint32_t *ids = NULL;
    size_t n_ids = 0, cap_ids = 0;
    for (int w = 0; w < 2; w++)
        read_acks(ack[w], &ids, &n_ids, &cap_ids);
    struct kvt_store_opts o;
    store_opts_for(&o, SYNTH_MODEL, SYNTH_FP, SYNTH_TOK);
    o.tmp_grace_ms = 0;
    kvt_store *s;
    if (kvt_store_open(dir, &o, &s) != 0)
        fail_msg("reopen: %s", kvt_last_error());
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    c.scan_corrupt = (long)st.corrupt_files;
    c.tmp_left = for_each_file(root, ".tmp", NULL, NULL);
    for (size_t i = 0; i < n_ids; i++)
        check_acked(s, ids[i], &c);
    kvt_store_close(s);
    printf("crash, two writers%s: %ld kills, %zu acknowledged puts, %ld visible files verified, "
           "%ld corrupt, %ld corrupt at scan, %ld lost, %ld restored with different bytes, "
           "%ld .tmp left\n",
           share ? " (sharing on)" : "", c.kills, n_ids, c.visible, c.corrupt, c.scan_corrupt,
           c.lost, c.mismatched, c.tmp_left);
    rm_rf(dir);
    for (int w = 0; w < 2; w++) {
        unlink(ack[w]);
        free(ack[w]);
    }
    free(ids);
    free(root);
    free(dir);
    free(exe);
    assert_true(n_ids > 0);
    assert_int_equal(c.corrupt, 0);
    assert_int_equal(c.scan_corrupt, 0);
    assert_int_equal(c.lost, 0);
    assert_int_equal(c.mismatched, 0);
    assert_int_equal(c.tmp_left, 0);
}

static void test_kill_loop(void **state)
{
    (void)state;
    kill_loop(false);
}

/* The same with the writers' store sharing prefixes: branches off three prompts. */
static void test_kill_loop_shared(void **state)
{
    (void)state;
    kill_loop(true);
}

static void test_two_writers(void **state)
{
    (void)state;
    two_writers(false);
}

/* Two writers sharing chunks on one directory, killed and restarted in turn. */
static void test_two_writers_shared(void **state)
{
    (void)state;
    two_writers(true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_loop),
        cmocka_unit_test(test_kill_loop_shared),
        cmocka_unit_test(test_two_writers),
        cmocka_unit_test(test_two_writers_shared),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
