/*
 * The store (STORE.md) on real directories: layout, restart recovery, namespace isolation,
 * every find rule through the public API, supersession and duplicates, cap eviction by mtime
 * and the LRU bump, oversize refusal, corrupt / foreign / newer files at open (golden bad
 * files and synthesized ones), quarantine, .tmp reaping that spares live writers and young
 * files, restores of vanished files, refresh across two handles, read-only stores, and soft
 * failures on a full disk (io fault backend, and a small tmpfs when the test may mount one)
 * with a warning logged once.
 *
 * Entries are synthetic: one kv layer whose rows are derived from the tokens (row i from a
 * running hash of tokens 0..i), plus an ssm layer for untrimmable entries, so any restore
 * can be checked byte for byte.
 */
#include "support/support.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "io/io_fault.h"
#include "support/synth.h"

static const char *const MODEL = "test/model";
static const char *const FP = "fp-test-bf16";
static const char *const TOK = "tk-test";

/* ---- synthetic entries ---------------------------------------------------------------- */

/* A kv layer, plus an ssm layer when the entry must not be trimmable. */
static struct kvt_entry *synth(const int32_t *tok, size_t n, const char *ns, bool trimmable)
{
    struct kvt_entry *e;
    assert_int_equal(synth_entry(tok, n, ns, trimmable, &e), 0);
    assert_int_equal(kvt_entry_is_trimmable(e), trimmable);
    return e;
}

/* The restored entry is exactly the synthetic entry of these tokens. */
static void assert_entry_is(const struct kvt_entry *e, const int32_t *tok, size_t n, const char *ns,
                            bool trimmable)
{
    assert_non_null(e);
    assert_int_equal(e->n_tokens, n);
    assert_memory_equal(e->tokens, tok, n * sizeof(*tok));
    assert_string_equal(e->meta.ns ? e->meta.ns : "", ns);
    assert_string_equal(e->meta.model_id, MODEL);
    struct kvt_entry *want = synth(tok, n, ns, trimmable);
    assert_int_equal(e->n_caches, want->n_caches);
    for (size_t i = 0; i < e->n_caches; i++)
        assert_true(synth_same_state(e->caches[i], want->caches[i]));
    kvt_entry_free(want);
}

/* ---- opening, storing, looking ------------------------------------------------------- */

struct logcap {
    int warns, infos;
    int store_failed, not_stored, restore_failed;
    char last[2048];
};

static void log_fn(void *ud, int level, const char *msg)
{
    struct logcap *lc = ud;
    if (level >= KVT_LOG_WARN)
        lc->warns++;
    else
        lc->infos++;
    lc->store_failed += strstr(msg, "store failed (disk full or unwritable?)") != NULL;
    lc->not_stored += strstr(msg, "entry not stored:") != NULL;
    lc->restore_failed += strstr(msg, "restore failed") != NULL;
    snprintf(lc->last, sizeof(lc->last), "%s", msg);
}

static kvt_store *open_ex(const char *dir, uint64_t max_bytes, struct logcap *lc,
                          void (*tweak)(struct kvt_store_opts *))
{
    struct kvt_store_opts o;
    store_opts_for(&o, MODEL, FP, TOK);
    if (max_bytes) /* 0: the default cap */
        o.max_bytes = max_bytes;
    o.log = lc ? log_fn : NULL;
    o.log_ud = lc;
    if (tweak)
        tweak(&o);
    kvt_store *s;
    int rc = kvt_store_open(dir, &o, &s);
    if (rc)
        fail_msg("kvt_store_open: %s", kvt_last_error());
    return s;
}

static kvt_store *open_store(const char *dir, uint64_t max_bytes, struct logcap *lc)
{
    return open_ex(dir, max_bytes, lc, NULL);
}

static void put_ok(kvt_store *s, const int32_t *tok, size_t n, const char *ns, bool trimmable)
{
    struct kvt_entry *e = synth(tok, n, ns, trimmable);
    int rc = kvt_store_put(s, e, NULL, NULL);
    if (rc)
        fail_msg("kvt_store_put: %s", kvt_last_error());
    kvt_entry_free(e);
}

static uint64_t plan_size(const int32_t *tok, size_t n, const char *ns, bool trimmable)
{
    struct kvt_entry *e = synth(tok, n, ns, trimmable);
    e->meta.model_id = strdup(MODEL);
    e->meta.config_fingerprint = strdup(FP);
    e->meta.tokenizer_hash = strdup(TOK);
    uint64_t f;
    assert_int_equal(kvt_file_plan_size(e, &f), 0);
    kvt_entry_free(e);
    return f;
}

/* find + restore; the restored entry must be the one of @p want_tok (NULL: a miss). */
static void expect_hit(kvt_store *s, const int32_t *prompt, size_t n, const char *ns,
                       size_t want_plen, const int32_t *want_tok, size_t want_n, bool trimmable)
{
    struct kvt_hit hit;
    assert_int_equal(kvt_store_find(s, prompt, n, ns, &hit), 0);
    assert_int_equal(hit.prefix_len, want_plen);
    if (!want_tok)
        return;
    assert_int_equal(hit.n_tokens, want_n);
    assert_int_equal(hit.trimmable, trimmable);
    struct kvt_entry *e;
    assert_int_equal(kvt_store_restore(s, &hit, &e), 0);
    assert_entry_is(e, want_tok, want_n, ns ? ns : "", trimmable);
    kvt_entry_free(e);
}

static char *ns_dir(kvt_store *s, const char *ns)
{
    char h[17];
    kvt_ns_hash(ns, h);
    return strf("%s/%s", kvt_store_root(s), h);
}

