/*
 * The write stream (stream.h). Bytes are copied into page-aligned staging chunks (hashed right
 * after the copy, while they are hot in the CPU cache) and each full chunk goes out as one
 * O_DIRECT write through the asynchronous queue (aq.h), several in flight, so the device
 * writes chunk i while the caller stages chunk i + 1. Direct writes skip the page cache: no
 * page-cache pages are allocated and dirtied only to be flushed by the fsync that follows, and
 * the saved file is not left taking up memory. The last chunk is padded to a whole block and
 * the file cut back to its logical end at finish. Where O_DIRECT is refused (tmpfs, some
 * network file systems) the staged chunks go through the page cache the same way, still
 * written asynchronously: a caller's write only ever copies into staging.
 *
 * While another io backend is installed (fault injection), writes are plain positional writes
 * through the io vtable: pieces of 8 MiB straight from the caller's memory, smaller adjacent
 * writes gathered into one buffer first.
 */
#include "io/stream.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/aq.h"
#include "io/io.h"
#include "mem/staging.h"
#include "settings/settings.h"

#define BLK ((uint64_t)4096)
/* 64 MiB in flight: on virtio-blk a smaller window left the device idle between requests */
#define DEFAULT_CHUNK ((size_t)16 << 20)
#define DEFAULT_DEPTH 4u
#define MAX_CHUNK ((size_t)64 << 20)
/* Staged bytes are copied and hashed in pieces of this size. */
#define CACHE_PIECE ((size_t)256 << 10)
/* Plain writes go out in pieces of at most this size, each hashed as it is taken. */
#define PLAIN_PIECE ((size_t)8 << 20)

struct wslot {
    uint64_t off; /* file offset of the request */
    size_t len;   /* request bytes (block multiple) */
    size_t done;  /* bytes the device has taken */
    bool busy;
};

struct kvt_wstream {
    int fd, dfd; /* the caller's descriptor; the staged writes' (O_DIRECT where taken), or -1 */
    struct kvt_aq q;
    void *staging;
    size_t staging_bytes, chunk;
    unsigned depth;
    struct wslot *slot;
    int cur;          /* slot being filled, or -1 */
    uint64_t cur_off; /* file offset of byte 0 of the slot being filled (block aligned) */
    size_t cur_fill;  /* bytes of it filled */
    uint64_t flushed; /* end of the last request submitted (block aligned) */
    uint64_t last;    /* end of the last write asked for */
    uint64_t end;     /* the logical end of the file */
    bool started;
    int err;
    uint64_t err_at;
    uint8_t *pbuf; /* plain mode: adjacent small writes gathered into one call */
    uint64_t poff;
    size_t pfill;
};

/* The first error sticks; its offset is the lowest seen, as writes may complete out of order. */
static void wfail(struct kvt_wstream *w, int rc, uint64_t at)
{
    if (!w->err) {
        w->err = rc;
        w->err_at = at;
    } else if (rc == w->err && at < w->err_at) {
        w->err_at = at;
    }
}

/* Bytes per direct write and writes in flight for options @p o. */
static void staging_shape(const struct kvt_stream_opts *o, size_t *chunk, unsigned *depth)
{
    *chunk = o->chunk ? o->chunk : DEFAULT_CHUNK;
    *chunk = *chunk > MAX_CHUNK ? MAX_CHUNK : (*chunk + BLK - 1) / BLK * BLK;
    *depth = o->depth ? o->depth : DEFAULT_DEPTH;
    if (*depth > KVT_AQ_MAX_DEPTH)
        *depth = KVT_AQ_MAX_DEPTH;
}

void kvt_wstream_warm(const struct kvt_stream_opts *o)
{
    struct kvt_stream_opts def = {0};
    size_t chunk;
    unsigned depth;
    if (!o)
        o = &def;
    if (!kvt_stream_fast_ok())
        return;
    staging_shape(o, &chunk, &depth);
    kvt_staging_put(kvt_staging_get(chunk * depth), chunk * depth);
}

/*
 * Write streams always use our own threads, whatever engine is asked for. Direct writes into
 * a new file's blocks are not issued inline by io_uring on ext4: each goes to the kernel's
 * io-wq workers, so a ring gains nothing over our threads here, and on a 6.18 kernel such a
 * write was now and then never completed (the save waited forever, with the request taken
 * by the kernel and no worker left to finish it).
 */
#define WRITE_ENGINE "threads"

