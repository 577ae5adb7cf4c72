/*
 * The buffer cache (kvt_buf_cache_limit() in kvtier.h): freed large mappings are kept, up to a
 * limit, and handed to the next large buffer. A restore after an eviction then reads into
 * memory the process already holds instead of faulting in fresh zeroed pages, which on a VM
 * that backs guest memory lazily can also cost a host fault per page.
 */
#ifndef KVT_BUF_CACHE_H
#define KVT_BUF_CACHE_H

#include <stdbool.h>
#include <stddef.h>

/**
 * A mapping of at least @p bytes: the smallest kept one that is large enough, else a fresh one
 * (kvt_hugepage_map(), zero filled). *@p len receives its length, to pass to
 * kvt_buf_cache_give(); *@p was_kept whether it was kept (its contents are then whatever its last
 * user left). @return the mapping, or NULL when memory is exhausted.
 */
void *kvt_buf_cache_take(size_t bytes, size_t *len, bool *was_kept);

/** An eighth of physical memory, at most 8 GiB (none under the sanitizers). */
size_t kvt_buf_cache_default_limit(void);

/** Give back a mapping from kvt_buf_cache_take(): kept while the cache has room, else unmapped. */
void kvt_buf_cache_give(void *p, size_t len);

#endif
