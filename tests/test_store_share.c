/*
 * Entries kept as shared chunks plus a tail (docs/SHARING.md), at the file level: round
 * trips that restore every byte of every layer (kv cut into chunks, ssm kept whole), two
 * branches off one prompt sharing the prompt's chunks, and every way a chunk can go bad
 * (a flipped byte, a missing file, another prefix's chunk under its name) failing the load
 * and naming the chunk.
 */
#include "support/support.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/share.h"
#include "support/synth.h"

static const struct kvt_save_opts NO_SYNC = {.no_sync = true};

/* Tokens of a branch: @p shared tokens common to every branch, then @p own of branch @p b. */
static int32_t *branch_tokens(size_t shared, size_t own, int b)
{
    int32_t *t = malloc((shared + own) * sizeof(*t));
    assert_non_null(t);
    for (size_t i = 0; i < shared + own; i++)
        t[i] = i < shared ? (int32_t)(i * 7 + 1) : (int32_t)(100000 * (b + 1) + (int)i);
    return t;
}

/* A kv layer (cut into chunks) and an ssm layer (kept whole), bytes derived from the tokens. */
static struct kvt_entry *entry_of(const int32_t *tok, size_t n)
{
    struct kvt_entry *e;
    assert_int_equal(synth_entry(tok, n, "", false, &e), 0);
    return e;
}

static void assert_same(const struct kvt_entry *got, const struct kvt_entry *want)
{
    assert_int_equal(got->n_tokens, want->n_tokens);
    assert_memory_equal(got->tokens, want->tokens, want->n_tokens * sizeof(int32_t));
    assert_int_equal(got->n_caches, want->n_caches);
    for (size_t i = 0; i < want->n_caches; i++) {
        assert_int_equal(kvt_cache_offset(got->caches[i]), kvt_cache_offset(want->caches[i]));
        assert_true(synth_same_state(got->caches[i], want->caches[i]));
    }
}

static char *tail_path(const char *name)
{
    return strf("%s/%s%s", test_dir, name, KVT_SHARE_EXT);
}

/* Save @p e under @p name and load it back; what the save did goes to @p sv. */
static struct kvt_entry *round_trip(const struct kvt_entry *e, const char *name,
                                    struct kvt_share_saved *sv)
{
    char *tp = tail_path(name);
    assert_int_equal(kvt_share_save(test_dir, tp, e, &NO_SYNC, sv), 0);
    struct kvt_entry *back;
    struct kvt_expect x = {.n_layers = e->n_caches};
    if (kvt_share_load(tp, &x, &back, NULL))
        fail_msg("kvt_share_load: %s", kvt_last_error());
    free(tp);
    return back;
}

static void test_round_trips(void **state)
{
    (void)state;
    /* chunk counts around the edges: one chunk and a row, a whole number of chunks, more, and
     * more files than one load opens at once (66 chunks and the tail: two loads of 64 and 3) */
    const size_t sizes[] = {257, 512, 768, 1000, 1025, 16900};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        int32_t *tok = branch_tokens(sizes[i], 0, 0);
        struct kvt_entry *e = entry_of(tok, sizes[i]);
        assert_true(kvt_share_applies(e));
        struct kvt_share_saved sv;
        char name[32];
        snprintf(name, sizeof(name), "e%zu", i);
        struct kvt_entry *back = round_trip(e, name, &sv);
        assert_same(back, e);
        assert_int_equal(sv.chunks_written + sv.chunks_reused, (sizes[i] - 1) / 256);
        /* the restored kv layer takes appends in place, like any restore */
        assert_true(kvt_cache_capacity(back->caches[0]) > (int64_t)sizes[i]);
        kvt_entry_free(back);
        kvt_entry_free(e);
        free(tok);
    }
}

