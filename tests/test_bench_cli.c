/*
 * The report of `kvtier bench` on small entries: the JSON carries every figure the
 * performance targets are read from, each ratio is the median of the per-repetition ratios
 * of its seconds (against the limit with the lower median time), and each 95 % interval is
 * the pair of order statistics a binomial count gives, recomputed here from the seconds the
 * same JSON lists; so are the numpy peer's (when python3-numpy is there). Bad arguments are
 * refused with the usage status.
 */
#include "support/support.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_USAGE 2

/* The seconds of figure @p key in size object @p size, checked to have @p n entries. */
static const json_t *secs_of(const json_t *size, const char *key, size_t n)
{
    const json_t *a = json_object_get(json_object_get(size, "secs"), key);
    if (!json_is_array(a) || json_array_size(a) != n)
        fail_msg("secs.%s: not an array of %zu", key, n);
    return a;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_sorted(const double *v, size_t n)
{
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double median_of(const json_t *a)
{
    double v[64];
    size_t n = 0;
    for (size_t i = 0; i < json_array_size(a); i++)
        if (json_number_value(json_array_get(a, i)) > 0)
            v[n++] = json_number_value(json_array_get(a, i));
    qsort(v, n, sizeof(*v), cmp);
    return n ? median_sorted(v, n) : 0;
}

/* The lower order statistic (0-based) of the 95 % interval of a median of n values, by
 * summing binomial coefficients: the largest j with 2 * sum_{i<=j} C(n,i) / 2^n <= 0.05. */
static size_t interval_index(size_t n)
{
    double c = 1, tail = 0;
    size_t j = 0;
    for (size_t i = 0; i < n / 2; i++) {
        if (i > 0)
            c = c * (double)(n - i + 1) / (double)i;
        tail += c;
        if (2 * tail / pow(2, (double)n) > 0.05)
            break;
        j = i;
    }
    return j;
}

/* Equal to the 6 significant digits the JSON prints. */
static bool close_to(double got, double want)
{
    return fabs(got - want) <= 1e-5 * fmax(1, fabs(want));
}

static void expect_close(const json_t *size, const char *key, double want)
{
    const json_t *v = json_object_get(size, key);
    if (!json_is_number(v))
        fail_msg("%s: missing", key);
    double got = json_number_value(v);
    if (!close_to(got, want))
        fail_msg("%s: %.6g, recomputed %.6g", key, got, want);
}

/*
 * Check @p obj's @p key and key_ci95 against the median of the @p m ratios @p v and its 95 %
 * interval, recomputed here; @p cost: the key holds 1 - ratio (the hash check's cost).
 */
static void check_median(const json_t *obj, const char *key, double *v, size_t m, bool cost)
{
    qsort(v, m, sizeof(*v), cmp);
    size_t j = interval_index(m);
    double med = median_sorted(v, m), lo = v[j], hi = v[m - 1 - j];
    double want = cost ? 1 - med : med, want_lo = cost ? 1 - hi : lo, want_hi = cost ? 1 - lo : hi;
    expect_close(obj, key, want);
    char *ci_key = strf("%s_ci95", key);
    const json_t *ci = json_object_get(obj, ci_key);
    if (!json_is_array(ci) || json_array_size(ci) != 2)
        fail_msg("%s: missing", ci_key);
    double got_lo = json_number_value(json_array_get(ci, 0));
    double got_hi = json_number_value(json_array_get(ci, 1));
    if (!close_to(got_lo, want_lo) || !close_to(got_hi, want_hi))
        fail_msg("%s: [%.6g, %.6g], recomputed [%.6g, %.6g]", ci_key, got_lo, got_hi, want_lo,
                 want_hi);
    assert_true(got_lo <= want + 1e-9 && want <= got_hi + 1e-9);
    free(ci_key);
}

/* The @p n per-repetition ratios num[i] / den[i] into @p v (every one measured). */
static void per_rep_ratios(const json_t *num, const json_t *den, size_t n, double *v)
{
    for (size_t i = 0; i < n; i++) {
        double x = json_number_value(json_array_get(num, i));
        double y = json_number_value(json_array_get(den, i));
        assert_true(x > 0 && y > 0);
        v[i] = x / y;
    }
}

/*
 * Check ratio @p key (and key_ci95) of @p size: per repetition, limit over kvtier seconds,
 * the limit being whichever of @p lim_a / @p lim_b has the lower median; @p cost reports
 * 1 - ratio instead (the hash check's cost, whose limit is the restore without it).
 */
static void check_ratio(const json_t *size, size_t n, const char *key, const char *kvt,
                        const char *lim_a, const char *lim_b, bool cost)
{
    const json_t *k = secs_of(size, kvt, n), *a = secs_of(size, lim_a, n);
    const json_t *b = lim_b ? secs_of(size, lim_b, n) : NULL;
    double ma = median_of(a), mb = b ? median_of(b) : 0;
    double v[64];
    per_rep_ratios(b && mb > 0 && (ma <= 0 || mb < ma) ? b : a, k, n, v);
    check_median(size, key, v, n, cost);
}

/* Run the bench with @p args and its JSON going to @p json; its table must hold @p in_table.
 * Returns the parsed JSON. */
static json_t *bench_json(const char *args, const char *json, const char *in_table)
{
    char *all = strf("bench --dir '%s/b' %s --json '%s'", test_dir, args, json), *out = NULL;
    int st = run_cli(all, true, &out);
    if (st != 0)
        fail_msg("kvtier %s: status %d\n%s", all, st, out);
    assert_non_null(strstr(out, in_table));
    json_t *root = load_json(json);
    assert_non_null(root);
    free(out);
    free(all);
    return root;
}

/* One bench run of @p sizes with @p n repetitions; checks its JSON against its seconds. */
static void bench_run(const char *sizes, size_t n, size_t n_sizes)
{
    char *json = strf("%s/r%zu.json", test_dir, n);
    char *args = strf("--size %s --repeat %zu", sizes, n);
    json_t *root = bench_json(args, json, "95 % intervals of the medians");
    assert_int_equal(json_integer_value(json_object_get(root, "repeat")), (json_int_t)n);
    const json_t *rows = json_object_get(root, "sizes");
    assert_int_equal(json_array_size(rows), n_sizes);
    for (size_t i = 0; i < n_sizes; i++) {
        const json_t *s = json_array_get(rows, i);
        /* Llama-3-8B's shape: 128 KiB of K and V per token, a token per 128 KiB asked for */
        uint64_t size = (uint64_t)json_integer_value(json_object_get(s, "size_bytes"));
        uint64_t tokens = (uint64_t)json_integer_value(json_object_get(s, "tokens"));
        uint64_t file = (uint64_t)json_integer_value(json_object_get(s, "file_bytes"));
        uint64_t entry = (uint64_t)json_integer_value(json_object_get(s, "entry_bytes"));
        assert_int_equal(tokens, size >> 17);
        assert_true(file > size && entry >= size); /* entry_bytes counts the capacity rows */
        assert_true(json_is_number(json_object_get(s, "peak_rss_extra_bytes")));
        check_ratio(s, n, "save_ratio", "save", "raw_write_buffered", "raw_write_direct", false);
        check_ratio(s, n, "restore_cold_ratio", "restore_cold", "raw_read", "raw_read_prefaulted",
                    false);
        check_ratio(s, n, "restore_warm_ratio", "restore_warm", "memcpy", "memcpy_prefaulted",
                    false);
        check_ratio(s, n, "verify_cost", "restore_cold", "restore_cold_noverify", NULL, true);
    }
    /* the entries are under the targets' 256 MiB: none of them counts */
    assert_int_equal(json_integer_value(json_object_get(json_object_get(root, "targets"), "sizes")),
                     0);
    json_decref(root);
    free(args);
    free(json);
}

static void test_report_nine(void **state)
{
    (void)state;
    assert_int_equal(interval_index(9), 1); /* 1 - 2 * 10/512 = 0.961; with 46/512, 0.82 */
    bench_run("4M,2M", 9, 2);
}

static void test_report_few(void **state)
{
    (void)state;
    assert_int_equal(interval_index(5), 0); /* too few for 95 %: the whole range */
    bench_run("3M", 5, 1);
}

/* The numpy peer's ratios pair its seconds with kvtier's of the same repetition. */
static void test_report_peer(void **state)
{
    (void)state;
    if (system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0)
        skip(); /* python3-numpy is optional (README) */
    char *json = strf("%s/peer.json", test_dir);
    char *args =
        strf("--size 4M --repeat 6 --peers --peer-script '%s/../bench/peers/numpy_peer.py'",
             KVT_TEST_DIR);
    json_t *root = bench_json(args, json, "numpy peer");
    const json_t *size = json_array_get(json_object_get(root, "sizes"), 0);
    const json_t *peer = json_object_get(size, "peer");
    assert_string_equal(json_string_value(json_object_get(peer, "name")), "numpy");
    const char *keys[][3] = {{"save_ratio", "save", "save"},
                             {"load_cold_ratio", "load_cold", "restore_cold"},
                             {"load_warm_ratio", "load_warm", "restore_warm"}};
    for (size_t k = 0; k < 3; k++) {
        const json_t *ps = json_object_get(json_object_get(peer, "secs"), keys[k][1]);
        const json_t *ks = secs_of(size, keys[k][2], 6);
        assert_int_equal(json_array_size(ps), 6);
        double v[6];
        per_rep_ratios(ps, ks, 6, v);
        check_median(peer, keys[k][0], v, 6, false);
    }
    json_decref(root);
    free(args);
    free(json);
}

static void test_usage_errors(void **state)
{
    (void)state;
    const char *bad[] = {"--repeat 0", "--repeat 65",  "--size 0",
                         "--size 1Q",  "--plot r.txt", "--frobnicate"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *args = strf("bench --dir '%s/b' %s", test_dir, bad[i]), *out = NULL;
        int st = run_cli(args, true, &out);
        if (st != EXIT_USAGE || !strstr(out, "usage: kvtier bench"))
            fail_msg("kvtier %s: status %d\n%s", args, st, out);
        free(out);
        free(args);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_report_nine),
        cmocka_unit_test(test_report_few),
        cmocka_unit_test(test_report_peer),
        cmocka_unit_test(test_usage_errors),
    };
    return cmocka_run_group_tests(tests, test_dir_setup, test_dir_teardown);
}
