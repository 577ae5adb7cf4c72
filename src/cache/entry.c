/*
 * Library-owned entries: construction from tokens and caches, freeing, cloning every cache
 * (all or nothing), and the byte and trimmability sums over the caches.
 */
#include "cache/cache_parts.h"
#include "common/error.h"
#include "tensor/alloc.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int kvt_entry_new(const int32_t *tok, size_t n, kvt_cache *const *caches, size_t n_caches,
                  const char *ns, struct kvt_entry **out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_entry_new: out is NULL");
    *out = NULL;
    if ((n && !tok) || (n_caches && !caches))
        return kvt_fail(-EINVAL, "kvt_entry_new: NULL tokens or caches");
    if (n > SIZE_MAX / sizeof(int32_t) || n_caches > SIZE_MAX / sizeof(kvt_cache *))
        return kvt_fail(-EINVAL, "kvt_entry_new: sizes overflow");
    int rc = -ENOMEM;
    struct kvt_entry *e = kvt_calloc(1, sizeof(*e));
    if (!e)
        goto out_fail;
    e->created_at = -1;
    e->tokens = kvt_malloc(n * sizeof(int32_t));
    e->caches = kvt_calloc(n_caches, sizeof(kvt_cache *));
    if (!e->tokens || !e->caches)
        goto out_free;
    e->meta.ns = kvt_strdup(ns, &rc);
    if (rc)
        goto out_free;
    if (n)
        memcpy(e->tokens, tok, n * sizeof(int32_t));
    e->n_tokens = n;
    for (size_t i = 0; i < n_caches; i++)
        e->caches[i] = caches[i];
    e->n_caches = n_caches;
    *out = e;
    return 0;

out_free:
    kvt_free(e->tokens);
    kvt_free(e->caches);
    kvt_free(e);
out_fail:
    return kvt_fail(-ENOMEM, "kvt_entry_new: out of memory");
}

void kvt_entry_free(struct kvt_entry *e)
{
    if (!e)
        return;
    for (size_t i = 0; i < e->n_caches; i++)
        kvt_cache_free(e->caches[i]);
    kvt_free(e->caches);
    kvt_free(e->tokens);
    kvt_free((char *)e->meta.model_id);
    kvt_free((char *)e->meta.config_fingerprint);
    kvt_free((char *)e->meta.tokenizer_hash);
    kvt_free((char *)e->meta.ns);
    kvt_free(e);
}

int kvt_entry_clone(const struct kvt_entry *e, struct kvt_entry **out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_entry_clone: out is NULL");
    *out = NULL;
    if (!e || (e->n_caches && !e->caches) || (e->n_tokens && !e->tokens))
        return kvt_fail(-EINVAL, "kvt_entry_clone: bad entry");
    if (e->n_caches > SIZE_MAX / sizeof(kvt_cache *))
        return kvt_fail(-EINVAL, "kvt_entry_clone: sizes overflow");
    kvt_cache **cl = kvt_calloc(e->n_caches, sizeof(*cl));
    if (!cl)
        return kvt_fail(-ENOMEM, "kvt_entry_clone: out of memory");
    size_t built = 0;
    int rc = 0;
    for (; built < e->n_caches; built++) {
        rc = kvt_cache_clone(e->caches[built], &cl[built]);
        if (rc) {
            char msg[256];
            snprintf(msg, sizeof(msg), "%s", kvt_last_error());
            rc = kvt_fail(rc, "kvt_entry_clone: cache %zu: %s", built, msg);
            goto out_release;
        }
    }
    struct kvt_entry *c;
    rc = kvt_entry_new(e->tokens, e->n_tokens, cl, e->n_caches, e->meta.ns, &c);
    if (rc)
        goto out_release;
    /* the entry owns the clones now */
    built = 0;
    kvt_free(cl);
    cl = NULL;
    const char *src[3] = {e->meta.model_id, e->meta.config_fingerprint, e->meta.tokenizer_hash};
    const char **dst[3] = {&c->meta.model_id, &c->meta.config_fingerprint, &c->meta.tokenizer_hash};
    for (int k = 0; k < 3; k++) {
        *dst[k] = kvt_strdup(src[k], &rc);
        if (rc) {
            kvt_entry_free(c);
            return kvt_fail(rc, "kvt_entry_clone: out of memory");
        }
    }
    c->created_at = e->created_at;
    *out = c;
    return 0;

out_release:
    for (size_t i = 0; i < built; i++)
        kvt_cache_free(cl[i]);
    kvt_free(cl);
    return rc;
}

size_t kvt_entry_bytes(const struct kvt_entry *e)
{
    size_t sum = 0;
    for (size_t i = 0; e && i < e->n_caches; i++)
        sum += kvt_cache_bytes(e->caches[i]);
    return sum;
}

bool kvt_entry_is_trimmable(const struct kvt_entry *e)
{
    for (size_t i = 0; e && i < e->n_caches; i++)
        if (!kvt_cache_is_trimmable(e->caches[i]))
            return false;
    return e != NULL;
}

long kvt_entry_uncovered(const struct kvt_entry *e)
{
    for (size_t i = 0; i < e->n_caches; i++) {
        struct kvt_cache_info info;
        kvt_cache_get_info(e->caches[i], &info);
        if (info.kind != KVT_KIND_SSM && (info.offset < 0 || (uint64_t)info.offset != e->n_tokens))
            return (long)i;
    }
    return -1;
}

bool kvt_entry_on_device(const struct kvt_entry *e)
{
    for (size_t i = 0; e && i < e->n_caches; i++)
        for (int k = 0; e->caches[i] && e->caches[i]->has_buf && k < e->caches[i]->nt; k++)
            if (kvt_tensor_on_device(&e->caches[i]->a[k].t))
                return true;
    return false;
}
