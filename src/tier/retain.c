/*
 * Ref-counted retains (TIER.md §2.6): a hold on engine backing memory shared by a RAM
 * record and every entry taken from it. A handle is one reference; the hook runs exactly
 * once, on the thread that drops the last one. A record "wrapping" the caller's retain in a
 * new share is the same as the record holding that reference: the hook still runs once,
 * after the last of the record and its takers lets go.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "common/error.h"
#include "kvtier.h"

struct kvt_retain {
    atomic_long refs;
    void (*hook)(void *ud);
    void *ud;
};

int kvt_retain_new(void (*hook)(void *ud), void *ud, kvt_retain **out)
{
    kvt_retain *r = malloc(sizeof(*r));
    *out = NULL;
    if (!r) {
        if (hook)
            hook(ud); /* the hold is released on every path, as kvt_buf_wrap() does */
        return kvt_fail(-ENOMEM, "kvt_retain_new: out of memory");
    }
    atomic_init(&r->refs, 1);
    r->hook = hook;
    r->ud = ud;
    *out = r;
    return 0;
}

kvt_retain *kvt_retain_acquire(kvt_retain *r)
{
    if (r)
        atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
    return r;
}

void kvt_retain_release(kvt_retain *r)
{
    if (!r)
        return;
    if (atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (r->hook)
        r->hook(r->ud);
    free(r);
}
