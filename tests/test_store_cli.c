/*
 * The store commands of the CLI (kvtier ls, find, stats, gc) run as a program on real store
 * directories: a root holding two fingerprints, one of them shared by two models, plus
 * corrupt, foreign and abandoned files. Checks the JSON they print, their exit codes, that
 * ls / find / stats / gc --dry-run change nothing, and what gc removes.
 */
#include "support/support.h"

#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static struct kvt_entry *synth(const int32_t *tok, size_t n, bool trimmable)
{
    kvt_cache *c[2] = {NULL, NULL};
    int64_t shape[4] = {1, 1, (int64_t)n, 4};
    struct kvt_tensor t[2];
    for (int w = 0; w < 2; w++) {
        assert_int_equal(kvt_tensor_zeros(&t[w], KVT_BFLOAT16, 4, shape), 0);
        memset((uint8_t *)kvt_buf_data(t[w].buf) + t[w].offset, tok[0] + w, n * 8);
    }
    struct kvt_cache_info kv = {.kind = KVT_KIND_KV, .offset = (int64_t)n};
    assert_int_equal(kvt_cache_from_state(&kv, t, 2, &c[0]), 0);
    kvt_tensor_release(&t[0]);
    kvt_tensor_release(&t[1]);
    if (!trimmable) {
        int64_t cs[3] = {1, 2, 4}, rs[4] = {1, 1, 2, 2};
        assert_int_equal(kvt_tensor_zeros(&t[0], KVT_BFLOAT16, 3, cs), 0);
        assert_int_equal(kvt_tensor_zeros(&t[1], KVT_FLOAT32, 4, rs), 0);
        struct kvt_cache_info ssm = {.kind = KVT_KIND_SSM, .offset = (int64_t)n};
        assert_int_equal(kvt_cache_from_state(&ssm, t, 2, &c[1]), 0);
        kvt_tensor_release(&t[0]);
        kvt_tensor_release(&t[1]);
    }
    struct kvt_entry *e;
    assert_int_equal(kvt_entry_new(tok, n, c, trimmable ? 1 : 2, "", &e), 0);
    return e;
}

static void put(const char *dir, const char *model, const char *fp, const int32_t *tok, size_t n,
                bool trimmable, const char *ns)
{
    struct kvt_store_opts o;
    store_opts_for(&o, model, fp, "tk-test");
    kvt_store *s;
    assert_int_equal(kvt_store_open(dir, &o, &s), 0);
    struct kvt_entry *e = synth(tok, n, trimmable);
    if (ns) {
        free((char *)e->meta.ns);
        e->meta.ns = strdup(ns);
    }
    assert_int_equal(kvt_store_put(s, e, NULL, NULL), 0);
    kvt_entry_free(e);
    kvt_store_close(s);
}

static json_t *cli_json(const char *args, int want_rc)
{
    char *out;
    int rc = run_cli(args, false, &out);
    if (rc != want_rc)
        fail_msg("kvtier %s: exit %d, output: %s", args, rc, out);
    json_error_t err;
    json_t *j = json_loads(out, 0, &err);
    if (!j)
        fail_msg("kvtier %s: not JSON (%s): %s", args, err.text, out);
    free(out);
    return j;
}

/* Count the regular files below @p dir (two levels: ns directories, then files). */
static int count_tree(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char *sub = strf("%s/%s", dir, de->d_name);
        DIR *s = opendir(sub);
        struct dirent *fe;
        while (s && (fe = readdir(s)))
            n += fe->d_name[0] != '.';
        if (s)
            closedir(s);
        free(sub);
    }
    if (d)
        closedir(d);
    return n;
}

static json_t *store_of(json_t *arr, const char *fp, const char *model)
{
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        if (!strcmp(json_string_value(json_object_get(v, "config_fingerprint")), fp) &&
            !strcmp(json_string_value(json_object_get(v, "model_id")), model))
            return v;
    }
    fail_msg("no store for %s / %s", fp, model);
    return NULL;
}

struct fixture {
    char *dir, *fp_dir, *corrupt, *tmp, *foreign_ver;
};

