/*
 * Streaming reads of tensor bytes for the loader and the verifier. Large blocks are read
 * straight into the destination and hashed right after each chunk arrives (still hot in the
 * CPU cache); many small blocks (a capacity buffer with short rows) are read in large chunks
 * through one bounded buffer and scattered into place. Nothing is mapped, and nothing is
 * read outside the validated range of the slot (FORMAT.md V17).
 */
#include "format/format.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "io/io.h"

/* Blocks at least this large are read in place; smaller ones go through the bounce buffer. */
#define DIRECT_MIN ((uint64_t)64 << 10)

void kvt_tensor_reader_free(struct kvt_tensor_reader *r)
{
    free(r->bounce);
    r->bounce = NULL;
}

static int read_err(const struct kvt_tensor_reader *r, int rc, size_t n, uint64_t off)
{
    return kvt_fail(rc, "%s: read of %zu bytes at offset %" PRIu64 ": %s", r->name, n, off,
                    kvt_strerror(rc));
}

/* Read [off, off + n) into @p dst in chunks, hashing each chunk after it arrives. */
static int read_direct(struct kvt_tensor_reader *r, uint8_t *dst, uint64_t n, uint64_t off,
                       struct kvt_wyhash_state *st)
{
    for (uint64_t done = 0; done < n;) {
        size_t len = n - done < KVT_IO_CHUNK ? (size_t)(n - done) : KVT_IO_CHUNK;
        int rc = kvt_io_read_full(r->fd, dst + done, len, off + done);
        if (rc < 0)
            return read_err(r, rc, len, off + done);
        if (r->verify)
            kvt_wyhash_update(st, dst + done, len);
        done += len;
    }
    return 0;
}

/* Read [off, off + n) through the bounce buffer, scattering blocks of @p blk bytes. */
static int read_scatter(struct kvt_tensor_reader *r, uint8_t *dst, uint64_t n, uint64_t off,
                        uint64_t blk, uint64_t stride, struct kvt_wyhash_state *st)
{
    if (!r->bounce && !(r->bounce = malloc(KVT_IO_CHUNK)))
        return kvt_fail(-ENOMEM, "%s: out of memory for the read buffer", r->name);
    for (uint64_t done = 0; done < n;) {
        size_t len = n - done < KVT_IO_CHUNK ? (size_t)(n - done) : KVT_IO_CHUNK;
        int rc = kvt_io_read_full(r->fd, r->bounce, len, off + done);
        if (rc < 0)
            return read_err(r, rc, len, off + done);
        if (r->verify)
            kvt_wyhash_update(st, r->bounce, len);
        if (dst) {
            /* bytes [done, done + len) of the tensor: whole or partial blocks */
            for (uint64_t p = done; p < done + len;) {
                uint64_t k = p / blk, in = p % blk;
                uint64_t take = blk - in;
                if (take > done + len - p)
                    take = done + len - p;
                memcpy(dst + k * stride + in, r->bounce + (p - done), (size_t)take);
                p += take;
            }
        }
        done += len;
    }
    return 0;
}

int kvt_tensor_read(struct kvt_tensor_reader *r, size_t ci, int sj, uint8_t *dst, uint64_t blocks,
                    uint64_t dst_stride)
{
    const struct kvt_slot *s = &r->h->caches[ci].slots[sj];
    uint64_t abs = kvt_slot_abs(r->h, s);
    uint64_t n = s->bytes;
    uint64_t blk = blocks ? n / blocks : 0;
    if (blocks == 0 || blk * blocks != n || (dst && dst_stride < blk))
        return kvt_fail(-EINVAL, "%s: caches[%zu].tensors[%d]: bad read geometry", r->name, ci, sj);
    if (dst && dst_stride > blk)
        for (uint64_t k = 0; k < blocks; k++)
            memset(dst + k * dst_stride + blk, 0, (size_t)(dst_stride - blk));
    if (n == 0 && !r->verify)
        return 0;

    struct kvt_wyhash_state st;
    kvt_wyhash_init(&st, 0);
    int rc = 0;
    if (dst && (blocks == 1 || dst_stride == blk || blk >= DIRECT_MIN)) {
        if (dst_stride == blk)
            rc = read_direct(r, dst, n, abs, &st);
        else
            for (uint64_t k = 0; k < blocks && !rc; k++)
                rc = read_direct(r, dst + k * dst_stride, blk, abs + k * blk, &st);
    } else if (n > 0) {
        rc = read_scatter(r, dst, n, abs, blk, dst_stride, &st);
    }
    if (rc)
        return rc;
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
