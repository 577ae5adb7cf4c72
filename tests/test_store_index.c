/*
 * The store's prefix index against a straightforward linear model of STORE.md §4, §7, §9
 * and §10: thousands of random inserts, removals, stores with supersession, LRU bumps and
 * evictions over small token alphabets (so prefixes collide), comparing every find,
 * has_durable_prefix, superseded set, eviction order, totals and longest length, and
 * checking the radix tree's invariants from scratch along the way.
 */
#include "support/support.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/index.h"

#define MAXT 48
#define MAXREC 4096

struct lrec {
    uint64_t seq;
    const char *ns;
    int32_t tok[MAXT];
    size_t n;
    bool trim;
    uint64_t bytes;
    int64_t mtime;
    struct kvt_rec *r;
    bool live;
};

struct model {
    struct lrec recs[MAXREC];
    size_t n_recs; /* slots used, live or not, in seq order */
    struct kvt_index *ix;
    uint64_t rng;
    int alphabet;
    size_t maxlen;
};

static const char *const namespaces[] = {"", "", "", "lora-a", "x+y"};

static size_t rnd(struct model *m, size_t n)
{
    return (size_t)(xs64(&m->rng) % n);
}

static size_t lin_lcp(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i])
        i++;
    return i;
}

/* STORE.md §7, verbatim. */
static struct lrec *lin_find(struct model *m, const char *ns, const int32_t *tok, size_t n,
                             size_t *plen)
{
    size_t best = 0;
    struct lrec *res = NULL;
    for (size_t i = 0; i < m->n_recs; i++) {
        struct lrec *r = &m->recs[i];
        if (!r->live || strcmp(r->ns, ns))
            continue;
        if (n == 0)
            continue;
        size_t p = lin_lcp(r->tok, r->n, tok, n);
        if (p > n - 1)
            p = n - 1;
        if (p == 0 || p <= best)
            continue;
        if (r->n > p && !r->trim)
            continue;
        best = p;
        res = r;
    }
    *plen = best;
    return res;
}

static bool lin_durable(struct model *m, const char *ns, const int32_t *tok, size_t n)
{
    for (size_t i = 0; i < m->n_recs; i++) {
        struct lrec *r = &m->recs[i];
        if (r->live && !strcmp(r->ns, ns) && r->n >= n && lin_lcp(r->tok, r->n, tok, n) == n &&
            (r->n == n || r->trim))
            return true;
    }
    return false;
}

static bool lin_superseded(const struct lrec *r, const char *ns, const int32_t *tok, size_t n,
                           bool trim)
{
    if (!r->live || strcmp(r->ns, ns))
        return false;
    if (r->n == n && lin_lcp(r->tok, r->n, tok, n) == n)
        return true;
    return trim && r->n < n && lin_lcp(r->tok, r->n, tok, n) == r->n;
}

static struct lrec *lin_oldest(struct model *m)
{
    struct lrec *best = NULL;
    for (size_t i = 0; i < m->n_recs; i++) {
        struct lrec *r = &m->recs[i];
        if (r->live && (!best || r->mtime < best->mtime))
            best = r; /* strict: the earliest seq wins among equal mtimes */
    }
    return best;
}

static struct lrec *lin_by_rec(struct model *m, const struct kvt_rec *r)
{
    for (size_t i = 0; i < m->n_recs; i++)
        if (m->recs[i].live && m->recs[i].r == r)
            return &m->recs[i];
    return NULL;
}

static struct lrec *random_live(struct model *m)
{
    size_t live = 0;
    for (size_t i = 0; i < m->n_recs; i++)
        live += m->recs[i].live;
    if (!live)
        return NULL;
    size_t k = rnd(m, live);
    for (size_t i = 0; i < m->n_recs; i++)
        if (m->recs[i].live && k-- == 0)
            return &m->recs[i];
    return NULL;
}

/* A token list that often shares a prefix with a live record: equal, a prefix, an extension,
 * or a divergent tail. */
static size_t gen_tokens(struct model *m, int32_t *tok, const char **ns)
{
    struct lrec *base = rnd(m, 5) ? random_live(m) : NULL;
    size_t n = 0;
    *ns = namespaces[rnd(m, sizeof(namespaces) / sizeof(namespaces[0]))];
    if (base) {
        if (rnd(m, 4))
            *ns = base->ns;
        size_t keep = base->n;
        switch (rnd(m, 4)) {
        case 0: break;                                            /* equal */
        case 1: keep = base->n ? rnd(m, base->n) : 0; break;      /* prefix (maybe empty) */
        case 2: break;                                            /* extension below */
        default: keep = base->n ? rnd(m, base->n + 1) : 0; break; /* divergent tail */
        }
        memcpy(tok, base->tok, keep * sizeof(*tok));
        n = keep;
    }
    size_t extra = rnd(m, 4) ? rnd(m, 4) : rnd(m, m->maxlen + 1);
    while (extra-- && n < m->maxlen)
        tok[n++] =
            rnd(m, 20) ? (int32_t)rnd(m, (size_t)m->alphabet) : (int32_t)(xs64(&m->rng) >> 33);
    return n;
}

