/*
 * A small open-addressing hash map from a caller-computed 64-bit hash to a pointer. Several
 * values may share a hash: lookups take an equality predicate. Used by the store index for
 * its namespace, id and path maps. Not thread-safe (the store's lock guards it).
 */
#ifndef KVT_HMAP_H
#define KVT_HMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvt_hmap_slot {
    uint64_t hash;
    void *val; /* NULL = empty; kvt_hmap_tomb = deleted */
};

struct kvt_hmap {
    struct kvt_hmap_slot *slots;
    size_t cap;  /* power of two, or 0 */
    size_t n;    /* live values */
    size_t used; /* live values + tombstones */
};

typedef bool (*kvt_hmap_eq_fn)(const void *val, const void *key);

/** Release the slot array (the values are the caller's). */
void kvt_hmap_free(struct kvt_hmap *m);
/** Add @p val (never NULL) under @p hash. 0 or -ENOMEM. */
int kvt_hmap_put(struct kvt_hmap *m, uint64_t hash, void *val);
/** The first value under @p hash for which @p eq(val, key) holds, or NULL. */
void *kvt_hmap_get(const struct kvt_hmap *m, uint64_t hash, kvt_hmap_eq_fn eq, const void *key);
/** Remove the value @p val (pointer identity) stored under @p hash; false if absent. */
bool kvt_hmap_del(struct kvt_hmap *m, uint64_t hash, const void *val);
/** Visit every value (order unspecified); the map must not change during the walk. */
void kvt_hmap_each(const struct kvt_hmap *m, void (*fn)(void *val, void *ud), void *ud);
/** The hash of the string @p s (its bytes up to the NUL). */
uint64_t kvt_str_hash(const char *s);
/** A well-mixed hash of a 64-bit integer (splitmix64 finalizer). */
uint64_t kvt_hmap_mix(uint64_t x);

#endif