static void make_fixture(struct fixture *f)
{
    f->dir = scratch_dir("cli");
    const int32_t a[] = {1, 2, 3, 4}, b[] = {1, 2, 9}, c[] = {5, 6, 7, 8, 9}, d[] = {42, 43};
    put(f->dir, "test/model", "fp-test", a, 4, true, NULL);
    put(f->dir, "test/model", "fp-test", b, 3, false, NULL);
    put(f->dir, "test/model", "fp-test", c, 5, true, "lora-a");
    put(f->dir, "test/other", "fp-test", d, 2, true, NULL);
    put(f->dir, "test/model", "fp-other", a, 4, true, NULL);
    f->fp_dir = strf("%s/fp-test", f->dir);
    f->corrupt = strf("%s/base/00000000-0000-4000-8000-00000000dead.mlxkv", f->fp_dir);
    size_t n;
    uint8_t *bytes = read_file(golden_path("truncated.mlxkv"), &n);
    assert_int_equal(write_file(f->corrupt, bytes, n), 0);
    free(bytes);
    f->foreign_ver = strf("%s/base/00000000-0000-4000-8000-00000000000f.mlxkv", f->fp_dir);
    bytes = read_file(golden_path("format-version-4.mlxkv"), &n);
    assert_int_equal(write_file(f->foreign_ver, bytes, n), 0);
    free(bytes);
    f->tmp = strf("%s/base/abandoned.mlxkv.tmp", f->fp_dir);
    assert_int_equal(write_file(f->tmp, "x", 1), 0);
    struct timespec ts[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
    assert_int_equal(utimensat(AT_FDCWD, f->tmp, ts, 0), 0);
}

static void free_fixture(struct fixture *f)
{
    rm_rf(f->dir);
    free(f->dir);
    free(f->fp_dir);
    free(f->corrupt);
    free(f->tmp);
    free(f->foreign_ver);
}

static bool exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static void test_ls_and_stats(void **state)
{
    (void)state;
    struct fixture f;
    make_fixture(&f);
    int files = count_tree(f.fp_dir);

    /* The root: every fingerprint, every identity found in the headers. */
    char *args = strf("ls '%s' --json", f.dir);
    json_t *j = cli_json(args, 0);
    free(args);
    assert_int_equal(json_array_size(j), 3);
    json_t *m = store_of(j, "fp-test", "test/model");
    json_t *ents = json_object_get(m, "entries");
    assert_int_equal(json_array_size(ents), 3);
    size_t i;
    json_t *e;
    int trimmable = 0, lora = 0;
    json_array_foreach(ents, i, e)
    {
        assert_true(exists(json_string_value(json_object_get(e, "path"))));
        trimmable += json_is_true(json_object_get(e, "trimmable"));
        lora += !strcmp(json_string_value(json_object_get(e, "ns")), "lora-a");
    }
    assert_int_equal(trimmable, 2);
    assert_int_equal(lora, 1);
    /* Everything this identity cannot index is left alone and counted as skipped. */
    assert_int_equal(json_integer_value(json_object_get(m, "skipped_files")), 3);
    assert_int_equal(
        json_array_size(json_object_get(store_of(j, "fp-test", "test/other"), "entries")), 1);
    assert_int_equal(
        json_array_size(json_object_get(store_of(j, "fp-other", "test/model"), "entries")), 1);
    json_decref(j);

    /* A fingerprint directory, with --ns and explicit identity. */
    args =
        strf("ls '%s' --json --ns lora-a --model-id test/model --tokenizer-hash tk-test", f.fp_dir);
    j = cli_json(args, 0);
    free(args);
    assert_int_equal(json_array_size(j), 1);
    assert_int_equal(json_array_size(json_object_get(json_array_get(j, 0), "entries")), 1);
    json_decref(j);

    args = strf("stats '%s' --json", f.fp_dir);
    j = cli_json(args, 0);
    free(args);
    m = store_of(j, "fp-test", "test/model");
    assert_int_equal(json_integer_value(json_object_get(m, "entries")), 3);
    assert_int_equal(json_integer_value(json_object_get(m, "longest_durable_prefix_tokens")), 5);
    assert_int_equal(json_integer_value(json_object_get(m, "corrupt_files")), 1);
    json_decref(j);

    /* Inspection changed nothing: the corrupt file and the abandoned .tmp are still there. */
    assert_int_equal(count_tree(f.fp_dir), files);
    assert_true(exists(f.corrupt));
    assert_true(exists(f.tmp));

    char *out;
    args = strf("ls '%s/nowhere'", f.dir);
    assert_int_equal(run_cli(args, false, &out), 2);
    free(out);
    free(args);
    free_fixture(&f);
}

static void test_find(void **state)
{
    (void)state;
    struct fixture f;
    make_fixture(&f);
    char *args = strf("find '%s' --tokens 1,2,3,4,5 --json --model-id test/model "
                      "--tokenizer-hash tk-test --config-fingerprint fp-test",
                      f.dir);
    json_t *j = cli_json(args, 0);
    free(args);
    assert_int_equal(json_array_size(j), 1);
    json_t *h = json_array_get(j, 0);
    assert_int_equal(json_integer_value(json_object_get(h, "prefix_len")), 4);
    assert_int_equal(json_integer_value(json_object_get(h, "n_tokens")), 4);
    assert_int_equal(json_integer_value(json_object_get(h, "trim")), 0);
    struct kvt_header *hd;
    assert_int_equal(kvt_file_read_header(json_string_value(json_object_get(h, "path")), NULL, &hd),
                     0);
    assert_int_equal(hd->n_tokens, 4);
    kvt_header_free(hd);
    json_decref(j);

    /* A divergent prompt served by the trimmable entry, trimmed by 2. */
    args = strf("find '%s' --tokens 1,2,7,7 --json --model-id test/model", f.fp_dir);
    j = cli_json(args, 0);
    free(args);
    h = json_array_get(j, 0);
    assert_int_equal(json_integer_value(json_object_get(h, "prefix_len")), 2);
    assert_int_equal(json_integer_value(json_object_get(h, "trim")), 2);
    json_decref(j);

    /* Namespaces: only lora-a holds 5,6,7,8,9. */
    args =
        strf("find '%s' --tokens 5,6,7,8,9,1 --ns lora-a --json --model-id test/model", f.fp_dir);
    j = cli_json(args, 0);
    free(args);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(j, 0), "prefix_len")), 5);
    json_decref(j);
    args = strf("find '%s' --tokens 5,6,7,8,9,1 --json --model-id test/model", f.fp_dir);
    j = cli_json(args, 1); /* a miss exits 1 */
    free(args);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(j, 0), "prefix_len")), 0);
    json_decref(j);

    char *out;
    args = strf("find '%s' --tokens 1,,2", f.fp_dir);
    assert_int_equal(run_cli(args, false, &out), 2);
    free(out);
    free(args);
    free_fixture(&f);
}