static void test_not_shareable(void **state)
{
    (void)state;
    int32_t *tok = branch_tokens(256, 0, 0);
    struct kvt_entry *e = entry_of(tok, 256); /* no row left for a tail beyond one chunk */
    assert_false(kvt_share_applies(e));
    struct kvt_share_saved sv;
    char *tp = tail_path("small");
    assert_int_equal(kvt_share_save(test_dir, tp, e, &NO_SYNC, &sv), -EINVAL);
    assert_int_equal(access(tp, F_OK), -1);
    int32_t *long_tok = branch_tokens(600, 0, 0);
    kvt_cache *ssm;
    assert_int_equal(synth_ssm(long_tok, 600, &ssm), 0);
    struct kvt_entry only_ssm = {
        .tokens = long_tok, .n_tokens = 600, .caches = &ssm, .n_caches = 1};
    assert_false(kvt_share_applies(&only_ssm)); /* nothing to cut */
    kvt_cache_free(ssm);
    free(long_tok);
    kvt_entry_free(e);
    free(tp);
    free(tok);
}

/* Chunk files in test_dir. */
static size_t count_chunks(void)
{
    char *out;
    char *cmd = strf("ls '%s' | grep -c '\\%s$'", test_dir, KVT_CHUNK_EXT);
    run_capture(cmd, &out);
    size_t n = strtoul(out, NULL, 10);
    free(out);
    free(cmd);
    return n;
}

static void test_branches_share_chunks(void **state)
{
    (void)state;
    /* three branches off a 600-token prompt, 100 tokens each: chunks 0-1 are the prompt's */
    struct kvt_entry *e[3];
    int32_t *tok[3];
    for (int b = 0; b < 3; b++) {
        tok[b] = branch_tokens(600, 100, b);
        e[b] = entry_of(tok[b], 700);
        struct kvt_share_saved sv;
        char name[8];
        snprintf(name, sizeof(name), "b%d", b);
        struct kvt_entry *back = round_trip(e[b], name, &sv);
        assert_int_equal(sv.chunks_written, b == 0 ? 2 : 0);
        assert_int_equal(sv.chunks_reused, b == 0 ? 0 : 2);
        assert_int_equal(sv.chunk_bytes == 0, b > 0);
        assert_same(back, e[b]);
        kvt_entry_free(back);
    }
    assert_int_equal(count_chunks(), 2);
    /* a branch that departs inside chunk 1 shares chunk 0 only */
    int32_t *t3 = branch_tokens(300, 400, 3);
    struct kvt_entry *e3 = entry_of(t3, 700);
    struct kvt_share_saved sv;
    struct kvt_entry *back = round_trip(e3, "b3", &sv);
    assert_int_equal(sv.chunks_reused, 1);
    assert_int_equal(sv.chunks_written, 1);
    assert_same(back, e3);
    assert_int_equal(count_chunks(), 3);
    kvt_entry_free(back);
    kvt_entry_free(e3);
    free(t3);
    for (int b = 0; b < 3; b++) {
        kvt_entry_free(e[b]);
        free(tok[b]);
    }
}

/* Load tail @p name: must fail with @p want and name chunk @p k of @p tok as the bad one. */
static void assert_chunk_fails(const char *name, int want, const int32_t *tok, size_t k)
{
    char *tp = tail_path(name), *bad = NULL, *chunk = kvt_share_chunk_path_of(test_dir, tok, k);
    struct kvt_entry *back = NULL;
    struct kvt_expect x = {0};
    assert_int_equal(kvt_share_load(tp, &x, &back, &bad), want);
    assert_null(back);
    assert_non_null(bad);
    assert_string_equal(bad, chunk);
    free(bad);
    free(chunk);
    free(tp);
}

