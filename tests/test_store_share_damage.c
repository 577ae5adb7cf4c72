/*
 * Damage to the files of a shared entry (docs/SHARING.md §4, §7): every 61st byte of its tail
 * and of each chunk flipped on its own, and the files cut at every 427th length; after each
 * case the entry is loaded with hashes checked. A load either fails or returns exactly the
 * saved entry (a flipped byte no load reads: header padding, gaps); a cut file never loads.
 */
#include "support/support.h"

#include <stdio.h>
#include <stdlib.h>

#include "progs/crash_entry.h"
#include "store/share.h"

struct sweep {
    const struct kvt_entry *want;
    const char *tail;
    long loads, caught, same, wrong;
};

/* Load the shared entry; a success must be the very entry that was saved. */
static void sweep_load(struct sweep *w)
{
    struct kvt_entry *back = NULL;
    struct kvt_expect x = {.n_layers = w->want->n_caches};
    int rc = kvt_share_load(w->tail, &x, &back, NULL);
    w->loads++;
    if (rc)
        w->caught++;
    else if (synth_same_caches(back, w->want))
        w->same++;
    else
        w->wrong++;
    kvt_entry_free(back);
}

/* Flip every @p step-th byte of @p path in turn (and truncate it at every @p step-th length),
 * loading the entry after each; the file is put back after each case. */
static void sweep_file(struct sweep *w, const char *path, size_t step)
{
    size_t n;
    uint8_t *orig = read_file(path, &n);
    assert_non_null(orig);
    for (size_t at = 0; at < n; at += step) {
        orig[at] ^= (uint8_t)(1u << (at % 8));
        assert_int_equal(write_file(path, orig, n), 0);
        orig[at] ^= (uint8_t)(1u << (at % 8));
        sweep_load(w);
    }
    for (size_t len = 0; len < n; len += step * 7) {
        assert_int_equal(write_file(path, orig, len), 0);
        long caught = w->caught;
        sweep_load(w);
        assert_int_equal(w->caught, caught + 1); /* a cut file never loads */
    }
    assert_int_equal(write_file(path, orig, n), 0);
    free(orig);
}

static void test_damage_sweep(void **state)
{
    (void)state;
    /* kv and qkv cut into two chunks, an ssm layer whole in the tail */
    struct kvt_entry *e;
    assert_int_equal(synth_shared_entry(7, &e), 0);
    char *tp = strf("%s/swept%s", test_dir, KVT_SHARE_EXT);
    struct kvt_share_saved sv;
    struct kvt_save_opts no_sync = {.no_sync = true};
    assert_int_equal(kvt_share_save(test_dir, tp, e, &no_sync, &sv), 0);
    assert_int_equal(sv.chunks_written, 2);
    struct sweep w = {.want = e, .tail = tp};
    sweep_load(&w);
    assert_int_equal(w.same, 1);
    sweep_file(&w, tp, 61);
    for (size_t k = 0; k < 2; k++) {
        char *c = kvt_share_chunk_path_of(test_dir, e->tokens, k);
        sweep_file(&w, c, 61);
        free(c);
    }
    printf("shared damage sweep: %ld loads, %ld failed, %ld identical (unread bytes), "
           "%ld served wrong\n",
           w.loads, w.caught, w.same, w.wrong);
    assert_int_equal(w.wrong, 0);
    assert_true(w.caught > w.loads / 4);
    free(tp);
    kvt_entry_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_damage_sweep, test_dir_setup, test_dir_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