static void test_gc(void **state)
{
    (void)state;
    struct fixture f;
    make_fixture(&f);
    int files = count_tree(f.fp_dir);
    char *out;

    /* Dry run: says what it would do, does nothing. */
    char *args = strf("gc '%s' --dry-run --remove-skipped --max-bytes 1", f.fp_dir);
    assert_int_equal(run_cli(args, false, &out), 0);
    free(args);
    assert_non_null(strstr(out, "would reap abandoned"));
    assert_non_null(strstr(out, "would remove corrupt"));
    assert_non_null(strstr(out, "would remove skipped"));
    assert_non_null(strstr(out, "would evict"));
    free(out);
    assert_int_equal(count_tree(f.fp_dir), files);

    /* Without --remove-skipped and --max-bytes: only the corrupt file and the dead .tmp. */
    args = strf("gc '%s'", f.fp_dir);
    assert_int_equal(run_cli(args, false, &out), 0);
    free(args);
    free(out);
    assert_false(exists(f.corrupt));
    assert_false(exists(f.tmp));
    assert_true(exists(f.foreign_ver));
    assert_int_equal(count_tree(f.fp_dir), files - 2);

    /* A cap: each identity evicted to it, oldest first; the newer format file stays. */
    struct kvt_store_opts o;
    store_opts_for(&o, "test/model", "fp-test", "tk-test");
    o.read_only = true;
    kvt_store *s;
    assert_int_equal(kvt_store_open(f.dir, &o, &s), 0);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    kvt_store_close(s);
    uint64_t cap = st.total_bytes - 1;
    args = strf("gc '%s' --max-bytes %llu", f.fp_dir, (unsigned long long)cap);
    assert_int_equal(run_cli(args, false, &out), 0);
    free(args);
    assert_non_null(strstr(out, "evict"));
    free(out);
    assert_int_equal(kvt_store_open(f.dir, &o, &s), 0);
    kvt_store_get_stats(s, &st);
    kvt_store_close(s);
    assert_int_equal(st.entries, 2);
    assert_true(st.total_bytes <= cap);
    assert_true(exists(f.foreign_ver));

    /* --remove-skipped clears what no identity here can use. */
    args = strf("gc '%s' --remove-skipped", f.fp_dir);
    assert_int_equal(run_cli(args, false, &out), 0);
    free(args);
    free(out);
    assert_false(exists(f.foreign_ver));
    assert_int_equal(kvt_store_open(f.dir, &o, &s), 0);
    kvt_store_get_stats(s, &st);
    kvt_store_close(s);
    assert_int_equal(st.entries, 2);
    assert_int_equal(st.skipped_files, 1); /* test/other's entry: its own identity */
    free_fixture(&f);
}