static void test_bad_chunks(void **state)
{
    (void)state;
    int32_t *ta = branch_tokens(600, 100, 0), *tb = branch_tokens(600, 100, 1);
    int32_t *tc = branch_tokens(0, 700, 2);
    struct kvt_entry *ea = entry_of(ta, 700), *eb = entry_of(tb, 700), *ec = entry_of(tc, 700);
    struct kvt_share_saved sv;
    char *pa = tail_path("a"), *pb = tail_path("b"), *pc = tail_path("c");
    assert_int_equal(kvt_share_save(test_dir, pa, ea, &NO_SYNC, &sv), 0);
    assert_int_equal(kvt_share_save(test_dir, pb, eb, &NO_SYNC, &sv), 0);
    assert_int_equal(kvt_share_save(test_dir, pc, ec, &NO_SYNC, &sv), 0);

    /* a long entry read in two loads names a bad chunk of its second load */
    int32_t *tl = branch_tokens(0, 16900, 3);
    struct kvt_entry *el = entry_of(tl, 16900);
    char *pl = tail_path("long");
    assert_int_equal(kvt_share_save(test_dir, pl, el, &NO_SYNC, &sv), 0);
    char *c65 = kvt_share_chunk_path_of(test_dir, tl, 65);
    flip_slot_byte(c65, 0, 1, 9, 0x08);
    assert_chunk_fails("long", KVT_E_CORRUPT, tl, 65);
    free(c65);
    free(pl);
    kvt_entry_free(el);
    free(tl);
    /* a flipped byte of a tail fails its own entry only */
    struct kvt_entry *back;
    struct kvt_expect x = {0};
    flip_slot_byte(pc, 0, 0, 3, 0x01);
    assert_int_equal(kvt_share_load(pc, &x, &back, NULL), KVT_E_CORRUPT);
    /* one flipped byte of the shared chunk 1: both branches that need it fail */
    char *c1 = kvt_share_chunk_path_of(test_dir, ta, 1);
    flip_slot_byte(c1, 0, 1, 77, 0x10);
    assert_chunk_fails("a", KVT_E_CORRUPT, ta, 1);
    assert_chunk_fails("b", KVT_E_CORRUPT, tb, 1);
    /* another prompt's chunk under chunk 1's name: its tokens give it away */
    char *other = kvt_share_chunk_path_of(test_dir, tc, 1);
    assert_int_equal(rename(other, c1), 0);
    assert_chunk_fails("a", KVT_E_CORRUPT, ta, 1);
    /* the chunk gone */
    assert_int_equal(unlink(c1), 0);
    assert_chunk_fails("b", -ENOENT, tb, 1);
    free(other);
    free(c1);
    free(pa);
    free(pb);
    free(pc);
    kvt_entry_free(ea);
    kvt_entry_free(eb);
    kvt_entry_free(ec);
    free(ta);
    free(tb);
    free(tc);
}

/* ---- the store with sharing on ------------------------------------------------------ */

static const char *const MODEL = "share/model";
static const char *const FP = "fp-share";
static const char *const TOKH = "tk-share";

/* A store handle on test_dir; @p cap 0: the default cap. */
static kvt_store *open_handle(bool share, uint64_t cap, int64_t grace_ms)
{
    struct kvt_store_opts o;
    store_opts_for(&o, MODEL, FP, TOKH);
    o.share_prefixes = share;
    o.tmp_grace_ms = grace_ms;
    if (cap)
        o.max_bytes = cap;
    kvt_store *s;
    if (kvt_store_open(test_dir, &o, &s))
        fail_msg("kvt_store_open: %s", kvt_last_error());
    return s;
}

static kvt_store *open_store(bool share, uint64_t cap)
{
    return open_handle(share, cap, 0); /* one writer: unneeded chunks go at once */
}

/* Branch @p b: 600 tokens shared by every branch, then 100 of its own (700, two chunks). */
#define SHARED 600
#define OWN 100

/* Branch @p b of prompt @p p, with one more token to compute: branches of one prompt share
 * its two chunks. */
static int32_t *prompt_branch(int p, int b)
{
    int32_t *t = branch_tokens(SHARED, OWN + 1, b);
    for (size_t i = 0; i < SHARED; i++)
        t[i] += 1000000 * p;
    return t;
}

static int put_branch(kvt_store *s, int p, int b)
{
    int32_t *tok = prompt_branch(p, b);
    struct kvt_entry *e;
    assert_int_equal(synth_entry(tok, SHARED + OWN, "", true, &e), 0);
    int rc = kvt_store_put(s, e, NULL, NULL);
    kvt_entry_free(e);
    free(tok);
    return rc;
}

