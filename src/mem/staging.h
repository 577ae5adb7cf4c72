/*
 * Aligned staging memory for the streams: blocks of depth x chunk bytes, page aligned (so
 * O_DIRECT accepts them) and on huge pages where they are on (so a direct request over them is
 * a few large segments), already faulted in, and cached process-wide after use so that a
 * restore or save does not pay page faults for its bounce buffers again.
 */
#ifndef KVT_STAGING_H
#define KVT_STAGING_H

#include <stddef.h>

/** A block of @p bytes (a multiple of the page size), or NULL. */
void *kvt_staging_get(size_t bytes);
/** Give a block from kvt_staging_get(@p bytes) back. Accepts NULL. */
void kvt_staging_put(void *p, size_t bytes);

#endif