/* Files in @p dir whose names end with @p suffix. */
static int count_files(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *de;
    size_t k = strlen(suffix);
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        n += de->d_name[0] != '.' && l >= k && !strcmp(de->d_name + l - k, suffix);
    }
    closedir(d);
    return n;
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static void set_mtime(const char *path, time_t secs_ago)
{
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= secs_ago;
    ts[1] = ts[0];
    assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static char *path_of(kvt_store *s, const int32_t *tok, size_t n, const char *ns)
{
    struct kvt_store_record *v;
    size_t count;
    assert_int_equal(kvt_store_list(s, &v, &count), 0);
    char *p = NULL;
    for (size_t i = 0; i < count && !p; i++) {
        if (v[i].n_tokens != n || strcmp(v[i].ns, ns))
            continue;
        struct kvt_header *h;
        assert_int_equal(kvt_file_read_header(v[i].path, NULL, &h), 0);
        if (!memcmp(h->tokens, tok, n * sizeof(*tok)))
            p = strdup(v[i].path);
        kvt_header_free(h);
    }
    kvt_store_list_free(v);
    assert_non_null(p);
    return p;
}

/* ---- tests ---------------------------------------------------------------------------- */

static void test_layout(void **state)
{
    (void)state;
    char h[17];
    kvt_ns_hash("", h);
    assert_string_equal(h, "base");
    kvt_ns_hash(NULL, h);
    assert_string_equal(h, "base");
    kvt_ns_hash("abc", h); /* FORMAT.md §7: 2a4f1d7cb516c72, unpadded */
    assert_string_equal(h, "2a4f1d7cb516c72");
    kvt_ns_hash("lora-a", h);
    char want[17];
    snprintf(want, sizeof(want), "%llx", (unsigned long long)kvt_wyhash(0, "lora-a", 6));
    assert_string_equal(h, want);

    char *dir = scratch_dir("layout");
    kvt_store *s = open_store(dir, 0, NULL);
    char *root = strf("%s/%s", dir, FP);
    assert_string_equal(kvt_store_root(s), root);
    const int32_t tok[] = {5, 6, 7};
    put_ok(s, tok, 3, "lora-a", true);
    struct kvt_store_record *v;
    size_t n;
    assert_int_equal(kvt_store_list(s, &v, &n), 0);
    assert_int_equal(n, 1);
    char *prefix = strf("%s/%s/", root, want);
    assert_int_equal(strncmp(v[0].path, prefix, strlen(prefix)), 0);
    const char *name = v[0].path + strlen(prefix);
    assert_int_equal(strlen(name), 36 + 6);
    assert_string_equal(name + 36, ".mlxkv");
    for (int i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23)
            assert_int_equal(name[i], '-');
        else
            assert_non_null(strchr("0123456789abcdef", name[i]));
    }
    assert_int_equal(name[14], '4');           /* version 4 */
    assert_non_null(strchr("89ab", name[19])); /* RFC 4122 variant */
    assert_string_equal(v[0].ns, "lora-a");
    assert_int_equal(v[0].n_tokens, 3);
    assert_true(v[0].trimmable);
    kvt_store_list_free(v);
    free(prefix);
    kvt_store_close(s);

    /* A fingerprint that is not one directory name is refused. */
    struct kvt_store_opts o;
    store_opts_for(&o, MODEL, "a/b", TOK);
    assert_int_equal(kvt_store_open(dir, &o, &s), -EINVAL);
    assert_null(s);
    o.config_fingerprint = "..";
    assert_int_equal(kvt_store_open(dir, &o, &s), -EINVAL);
    /* Values are literal after kvt_store_opts_init(): the unusable ones are refused. */
    o.config_fingerprint = FP;
    o.max_bytes = 0;
    assert_int_equal(kvt_store_open(dir, &o, &s), -EINVAL);
    store_opts_for(&o, MODEL, FP, TOK);
    o.max_header_bytes = 0;
    assert_int_equal(kvt_store_open(dir, &o, &s), -EINVAL);
    o.max_header_bytes = 1 << 20;
    o.tmp_grace_ms = -1;
    assert_int_equal(kvt_store_open(dir, &o, &s), -EINVAL);
    assert_null(s);
    free(root);
    rm_rf(dir);
    free(dir);
}

static void test_restart_recovery(void **state)
{
    (void)state;
    char *dir = scratch_dir("restart");
    int32_t a[40], b[25], c[3] = {9, 9, 9};
    for (int i = 0; i < 40; i++)
        a[i] = 1000 + i;
    for (int i = 0; i < 25; i++)
        b[i] = i < 10 ? 1000 + i : 5000 + i; /* shares 10 tokens with a */
    kvt_store *s = open_store(dir, 0, NULL);
    put_ok(s, a, 40, "", true);
    put_ok(s, b, 25, "", false);
    put_ok(s, c, 3, "x", true);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 3);
    assert_int_equal(st.spills, 3);
    uint64_t bytes = st.total_bytes;
    kvt_store_close(s);

    s = open_store(dir, 0, NULL);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 3);
    assert_int_equal(st.total_bytes, bytes);
    assert_int_equal(st.longest_durable_prefix_tokens, 40);
    assert_int_equal(st.skipped_files, 0);
    int32_t prompt[50];
    memcpy(prompt, a, sizeof(a));
    for (int i = 40; i < 50; i++)
        prompt[i] = 7;
    expect_hit(s, prompt, 50, "", 40, a, 40, true);
    memcpy(prompt, b, sizeof(b));
    prompt[25] = 1;
    expect_hit(s, prompt, 26, "", 25, b, 25, false);
    const int32_t cp[] = {9, 9, 9, 9};
    expect_hit(s, cp, 4, "x", 3, c, 3, true);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.restores, 3);
    assert_true(st.restore_ms_last >= 0);
    kvt_store_close(s);
    rm_rf(dir);
    free(dir);
}

static void test_ns_isolation(void **state)
{
    (void)state;
    char *dir = scratch_dir("ns");
    kvt_store *s = open_store(dir, 0, NULL);
    const int32_t t[] = {1, 2, 3, 4}, p[] = {1, 2, 3, 4, 5};
    put_ok(s, t, 4, "", true);
    put_ok(s, t, 4, "lora-a", false);
    put_ok(s, t, 4, "lora-a+lora-b", true);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 3); /* identical tokens in other namespaces are no duplicates */
    expect_hit(s, p, 5, "", 4, t, 4, true);
    expect_hit(s, p, 5, NULL, 4, t, 4, true);
    expect_hit(s, p, 5, "lora-a", 4, t, 4, false);
    expect_hit(s, p, 5, "lora-a+lora-b", 4, t, 4, true);
    expect_hit(s, p, 5, "lora-b", 0, NULL, 0, false);
    assert_false(kvt_store_has_durable_prefix(s, t, 4, "lora-b"));
    assert_true(kvt_store_has_durable_prefix(s, t, 4, "lora-a"));
    char *d0 = ns_dir(s, ""), *d1 = ns_dir(s, "lora-a");
    assert_int_equal(count_files(d0, ".mlxkv"), 1);
    assert_int_equal(count_files(d1, ".mlxkv"), 1);
    free(d0);
    free(d1);
    kvt_store_close(s);
    rm_rf(dir);
    free(dir);
}

