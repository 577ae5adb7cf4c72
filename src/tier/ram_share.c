/*
 * Prefixes the RAM tier holds once (docs/SHARING.md, "The RAM tier"): cutting an entry into
 * chunks and a tail, the holds records keep on chunks, and the join that gives a record's
 * whole entry back. Copies are made with no lock held; holds change under the RAM LRU's lock.
 */
#include "tier/ram_share.h"

#include <errno.h>
#include <stdlib.h>

#include "common/error.h"

static size_t entry_bytes(const struct kvt_tier_cache_ops *ops, const struct kvt_entry *e)
{
    size_t sum = 0;
    for (size_t i = 0; i < e->n_caches; i++)
        sum += ops->bytes(e->caches[i]);
    return sum;
}

static void chunk_free(const struct kvt_tier_cache_ops *ops, struct kvt_ram_chunk *c)
{
    if (c)
        ops->entry_free(c->e);
    free(c);
}

void kvt_ram_cut_new(const struct kvt_tier_cache_ops *ops, const struct kvt_tier_alloc *a,
                     const struct kvt_entry *e, size_t from, size_t m, struct kvt_ram_cut *out)
{
    *out = (struct kvt_ram_cut){calloc(m, sizeof(*out->chunks)), m, from, NULL};
    int rc = out->chunks ? 0 : -ENOMEM;
    for (size_t k = from; rc == 0 && k < m; k++) {
        struct kvt_ram_chunk *c = calloc(1, sizeof(*c));
        rc = c ? ops->share_chunk(e, k, a, &c->e) : -ENOMEM;
        if (rc == 0)
            c->bytes = entry_bytes(ops, c->e);
        else
            free(c);
        out->chunks[k] = rc == 0 ? c : NULL;
    }
    if (rc == 0)
        rc = ops->share_tail(e, a, &out->tail);
    if (rc) {
        kvt_clear_error(); /* held whole instead */
        kvt_ram_cut_free(ops, out);
    }
}

void kvt_ram_cut_free(const struct kvt_tier_cache_ops *ops, struct kvt_ram_cut *c)
{
    for (size_t k = c->from; c->chunks && k < c->m; k++)
        chunk_free(ops, c->chunks[k]);
    free(c->chunks);
    if (c->tail)
        ops->entry_free(c->tail);
    *c = (struct kvt_ram_cut){0};
}

void kvt_ram_chunks_take(struct kvt_ram_chunk **c, size_t m, uint64_t *total)
{
    for (size_t k = 0; k < m; k++)
        if (c[k]->refs++ == 0)
            *total += c[k]->bytes;
}

void kvt_ram_chunks_drop(const struct kvt_tier_cache_ops *ops, struct kvt_ram_chunk **c, size_t m,
                         struct kvt_entry **parts, uint64_t *total)
{
    for (size_t k = 0; k < m; k++) {
        if (parts && ops->entry_clone(c[k]->e, &parts[k]) < 0)
            parts[k] = NULL;
        if (--c[k]->refs == 0) {
            *total -= c[k]->bytes;
            chunk_free(ops, c[k]);
        }
    }
}

int kvt_ram_hold(const struct kvt_tier_cache_ops *ops, const struct kvt_entry *e,
                 struct kvt_ram_chunk *const *c, size_t m, struct kvt_ram_held *h)
{
    *h = (struct kvt_ram_held){NULL, m ? calloc(m, sizeof(*h->parts)) : NULL, m};
    int rc = m && !h->parts ? kvt_fail(-ENOMEM, "prompt cache: out of memory") : 0;
    for (size_t k = 0; rc == 0 && k < m; k++)
        rc = ops->entry_clone(c[k]->e, &h->parts[k]);
    if (rc == 0)
        rc = ops->entry_clone(e, &h->e);
    if (rc)
        kvt_ram_held_free(ops, h);
    return rc;
}

int kvt_ram_join(const struct kvt_tier_cache_ops *ops, const struct kvt_tier_alloc *a,
                 struct kvt_ram_held *h, struct kvt_entry **out)
{
    *out = NULL;
    if (!h->m) { /* held whole: the entry is the clone */
        *out = h->e;
        h->e = NULL;
        return 0;
    }
    int rc = h->e && h->parts ? 0 : kvt_fail(-ENOMEM, "prompt cache: out of memory");
    for (size_t k = 0; rc == 0 && k < h->m; k++)
        if (!h->parts[k])
            rc = kvt_fail(-ENOMEM, "prompt cache: out of memory");
    if (rc == 0)
        rc = ops->share_join(h->e, h->parts, h->m, a, out);
    kvt_ram_held_free(ops, h);
    return rc;
}

void kvt_ram_held_free(const struct kvt_tier_cache_ops *ops, struct kvt_ram_held *h)
{
    for (size_t k = 0; h->parts && k < h->m; k++)
        ops->entry_free(h->parts[k]);
    free(h->parts);
    if (h->e)
        ops->entry_free(h->e);
    *h = (struct kvt_ram_held){0};
}
