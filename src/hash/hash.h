/*
 * Internal additions to the public Wyhash (kvtier.h).
 */
#ifndef KVT_HASH_H
#define KVT_HASH_H

#include <stddef.h>

#include "kvtier.h"

/**
 * memcpy(@p dst, @p src, @p len) and kvt_wyhash_update(@p st, @p src, @p len) in one pass over
 * the bytes: a copy out of a read buffer that is hashed reads the bytes once. The ranges must
 * not overlap.
 */
void kvt_wyhash_update_copy(struct kvt_wyhash_state *st, void *dst, const void *src, size_t len);

#endif