static void do_insert(struct model *m, const char *ns, const int32_t *tok, size_t n, bool trim)
{
    assert_true(m->n_recs < MAXREC);
    struct lrec *l = &m->recs[m->n_recs++];
    l->ns = ns;
    memcpy(l->tok, tok, n * sizeof(*tok));
    l->n = n;
    l->trim = trim;
    l->bytes = 1 + rnd(m, 1000);
    l->mtime = (int64_t)rnd(m, 50);
    char path[64];
    snprintf(path, sizeof(path), "/x/%zu.mlxkv", m->n_recs);
    assert_int_equal(kvt_index_insert(m->ix, ns, tok, n, trim, l->bytes, l->mtime, path, &l->r), 0);
    l->seq = l->r->seq;
    l->live = true;
    assert_ptr_equal(kvt_index_by_path(m->ix, path), l->r);
    assert_int_equal(kvt_index_insert(m->ix, ns, tok, n, trim, 1, 1, path, NULL), -EEXIST);
}

static void do_remove(struct model *m, struct lrec *l)
{
    assert_ptr_equal(kvt_index_by_seq(m->ix, l->seq), l->r);
    kvt_index_remove(m->ix, l->r);
    assert_null(kvt_index_by_seq(m->ix, l->seq));
    l->live = false;
    l->r = NULL;
}

static void check_find(struct model *m)
{
    int32_t tok[MAXT];
    const char *ns;
    size_t n = gen_tokens(m, tok, &ns);
    size_t want_len, got_len;
    struct lrec *want = lin_find(m, ns, tok, n, &want_len);
    struct kvt_rec *got = kvt_index_find(m->ix, ns, tok, n, &got_len);
    assert_int_equal(got_len, want_len);
    if (!want) {
        assert_null(got);
    } else {
        assert_non_null(got);
        assert_int_equal(got->seq, want->seq);
    }
    assert_int_equal(kvt_index_has_durable_prefix(m->ix, ns, tok, n), lin_durable(m, ns, tok, n));
}

/* A store (§9): supersede, then insert. */
static void do_put(struct model *m)
{
    int32_t tok[MAXT];
    const char *ns;
    size_t n = gen_tokens(m, tok, &ns);
    bool trim = rnd(m, 3) != 0;
    struct kvt_rec **sup;
    size_t n_sup;
    assert_int_equal(kvt_index_superseded(m->ix, ns, tok, n, trim, &sup, &n_sup), 0);
    size_t want = 0;
    for (size_t i = 0; i < m->n_recs; i++)
        want += lin_superseded(&m->recs[i], ns, tok, n, trim);
    assert_int_equal(n_sup, want);
    for (size_t i = 0; i < n_sup; i++) {
        struct lrec *l = lin_by_rec(m, sup[i]);
        assert_non_null(l);
        assert_true(lin_superseded(l, ns, tok, n, trim));
    }
    for (size_t i = 0; i < n_sup; i++)
        do_remove(m, lin_by_rec(m, sup[i]));
    free(sup);
    do_insert(m, ns, tok, n, trim);
}

static void check_totals(struct model *m)
{
    uint64_t count = 0, bytes = 0;
    size_t longest = 0;
    for (size_t i = 0; i < m->n_recs; i++) {
        struct lrec *l = &m->recs[i];
        if (!l->live)
            continue;
        count++;
        bytes += l->bytes;
        if (l->n > longest)
            longest = l->n;
    }
    assert_int_equal(kvt_index_count(m->ix), count);
    assert_int_equal(kvt_index_total_bytes(m->ix), bytes);
    assert_int_equal(kvt_index_longest(m->ix), longest);
}

static void check_structure(struct model *m)
{
    int rc = kvt_index_check(m->ix);
    if (rc)
        fail_msg("%s", kvt_last_error());
    struct lrec *l = random_live(m);
    if (l) {
        int32_t tok[MAXT];
        assert_int_equal(l->r->n_tokens, l->n);
        kvt_rec_tokens(l->r, tok);
        assert_memory_equal(tok, l->tok, l->n * sizeof(*tok));
        assert_string_equal(kvt_rec_ns(l->r), l->ns);
    }
    struct kvt_rec **all;
    size_t n;
    assert_int_equal(kvt_index_records(m->ix, &all, &n), 0);
    assert_int_equal(n, kvt_index_count(m->ix));
    for (size_t i = 1; i < n; i++)
        assert_true(all[i - 1]->seq < all[i]->seq);
    free(all);
}

