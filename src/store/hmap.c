/*
 * Open-addressing hash map (linear probing, tombstones, power-of-two capacity) for the store
 * index. Keys live in the values; the map stores only the hash, so lookups take a predicate.
 */
#include "store/hmap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "hash/hash.h"

static char tomb_marker;
#define TOMB ((void *)&tomb_marker)

uint64_t kvt_hmap_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void kvt_hmap_free(struct kvt_hmap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = m->n = m->used = 0;
}

static void insert_slot(struct kvt_hmap_slot *slots, size_t cap, uint64_t hash, void *val)
{
    size_t i = (size_t)hash & (cap - 1);
    while (slots[i].val && slots[i].val != TOMB)
        i = (i + 1) & (cap - 1);
    slots[i].hash = hash;
    slots[i].val = val;
}

static int grow(struct kvt_hmap *m)
{
    size_t cap = m->cap ? m->cap : 16;
    while ((m->n + 1) * 2 > cap) /* keep the live load at most 1/2 after a rehash */
        cap *= 2;
    struct kvt_hmap_slot *slots = calloc(cap, sizeof(*slots));
    if (!slots)
        return -ENOMEM;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].val && m->slots[i].val != TOMB)
            insert_slot(slots, cap, m->slots[i].hash, m->slots[i].val);
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    m->used = m->n;
    return 0;
}

int kvt_hmap_put(struct kvt_hmap *m, uint64_t hash, void *val)
{
    if ((m->used + 1) * 10 > m->cap * 7) {
        int rc = grow(m);
        if (rc < 0)
            return rc;
    }
    size_t i = (size_t)hash & (m->cap - 1);
    while (m->slots[i].val && m->slots[i].val != TOMB)
        i = (i + 1) & (m->cap - 1);
    if (!m->slots[i].val)
        m->used++;
    m->slots[i].hash = hash;
    m->slots[i].val = val;
    m->n++;
    return 0;
}

void *kvt_hmap_get(const struct kvt_hmap *m, uint64_t hash, kvt_hmap_eq_fn eq, const void *key)
{
    if (!m->cap)
        return NULL;
    for (size_t i = (size_t)hash & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        void *v = m->slots[i].val;
        if (!v)
            return NULL;
        if (v != TOMB && m->slots[i].hash == hash && eq(v, key))
            return v;
    }
}

bool kvt_hmap_del(struct kvt_hmap *m, uint64_t hash, const void *val)
{
    if (!m->cap)
        return false;
    for (size_t i = (size_t)hash & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        void *v = m->slots[i].val;
        if (!v)
            return false;
        if (v == val) {
            m->slots[i].val = TOMB;
            m->n--;
            return true;
        }
    }
}

void kvt_hmap_each(const struct kvt_hmap *m, void (*fn)(void *val, void *ud), void *ud)
{
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].val && m->slots[i].val != TOMB)
            fn(m->slots[i].val, ud);
}

uint64_t kvt_str_hash(const char *s)
{
    return kvt_wyhash(0, s, strlen(s));
}
