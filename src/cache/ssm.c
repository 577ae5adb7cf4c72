/*
 * The gated-DeltaNet state (CACHES.md §8): kvt_cache_ssm_update() replaces conv and
 * recurrent wholesale. The new bytes go into the current buffers when this cache holds them
 * alone, else into fresh ones, so clones keep the state they captured.
 */
#include "cache/cache_parts.h"
#include "common/error.h"

#include <errno.h>
#include <string.h>

int kvt_cache_ssm_update(kvt_cache *c, const struct kvt_tensor *conv,
                         const struct kvt_tensor *recurrent, int64_t n_tokens)
{
    if (!c || !conv || !recurrent)
        return kvt_fail(-EINVAL, "ssm update: NULL argument");
    if (c->info.kind != KVT_KIND_SSM)
        return kvt_fail(-EINVAL, "ssm update on a %s cache", kvt_kind_name(c->info.kind));
    int64_t end;
    if (n_tokens < 0 || __builtin_add_overflow(c->info.offset, n_tokens, &end))
        return kvt_fail(-EINVAL, "ssm update: bad token count %lld", (long long)n_tokens);
    struct kvt_tensor in[2] = {*conv, *recurrent}; /* borrowed */
    struct kvt_cache_info p = {.kind = KVT_KIND_SSM};
    int rc = kvt_cache_check_tensors("ssm update", &p, in, 2);
    if (rc == 0)
        rc = kvt_cache_check_host("ssm update", c, in, 2);
    if (rc)
        return rc;
    if (c->has_buf) {
        for (int i = 0; i < 2; i++) {
            const struct kvt_tensor *h = &c->a[i].t;
            bool same = in[i].dtype == h->dtype && in[i].rank == h->rank;
            for (int ax = 0; same && ax < h->rank; ax++)
                same = in[i].shape[ax] == h->shape[ax];
            if (!same)
                return kvt_fail(-EINVAL, "ssm update: %s shape or dtype differs from the cache",
                                i ? "recurrent" : "conv");
        }
    }
    struct kvt_tensor fresh[2];
    bool move[2];
    memset(fresh, 0, sizeof(fresh));
    for (int i = 0; i < 2; i++) {
        move[i] = !c->has_buf || !kvt_arr_writable(c, i, 0);
        if (!move[i])
            continue;
        rc = kvt_arr_alloc(&fresh[i], &in[i], in[i].shape[2], false);
        if (rc) {
            kvt_tensors_release(fresh, 2);
            return kvt_fail(rc, "ssm update: cannot allocate the state");
        }
    }
    for (int i = 0; i < 2; i++) {
        if (move[i])
            kvt_arr_replace(c, i, &fresh[i]);
        kvt_tensor_copy(&c->a[i].t, &in[i]);
    }
    c->has_buf = true;
    c->info.offset = end;
    return 0;
}
