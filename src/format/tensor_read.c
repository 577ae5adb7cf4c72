/*
 * Streaming reads of tensor bytes for the loader and the verifier. One read-ahead stream
 * (io/stream.h) covers every slot of the header in header order, so the device keeps
 * reading the next tensors while this one is copied into place and hashed, and while the
 * loader allocates the next buffer. Blocks land straight in their destination (row blocks
 * of a capacity buffer one by one), each piece is hashed as soon as it is in place, and
 * nothing is read outside the validated ranges of the slots (FORMAT.md V16, V17). Nothing is
 * mapped. A caller that reads slots out of order gets a new stream from that slot on.
 */
#include "format/format.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "io/io.h"
#include "io/stream.h"

void kvt_tensor_reader_free(struct kvt_tensor_reader *r)
{
    kvt_rstream_close(r->rs);
    r->rs = NULL;
}

static int read_err(const struct kvt_tensor_reader *r, int rc, uint64_t off)
{
    return kvt_fail(rc, "%s: read at offset %" PRIu64 ": %s", r->name, off, kvt_strerror(rc));
}

static void hash_piece(void *ud, const void *p, size_t n)
{
    kvt_wyhash_update(ud, p, n);
}

/*
 * The ranges slot @p s takes in a stream with destination @p d: one per block of a strided
 * destination, one for a contiguous one, 0 when it has none (or a geometry that
 * kvt_tensor_read() will refuse): the slot is then one range read through staging.
 */
static size_t dst_ranges(const struct kvt_slot *s, const struct kvt_slot_dst *d)
{
    if (!d || !d->dst || s->bytes == 0 || d->blocks == 0 || s->bytes % d->blocks ||
        d->stride < s->bytes / d->blocks || d->blocks > SIZE_MAX)
        return 0;
    return d->stride == s->bytes / d->blocks ? 1 : (size_t)d->blocks;
}

/* A new stream over slot @p sj of cache @p ci and every slot after it, in header order. */
static int open_stream(struct kvt_tensor_reader *r, size_t ci, int sj)
{
    const struct kvt_header *h = r->h;
    size_t n = 0, ord = 0; /* ranges; the ordinal of slot (ci, sj) in header order */
    kvt_rstream_close(r->rs);
    r->rs = NULL;
    for (size_t i = 0; i < ci; i++)
        ord += (size_t)h->caches[i].n_slots;
    ord += (size_t)sj;
    for (size_t i = ci, o = ord; i < h->n_caches; i++)
        for (int j = i == ci ? sj : 0; j < h->caches[i].n_slots; j++, o++) {
            size_t nr = dst_ranges(&h->caches[i].slots[j], r->dst ? &r->dst[o] : NULL);
            n += nr ? nr : 1;
        }
    struct kvt_range *rg = malloc((n ? n : 1) * sizeof(*rg));
    if (!rg)
        return kvt_fail(-ENOMEM, "%s: out of memory for the read stream", r->name);
    n = 0;
    for (size_t i = ci, o = ord; i < h->n_caches; i++)
        for (int j = i == ci ? sj : 0; j < h->caches[i].n_slots; j++, o++) {
            const struct kvt_slot *s = &h->caches[i].slots[j];
            const struct kvt_slot_dst *d = r->dst ? &r->dst[o] : NULL;
            size_t nr = dst_ranges(s, d);
            if (nr == 0) {
                rg[n++] = (struct kvt_range){kvt_slot_abs(h, s), s->bytes, NULL};
                continue;
            }
            uint64_t blk = s->bytes / nr;
            for (size_t k = 0; k < nr; k++)
                rg[n++] =
                    (struct kvt_range){kvt_slot_abs(h, s) + k * blk, blk, d->dst + k * d->stride};
        }
    int rc = kvt_rstream_open(r->fd, rg, n, NULL, &r->rs);
    free(rg);
    if (rc < 0)
        return kvt_fail(rc, "%s: cannot open the read stream: %s", r->name, kvt_strerror(rc));
    r->next_ci = ci;
    r->next_sj = sj;
    return 0;
}

/* The stream has delivered slot (ci, sj): the next one in header order is due. */
static void advance(struct kvt_tensor_reader *r, size_t ci, int sj)
{
    if (sj + 1 < r->h->caches[ci].n_slots) {
        r->next_ci = ci;
        r->next_sj = sj + 1;
    } else {
        r->next_ci = ci + 1;
        r->next_sj = 0;
    }
}

int kvt_tensor_read(struct kvt_tensor_reader *r, size_t ci, int sj, uint8_t *dst, uint64_t blocks,
                    uint64_t dst_stride)
{
    const struct kvt_slot *s = &r->h->caches[ci].slots[sj];
    uint64_t abs = kvt_slot_abs(r->h, s);
    uint64_t n = s->bytes;
    uint64_t blk = blocks ? n / blocks : 0;
    if (blocks == 0 || blk * blocks != n || (dst && dst_stride < blk) || n > SIZE_MAX)
        return kvt_fail(-EINVAL, "%s: caches[%zu].tensors[%d]: bad read geometry", r->name, ci, sj);
    if (dst && dst_stride > blk)
        for (uint64_t k = 0; k < blocks; k++)
            memset(dst + k * dst_stride + blk, 0, (size_t)(dst_stride - blk));
    bool due = r->rs && r->next_ci == ci && r->next_sj == sj;
    if (n == 0) {
        if (due)
            advance(r, ci, sj);
        if (!r->verify)
            return 0;
    } else {
        int rc = due ? 0 : open_stream(r, ci, sj);
        if (rc)
            return rc;
    }

    struct kvt_wyhash_state st;
    kvt_wyhash_init(&st, 0);
    kvt_piece_fn fn = r->verify ? hash_piece : NULL;
    uint64_t at = abs;
    int rc = 0;
    if (n == 0)
        rc = 0;
    else if (!dst || dst_stride == blk)
        rc = kvt_rstream_read(r->rs, dst, (size_t)n, fn, &st, &at);
    else
        for (uint64_t k = 0; k < blocks && !rc; k++)
            rc = kvt_rstream_read(r->rs, dst + k * dst_stride, (size_t)blk, fn, &st, &at);
    if (rc)
        return read_err(r, rc, at);
    if (n > 0)
        advance(r, ci, sj);
    if (!r->keep_cache && n > 0) {
        uint64_t len = kvt_align_up(n);
        if (len > r->h->file_size - abs)
            len = r->h->file_size - abs;
        kvt_io()->fadvise_dontneed(r->fd, abs, len); /* advisory: the result does not matter */
    }
    if (r->verify) {
        uint64_t got = kvt_wyhash_final(&st);
        if (got != s->hash)
            return kvt_fail(KVT_E_CORRUPT,
                            "%s: L3: tensor hash mismatch at offset %" PRIu64
                            " (caches[%zu].tensors[%d]: stored %016" PRIx64 ", read %016" PRIx64
                            ")",
                            r->name, abs, ci, sj, s->hash, got);
    }
    return 0;
}
