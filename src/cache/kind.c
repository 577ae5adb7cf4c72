/*
 * The kind table: names, tensor counts, and the one trimmability rule (CACHES.md §9) used
 * for live caches and for headers alike.
 */
#include "cache/cache_parts.h"

#include <string.h>

static const struct {
    const char *name;
    int tensors;
} kinds[KVT_KIND_COUNT] = {
    [KVT_KIND_KV] = {"kv", 2},   [KVT_KIND_ROTATING] = {"rotating", 2},
    [KVT_KIND_QKV] = {"qkv", 6}, [KVT_KIND_ROTATING_QKV] = {"rotating-qkv", 6},
    [KVT_KIND_SSM] = {"ssm", 2}, [KVT_KIND_TURBOQUANT] = {"turboquant", 5},
};

const char *kvt_kind_name(int kind)
{
    if (kind < 0 || kind >= KVT_KIND_COUNT)
        return NULL;
    return kinds[kind].name;
}

int kvt_kind_from_name(const char *name)
{
    if (!name)
        return -1;
    for (int k = 0; k < KVT_KIND_COUNT; k++)
        if (strcmp(name, kinds[k].name) == 0)
            return k;
    return -1;
}

int kvt_kind_tensor_count(int kind)
{
    if (kind < 0 || kind >= KVT_KIND_COUNT)
        return 0;
    return kinds[kind].tensors;
}

bool kvt_kind_is_trimmable(int kind, int64_t offset, int64_t max_size)
{
    switch (kind) {
    case KVT_KIND_KV:
    case KVT_KIND_QKV:
    case KVT_KIND_TURBOQUANT: return true;
    case KVT_KIND_ROTATING:
    case KVT_KIND_ROTATING_QKV: return offset < max_size;
    default: return false; /* ssm, and kinds outside the table */
    }
}

bool kvt_kind_is_step(int kind)
{
    return kind == KVT_KIND_KV || kind == KVT_KIND_QKV || kind == KVT_KIND_TURBOQUANT;
}

bool kvt_kind_is_ring(int kind)
{
    return kind == KVT_KIND_ROTATING || kind == KVT_KIND_ROTATING_QKV;
}