/* A placement that must not be reached: its refusal would be -EPERM. */
static int refuse_placement(void *ud, const struct kvt_header *h, void **dst)
{
    (void)ud, (void)h, (void)dst;
    return -EPERM;
}

/* A hit names the store that found it: another store's restores refuse it (-EINVAL) rather
 * than serving their own record of the same id. */
static void test_hit_of_another_store_refused(void **state)
{
    (void)state;
    char *da = scratch_dir("hit-a"), *db = scratch_dir("hit-b");
    kvt_store *a = open_store(da, 0, NULL), *b = open_store(db, 0, NULL);
    const int32_t ta[] = {1, 2, 3, 4}, pa[] = {1, 2, 3, 4, 5};
    const int32_t tb[] = {7, 8, 9, 10}, pb[] = {7, 8, 9, 10, 11};
    put_ok(a, ta, 4, "", true);
    put_ok(b, tb, 4, "", true);
    struct kvt_hit ha, hb;
    assert_int_equal(kvt_store_find(a, pa, 5, "", &ha), 0);
    assert_int_equal(kvt_store_find(b, pb, 5, "", &hb), 0);
    assert_int_equal(ha.prefix_len, 4);
    assert_int_equal(ha.id, hb.id); /* the same record id in both: only the source tells */
    assert_int_not_equal(ha.store, 0);
    assert_int_not_equal(ha.store, hb.store);
    /* the field sits in the padding after trimmable: 0.1.0's size and offsets */
    assert_int_equal(offsetof(struct kvt_hit, store), offsetof(struct kvt_hit, trimmable) + 4);
    assert_int_equal(sizeof(struct kvt_hit), 3 * sizeof(uint64_t) + 8);

    struct kvt_entry *e = (struct kvt_entry *)1;
    assert_int_equal(kvt_store_restore(b, &ha, &e), -EINVAL);
    assert_null(e);
    assert_non_null(strstr(kvt_last_error(), "another store"));
    struct kvt_header *h = (struct kvt_header *)1;
    assert_int_equal(kvt_store_restore_into(b, &ha, refuse_placement, NULL, &h), -EINVAL);
    assert_null(h);
    struct kvt_hit none = ha;
    none.store = 0; /* a hit no store made */
    assert_int_equal(kvt_store_restore(a, &none, &e), -EINVAL);

    struct kvt_store_stats st;
    kvt_store_get_stats(b, &st);
    assert_int_equal(st.entries, 1); /* b's record is kept and still restores */
    assert_int_equal(st.restore_misses, 0);
    expect_hit(b, pb, 5, "", 4, tb, 4, true);
    assert_int_equal(kvt_store_restore(a, &ha, &e), 0);
    assert_entry_is(e, ta, 4, "", true);
    kvt_entry_free(e);
    kvt_store_close(a);
    kvt_store_close(b);
    rm_rf(da);
    rm_rf(db);
    free(da);
    free(db);
}

static void test_find_rules(void **state)
{
    (void)state;
    char *dir = scratch_dir("find");
    kvt_store *s = open_store(dir, 0, NULL);
    const int32_t u[] = {1, 2, 3, 4};        /* untrimmable */
    const int32_t tr[] = {1, 2, 3, 4, 5, 6}; /* trimmable, extends u */
    const int32_t x[] = {1, 2, 3, 9};        /* trimmable, ties with tr below */
    put_ok(s, u, 4, "", false);

    /* Prompts of length <= 1 always miss. */
    expect_hit(s, u, 1, "", 0, NULL, 0, false);
    expect_hit(s, u, 0, "", 0, NULL, 0, false);
    /* An exact-length prompt needs a one-token trim: no hit from an untrimmable entry. */
    expect_hit(s, u, 4, "", 0, NULL, 0, false);
    /* An untrimmable entry serves prompts that extend it by at least one token. */
    const int32_t ext[] = {1, 2, 3, 4, 8};
    expect_hit(s, ext, 5, "", 4, u, 4, false);
    /* ... but never a prompt that diverges inside it. */
    const int32_t div[] = {1, 2, 7, 7, 7};
    expect_hit(s, div, 5, "", 0, NULL, 0, false);

    /* A trimmable entry supersedes its strict ancestors (STORE.md §9 step 4), u included. */
    put_ok(s, tr, 6, "", true);
    assert_true(kvt_store_has_durable_prefix(s, u, 4, ""));
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 1);
    /* A longer trimmable entry serves a divergent prompt; the caller trims. */
    expect_hit(s, div, 5, "", 2, tr, 6, true);
    /* Exact-length prompt equal to a trimmable entry: prefix n - 1. */
    expect_hit(s, tr, 6, "", 5, tr, 6, true);
    const int32_t ext2[] = {1, 2, 3, 4, 5, 6, 7};
    expect_hit(s, ext2, 7, "", 6, tr, 6, true);

    /* Ties keep the earliest entry in index order. */
    put_ok(s, x, 4, "", true);
    const int32_t tie[] = {1, 2, 3, 7, 7};
    expect_hit(s, tie, 5, "", 3, tr, 6, true);
    /* The deeper match wins over the earlier one. */
    const int32_t deep[] = {1, 2, 3, 9, 0};
    expect_hit(s, deep, 5, "", 4, x, 4, true);
    /* Restores do not change index order: the tie still goes to tr. */
    expect_hit(s, tie, 5, "", 3, tr, 6, true);
    kvt_store_close(s);
    rm_rf(dir);
    free(dir);
}

static void test_supersede_and_duplicates(void **state)
{
    (void)state;
    char *dir = scratch_dir("supersede");
    kvt_store *s = open_store(dir, 0, NULL);
    char *d = ns_dir(s, "");
    struct kvt_store_stats st;
    const int32_t t[] = {3, 1, 4, 1, 5}, longer[] = {3, 1, 4, 1, 5, 9, 2};
    const int32_t longest[] = {3, 1, 4, 1, 5, 9, 2, 6};

    /* Exact duplicates are replaced whatever their trimmability. */
    put_ok(s, t, 5, "", false);
    put_ok(s, t, 5, "", true);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 1);
    assert_int_equal(count_files(d, ".mlxkv"), 1);
    const int32_t p[] = {3, 1, 4, 1, 5, 0};
    expect_hit(s, p, 6, "", 5, t, 5, true);
    put_ok(s, t, 5, "", false);
    assert_int_equal(count_files(d, ".mlxkv"), 1);
    expect_hit(s, p, 6, "", 5, t, 5, false);

    /* An untrimmable entry never supersedes its ancestors. */
    put_ok(s, longer, 7, "", false);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 2);
    assert_int_equal(count_files(d, ".mlxkv"), 2);

    /* A trimmable one removes every strict ancestor, trimmable or not. */
    put_ok(s, longest, 8, "", true);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 1);
    assert_int_equal(count_files(d, ".mlxkv"), 1);
    assert_int_equal(st.spills, 5);
    assert_int_equal(st.evictions, 0);

    /* Ancestors in another namespace stay. */
    put_ok(s, t, 5, "other", true);
    put_ok(s, longest, 8, "", true);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 2);
    free(d);
    kvt_store_close(s);
    rm_rf(dir);
    free(dir);
}