/* Whether branch @p b of prompt @p p is found whole and restores to exactly its bytes. */
static bool branch_restores(kvt_store *s, int p, int b)
{
    int32_t *tok = prompt_branch(p, b);
    struct kvt_hit hit;
    assert_int_equal(kvt_store_find(s, tok, SHARED + OWN + 1, "", &hit), 0);
    bool ok = hit.prefix_len == SHARED + OWN;
    struct kvt_entry *back = NULL;
    if (ok)
        assert_int_equal(kvt_store_restore(s, &hit, &back), 0);
    ok = ok && back;
    if (ok) {
        struct kvt_entry *want;
        assert_int_equal(synth_entry(tok, SHARED + OWN, "", true, &want), 0);
        assert_same(back, want);
        kvt_entry_free(want);
    }
    kvt_entry_free(back);
    free(tok);
    return ok;
}

/* Files under the store's namespace directory ending in @p ext, and their bytes. */
static size_t files_with(const char *ext, uint64_t *bytes)
{
    char *cmd = strf("find '%s/%s' -name '*%s' -printf '%%s\\n' 2>/dev/null | "
                     "awk '{n++; b+=$1} END {print n+0, b+0}'",
                     test_dir, FP, ext);
    char *out;
    run_capture(cmd, &out);
    unsigned long long n = 0, b = 0;
    sscanf(out, "%llu %llu", &n, &b);
    if (bytes)
        *bytes = b;
    free(out);
    free(cmd);
    return (size_t)n;
}

static void test_store_branches(void **state)
{
    (void)state;
    kvt_store *s = open_store(true, 0);
    for (int b = 0; b < 4; b++)
        assert_int_equal(put_branch(s, 0, b), 0);
    for (int b = 0; b < 4; b++)
        assert_true(branch_restores(s, 0, b));
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    uint64_t tails, chunks;
    assert_int_equal(files_with(KVT_SHARE_EXT, &tails), 4);
    assert_int_equal(files_with(KVT_CHUNK_EXT, &chunks), 2); /* the prompt's, once */
    assert_int_equal(files_with(".mlxkv", NULL), 0);
    assert_int_equal(st.entries, 4);
    assert_int_equal(st.shared_chunks, 2);
    assert_int_equal(st.shared_bytes, chunks);
    assert_int_equal(st.total_bytes, tails + chunks); /* shared bytes counted once */
    kvt_store_close(s);

    /* a restart finds the same, with sharing off too: only writing depends on the option */
    s = open_store(false, 0);
    struct kvt_store_stats again;
    kvt_store_get_stats(s, &again);
    assert_int_equal(again.entries, 4);
    assert_int_equal(again.total_bytes, st.total_bytes);
    assert_int_equal(again.shared_chunks, 2);
    for (int b = 0; b < 4; b++)
        assert_true(branch_restores(s, 0, b));
    /* and with it off, puts write the usual layout */
    assert_int_equal(put_branch(s, 0, 9), 0);
    assert_int_equal(files_with(".mlxkv", NULL), 1);
    assert_true(branch_restores(s, 0, 9));
    kvt_store_close(s);
}

static char *ns_dir(void)
{
    return strf("%s/%s/base", test_dir, FP);
}

static void test_store_eviction(void **state)
{
    (void)state;
    kvt_store *s = open_store(true, 0);
    assert_int_equal(put_branch(s, 0, 0), 0);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    uint64_t chunks = st.shared_bytes, tail = st.total_bytes - chunks;
    kvt_store_close(s);
    /* room for two prompts' chunks and three tails */
    s = open_store(true, 2 * chunks + 3 * tail + tail / 2);
    for (int i = 0; i < 12; i++) {
        int p = i / 4, b = i % 4; /* four branches of each of three prompts */
        assert_int_equal(put_branch(s, p, b), 0);
        assert_true(branch_restores(s, p, b));
        kvt_store_get_stats(s, &st);
        assert_true(st.total_bytes <= st.max_bytes);
        /* what the store counts is what the disk holds: shared bytes once, nothing orphaned */
        uint64_t on_disk_tails, on_disk_chunks;
        size_t n_tails = files_with(KVT_SHARE_EXT, &on_disk_tails);
        size_t n_chunks = files_with(KVT_CHUNK_EXT, &on_disk_chunks);
        assert_int_equal(n_tails, st.entries);
        assert_int_equal(n_chunks, st.shared_chunks);
        assert_int_equal(on_disk_tails + on_disk_chunks, st.total_bytes);
        /* every entry still indexed restores: none lost a chunk to eviction */
        for (int j = 0; j <= i; j++) {
            int32_t *tok = prompt_branch(j / 4, j % 4);
            struct kvt_hit hit;
            assert_int_equal(kvt_store_find(s, tok, SHARED + OWN + 1, "", &hit), 0);
            if (hit.prefix_len == SHARED + OWN)
                assert_true(branch_restores(s, j / 4, j % 4));
            free(tok);
        }
    }
    assert_true(st.evictions > 0);
    kvt_store_close(s);
}

