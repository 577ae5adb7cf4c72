/*
 * A header cut to a prefix of its tokens, as a load of only that prefix into caller memory
 * lays it out (the device restores of a hit shorter than its entry).
 */
#include "format/format.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

int kvt_header_cut_prefix(const struct kvt_header *h, size_t keep, struct kvt_header **out)
{
    *out = NULL;
    int64_t t = (int64_t)(h->n_tokens - keep);
    for (size_t i = 0; i < h->n_caches; i++) {
        const struct kvt_cache_header *c = &h->caches[i];
        if (c->info.kind != KVT_KIND_KV || c->info.offset < t)
            return kvt_fail(KVT_E_UNSUPPORTED,
                            "a prefix load into device memory needs kv caches "
                            "(caches[%zu] is %s)",
                            i, kvt_kind_name(c->info.kind));
        for (int j = 0; j < c->n_slots; j++)
            if (c->slots[j].rank != 4 || c->slots[j].shape[2] != c->info.offset)
                return kvt_fail(KVT_E_UNSUPPORTED, "caches[%zu].tensors[%d] is not [B, H, T, D]", i,
                                j);
    }
    struct kvt_header *o = calloc(1, sizeof(*o));
    int rc = 0;
    if (o) {
        *o = *h;
        o->model_id = o->config_fingerprint = o->tokenizer_hash = o->ns = NULL;
        o->tokens = malloc(keep ? keep * sizeof(*o->tokens) : 1);
        o->caches = malloc((h->n_caches ? h->n_caches : 1) * sizeof(*o->caches));
        const char *src[4] = {h->model_id, h->config_fingerprint, h->tokenizer_hash, h->ns};
        char **dst[4] = {&o->model_id, &o->config_fingerprint, &o->tokenizer_hash, &o->ns};
        for (int k = 0; k < 4; k++)
            if (src[k] && !(*dst[k] = strdup(src[k])))
                rc = -ENOMEM;
    }
    if (!o || rc || !o->tokens || !o->caches) {
        kvt_header_free(o);
        return kvt_fail(-ENOMEM, "out of memory");
    }
    memcpy(o->tokens, h->tokens, keep * sizeof(*o->tokens));
    o->n_tokens = keep;
    memcpy(o->caches, h->caches, h->n_caches * sizeof(*o->caches));
    uint64_t off = 0;
    for (size_t i = 0; i < o->n_caches; i++) {
        struct kvt_cache_header *c = &o->caches[i];
        c->info.offset -= t;
        for (int j = 0; j < c->n_slots; j++) {
            struct kvt_slot *sl = &c->slots[j];
            sl->bytes = sl->bytes / (uint64_t)(sl->shape[2] ? sl->shape[2] : 1) *
                        (uint64_t)(sl->shape[2] - t);
            sl->shape[2] -= t;
            sl->off = off;
            sl->hash = 0;
            off += sl->bytes;
        }
    }
    *out = o;
    return 0;
}