static void test_cap_eviction(void **state)
{
    (void)state;
    char *dir = scratch_dir("cap");
    const int32_t e[4][3] = {{10, 1, 1}, {20, 2, 2}, {30, 3, 3}, {40, 4, 4}};
    uint64_t f = plan_size(e[0], 3, "", true);
    kvt_store *s = open_store(dir, 0, NULL);
    for (int i = 0; i < 4; i++)
        put_ok(s, e[i], 3, "", true);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.total_bytes, 4 * f);
    /* Ages: e2 oldest, then e0, e3, e1. */
    const int ages[4] = {900, 700, 1000, 800};
    char *paths[4];
    for (int i = 0; i < 4; i++) {
        paths[i] = path_of(s, e[i], 3, "");
        set_mtime(paths[i], ages[i]);
    }
    kvt_store_close(s);

    /* A lowered cap applies at open (STORE.md §12.6): the two oldest by mtime go. */
    s = open_store(dir, 2 * f + f / 2, NULL);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 2);
    assert_int_equal(st.evictions, 2);
    assert_int_equal(st.max_bytes, 2 * f + f / 2);
    assert_false(exists(paths[2]));
    assert_false(exists(paths[0]));
    assert_true(exists(paths[1]));
    assert_true(exists(paths[3]));

    /* The LRU bump: restoring e3 makes it newer than e1, on disk too. */
    const int32_t p3[] = {40, 4, 4, 0};
    expect_hit(s, p3, 4, "", 3, e[3], 3, true);
    struct stat sb;
    assert_int_equal(stat(paths[3], &sb), 0);
    assert_true(sb.st_mtime > time(NULL) - 100);
    kvt_store_close(s);

    /* Across a restart the bumped mtime orders eviction: e1 goes, e3 stays. */
    s = open_store(dir, f, NULL);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 1);
    assert_int_equal(st.evictions, 1);
    assert_false(exists(paths[1]));
    expect_hit(s, p3, 4, "", 3, e[3], 3, true);

    /* A store at the cap evicts the oldest to make room: the new entry is the newest. */
    put_ok(s, e[0], 3, "", true);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 1);
    assert_int_equal(st.evictions, 2);
    assert_false(exists(paths[3]));
    const int32_t p0[] = {10, 1, 1, 0};
    expect_hit(s, p0, 4, "", 3, e[0], 3, true);
    kvt_store_close(s);
    for (int i = 0; i < 4; i++)
        free(paths[i]);
    rm_rf(dir);
    free(dir);
}

static void test_oversize_refused(void **state)
{
    (void)state;
    char *dir = scratch_dir("oversize");
    const int32_t t[] = {1, 2, 3};
    uint64_t f = plan_size(t, 3, "", true);
    struct logcap lc = {0};
    kvt_store *s = open_store(dir, f - 1, &lc);
    struct kvt_entry *e = synth(t, 3, "", true);
    assert_int_equal(kvt_store_put(s, e, NULL, NULL), KVT_E_TOO_LARGE);
    assert_int_equal(lc.not_stored, 1);
    char *want = strf("[ssd-cache] entry not stored: %llu bytes exceeds the %llu-byte cap",
                      (unsigned long long)f, (unsigned long long)(f - 1));
    assert_string_equal(lc.last, want);
    free(want);
    char *d = ns_dir(s, "");
    assert_int_equal(count_files(d, ".mlxkv"), 0);
    assert_int_equal(count_files(d, ".tmp"), 0);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.store_failures, 1);
    assert_int_equal(st.spills, 0);
    assert_int_equal(st.entries, 0);
    kvt_store_close(s);

    /* Exactly at the cap is fine. */
    s = open_store(dir, f, &lc);
    assert_int_equal(kvt_store_put(s, e, NULL, NULL), 0);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 1);
    assert_int_equal(st.total_bytes, f);
    kvt_store_close(s);
    kvt_entry_free(e);
    free(d);
    rm_rf(dir);
    free(dir);
}

/* An entry whose token list is longer than its kv cache would be unindexable (V21). */
static void test_put_refuses_unindexable(void **state)
{
    (void)state;
    char *dir = scratch_dir("v21");
    kvt_store *s = open_store(dir, 0, NULL);
    const int32_t t[] = {1, 2, 3, 4};
    kvt_cache *c;
    assert_int_equal(synth_kv(t, 3, 0, &c), 0);
    struct kvt_entry *e;
    assert_int_equal(kvt_entry_new(t, 4, &c, 1, "", &e), 0);
    assert_int_equal(kvt_store_put(s, e, NULL, NULL), -EINVAL);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.store_failures, 1);
    assert_int_equal(st.entries, 0);
    kvt_entry_free(e);
    kvt_store_close(s);
    rm_rf(dir);
    free(dir);
}

static void copy_file(const char *from, const char *to)
{
    size_t n;
    uint8_t *b = read_file(from, &n);
    assert_non_null(b);
    assert_int_equal(write_file(to, b, n), 0);
    free(b);
}

static bool golden_indexable(json_t *f)
{
    return json_is_true(json_object_get(f, "ok")) &&
           json_is_true(json_object_get(f, "indexable")) &&
           !strcmp(json_string_value(json_object_get(f, "modelId")), "golden/model") &&
           !strcmp(json_string_value(json_object_get(f, "configFingerprint")), "fp-golden") &&
           !strcmp(json_string_value(json_object_get(f, "tokenizerHash")), "tk-golden");
}

static bool golden_corrupt_at_scan(json_t *f)
{
    json_t *cat = json_object_get(f, "category");
    return cat && !strcmp(json_string_value(cat), "corrupt") &&
           !json_is_true(json_object_get(f, "only_with_verify"));
}