int kvt_wstream_open(int fd, const struct kvt_stream_opts *o, struct kvt_wstream **out)
{
    struct kvt_stream_opts def = {0};
    *out = NULL;
    if (!o)
        o = &def;
    struct kvt_wstream *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    w->fd = fd;
    w->dfd = -1;
    w->cur = -1;
    if (kvt_stream_fast_ok()) {
        staging_shape(o, &w->chunk, &w->depth);
        const struct kvt_io *io = kvt_io();
        if (kvt_mem_direct() && !o->no_direct)
            w->dfd = io->reopen(fd, O_WRONLY | O_DIRECT);
        if (w->dfd < 0) /* no O_DIRECT here: the staged writes go through the page cache */
            w->dfd = io->reopen(fd, O_WRONLY);
        if (w->dfd < 0)
            w->dfd = -1;
        w->slot = calloc(w->depth, sizeof(*w->slot));
        w->staging_bytes = w->chunk * w->depth;
        if (w->dfd >= 0 && w->slot)
            w->staging = kvt_staging_get(w->staging_bytes);
        if (w->dfd >= 0 &&
            (!w->slot || !w->staging || kvt_aq_open(&w->q, w->depth, WRITE_ENGINE))) {
            kvt_io()->close(w->dfd); /* fall back to plain writes */
            w->dfd = -1;
        }
    }
    *out = w;
    return 0;
}

uint64_t kvt_wstream_end(const struct kvt_wstream *w)
{
    return w->end;
}

static void *slot_buf(const struct kvt_wstream *w, int k)
{
    return (char *)w->staging + (size_t)k * w->chunk;
}

static int submit_slot(struct kvt_wstream *w, int k)
{
    struct wslot *s = &w->slot[k];
    int rc = kvt_aq_submit(&w->q, w->dfd, 1, (char *)slot_buf(w, k) + s->done, s->len - s->done,
                           s->off + s->done, (uint64_t)k);
    if (rc < 0)
        wfail(w, rc, s->off + s->done);
    return rc;
}

/* Reap one completion; a short or interrupted write is continued, an error is recorded. */
static int reap(struct kvt_wstream *w)
{
    uint64_t tag;
    int64_t res;
    int rc = kvt_aq_wait(&w->q, &tag, &res);
    if (rc < 0) {
        wfail(w, rc, w->flushed);
        return rc;
    }
    struct wslot *s = &w->slot[tag % w->depth];
    if (res == -EINTR && !w->err && submit_slot(w, (int)(tag % w->depth)) == 0)
        return 0; /* interrupted before it moved a byte: send it again, as a pwrite loop would */
    if (res <= 0) {
        wfail(w, res < 0 ? (int)res : -EIO, s->off + s->done);
        s->busy = false;
        return 0;
    }
    s->done += (size_t)res;
    if (s->done < s->len && !w->err && submit_slot(w, (int)(tag % w->depth)) == 0)
        return 0; /* the rest of a short write is on its way */
    s->busy = false;
    return 0;
}

/* A free staging slot, waiting for the device when all are busy; -1 after an error. */
static int take_slot(struct kvt_wstream *w)
{
    for (;;) {
        for (unsigned k = 0; k < w->depth; k++)
            if (!w->slot[k].busy)
                return (int)k;
        if (w->err || reap(w) < 0)
            return -1;
    }
}

/* Pad the slot being filled to a whole block and send it. */
static void flush_cur(struct kvt_wstream *w)
{
    if (w->cur < 0)
        return;
    struct wslot *s = &w->slot[w->cur];
    size_t padded = (size_t)((w->cur_fill + BLK - 1) / BLK * BLK);
    memset((char *)slot_buf(w, w->cur) + w->cur_fill, 0, padded - w->cur_fill);
    s->off = w->cur_off;
    s->len = padded;
    s->done = 0;
    s->busy = true;
    w->flushed = w->cur_off + padded;
    int k = w->cur;
    w->cur = -1;
    if (submit_slot(w, k) < 0)
        s->busy = false;
}

static int plain_flush(struct kvt_wstream *w)
{
    if (w->pfill == 0)
        return 0;
    int rc = kvt_io_write_full(w->fd, w->pbuf, w->pfill, w->poff);
    if (rc < 0)
        wfail(w, rc, w->poff);
    w->poff += w->pfill;
    w->pfill = 0;
    return rc;
}

/* Plain mode: large pieces straight from @p src, small ones gathered while they are adjacent. */
static int write_plain(struct kvt_wstream *w, uint64_t off, const uint8_t *src, size_t len,
                       struct kvt_wyhash_state *h)
{
    if (w->pfill && off != w->poff + w->pfill && plain_flush(w) < 0)
        return w->err;
    while (len > 0) {
        size_t n = len < PLAIN_PIECE ? len : PLAIN_PIECE;
        if (w->pfill == 0 && n == PLAIN_PIECE) {
            if (h)
                kvt_wyhash_update(h, src, n);
            int rc = kvt_io_write_full(w->fd, src, n, off);
            if (rc < 0) {
                wfail(w, rc, off);
                return rc;
            }
        } else {
            if (!w->pbuf && !(w->pbuf = malloc(PLAIN_PIECE))) {
                wfail(w, -ENOMEM, off);
                return -ENOMEM;
            }
            if (w->pfill == 0)
                w->poff = off;
            if (n > PLAIN_PIECE - w->pfill)
                n = PLAIN_PIECE - w->pfill;
            memcpy(w->pbuf + w->pfill, src, n);
            if (h)
                kvt_wyhash_update(h, src, n);
            w->pfill += n;
            if (w->pfill == PLAIN_PIECE && plain_flush(w) < 0)
                return w->err;
        }
        off += n;
        src += n;
        len -= n;
    }
    return 0;
}