static void run_model(uint64_t seed, int alphabet, size_t maxlen, int ops)
{
    struct model *m = calloc(1, sizeof(*m));
    assert_non_null(m);
    m->rng = seed;
    m->alphabet = alphabet;
    m->maxlen = maxlen;
    assert_int_equal(kvt_index_new(&m->ix), 0);
    for (int op = 0; op < ops && m->n_recs < MAXREC - 1; op++) {
        size_t live = kvt_index_count(m->ix);
        size_t what = rnd(m, 100);
        if (what < 22 || live < 3) {
            int32_t tok[MAXT];
            const char *ns;
            size_t n = gen_tokens(m, tok, &ns);
            do_insert(m, ns, tok, n, rnd(m, 2));
        } else if (what < 34) {
            do_put(m);
        } else if (what < 44) {
            do_remove(m, random_live(m));
        } else if (what < 50) {
            struct lrec *l = random_live(m);
            l->mtime = (int64_t)rnd(m, 60);
            kvt_index_touch(m->ix, l->r, l->mtime);
        } else if (what < 56) {
            struct lrec *want = lin_oldest(m);
            struct kvt_rec *got = kvt_index_oldest(m->ix);
            assert_non_null(got);
            assert_int_equal(got->seq, want->seq);
            do_remove(m, want);
        } else {
            check_find(m);
        }
        check_totals(m);
        if (op % 97 == 0)
            check_structure(m);
    }
    check_structure(m);
    /* Drain through the eviction order: every pop matches the model, the tree empties. */
    while (kvt_index_count(m->ix)) {
        struct lrec *want = lin_oldest(m);
        assert_int_equal(kvt_index_oldest(m->ix)->seq, want->seq);
        do_remove(m, want);
        if (kvt_index_count(m->ix) % 64 == 0)
            check_structure(m);
    }
    assert_null(kvt_index_oldest(m->ix));
    check_totals(m);
    kvt_index_free(m->ix);
    free(m);
}

static void test_random_binary_alphabet(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 12; seed++)
        run_model(seed * 0x9e3779b97f4a7c15ull, 2, 12, 2500);
}

static void test_random_small_alphabet(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 8; seed++)
        run_model(seed * 0x2545f4914f6cdd1dull + 7, 4, 24, 3000);
}

static void test_random_wide_nodes(void **state)
{
    (void)state;
    /* Many children per node: the "earliest trimmable record outside one child" lookup. */
    for (uint64_t seed = 1; seed <= 8; seed++)
        run_model(seed * 0x9fb21c651e98df25ull + 11, 8, 6, 3000);
}

static void test_random_long_labels(void **state)
{
    (void)state;
    /* Long shared runs exercise the 16-token block compare and label splits far apart. */
    for (uint64_t seed = 1; seed <= 4; seed++)
        run_model(seed * 0x51afd7ed558ccd1dull + 3, 3, MAXT, 3000);
}