static void golden_scan(bool quarantine)
{
    char *dir = scratch_dir(quarantine ? "golden-q" : "golden");
    char *ns = strf("%s/fp-golden/base", dir);
    char *mid = strf("%s/fp-golden", dir);
    assert_int_equal(mkdir(mid, 0755), 0);
    assert_int_equal(mkdir(ns, 0755), 0);
    json_t *root = load_json(golden_path("expected.json"));
    json_t *files = json_object_get(root, "files");
    const char *name;
    json_t *f;
    uint64_t want_entries = 0, want_skipped = 0, want_corrupt = 0;
    json_object_foreach(files, name, f)
    {
        if (!strcmp(name, "kv.mlxkv"))
            continue; /* has the tokens of tensor-byte-flipped.mlxkv: added further down */
        char *to = strf("%s/%s", ns, name);
        copy_file(golden_path(name), to);
        free(to);
        if (golden_corrupt_at_scan(f))
            want_corrupt++;
        else if (golden_indexable(f) || json_is_true(json_object_get(f, "only_with_verify")))
            want_entries++;
        else
            want_skipped++;
    }
    assert_true(want_corrupt >= 5 && want_skipped >= 5 && want_entries >= 5);
    /* Other names are ignored; another fingerprint's directory is never touched. */
    char *other = strf("%s/fp-other", dir), *other_f = strf("%s/fp-other/x.mlxkv", dir);
    assert_int_equal(mkdir(other, 0755), 0);
    copy_file(golden_path("truncated.mlxkv"), other_f);
    char *readme = strf("%s/notes.txt", ns);
    assert_int_equal(write_file(readme, "hi", 2), 0);

    struct logcap lc = {0};
    struct kvt_store_opts o;
    store_opts_for(&o, "golden/model", "fp-golden", "tk-golden");
    o.quarantine = quarantine;
    o.log = log_fn;
    o.log_ud = &lc;
    kvt_store *s;
    assert_int_equal(kvt_store_open(dir, &o, &s), 0);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, want_entries);
    assert_int_equal(st.corrupt_files, want_corrupt);
    assert_int_equal(st.skipped_files, want_skipped);
    json_object_foreach(files, name, f)
    {
        if (!strcmp(name, "kv.mlxkv"))
            continue;
        char *p = strf("%s/%s", ns, name), *q = strf("%s/%s.corrupt", ns, name);
        if (golden_corrupt_at_scan(f)) {
            assert_false(exists(p));
            assert_int_equal(exists(q), quarantine);
        } else {
            assert_true(exists(p)); /* foreign, newer, unsupported and V21 files stay */
            assert_false(exists(q));
        }
        free(p);
        free(q);
    }
    assert_true(exists(other_f));
    assert_true(exists(readme));

    /* The tensor-flipped file passes the header checks and fails its restore (L3). */
    struct kvt_header *h;
    char *flipped = strf("%s/tensor-byte-flipped.mlxkv", ns);
    assert_int_equal(kvt_file_read_header(flipped, NULL, &h), 0);
    int32_t prompt[64];
    memcpy(prompt, h->tokens, h->n_tokens * sizeof(*prompt));
    prompt[h->n_tokens] = 1;
    struct kvt_hit hit;
    assert_int_equal(kvt_store_find(s, prompt, h->n_tokens + 1, "", &hit), 0);
    assert_int_equal(hit.prefix_len, h->n_tokens);
    struct kvt_entry *e = (struct kvt_entry *)1;
    assert_int_equal(kvt_store_restore(s, &hit, &e), 0);
    assert_null(e);
    assert_true(lc.restore_failed >= 1);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, want_entries - 1);
    assert_int_equal(st.corrupt_files, want_corrupt + 1);
    assert_int_equal(st.restore_misses, 1);
    assert_false(exists(flipped));
    char *fq = strf("%s.corrupt", flipped);
    assert_int_equal(exists(fq), quarantine);
    /* The same hit again is a clean miss. */
    assert_int_equal(kvt_store_restore(s, &hit, &e), 0);
    assert_null(e);
    kvt_header_free(h);

    /* Golden kv.mlxkv, published later, enters at a refresh and restores. */
    char *kv = strf("%s/kv.mlxkv", ns);
    copy_file(golden_path("kv.mlxkv"), kv);
    assert_int_equal(kvt_store_refresh(s), 0);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, want_entries);
    assert_int_equal(kvt_file_read_header(golden_path("kv.mlxkv"), NULL, &h), 0);
    memcpy(prompt, h->tokens, h->n_tokens * sizeof(*prompt));
    prompt[h->n_tokens] = 1;
    assert_int_equal(kvt_store_find(s, prompt, h->n_tokens + 1, "", &hit), 0);
    assert_int_equal(hit.prefix_len, h->n_tokens);
    assert_int_equal(kvt_store_restore(s, &hit, &e), 0);
    assert_non_null(e);
    assert_int_equal(e->n_tokens, h->n_tokens);
    kvt_entry_free(e);
    kvt_header_free(h);
    kvt_store_close(s);

    /* A reopen changes nothing: skipped files stay skipped, .corrupt files are not read. */
    assert_int_equal(kvt_store_open(dir, &o, &s), 0);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, want_entries);
    assert_int_equal(st.corrupt_files, 0);
    assert_int_equal(st.skipped_files, want_skipped);
    kvt_store_close(s);

    /* A store of another model skips (and keeps) this model's entries. */
    o.model_id = "golden/other-model";
    assert_int_equal(kvt_store_open(dir, &o, &s), 0);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.skipped_files, want_skipped + want_entries);
    kvt_store_close(s);
    assert_true(exists(kv));

    free(kv);
    free(fq);
    free(flipped);
    free(readme);
    free(other);
    free(other_f);
    json_decref(root);
    free(mid);
    free(ns);
    rm_rf(dir);
    free(dir);
}

static void test_golden_files_at_open(void **state)
{
    (void)state;
    golden_scan(false);
}

static void test_golden_files_quarantined(void **state)
{
    (void)state;
    golden_scan(true);
}

static void rewrite_byte(const char *path, long off, int delta)
{
    size_t n;
    uint8_t *b = read_file(path, &n);
    assert_non_null(b);
    size_t at = off < 0 ? n + (size_t)off : (size_t)off;
    b[at] = (uint8_t)(b[at] + delta);
    assert_int_equal(write_file(path, b, n), 0);
    free(b);
}