static void test_store_corrupt_chunk(void **state)
{
    (void)state;
    kvt_store *s = open_store(true, 0);
    for (int b = 0; b < 3; b++)
        assert_int_equal(put_branch(s, 0, b), 0);
    assert_int_equal(put_branch(s, 1, 0), 0); /* another prompt: its own chunks */
    char *dir = ns_dir();
    int32_t *tok = prompt_branch(0, 0);
    char *c1 = kvt_share_chunk_path_of(dir, tok, 1);
    flip_slot_byte(c1, 0, 0, 5, 0x40);
    /* the restore that meets the bad chunk is a miss, and so is every branch that needs it */
    assert_false(branch_restores(s, 0, 0));
    for (int b = 1; b < 3; b++) {
        int32_t *t = prompt_branch(0, b);
        struct kvt_hit hit;
        assert_int_equal(kvt_store_find(s, t, SHARED + OWN + 1, "", &hit), 0);
        assert_int_equal(hit.prefix_len, 0);
        free(t);
    }
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 1);
    assert_int_equal(st.corrupt_files, 1);
    assert_int_equal(access(c1, F_OK), -1);
    assert_int_equal(files_with(KVT_SHARE_EXT, NULL), 1); /* the dependents' tails are gone */
    assert_true(branch_restores(s, 1, 0));
    /* a new put of the prompt writes the chunk again */
    assert_int_equal(put_branch(s, 0, 0), 0);
    assert_true(branch_restores(s, 0, 0));
    kvt_store_close(s);

    /* a chunk missing at open: the entries that need it are not indexed, their tails go */
    assert_int_equal(unlink(c1), 0);
    s = open_store(true, 0);
    kvt_store_get_stats(s, &st);
    assert_int_equal(st.entries, 1);
    assert_false(branch_restores(s, 0, 0));
    assert_true(branch_restores(s, 1, 0));
    assert_int_equal(files_with(KVT_SHARE_EXT, NULL), 1);
    kvt_store_close(s);
    free(c1);
    free(tok);
    free(dir);
}

/* ---- two processes' tables on one directory ------------------------------------------ */

/* While the gated put runs (after its scan, before its eviction), the other handle puts a
 * branch of prompt 0, reusing its chunks, then the reuse ages past the grace. */
struct other_put {
    kvt_store *other;
    int steps;
};

static int other_puts_meanwhile(void *engine, kvt_step_fn step, void *arg)
{
    struct other_put *o = engine;
    if (o->steps++ == 0) {
        assert_int_equal(put_branch(o->other, 0, 1), 0);
        usleep(150 * 1000);
    }
    return step(arg);
}

/*
 * Each process counts the chunks of the tails it has indexed. One that evicts the last branch
 * it knows of a prompt must not remove the prompt's chunks while another process's branch,
 * published since its last scan, still needs them: that branch restores afterwards.
 */
static void test_eviction_keeps_another_tables_chunks(void **state)
{
    (void)state;
    kvt_store *a = open_handle(true, 0, 50);
    assert_int_equal(put_branch(a, 0, 0), 0);
    struct kvt_store_stats st;
    kvt_store_get_stats(a, &st);
    kvt_store_close(a);
    a = open_handle(true, st.total_bytes + st.total_bytes / 2, 50); /* room for one prompt */
    kvt_store *b = open_handle(true, 0, 50);
    int32_t *tok = prompt_branch(1, 0);
    struct kvt_entry *e;
    assert_int_equal(synth_entry(tok, SHARED + OWN, "", true, &e), 0);
    struct other_put o = {b, 0};
    assert_int_equal(kvt_store_put(a, e, other_puts_meanwhile, &o), 0);
    kvt_store_get_stats(a, &st);
    assert_int_equal(st.evictions, 1); /* prompt 0's branch 0: a knew no other of prompt 0 */
    assert_true(branch_restores(b, 0, 1));
    kvt_entry_free(e);
    free(tok);
    kvt_store_close(a);
    kvt_store_close(b);
}