/* Run kvtier with @p args; its exit status must be @p want_rc and its output exactly @p want. */
static void expect_output(const char *args, bool with_stderr, int want_rc, const char *want)
{
    char *out;
    int rc = run_cli(args, with_stderr, &out);
    if (rc != want_rc || strcmp(out, want))
        fail_msg("kvtier %s: exit %d, output:\n%s\nexpected exit %d, output:\n%s", args, rc, out,
                 want_rc, want);
    free(out);
}

#define IDENTITY "[--model-id M] [--config-fingerprint F] [--tokenizer-hash T]"
#define REMOTE(cmd)                                                                                \
    "       kvtier " cmd " --redis URL --model-id M --config-fingerprint F "                       \
    "--tokenizer-hash T"

/* Each store command's usage, on stdout for --help, on stderr for bad arguments; those that
 * take --redis say so, with the flags a remote needs. */
static void test_usage(void **state)
{
    (void)state;
    const char *ls = "usage: kvtier ls DIR [--json] [--ns NS] " IDENTITY
                     "\n" REMOTE("ls") " [--json] [--ns NS]\n";
    const char *stats =
        "usage: kvtier stats DIR [--json] " IDENTITY "\n" REMOTE("stats") " [--json]\n";
    const char *gc =
        "usage: kvtier gc DIR [--max-bytes N] [--dry-run] [--remove-skipped] "
        "[--tmp-grace-ms MS] " IDENTITY "\n" REMOTE("gc") " [--max-bytes N] [--dry-run]\n";
    const char *find = "usage: kvtier find DIR --tokens 1,2,3 [--ns NS] [--json] " IDENTITY "\n";
    expect_output("ls --help", false, 0, ls);
    expect_output("ls -h", false, 0, ls);
    expect_output("stats --help", false, 0, stats);
    expect_output("gc --help", false, 0, gc);
    expect_output("find --help", false, 0, find);
    expect_output("ls", true, 2, ls);
    expect_output("find /tmp", true, 2, find);
    char *want = strf("kvtier ls: --redis needs --model-id, --config-fingerprint and "
                      "--tokenizer-hash\n%s",
                      ls);
    expect_output("ls --redis redis://127.0.0.1:1/x", true, 2, want);
    free(want);
    want = strf("kvtier gc: unknown or incomplete option --bogus\n%s", gc);
    expect_output("gc --redis redis://127.0.0.1:1/x --bogus", true, 2, want);
    free(want);
}

/* Every command's --help: its usage on stdout, exit 0, nothing run. */
static void test_help_of_every_command(void **state)
{
    (void)state;
    const char *cmds[] = {"inspect", "verify", "synth", "ls",  "find",
                          "gc",      "stats",  "bench", "demo"};
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        char *args = strf("%s --help", cmds[i]), *out;
        int rc = run_cli(args, false, &out);
        char *want = strf("usage: kvtier %s", cmds[i]);
        if (rc != 0 || !strstr(out, want))
            fail_msg("kvtier %s: exit %d, stdout:\n%s", args, rc, out);
        free(want);
        free(out);
        free(args);
    }
}

/* A store directory that is missing or a file: the message names the path and what is wrong. */
static void test_bad_dir(void **state)
{
    (void)state;
    char *dir = scratch_dir("cli-bad-dir");
    char *missing = strf("%s/nonexistent", dir), *file = strf("%s/file", dir);
    assert_int_equal(write_file(file, "x", 1), 0);
    const char *cmds[] = {"ls", "stats", "gc", "find --tokens 1"};
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        char *args = strf("%s %s", cmds[i], missing);
        char *want = strf("kvtier: %s: does not exist\n", missing);
        expect_output(args, true, 2, want);
        free(args);
        free(want);
        args = strf("%s %s/", cmds[i], file);
        want = strf("kvtier: %s: not a directory\n", file);
        expect_output(args, true, 2, want);
        free(args);
        free(want);
    }
    free(missing);
    free(file);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ls_and_stats),
        cmocka_unit_test(test_find),
        cmocka_unit_test(test_gc),
        cmocka_unit_test(test_usage),
        cmocka_unit_test(test_help_of_every_command),
        cmocka_unit_test(test_bad_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