/* Files the store wrote, damaged afterwards; and another model's entry next to them. */
static void test_synthesized_damage(void **state)
{
    (void)state;
    char *dir = scratch_dir("damage");
    kvt_store *s = open_store(dir, 0, NULL);
    const int32_t a[] = {1, 1, 1}, b[] = {2, 2, 2}, c[] = {3, 3, 3}, d[] = {4, 4, 4};
    put_ok(s, a, 3, "", true);
    put_ok(s, b, 3, "", true);
    put_ok(s, c, 3, "", true);
    char *pa = path_of(s, a, 3, ""), *pb = path_of(s, b, 3, ""), *pc = path_of(s, c, 3, "");
    kvt_store_close(s);

    struct kvt_store_opts o;
    store_opts_for(&o, "test/other-model", FP, TOK);
    assert_int_equal(kvt_store_open(dir, &o, &s), 0);
    struct kvt_entry *e = synth(d, 3, "", true);
    assert_int_equal(kvt_store_put(s, e, NULL, NULL), 0);
    kvt_entry_free(e);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.skipped_files, 3); /* test/model's entries, left alone */
    kvt_store_close(s);

    rewrite_byte(pa, 40, 1); /* a header byte: V6 */
    assert_int_equal(truncate(pb, 20000), 0);
    char *pd = NULL;
    {
        char *nsd = strf("%s/%s/base", dir, FP);
        DIR *dd = opendir(nsd);
        struct dirent *de;
        while ((de = readdir(dd))) {
            char *p = strf("%s/%s", nsd, de->d_name);
            if (de->d_name[0] != '.' && strcmp(p, pa) && strcmp(p, pb) && strcmp(p, pc))
                pd = p;
            else
                free(p);
        }
        closedir(dd);
        free(nsd);
    }
    assert_non_null(pd);

    s = open_store(dir, 0, NULL);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 1);
    assert_int_equal(st.corrupt_files, 2);
    assert_int_equal(st.skipped_files, 1);
    assert_false(exists(pa));
    assert_false(exists(pb));
    assert_true(exists(pc));
    assert_true(exists(pd));
    const int32_t pr[] = {3, 3, 3, 0};
    expect_hit(s, pr, 4, "", 3, c, 3, true);
    kvt_store_close(s);
    free(pa);
    free(pb);
    free(pc);
    free(pd);
    rm_rf(dir);
    free(dir);
}

static void grace_zero(struct kvt_store_opts *o)
{
    o->tmp_grace_ms = 0;
}

static void test_tmp_reaping(void **state)
{
    (void)state;
    char *dir = scratch_dir("tmp");
    kvt_store *s = open_store(dir, 0, NULL);
    char *d = ns_dir(s, "");
    const int32_t t[] = {1, 2};
    put_ok(s, t, 2, "", true);
    kvt_store_close(s);

    char *dead = strf("%s/dead.mlxkv.tmp", d), *young = strf("%s/young.mlxkv.tmp", d);
    char *held = strf("%s/held.mlxkv.tmp", d), *child = strf("%s/child.mlxkv.tmp", d);
    assert_int_equal(write_file(dead, "x", 1), 0);
    assert_int_equal(write_file(young, "x", 1), 0);
    assert_int_equal(write_file(held, "x", 1), 0);
    assert_int_equal(write_file(child, "x", 1), 0);
    set_mtime(dead, 3600);
    set_mtime(held, 3600);
    set_mtime(child, 3600);

    /* A writer in this process (another descriptor) and one in a child hold their locks. */
    int hfd = open(held, O_RDWR);
    assert_true(hfd >= 0);
    assert_int_equal(flock(hfd, LOCK_EX), 0);
    int ready[2], go[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(go), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* Only this end of each pipe: if the suite dies, read() sees EOF and we leave. */
        close(hfd);
        close(ready[0]);
        close(go[1]);
        int fd = open(child, O_RDWR);
        char c = 0;
        if (fd < 0 || flock(fd, LOCK_EX) != 0)
            _exit(1);
        if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1)
            _exit(2);
        _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);

    s = open_store(dir, 0, NULL);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.tmp_reaped, 1);
    assert_false(exists(dead));
    assert_true(exists(young)); /* younger than the grace period */
    assert_true(exists(held));
    assert_true(exists(child));
    assert_int_equal(st.entries, 1);
    kvt_store_close(s);

    /* Grace 0: the young unlocked one goes; locked ones still stay. */
    s = open_ex(dir, 0, NULL, grace_zero);
    assert_false(exists(young));
    assert_true(exists(held));
    assert_true(exists(child));

    /* Once the writers are gone, a refresh of the same handle reaps their files. */
    assert_int_equal(write(go[1], &c, 1), 1);
    int wst;
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    close(hfd);
    assert_int_equal(kvt_store_refresh(s), 0);
    assert_false(exists(held));
    assert_false(exists(child));
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.tmp_reaped, 3);
    assert_int_equal(st.entries, 1);
    kvt_store_close(s);
    close(ready[0]);
    close(go[1]);
    free(dead);
    free(young);
    free(held);
    free(child);
    free(d);
    rm_rf(dir);
    free(dir);
}

static void test_vanished_and_refresh(void **state)
{
    (void)state;
    char *dir = scratch_dir("refresh");
    struct logcap lc = {0};
    kvt_store *a = open_store(dir, 0, &lc), *b = open_store(dir, 0, &lc);
    const int32_t t1[] = {1, 2, 3}, t2[] = {4, 5, 6}, t3[] = {7, 8, 9};
    const int32_t p1[] = {1, 2, 3, 0}, p2[] = {4, 5, 6, 0}, p3[] = {7, 8, 9, 0};
    put_ok(a, t1, 3, "", true);
    put_ok(a, t2, 3, "q", true);
    /* b sees a's files after a refresh. */
    expect_hit(b, p1, 4, "", 0, NULL, 0, true);
    assert_int_equal(kvt_store_refresh(b), 0);
    expect_hit(b, p1, 4, "", 3, t1, 3, true);
    expect_hit(b, p2, 4, "q", 3, t2, 3, true);

    /* a file removed behind b's back: a clean, silent miss that drops the record. */
    char *p = path_of(a, t1, 3, "");
    struct kvt_hit hit;
    assert_int_equal(kvt_store_find(b, p1, 4, "", &hit), 0);
    assert_int_equal(hit.prefix_len, 3);
    assert_int_equal(unlink(p), 0);
    int warns = lc.warns;
    struct kvt_entry *e;
    assert_int_equal(kvt_store_restore(b, &hit, &e), 0);
    assert_null(e);
    assert_int_equal(lc.warns, warns);
    struct kvt_store_stats st;
    kvt_store_get_stats(b, &st);
    assert_int_equal(st.restore_misses, 1);
    assert_int_equal(st.entries, 1);
    /* a learns of the deletion at its refresh. */
    assert_int_equal(kvt_store_refresh(a), 0);
    kvt_store_get_stats(a, &st);
    assert_int_equal(st.entries, 1);
    expect_hit(a, p1, 4, "", 0, NULL, 0, true);

    /* A whole namespace directory removed: its records go at the next refresh. */
    char *qd = ns_dir(a, "q");
    rm_rf(qd);
    assert_int_equal(kvt_store_refresh(b), 0);
    expect_hit(b, p2, 4, "q", 0, NULL, 0, true);
    kvt_store_get_stats(b, &st);
    assert_int_equal(st.entries, 0);

    /* Refresh then evicts to cap, counting files from both handles. */
    put_ok(b, t3, 3, "", true);
    assert_int_equal(kvt_store_refresh(a), 0);
    expect_hit(a, p3, 4, "", 3, t3, 3, true);
    kvt_store_close(a);
    kvt_store_close(b);
    free(qd);
    free(p);
    rm_rf(dir);
    free(dir);
}

