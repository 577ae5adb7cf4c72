/*
 * Append for the STEP-growth kinds (kv, qkv, turboquant; CACHES.md §2): capacity grows in
 * chunks of 256 rows with the reference's cut-to-prev rule, new rows are written in place
 * when no other holder can see them, and a clone that holds the last references of its
 * donor's buffer keeps appending into the spare rows (CACHES.md §13).
 */
#include "cache/cache_parts.h"
#include "common/error.h"

#include <errno.h>
#include <string.h>

static int64_t round_step(int64_t n)
{
    return (n + KVT_STEP - 1) / KVT_STEP * KVT_STEP;
}

/* Sole-owner appends: take over every spare row of buffers nobody else references. */
static void try_extend(kvt_cache *c, int64_t need)
{
    int64_t phys = INT64_MAX;
    for (int i = 0; i < c->nt; i++) {
        if (kvt_buf_is_wrapped(c->a[i].t.buf) || !kvt_arr_sole(c, i))
            return;
        if (c->a[i].t.shape[2] < phys)
            phys = c->a[i].t.shape[2];
    }
    if (phys < need)
        return;
    for (int i = 0; i < c->nt; i++) {
        c->a[i].owner = true;
        kvt_buf_unexpose(c->a[i].t.buf);
    }
    c->cap = phys;
    c->exact_cap = false;
}

/*
 * Which arrays an append of @p l rows at @p prev (to @p need) moves to fresh buffers: all of
 * them (*all, at the returned capacity) when the capacity must grow, else those not
 * writable in place (move[]).
 */
static int64_t plan_growth(kvt_cache *c, int64_t prev, int64_t l, int64_t need, bool *move,
                           bool *all)
{
    bool any = false;
    *all = true;
    if (!c->has_buf)
        return round_step(l);
    if (need > c->cap)
        try_extend(c, need);
    if (need > c->cap) {
        /* §2: a misaligned prev first cuts the buffer to [0, prev) */
        if (c->exact_cap)
            return round_step(need); /* a clone's first allocation: §12 capacity */
        return (prev % KVT_STEP ? prev : c->cap) + round_step(l);
    }
    for (int i = 0; i < c->nt; i++) {
        move[i] = !kvt_arr_writable(c, i, prev);
        any = any || move[i];
    }
    if (any && c->exact_cap)
        return round_step(need);
    *all = false;
    return c->cap;
}

int kvt_step_append(kvt_cache *c, const struct kvt_tensor *in, int64_t l)
{
    int64_t prev = c->info.offset, need;
    if (__builtin_add_overflow(prev, l, &need) || need > INT64_MAX / 2)
        return kvt_fail(-EINVAL, "%s append: offset %lld + %lld overflows",
                        kvt_kind_name(c->info.kind), (long long)prev, (long long)l);
    struct kvt_tensor fresh[KVT_MAX_CACHE_TENSORS];
    bool move[KVT_MAX_CACHE_TENSORS] = {false};
    bool all;
    memset(fresh, 0, sizeof(fresh));
    int64_t newcap = plan_growth(c, prev, l, need, move, &all);
    for (int i = 0; i < c->nt; i++) {
        if (all)
            move[i] = true;
        if (!move[i])
            continue;
        const struct kvt_tensor *like = c->has_buf ? &c->a[i].t : &in[i];
        int rc = kvt_arr_alloc(&fresh[i], like, newcap, true);
        if (rc) {
            kvt_tensors_release(fresh, c->nt);
            return kvt_fail(rc, "%s append: cannot allocate %lld rows", kvt_kind_name(c->info.kind),
                            (long long)newcap);
        }
        if (c->has_buf)
            kvt_rows_copy(&fresh[i], 0, &c->a[i].t, 0, prev);
    }
    for (int i = 0; i < c->nt; i++)
        if (move[i])
            kvt_arr_replace(c, i, &fresh[i]);
    if (all) {
        c->cap = newcap;
        c->exact_cap = false;
    }
    c->has_buf = true;
    for (int i = 0; i < c->nt; i++)
        kvt_rows_copy(&c->a[i].t, prev, &in[i], 0, l);
    c->info.offset = need;
    return 0;
}
