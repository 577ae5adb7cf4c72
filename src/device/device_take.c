/*
 * Layer-wise takes (kvtier.h, kvt_dtake): the copies of a RAM hit run on the device's side
 * stream with a mark after each slot's, so that the caller's stream waits for a layer only
 * when it reaches it, and the host entry they read from lives until they are done.
 */
#include <errno.h>
#include <stdlib.h>

#include "common/error.h"
#include "device/device_parts.h"

int kvt_dtake_wait(kvt_dtake *p, size_t slot, uint64_t stream)
{
    if (!p)
        return kvt_fail(-EINVAL, "kvt_dtake_wait: NULL take");
    if (!p->marks) /* landed before the take returned (a disk hit) */
        return 0;
    if (slot >= p->n)
        return kvt_fail(-EINVAL, "kvt_dtake_wait: slot %zu of a take of %zu", slot, p->n);
    return p->d->ops->mark_wait(p->d, p->marks[slot], stream);
}

int kvt_dtake_end(kvt_dtake *p)
{
    if (!p)
        return 0;
    int rc = p->n ? p->d->ops->mark_sync(p->d, p->marks[p->n - 1]) : 0; /* one stream, in order */
    for (size_t k = 0; k < p->n; k++)
        p->d->ops->mark_free(p->d, p->marks[k]);
    free(p->marks);
    kvt_entry_free(p->src);
    for (size_t k = 0; k < p->n_parts; k++)
        kvt_entry_free(p->parts[k]);
    free(p->parts);
    free(p);
    return rc;
}