/* ---- the CLI over a store with shared entries ------------------------------------- */

static void test_cli(void **state)
{
    (void)state;
    kvt_store *s = open_store(true, 0);
    for (int b = 0; b < 3; b++)
        assert_int_equal(put_branch(s, 0, b), 0);
    assert_int_equal(put_branch(s, 1, 0), 0);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    struct kvt_store_record *v;
    size_t n;
    assert_int_equal(kvt_store_list(s, &v, &n), 0);
    char *tail = strdup(v[n - 1].path); /* prompt 1's only branch, put last */
    kvt_store_list_free(v);
    kvt_store_close(s);
    char *fp_dir = strf("%s/%s", test_dir, FP), *out, *args;

    /* stats: the chunks, counted once in total_bytes */
    args = strf("stats '%s' --json", fp_dir);
    assert_int_equal(run_cli(args, false, &out), 0);
    char *want =
        strf("\"shared_chunks\":4,\"shared_bytes\":%llu", (unsigned long long)st.shared_bytes);
    if (!strstr(out, want))
        fail_msg("stats: %s (want %s)", out, want);
    char *total = strf("\"total_bytes\":%llu", (unsigned long long)st.total_bytes);
    assert_non_null(strstr(out, total));
    free(total);
    free(want);
    free(out);
    free(args);

    /* verify: every tail and chunk, hashes and all */
    args = strf("verify '%s'", fp_dir);
    assert_int_equal(run_cli(args, false, &out), 0);
    free(args);
    if (!strstr(out, "8 files checked, 0 bad")) /* 4 tails, 4 chunks */
        fail_msg("verify: %s", out);
    free(out);

    /* gc: the chunks of prompt 1 are unneeded once its only tail is gone */
    char *dir = ns_dir();
    int32_t *tok = prompt_branch(1, 0);
    char *c0 = kvt_share_chunk_path_of(dir, tok, 0), *c1 = kvt_share_chunk_path_of(dir, tok, 1);
    args = strf("ls '%s'", fp_dir);
    assert_int_equal(run_cli(args, false, &out), 0);
    free(args);
    if (!strstr(out, "4 entries") || !strstr(out, KVT_SHARE_EXT))
        fail_msg("ls: %s", out);
    free(out);
    assert_int_equal(unlink(tail), 0);
    args = strf("gc '%s' --tmp-grace-ms 0 --dry-run", fp_dir);
    assert_int_equal(run_cli(args, false, &out), 0);
    assert_non_null(strstr(out, "would remove unneeded chunk"));
    assert_non_null(strstr(out, "remove unneeded chunk 2"));
    free(out);
    free(args);
    assert_int_equal(access(c0, F_OK), 0);
    args = strf("gc '%s' --tmp-grace-ms 0", fp_dir);
    assert_int_equal(run_cli(args, false, &out), 0);
    free(out);
    free(args);
    assert_int_equal(access(c0, F_OK), -1);
    assert_int_equal(access(c1, F_OK), -1);
    assert_int_equal(files_with(KVT_CHUNK_EXT, NULL), 2); /* prompt 0's, still needed */
    s = open_store(true, 0);
    for (int b = 0; b < 3; b++)
        assert_true(branch_restores(s, 0, b));
    kvt_store_close(s);
    free(tail);
    free(c0);
    free(c1);
    free(tok);
    free(dir);
    free(fp_dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trips, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_not_shareable, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_branches_share_chunks, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_bad_chunks, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_store_branches, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_store_eviction, test_dir_setup, test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_store_corrupt_chunk, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_eviction_keeps_another_tables_chunks, test_dir_setup,
                                        test_dir_teardown),
        cmocka_unit_test_setup_teardown(test_cli, test_dir_setup, test_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