static void read_only(struct kvt_store_opts *o)
{
    o->read_only = true;
    o->tmp_grace_ms = 0;
}

static void test_read_only(void **state)
{
    (void)state;
    char *dir = scratch_dir("ro");
    kvt_store *s = open_ex(dir, 0, NULL, read_only); /* a missing directory is empty */
    char *root = strf("%s/%s", dir, FP);
    assert_false(exists(root));
    struct kvt_entry *e = synth((const int32_t[]){1, 2}, 2, "", true);
    assert_int_equal(kvt_store_put(s, e, NULL, NULL), KVT_E_STATE);
    kvt_store_close(s);

    s = open_store(dir, 0, NULL);
    assert_int_equal(kvt_store_put(s, e, NULL, NULL), 0);
    const int32_t t2[] = {5, 5};
    put_ok(s, t2, 2, "", true);
    char *p = path_of(s, t2, 2, "");
    char *d = ns_dir(s, "");
    kvt_store_close(s);
    rewrite_byte(p, 30, 1);
    char *tmp = strf("%s/dead.mlxkv.tmp", d);
    assert_int_equal(write_file(tmp, "x", 1), 0);
    set_mtime(tmp, 3600);

    /* Read-only with a 1-byte cap: nothing is evicted, reaped or removed. */
    s = open_ex(dir, 1, NULL, read_only);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 1);
    assert_int_equal(st.corrupt_files, 1);
    assert_int_equal(st.evictions, 0);
    assert_true(exists(p));
    assert_true(exists(tmp));
    const int32_t pr[] = {1, 2, 3};
    expect_hit(s, pr, 3, "", 2, (const int32_t[]){1, 2}, 2, true);
    kvt_store_close(s);
    kvt_entry_free(e);
    free(tmp);
    free(d);
    free(p);
    free(root);
    rm_rf(dir);
    free(dir);
}

/* An open that fails leaves the process's memory settings as they were; one that succeeds
 * applies them (the control). */
static void test_failed_open_changes_nothing(void **state)
{
    (void)state;
    char *dir = scratch_dir("open-fails");
    char *file = strf("%s/a-file", dir);
    assert_int_equal(write_file(file, "x", 1), 0);
    struct mem_probe mp;
    mem_probe_init(&mp);
    struct kvt_store_opts o;
    store_opts_for(&o, MODEL, FP, TOK);
    o.mem = &mp.m;
    kvt_store *s = NULL;
    assert_int_equal(kvt_store_open(file, &o, &s), -ENOTDIR); /* a file, not a directory */
    assert_null(s);
    mem_probe_check(&mp, false);

    assert_int_equal(kvt_store_open(dir, &o, &s), 0);
    kvt_store_close(s);
    mem_probe_check(&mp, true);
    free(file);
    rm_rf(dir);
    free(dir);
}

/* Every failure point of a put (each io call in turn fails): the put fails softly or
 * succeeds; no partial file is ever left; the store keeps serving. */
static void test_io_fault_loop(void **state)
{
    (void)state;
    char *dir = scratch_dir("faults");
    struct logcap lc = {0};
    kvt_store *s = open_store(dir, 0, &lc);
    char *d = ns_dir(s, "");
    const int32_t base[] = {1, 2, 3};
    put_ok(s, base, 3, "", true);
    int failures = 0;
    for (uint64_t nth = 1; nth < 200; nth++) {
        int32_t t[] = {9, (int32_t)nth, 9};
        struct kvt_entry *e = synth(t, 3, "", true);
        kvt_fault_reset();
        struct kvt_fault_rule r = {.op = KVT_FAULT_ANY, .nth = nth, .err = EIO};
        assert_int_equal(kvt_fault_arm(&r), 0);
        kvt_io_set(kvt_io_fault());
        int rc = kvt_store_put(s, e, NULL, NULL);
        kvt_io_set(NULL);
        bool injected = kvt_fault_injected() > 0;
        kvt_fault_reset();
        kvt_entry_free(e);
        struct kvt_store_stats st;
        kvt_store_get_stats(s, &st);
        assert_int_equal(count_files(d, ".tmp"), 0);
        assert_int_equal(count_files(d, ".mlxkv"), (int)st.entries);
        const int32_t pt[] = {9, (int32_t)nth, 9, 0};
        struct kvt_hit hit;
        assert_int_equal(kvt_store_find(s, pt, 4, "", &hit), 0);
        if (rc == 0) {
            assert_int_equal(hit.prefix_len, 3);
        } else {
            failures++;
            assert_true(injected);
            assert_int_equal(hit.prefix_len, 0);
        }
        const int32_t pb[] = {1, 2, 3, 0};
        expect_hit(s, pb, 4, "", 3, base, 3, true);
        if (!injected)
            break;
    }
    assert_true(failures >= 3);
    assert_int_equal(lc.store_failed, 1); /* warned once per store */
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.store_failures, (uint64_t)failures);
    kvt_store_close(s);
    free(d);
    rm_rf(dir);
    free(dir);
}

