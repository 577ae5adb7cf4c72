/*
 * Restores of a shared entry into device memory (docs/SHARING.md §4): its files are composed
 * in host memory first, as one load into the whole entry's rows (kvt_share_read(), every byte
 * hash-checked), then each slot the placement asked for is uploaded through the device's
 * staging ring. A whole file streams straight to the device instead (device_load.c); a
 * shared entry's rows come from several files, which that stream does not take.
 */
#include "device/device_parts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "format/format.h"
#include "store/share.h"

/* Upload slot @p s of the whole entry (at @p host) to @p dev, cut to the @p c slot's rows
 * (c NULL: whole): each [B, H] block's first rows, packed in place first. */
static int upload(kvt_device *d, uint64_t dev, uint8_t *host, const struct kvt_slot *s,
                  const struct kvt_slot *c)
{
    if (c && c->bytes != s->bytes) {
        uint64_t blocks = (uint64_t)(s->shape[0] * s->shape[1]);
        uint64_t whole = s->bytes / blocks, kept = c->bytes / blocks;
        for (uint64_t b = 1; b < blocks; b++) /* forward: block b never overlaps b' > b */
            memmove(host + b * kept, host + b * whole, (size_t)kept);
    }
    return kvt_device_upload(d, dev, host, (size_t)(c ? c->bytes : s->bytes));
}

/* Read the whole entry of @p so into @p host (slot k at its offset) and upload the slots
 * @p dst names, cut as @p cut (NULL: whole). */
static int read_and_upload(struct kvt_share_open *so, const struct kvt_expect *x, kvt_device *d,
                           const struct kvt_header *cut, const uint64_t *dst, char **bad_chunk)
{
    const struct kvt_header *w = so->whole;
    size_t n = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < w->n_caches; i++)
        for (int j = 0; j < w->caches[i].n_slots; j++, n++)
            bytes += w->caches[i].slots[j].bytes;
    uint8_t *host = bytes <= SIZE_MAX ? malloc((size_t)bytes + 1) : NULL;
    void **at = calloc(n + 1, sizeof(*at));
    struct kvt_slot_dst *sd = calloc(n + 1, sizeof(*sd));
    int rc = host && at && sd ? 0 : kvt_fail(-ENOMEM, "%s: out of memory", so->path[0]);
    for (size_t i = 0, o = 0; rc == 0 && i < w->n_caches; i++)
        for (int j = 0; j < w->caches[i].n_slots; j++, o++)
            at[o] = dst[o] ? host + w->caches[i].slots[j].off : NULL;
    if (rc == 0) {
        kvt_share_placed_dsts(w, at, sd);
        rc = kvt_share_read(so, sd, x, bad_chunk);
    }
    for (size_t i = 0, o = 0; rc == 0 && i < w->n_caches; i++)
        for (int j = 0; rc == 0 && j < w->caches[i].n_slots; j++, o++)
            if (dst[o])
                rc = upload(d, dst[o], at[o], &w->caches[i].slots[j],
                            cut ? &cut->caches[i].slots[j] : NULL);
    free(host);
    free(at);
    free(sd);
    return rc;
}

int kvt_share_load_to_device(const char *tail_path, const struct kvt_expect *x, kvt_device *d,
                             const struct kvt_placement *p, size_t keep,
                             struct kvt_header **out_header, char **bad_chunk)
{
    *out_header = NULL;
    struct kvt_share_open so;
    int rc = kvt_share_open(tail_path, x, &so, bad_chunk);
    if (rc)
        return rc;
    struct kvt_header *cut = NULL;
    void *dst = NULL;
    if (keep && keep < so.whole->n_tokens)
        rc = kvt_header_cut_prefix(so.whole, keep, &cut);
    if (rc == 0)
        rc = kvt_placement_ask(p, cut ? cut : so.whole, tail_path, &dst);
    if (rc == 0)
        rc = read_and_upload(&so, x, d, cut, (const uint64_t *)dst, bad_chunk);
    if (rc == 0) {
        *out_header = so.whole; /* the whole header, as a file's load gives it */
        so.whole = NULL;
    }
    kvt_header_free(cut);
    free(dst);
    kvt_share_close(&so);
    return rc;
}