int kvt_wstream_write(struct kvt_wstream *w, uint64_t off, const void *src, size_t len,
                      struct kvt_wyhash_state *h, uint64_t *at)
{
    const uint8_t *p = src;
    if (w->err)
        goto out;
    if (off > UINT64_MAX - len || off + len > (uint64_t)INT64_MAX || (w->started && off < w->last))
        return -EINVAL;
    if (len == 0)
        return 0;
    w->started = true;
    if (w->dfd < 0) {
        write_plain(w, off, p, len, h);
    } else {
        while (len > 0 && !w->err) {
            if (w->cur >= 0 && off >= w->cur_off + w->chunk)
                flush_cur(w);
            if (w->cur < 0) {
                uint64_t base = off / BLK * BLK;
                if (base < w->flushed) {
                    wfail(w, -EINVAL, off); /* would rewrite a block already sent */
                    break;
                }
                int k = take_slot(w);
                if (k < 0)
                    break;
                w->cur = k;
                w->cur_off = base;
                w->cur_fill = 0;
            }
            uint8_t *buf = slot_buf(w, w->cur);
            size_t at_in = (size_t)(off - w->cur_off);
            if (at_in > w->cur_fill)
                memset(buf + w->cur_fill, 0, at_in - w->cur_fill); /* a gap inside the chunk */
            size_t n = w->chunk - at_in < len ? w->chunk - at_in : len;
            for (size_t k = 0; k < n; k += CACHE_PIECE) {
                /* hash each piece right after its copy, while it is in the CPU's L2 */
                size_t m = n - k < CACHE_PIECE ? n - k : CACHE_PIECE;
                memcpy(buf + at_in + k, p + k, m);
                if (h)
                    kvt_wyhash_update(h, buf + at_in + k, m);
            }
            w->cur_fill = at_in + n;
            off += n;
            p += n;
            len -= n;
            if (w->cur_fill == w->chunk)
                flush_cur(w);
        }
    }
    if (!w->err) {
        w->last = off + len;
        if (w->last > w->end)
            w->end = w->last;
    }
out:
    if (w->err && at)
        *at = w->err_at;
    return w->err;
}

int kvt_wstream_room(struct kvt_wstream *w, size_t len)
{
    if (w->dfd < 0 || w->err)
        return w->err;
    size_t fill = w->cur >= 0 ? w->cur_fill : 0;
    size_t need = (fill + len + w->chunk - 1) / w->chunk - (w->cur >= 0 ? 1 : 0);
    if (need > w->depth - (w->cur >= 0 ? 1u : 0u))
        need = w->depth - (w->cur >= 0 ? 1u : 0u);
    for (;;) {
        size_t free_slots = 0;
        for (unsigned k = 0; k < w->depth; k++)
            free_slots += !w->slot[k].busy && (int)k != w->cur;
        if (free_slots >= need || w->err || reap(w) < 0)
            return w->err;
    }
}

int kvt_wstream_flush(struct kvt_wstream *w, uint64_t *at)
{
    if (!w->err)
        plain_flush(w);
    if (w->dfd >= 0 && !w->err)
        flush_cur(w);
    if (w->err && at)
        *at = w->err_at;
    return w->err;
}

int kvt_wstream_finish(struct kvt_wstream *w, uint64_t *at)
{
    kvt_wstream_flush(w, NULL);
    if (w->dfd >= 0) {
        while (w->q.inflight > 0)
            if (reap(w) < 0)
                break;
        if (!w->err && w->flushed > w->end) {
            int rc = kvt_io()->ftruncate(w->fd, w->end);
            if (rc < 0)
                wfail(w, rc, w->end);
        }
    }
    if (w->err && at)
        *at = w->err_at;
    return w->err;
}

void kvt_stream_fast_release(struct kvt_aq *q, int dfd, void *staging, size_t staging_bytes)
{
    kvt_aq_close(q); /* reaps what is in flight before the staging goes away */
    if (dfd >= 0)
        kvt_io()->close(dfd);
    kvt_staging_put(staging, staging_bytes);
}

void kvt_wstream_free(struct kvt_wstream *w)
{
    if (!w)
        return;
    kvt_stream_fast_release(&w->q, w->dfd, w->staging, w->staging_bytes);
    free(w->pbuf);
    free(w->slot);
    free(w);
}