static void test_disk_full_fault(void **state)
{
    (void)state;
    char *dir = scratch_dir("enospc");
    struct logcap lc = {0};
    kvt_store *s = open_store(dir, 0, &lc);
    char *d = ns_dir(s, "");
    const int32_t a[] = {1, 2, 3}, b[] = {4, 5, 6}, c[] = {7, 8, 9};
    put_ok(s, a, 3, "", true);
    for (int round = 0; round < 2; round++) {
        kvt_fault_reset();
        struct kvt_fault_rule r = {.op = KVT_FAULT_PWRITE, .nth = 2, .err = ENOSPC, .sticky = true};
        assert_int_equal(kvt_fault_arm(&r), 0);
        kvt_io_set(kvt_io_fault());
        struct kvt_entry *e = synth(b, 3, "", true);
        int rc = kvt_store_put(s, e, NULL, NULL);
        kvt_io_set(NULL);
        kvt_fault_reset();
        kvt_entry_free(e);
        assert_int_equal(rc, -ENOSPC);
        assert_int_equal(count_files(d, ".tmp"), 0);
        assert_int_equal(count_files(d, ".mlxkv"), 1);
    }
    assert_int_equal(lc.store_failed, 1);
    assert_non_null(strstr(lc.last, "cold tier disabled for this entry"));
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.store_failures, 2);
    /* Serving continues, and the disk coming back makes puts work again. */
    const int32_t pa[] = {1, 2, 3, 0}, pc[] = {7, 8, 9, 0};
    expect_hit(s, pa, 4, "", 3, a, 3, true);
    put_ok(s, c, 3, "", true);
    expect_hit(s, pc, 4, "", 3, c, 3, true);
    kvt_store_close(s);
    free(d);
    rm_rf(dir);
    free(dir);
}

/* A real full filesystem: a 256 KiB tmpfs (needs the right to mount; skipped otherwise). */
static void test_disk_full_tmpfs(void **state)
{
    (void)state;
    char *mp = scratch_dir("tmpfs");
    if (geteuid() != 0 || mount("tmpfs", mp, "tmpfs", 0, "size=256k") != 0) {
        rm_rf(mp);
        free(mp);
        skip();
    }
    struct logcap lc = {0};
    kvt_store *s = open_store(mp, 0, &lc);
    int32_t tok[6000];
    int stored = 0, failed = 0;
    for (int k = 0; k < 6 && !failed; k++) {
        for (int i = 0; i < 6000; i++)
            tok[i] = k * 10000 + i;
        struct kvt_entry *e = synth(tok, 6000, "", true);
        int rc = kvt_store_put(s, e, NULL, NULL);
        kvt_entry_free(e);
        if (rc == 0)
            stored++;
        else {
            assert_int_equal(rc, -ENOSPC);
            failed++;
        }
    }
    assert_true(stored >= 1);
    assert_int_equal(failed, 1);
    assert_int_equal(lc.store_failed, 1);
    char *d = ns_dir(s, "");
    assert_int_equal(count_files(d, ".tmp"), 0);
    assert_int_equal(count_files(d, ".mlxkv"), stored);
    /* Everything stored before still restores. */
    for (int k = 0; k < stored; k++) {
        for (int i = 0; i < 6000; i++)
            tok[i] = k * 10000 + i;
        int32_t *p = malloc(6001 * sizeof(*p));
        memcpy(p, tok, sizeof(tok));
        p[6000] = 0;
        expect_hit(s, p, 6001, "", 6000, tok, 6000, true);
        free(p);
    }
    kvt_store_close(s);
    free(d);
    umount2(mp, MNT_DETACH);
    rm_rf(mp);
    free(mp);
}

/* A directory bigger than one scan batch: headers are read on several threads, yet the
 * index order is the name order and every file is classified. */
static void test_big_directory_scan(void **state)
{
    (void)state;
    char *dir = scratch_dir("big");
    char *ns = strf("%s/%s/base", dir, FP);
    char *mid = strf("%s/%s", dir, FP);
    assert_int_equal(mkdir(mid, 0755), 0);
    assert_int_equal(mkdir(ns, 0755), 0);
    free(mid);
    enum { N = 300 };
    char *bad = NULL;
    for (int i = 0; i < N; i++) {
        int32_t tok[3] = {i / 256, i % 256, 7};
        struct kvt_entry *e = synth(tok, 3, "", i % 3 != 0);
        e->meta.model_id = strdup(MODEL);
        e->meta.config_fingerprint = strdup(FP);
        e->meta.tokenizer_hash = strdup(TOK);
        char *p = strf("%s/%08x-0000-4000-8000-%012x.mlxkv", ns, (unsigned)(N - i), i);
        struct kvt_save_opts so = {.no_sync = true};
        assert_int_equal(kvt_file_save(p, e, &so, NULL), 0);
        kvt_entry_free(e);
        if (i == 123)
            bad = p;
        else
            free(p);
    }
    rewrite_byte(bad, 30, 1);
    kvt_store *s = open_store(dir, 0, NULL);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, N - 1);
    assert_int_equal(st.corrupt_files, 1);
    assert_false(exists(bad));
    struct kvt_store_record *v;
    size_t n;
    assert_int_equal(kvt_store_list(s, &v, &n), 0);
    assert_int_equal(n, N - 1);
    for (size_t i = 1; i < n; i++)
        assert_true(strcmp(v[i - 1].path, v[i].path) < 0); /* ids ascend with names */
    kvt_store_list_free(v);
    const int32_t pr[] = {200 / 256, 200 % 256, 7, 1};
    const int32_t want[] = {200 / 256, 200 % 256, 7};
    expect_hit(s, pr, 4, "", 3, want, 3, 200 % 3 != 0);
    kvt_store_close(s);
    free(bad);
    free(ns);
    rm_rf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_restart_recovery),
        cmocka_unit_test(test_ns_isolation),
        cmocka_unit_test(test_hit_of_another_store_refused),
        cmocka_unit_test(test_find_rules),
        cmocka_unit_test(test_supersede_and_duplicates),
        cmocka_unit_test(test_cap_eviction),
        cmocka_unit_test(test_oversize_refused),
        cmocka_unit_test(test_put_refuses_unindexable),
        cmocka_unit_test(test_golden_files_at_open),
        cmocka_unit_test(test_golden_files_quarantined),
        cmocka_unit_test(test_synthesized_damage),
        cmocka_unit_test(test_big_directory_scan),
        cmocka_unit_test(test_tmp_reaping),
        cmocka_unit_test(test_vanished_and_refresh),
        cmocka_unit_test(test_read_only),
        cmocka_unit_test(test_failed_open_changes_nothing),
        cmocka_unit_test(test_io_fault_loop),
        cmocka_unit_test(test_disk_full_fault),
        cmocka_unit_test(test_disk_full_tmpfs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