/* Hand-checked cases of §7 and §4 on a fresh index. */
static void test_rules_by_hand(void **state)
{
    (void)state;
    struct kvt_index *ix;
    assert_int_equal(kvt_index_new(&ix), 0);
    const int32_t a[] = {1, 2, 3, 4}, ab[] = {1, 2, 3, 4, 5, 6}, other[] = {1, 2, 9};
    struct kvt_rec *ra, *rab, *ro, *rdup;
    size_t plen;
    assert_int_equal(kvt_index_insert(ix, "", a, 4, false, 10, 5, "a", &ra), 0);

    /* Prompts of length <= 1 always miss; an exact-length prompt needs a 1-token trim. */
    assert_null(kvt_index_find(ix, "", a, 1, &plen));
    assert_int_equal(plen, 0);
    assert_null(kvt_index_find(ix, "", a, 4, &plen));
    /* An untrimmable record serves only prompts that extend it. */
    const int32_t ext[] = {1, 2, 3, 4, 7};
    assert_ptr_equal(kvt_index_find(ix, "", ext, 5, &plen), ra);
    assert_int_equal(plen, 4);
    /* Namespaces are isolated. */
    assert_null(kvt_index_find(ix, "lora", ext, 5, &plen));

    /* A longer trimmable record serves a divergent prompt; the caller trims. */
    assert_int_equal(kvt_index_insert(ix, "", ab, 6, true, 20, 5, "ab", &rab), 0);
    const int32_t div[] = {1, 2, 3, 4, 5, 8, 8};
    assert_ptr_equal(kvt_index_find(ix, "", div, 7, &plen), rab);
    assert_int_equal(plen, 5);
    /* Exact-length prompt equal to the trimmable record: prefix n - 1. */
    assert_ptr_equal(kvt_index_find(ix, "", ab, 6, &plen), rab);
    assert_int_equal(plen, 5);
    /* Ties keep the earliest record: both give 4 for this prompt. */
    assert_ptr_equal(kvt_index_find(ix, "", ext, 5, &plen), ra);
    assert_int_equal(plen, 4);
    /* A divergent untrimmable record never serves past the divergence. */
    assert_int_equal(kvt_index_insert(ix, "", other, 3, false, 30, 1, "o", &ro), 0);
    const int32_t p2[] = {1, 2, 9, 9};
    assert_ptr_equal(kvt_index_find(ix, "", p2, 4, &plen), ro);
    assert_int_equal(plen, 3);
    const int32_t p3[] = {1, 2, 7, 7};
    assert_ptr_equal(kvt_index_find(ix, "", p3, 4, &plen), rab);
    assert_int_equal(plen, 2);

    /* has_durable_prefix: some record starts with the tokens, exactly as long or trimmable. */
    assert_true(kvt_index_has_durable_prefix(ix, "", a, 4));
    assert_true(kvt_index_has_durable_prefix(ix, "", a, 3)); /* via the trimmable ab */
    assert_true(kvt_index_has_durable_prefix(ix, "", other, 3));
    assert_true(kvt_index_has_durable_prefix(ix, "", other, 2));
    assert_false(kvt_index_has_durable_prefix(ix, "", ext, 5));
    assert_false(kvt_index_has_durable_prefix(ix, "lora", a, 2));

    /* Supersession: exact duplicates always, strict ancestors only for a trimmable entry. */
    struct kvt_rec **sup;
    size_t n_sup;
    assert_int_equal(kvt_index_superseded(ix, "", ab, 6, false, &sup, &n_sup), 0);
    assert_int_equal(n_sup, 1);
    assert_ptr_equal(sup[0], rab);
    free(sup);
    const int32_t abc[] = {1, 2, 3, 4, 5, 6, 7};
    assert_int_equal(kvt_index_superseded(ix, "", abc, 7, true, &sup, &n_sup), 0);
    assert_int_equal(n_sup, 2);
    assert_ptr_equal(sup[0], ra);
    assert_ptr_equal(sup[1], rab);
    free(sup);
    assert_int_equal(kvt_index_superseded(ix, "", abc, 7, false, &sup, &n_sup), 0);
    assert_int_equal(n_sup, 0);
    free(sup);

    /* Eviction order is (mtime, seq); an LRU bump moves a record back. */
    assert_ptr_equal(kvt_index_oldest(ix), ro);
    kvt_index_touch(ix, ro, 100);
    assert_ptr_equal(kvt_index_oldest(ix), ra);
    assert_int_equal(kvt_index_insert(ix, "", a, 4, true, 1, 5, "dup", &rdup), 0);
    assert_ptr_equal(kvt_index_oldest(ix), ra);
    kvt_index_remove(ix, ra);
    assert_ptr_equal(kvt_index_oldest(ix), rab);
    assert_int_equal(kvt_index_total_bytes(ix), 20 + 30 + 1);
    assert_int_equal(kvt_index_longest(ix), 6);
    kvt_index_remove(ix, rab);
    assert_int_equal(kvt_index_longest(ix), 4);
    assert_int_equal(kvt_index_check(ix), 0);
    kvt_index_free(ix);
}

/* Records with no tokens and one-token records: never served, still counted and durable. */
static void test_empty_and_short(void **state)
{
    (void)state;
    struct kvt_index *ix;
    assert_int_equal(kvt_index_new(&ix), 0);
    const int32_t one[] = {7}, two[] = {7, 8};
    size_t plen;
    assert_int_equal(kvt_index_insert(ix, "", NULL, 0, true, 1, 1, NULL, NULL), 0);
    assert_int_equal(kvt_index_insert(ix, "", one, 1, false, 1, 1, NULL, NULL), 0);
    assert_null(kvt_index_find(ix, "", two, 1, &plen));
    assert_non_null(kvt_index_find(ix, "", two, 2, &plen));
    assert_int_equal(plen, 1);
    assert_true(kvt_index_has_durable_prefix(ix, "", NULL, 0));
    struct kvt_rec **sup;
    size_t n_sup;
    assert_int_equal(kvt_index_superseded(ix, "", two, 2, true, &sup, &n_sup), 0);
    assert_int_equal(n_sup, 2); /* the empty record and {7} are both strict prefixes */
    free(sup);
    assert_int_equal(kvt_index_check(ix), 0);
    kvt_index_free(ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rules_by_hand),          cmocka_unit_test(test_empty_and_short),
        cmocka_unit_test(test_random_binary_alphabet), cmocka_unit_test(test_random_small_alphabet),
        cmocka_unit_test(test_random_wide_nodes),      cmocka_unit_test(test_random_long_labels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
