/*
 * kvt_mem_configure(): the settings (settings/settings.h), then the buffer cache's limit, which
 * is memory of its own rather than a flag, so it is applied here above both.
 */
#include "kvtier.h"
#include "settings/settings.h"

int kvt_mem_configure(const struct kvt_mem_opts *o)
{
    int rc = kvt_mem_apply(o);
    if (rc == 0 && o && o->buf_cache_bytes != 0)
        kvt_buf_cache_limit(o->buf_cache_bytes < 0 ? 0 : (size_t)o->buf_cache_bytes);
    return rc;
}
