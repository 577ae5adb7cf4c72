/*
 * The read-ahead stream (stream.h). The ranges are cut into chunks of whole 4096-byte blocks;
 * up to `depth` chunks are in flight at once, read with O_DIRECT through the asynchronous
 * queue (aq.h) while the caller hashes the chunks that have arrived. The ring holds twice as
 * many chunks as are read at once, so a read that completes is replaced at once, not when the
 * consumer has hashed the chunks before it. The whole blocks of a
 * range whose destination is known and lies on the same block grid are read straight into
 * that destination (no copy at all); everything else (the partial blocks at the edges of such
 * ranges, ranges without a destination or off the grid) goes through staging buffers and is
 * copied into place when consumed. Chunks whose pages are already in the page cache (asked
 * with cachestat(2)) are not read ahead: they are copied straight from the page cache into
 * the destination when consumed, which beats reading the device again. Without O_DIRECT every
 * chunk is read that way, and the kernel's own readahead keeps the device busy.
 *
 * Destination pages are faulted in on a helper thread (threads/restore_helper.h) ahead of the
 * reads and copies (known destinations as soon as the stream plans them); a copy that catches
 * up with the helper populates its piece first instead of faulting page by page. Whether the
 * stream reads plainly, directly and with the helper is kvt_read_choose()'s call (read_way.c).
 */
#include "io/stream.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "io/aq.h"
#include "hash/hash.h"
#include "io/io.h"
#include "settings/settings.h"
#include "threads/restore_helper.h"
#include "mem/staging.h"

#define BLK ((uint64_t)4096)
#define DEFAULT_CHUNK ((size_t)2 << 20)
#define DEFAULT_DEPTH 8u
#define MAX_CHUNK ((size_t)64 << 20)
/* Staged bytes are copied and hashed in pieces of this size. */
#define CACHE_PIECE ((size_t)256 << 10)
/* In-place pieces at least this large are read straight into their destination. */
#define SMALL_PIECE ((size_t)64 << 10)
/* Destinations get the prefault helper this far ahead of the reads. */
#define PREFAULT_AHEAD ((uint64_t)64 << 20)

/* A chunk read into place spans at most this many ranges (the row blocks of a capacity
 * buffer lie back to back in the file: one vectored request reads several). */
#define CHUNK_IOV 16

enum { C_FREE, C_INFLIGHT, C_DONE, C_INPLACE };

struct chunk {
    uint64_t a, b; /* requested file bytes [a, b), block aligned */
    uint64_t hi;   /* end of the stream bytes the chunk holds (<= b) */
    uint64_t got;  /* bytes arrived, from a */
    int err;       /* the read failed after `got` bytes: surfaces when they are consumed */
    int state;
    int stage;                   /* the staging slot buf lies in, or -1 */
    bool in_dst;                 /* read straight into its ranges' destinations */
    void *buf;                   /* not in_dst: the staging slot where byte a lands */
    struct iovec iov[CHUNK_IOV]; /* in_dst: the destination pieces still to read, in order */
    int niov;
    /* in_dst: a range without destination inside the chunk, [st_a, st_a + st_len), is read
     * into the staging slot buf (iov[st_iov]) and copied from there; st_len 0: none */
    uint64_t st_a, st_len;
    int st_iov;
};

struct kvt_rstream {
    int fd, dfd; /* the caller's descriptor, and an O_DIRECT one (or -1) */
    struct kvt_range *r;
    size_t n;
    size_t plan_ri; /* the next chunk starts at range plan_ri, byte plan_pos */
    uint64_t plan_pos;
    size_t ri; /* the consumer is at range ri, byte pos */
    uint64_t pos;
    struct chunk *ring;
    unsigned head, count, slots; /* the ring of planned chunks: read, in flight or arrived */
    unsigned depth;              /* most reads in flight */
    uint32_t stage_free;         /* staging slots (depth of them) not taken by a chunk */
    size_t chunk;
    struct kvt_aq q;
    void *staging;
    size_t staging_bytes;
    uint8_t *bounce; /* small in-place pieces are served from it */
    uint64_t pb_off; /* file bytes [pb_off, pb_off + pb_len) are in the bounce buffer */
    size_t pb_len;
    struct kvt_restore_helper *pf;
    size_t pf_ri; /* destinations of ranges before pf_ri are queued for prefaulting */
    bool fast;
    int err;
    uint64_t err_at;
    char engine[24];
};

static uint64_t range_end(const struct kvt_range *r)
{
    return r->off + r->len;
}

/*
 * The blocks of range @p r read straight into its destination: file bytes [*da, *db), whole
 * blocks inside the range; empty unless the destination lies on the file's block grid and
 * the stream reads with O_DIRECT.
 */
static void direct_span(const struct kvt_rstream *s, const struct kvt_range *r, uint64_t *da,
                        uint64_t *db)
{
    *da = *db = 0;
    if (s->dfd < 0 || !kvt_range_on_grid(r))
        return;
    uint64_t a = (r->off + BLK - 1) / BLK * BLK, b = range_end(r) / BLK * BLK;
    if (a < b) {
        *da = a;
        *db = b;
    }
}

/*
 * A chunk read straight into destinations, from file byte @p f (on a block) of range @p r0,
 * whose in-place blocks end at @p db; it goes on over the ranges that follow back to back.
 */
static void plan_in_place(struct kvt_rstream *s, struct chunk *c, const struct kvt_range *r0,
                          uint64_t f, uint64_t db)
{
    uint64_t da;
    uint64_t end = db - f < s->chunk ? db : f + s->chunk;
    c->a = f;
    c->in_dst = true;
    c->iov[0] = (struct iovec){(uint8_t *)r0->dst + (f - r0->off), (size_t)(end - f)};
    c->niov = 1;
    s->plan_pos += end - f;
    /* the next ranges while each starts where this one ended, wholly read into place; and
     * one range without a destination among them (the loader gives none to a buffer's
     * small-page tail) that lies on whole blocks and fits: it goes to the chunk's staging
     * slot in the same request, so the request stays large */
    while (end == range_end(&s->r[s->plan_ri]) && end - f < s->chunk && c->niov < CHUNK_IOV &&
           s->plan_ri + 1 < s->n) {
        const struct kvt_range *rn = &s->r[s->plan_ri + 1];
        if (!rn->dst && rn->off == end && !c->st_len && rn->len % BLK == 0 &&
            rn->len <= s->chunk - (end - f)) {
            c->st_a = rn->off;
            c->st_len = rn->len;
            c->st_iov = c->niov;
            c->iov[c->niov++] = (struct iovec){NULL, (size_t)rn->len}; /* set in top_up */
            s->plan_ri++;
            s->plan_pos = rn->len;
            end += rn->len;
            continue;
        }
        direct_span(s, rn, &da, &db);
        if (rn->off != end || da != rn->off || db <= da)
            break;
        uint64_t stop = db - da < s->chunk - (end - f) ? db : da + (s->chunk - (end - f));
        c->iov[c->niov++] = (struct iovec){rn->dst, (size_t)(stop - da)};
        s->plan_ri++;
        s->plan_pos = stop - da;
        end = stop;
    }
    c->hi = c->b = end;
}

/*
 * Plan the next chunk from the planning cursor; false when the ranges are exhausted. A chunk
 * either reads blocks of one range straight into its destination, or gathers the bytes of
 * one or more ranges into staging, stopping where a destination's blocks begin.
 */
static bool plan_next(struct kvt_rstream *s, struct chunk *c)
{
    while (s->plan_ri < s->n && s->plan_pos >= s->r[s->plan_ri].len) {
        s->plan_ri++;
        s->plan_pos = 0;
    }
    if (s->plan_ri >= s->n)
        return false;
    const struct kvt_range *r0 = &s->r[s->plan_ri];
    uint64_t f = r0->off + s->plan_pos, da, db;
    c->got = 0;
    c->err = 0;
    c->buf = NULL;
    c->stage = -1;
    c->st_len = 0;
    direct_span(s, r0, &da, &db);
    if (f >= da && f < db) { /* f is on a block: da is, and chunks are whole blocks */
        plan_in_place(s, c, r0, f, db);
        return true;
    }
    uint64_t a = f / BLK * BLK, limit = a + s->chunk, hi = f;
    /* take range bytes while they fall inside [a, limit), up to the next destination blocks */
    while (s->plan_ri < s->n) {
        const struct kvt_range *r = &s->r[s->plan_ri];
        uint64_t start = r->off + s->plan_pos;
        if (s->plan_pos >= r->len) {
            s->plan_ri++;
            s->plan_pos = 0;
            continue;
        }
        if (start >= limit)
            break;
        uint64_t end = range_end(r) < limit ? range_end(r) : limit;
        direct_span(s, r, &da, &db);
        if (start >= da && start < db)
            break; /* the next chunk reads these into place */
        bool to_direct = start < da && end > da;
        if (to_direct)
            end = da;
        hi = end;
        s->plan_pos += end - start;
        if (end == limit || to_direct)
            break;
    }
    c->a = a;
    c->hi = hi;
    c->b = (hi + BLK - 1) / BLK * BLK;
    c->in_dst = false;
    return true;
}

/*
 * Queue the destinations of the ranges up to PREFAULT_AHEAD bytes past the planning cursor
 * for prefaulting: the pages of a direct read must be there when it is submitted.
 */
static void prefault_ahead(struct kvt_rstream *s)
{
    if (!s->pf)
        return;
    uint64_t horizon = s->plan_ri < s->n ? s->r[s->plan_ri].off + s->plan_pos : UINT64_MAX;
    horizon = horizon > UINT64_MAX - PREFAULT_AHEAD ? UINT64_MAX : horizon + PREFAULT_AHEAD;
    for (; s->pf_ri < s->n && s->r[s->pf_ri].off < horizon; s->pf_ri++) {
        const struct kvt_range *r = &s->r[s->pf_ri];
        void *to = kvt_range_target(r);
        if (to && r->len >= KVT_PREFAULT_MIN && !kvt_restore_helper_add(s->pf, to, r->len))
            return; /* the helper's queue is full: try again after the next chunk */
    }
}

static int submit_chunk(struct kvt_rstream *s, unsigned k)
{
    struct chunk *c = &s->ring[k];
    if (c->in_dst && c->niov > 1)
        return kvt_aq_readv(&s->q, s->dfd, c->iov, c->niov, c->a + c->got, k);
    if (c->in_dst) /* what is left may lie in a later range's destination */
        return kvt_aq_submit(&s->q, s->dfd, 0, c->iov[0].iov_base, c->iov[0].iov_len, c->a + c->got,
                             k);
    return kvt_aq_submit(&s->q, s->dfd, 0, (char *)c->buf + c->got, (size_t)(c->b - c->a - c->got),
                         c->a + c->got, k);
}

/* @p n more bytes of in_dst chunk @p c arrived: drop them from the pieces still to read. */
static void iov_advance(struct chunk *c, uint64_t n)
{
    int i = 0;
    while (i < c->niov && n >= c->iov[i].iov_len)
        n -= c->iov[i++].iov_len;
    c->niov -= i;
    memmove(c->iov, c->iov + i, (size_t)c->niov * sizeof(c->iov[0]));
    if (c->niov > 0) {
        c->iov[0].iov_base = (uint8_t *)c->iov[0].iov_base + n;
        c->iov[0].iov_len -= (size_t)n;
    }
}

static void fail_at(struct kvt_rstream *s, int rc, uint64_t at)
{
    if (!s->err) {
        s->err = rc;
        s->err_at = at;
    }
}

/* Fill the ring with planned chunks, starting reads for those not in the page cache. */
static void top_up(struct kvt_rstream *s)
{
    /* a staged chunk needs a free staging slot: planning waits for one, so the ring never
     * holds more staged chunks than there are slots */
    while (!s->err && s->count < s->slots &&
           (s->dfd < 0 || (s->q.inflight < s->depth && s->stage_free))) {
        unsigned k = (s->head + s->count) % s->slots;
        struct chunk *c = &s->ring[k];
        if (!plan_next(s, c))
            return;
        s->count++;
        if (s->dfd < 0 || kvt_stream_cached(s->fd, c->a, c->hi - c->a)) {
            c->state = C_INPLACE;
            continue;
        }
        /* staging is taken when first needed: a restore whose ranges are all read into
         * place never pays for faulting it in */
        bool staged = !c->in_dst || c->st_len;
        if (staged && !s->staging)
            s->staging = kvt_staging_get(s->staging_bytes);
        if (staged && !s->staging) {
            c->state = C_INPLACE; /* no memory for staging: read it in place instead */
            continue;
        }
        if (staged) {
            c->stage = __builtin_ctz(s->stage_free);
            s->stage_free &= ~(1u << c->stage);
            c->buf = (char *)s->staging + (size_t)c->stage * s->chunk;
        }
        if (c->in_dst && c->st_len)
            c->iov[c->st_iov].iov_base = c->buf;
        c->state = C_INFLIGHT;
        int rc = submit_chunk(s, k);
        if (rc < 0)
            c->state = C_INPLACE; /* the queue refused: read it in place instead */
    }
    prefault_ahead(s);
}

/* A read of chunk @p tag completed with @p res: a failed read marks its chunk (the stream
 * fails when the consumer gets there), a short or interrupted one goes on from where it
 * stopped. */
static void arrived(struct kvt_rstream *s, uint64_t tag, int64_t res)
{
    struct chunk *c = &s->ring[tag % s->slots];
    int rc;
    if (res == -EINTR && submit_chunk(s, (unsigned)(tag % s->slots)) == 0)
        return; /* interrupted before it moved a byte: ask again, as a pread loop would */
    if (res < 0) {
        c->err = (int)res;
        c->state = C_DONE;
        return;
    }
    c->got += (uint64_t)res;
    if (c->in_dst)
        iov_advance(c, (uint64_t)res);
    if (c->a + c->got >= c->hi) {
        c->state = C_DONE;
    } else if (res == 0 || c->got % 512) {
        /* the file ends inside the ranges (a direct read stops short only at the end) */
        c->err = -EIO;
        c->state = C_DONE;
    } else if ((rc = submit_chunk(s, (unsigned)(tag % s->slots))) < 0) {
        c->err = rc;
        c->state = C_DONE;
    }
}

/*
 * Take every completed read (after waiting for one when @p wait) and start the next reads at
 * once: the device gets its window back before the consumer hashes what arrived.
 */
static int reap(struct kvt_rstream *s, bool wait)
{
    uint64_t tag;
    int64_t res;
    if (wait) {
        int rc = kvt_aq_wait(&s->q, &tag, &res);
        if (rc < 0)
            return rc;
        arrived(s, tag, res);
    }
    while (kvt_aq_poll(&s->q, &tag, &res) == 0)
        arrived(s, tag, res);
    top_up(s);
    return 0;
}

/* The O_DIRECT descriptor (when @p direct) and the queue of a fast stream; without either,
 * the stream reads in place through the page cache ("buffered"). */
static void open_direct(struct kvt_rstream *s, int fd, const struct kvt_stream_opts *o, bool direct)
{
    if (direct) {
        int dfd = kvt_io()->reopen(fd, O_RDONLY | O_DIRECT);
        s->dfd = dfd < 0 ? -1 : dfd;
    }
    if (s->dfd >= 0) {
        s->staging_bytes = s->chunk * s->depth;
        if (kvt_aq_open(&s->q, s->depth, o->engine) < 0) {
            kvt_io()->close(s->dfd);
            s->dfd = -1;
        }
    }
    snprintf(s->engine, sizeof(s->engine), "%s%s", s->dfd >= 0 ? kvt_aq_name(&s->q) : "buffered",
             s->dfd >= 0 ? "+direct" : "");
}

int kvt_rstream_open(int fd, const struct kvt_range *r, size_t n, const struct kvt_stream_opts *o,
                     struct kvt_rstream **out)
{
    struct kvt_stream_opts def = {0};
    uint64_t total = 0;
    *out = NULL;
    if (!o)
        o = &def;
    for (size_t i = 0; i < n; i++) {
        if (r[i].off > UINT64_MAX - r[i].len || range_end(&r[i]) > (uint64_t)INT64_MAX ||
            (i > 0 && r[i].off < range_end(&r[i - 1])) || total > UINT64_MAX - r[i].len)
            return -EINVAL;
        total += r[i].len;
    }
    struct kvt_rstream *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->fd = fd;
    s->dfd = -1;
    s->n = n;
    s->r = malloc((n ? n : 1) * sizeof(*s->r));
    if (!s->r) {
        free(s);
        return -ENOMEM;
    }
    if (n)
        memcpy(s->r, r, n * sizeof(*r));
    snprintf(s->engine, sizeof(s->engine), "plain");
    struct kvt_read_way way = kvt_read_choose(fd, r, n, o, NULL);
    s->fast = way.path != KVT_READ_PLAIN;
    if (!s->fast) {
        *out = s;
        return 0;
    }
    s->chunk = o->chunk ? o->chunk : way.chunk ? way.chunk : DEFAULT_CHUNK;
    s->chunk = s->chunk > MAX_CHUNK ? MAX_CHUNK : (s->chunk + BLK - 1) / BLK * BLK;
    s->depth = o->depth ? o->depth : DEFAULT_DEPTH;
    if (s->depth > KVT_AQ_MAX_DEPTH)
        s->depth = KVT_AQ_MAX_DEPTH;
    /* twice as many chunks planned as read at once: reads that arrived wait in the ring for
     * the consumer while the device already has the next ones */
    s->slots = 2 * s->depth;
    s->stage_free = s->depth == 32 ? UINT32_MAX : (1u << s->depth) - 1;
    s->ring = calloc(s->slots, sizeof(*s->ring));
    if (!s->ring) {
        kvt_rstream_close(s);
        return -ENOMEM;
    }
    open_direct(s, fd, o, way.direct);
    if (way.helper)
        s->pf = kvt_restore_helper_start();
    top_up(s);
    *out = s;
    return 0;
}

void kvt_rstream_warm(void)
{
    if (kvt_stream_fast_ok() && kvt_mem_direct())
        kvt_staging_put(kvt_staging_get(KVT_COPY_CHUNK * DEFAULT_DEPTH),
                        KVT_COPY_CHUNK * DEFAULT_DEPTH);
}

const char *kvt_rstream_engine(const struct kvt_rstream *s)
{
    return s->engine;
}

/* Whether the range at the consumer's cursor came with a destination (or a copy target):
 * its pages are queued for prefaulting already. */
static bool range_has_dst(const struct kvt_rstream *s)
{
    size_t ri = s->ri;
    uint64_t pos = s->pos;
    for (; ri < s->n && pos >= s->r[ri].len; ri++)
        pos = 0;
    return ri < s->n && kvt_range_target(&s->r[ri]);
}

/*
 * Pass a piece that is in place to the caller's @p fn: on the helper when the piece is in
 * the caller's destination (stable until the read returns), here otherwise (staging is
 * reused), after the pieces handed to the helper before it.
 */
void kvt_piece_hash(void *ud, const void *data, size_t len)
{
    kvt_wyhash_update(ud, data, len);
}

static void piece_done(struct kvt_rstream *s, kvt_piece_fn fn, void *ud, const uint8_t *p, size_t n,
                       bool in_dst)
{
    if (!fn || (in_dst && kvt_restore_helper_defer(s->pf, fn, ud, p, n)))
        return;
    kvt_restore_helper_drain(s->pf);
    fn(ud, p, n);
}

static int read_in_place(struct kvt_rstream *s, void *dst, size_t len, uint64_t off)
{
    int rc = kvt_io_read_full(s->fd, dst, len, off);
    if (rc < 0)
        fail_at(s, rc, off);
    return rc;
}

static bool in_bounce(const struct kvt_rstream *s, uint64_t f)
{
    return s->pb_len && f >= s->pb_off && f - s->pb_off < s->pb_len;
}

/*
 * Deliver @p len bytes at file offset @p f without read-ahead (an in-place chunk, or a plain
 * stream): a large piece straight into @p dst, small ones through the bounce buffer, which
 * is filled up to @p limit so that short row blocks cost one call per bounce-full.
 */
static int consume_in_place(struct kvt_rstream *s, uint8_t *dst, size_t len, uint64_t f,
                            uint64_t limit, kvt_piece_fn fn, void *ud)
{
    if (dst && len >= SMALL_PIECE && !in_bounce(s, f)) {
        /* straight into place in pieces: a callback sees each while it is in L2, and the
         * prefault helper stays ahead of the copy (one large read faults the pages itself,
         * racing the helper for the page tables: 20-30 % slower) */
        for (size_t k = 0; k < len; k += CACHE_PIECE) {
            size_t m = len - k < CACHE_PIECE ? len - k : CACHE_PIECE;
            kvt_restore_helper_ensure(s->pf, dst + k, m);
            int rc = read_in_place(s, dst + k, m, f + k);
            if (rc < 0)
                return rc;
            piece_done(s, fn, ud, dst + k, m, true);
        }
        return 0;
    }
    size_t bn = s->chunk ? s->chunk : DEFAULT_CHUNK;
    if (!s->bounce && !(s->bounce = malloc(bn)))
        return -ENOMEM;
    while (len > 0) {
        if (!in_bounce(s, f)) {
            size_t m = limit - f < bn ? (size_t)(limit - f) : bn;
            s->pb_len = 0;
            int rc = read_in_place(s, s->bounce, m, f);
            if (rc < 0)
                return rc;
            s->pb_off = f;
            s->pb_len = m;
        }
        size_t take = (size_t)(s->pb_off + s->pb_len - f);
        if (take > len)
            take = len;
        const uint8_t *src = s->bounce + (f - s->pb_off);
        if (dst && fn == kvt_piece_hash) {
            kvt_restore_helper_drain(s->pf); /* the pieces before it are hashed first */
            kvt_wyhash_update_copy(ud, dst, src, take);
        } else {
            if (dst)
                memcpy(dst, src, take);
            piece_done(s, fn, ud, dst ? dst : src, take, false);
        }
        f += take;
        len -= take;
        if (dst)
            dst += take;
    }
    return 0;
}

/* The next @p len bytes into @p d (see kvt_rstream_read()), without waiting for the pieces
 * handed to the helper; a failed read is left in s->err. */
/*
 * The fast path's part of a read: @p take bytes at file offset @p f, all inside chunk @p c at
 * the head of the ring, into @p d (NULL: only to @p fn). A chunk used up is recycled and the
 * ring reads further ahead. @return 0 or the error to fail the stream with.
 */
static int consume_chunk(struct kvt_rstream *s, struct chunk *c, uint8_t *d, size_t take,
                         uint64_t f, uint64_t limit, kvt_piece_fn fn, void *ud)
{
    int rc = 0;
    if (s->dfd >= 0)
        reap(s, false);
    if (c->state == C_INPLACE) {
        rc = consume_in_place(s, d, take, f, limit < c->hi ? limit : c->hi, fn, ud);
    } else {
        while (c->state == C_INFLIGHT && rc == 0)
            rc = reap(s, true);
        if (rc == 0 && c->err && f + take > c->a + c->got)
            fail_at(s, c->err, c->a + c->got); /* a later chunk's error waits its turn */
        if (rc == 0 && !s->err) {
            /* in place: in the destination of the consumer's range (or, for its
             * range without one, in the chunk's staging slot) */
            const uint8_t *src = !c->in_dst        ? (const uint8_t *)c->buf + (f - c->a)
                                 : s->r[s->ri].dst ? (const uint8_t *)s->r[s->ri].dst + s->pos
                                                   : (const uint8_t *)c->buf + (f - c->st_a);
            for (size_t k = 0; k < take; k += CACHE_PIECE) {
                /* hash each piece right after its copy, while it is in L2 */
                size_t m = take - k < CACHE_PIECE ? take - k : CACHE_PIECE;
                if (d && d != src) { /* read into place already: nothing to copy */
                    kvt_restore_helper_ensure(s->pf, d + k, m);
                    if (fn == kvt_piece_hash && !s->pf) { /* no helper to hash it */
                        kvt_wyhash_update_copy(ud, d + k, src + k, m);
                        continue;
                    }
                    memcpy(d + k, src + k, m);
                }
                piece_done(s, fn, ud, d ? d + k : src + k, m, d != NULL);
            }
        }
    }
    if (f + take == c->hi) { /* chunk used up: recycle its slot, read further ahead */
        c->state = C_FREE;
        if (c->stage >= 0)
            s->stage_free |= 1u << c->stage;
        s->head = (s->head + 1) % s->slots;
        s->count--;
        top_up(s);
    }
    return rc;
}

static int read_run(struct kvt_rstream *s, uint8_t *d, size_t len, kvt_piece_fn fn, void *ud)
{
    int rc = 0;
    bool pf_now = false;
    if (s->err)
        return 0;
    /* destinations the stream did not know ahead: prefault them now */
    pf_now = s->pf && d && !range_has_dst(s) && len >= KVT_PREFAULT_MIN;
    if (pf_now)
        kvt_restore_helper_add(s->pf, d, len);
    while (len > 0 && !s->err) {
        while (s->ri < s->n && s->pos >= s->r[s->ri].len) {
            s->ri++;
            s->pos = 0;
        }
        if (s->ri >= s->n) {
            rc = -EINVAL; /* more bytes asked for than the ranges hold */
            goto out_cancel;
        }
        uint64_t f = s->r[s->ri].off + s->pos;
        size_t take = len;
        if (take > s->r[s->ri].len - s->pos)
            take = (size_t)(s->r[s->ri].len - s->pos);
        uint64_t limit = range_end(&s->r[s->ri]);
        if (!s->fast) {
            rc = consume_in_place(s, d, take, f, limit, fn, ud);
        } else {
            if (s->count == 0)
                top_up(s);
            struct chunk *c = &s->ring[s->head];
            if (s->count == 0 || f < c->a || f >= c->hi) {
                rc = -EINVAL; /* cannot happen: chunks follow the ranges */
                goto out_cancel;
            }
            if (take > c->hi - f)
                take = (size_t)(c->hi - f);
            rc = consume_chunk(s, c, d, take, f, limit, fn, ud);
        }
        if (rc < 0) {
            fail_at(s, rc, f);
            break;
        }
        s->pos += take;
        len -= take;
        if (d)
            d += take;
    }
out_cancel:
    if (pf_now)
        kvt_restore_helper_cancel(s->pf);
    return rc;
}

int kvt_rstream_read_blocks(struct kvt_rstream *s, void *dst, size_t blocks, size_t len,
                            size_t stride, kvt_piece_fn fn, void *ud, uint64_t *at)
{
    int rc = 0;
    for (size_t k = 0; k < blocks && rc == 0 && !s->err; k++)
        rc = read_run(s, dst ? (uint8_t *)dst + k * stride : NULL, len, fn, ud);
    /* once per call, not per block: the helper hashes a block while the next one arrives */
    kvt_restore_helper_drain(s->pf); /* the caller's ud is its own again */
    if (s->err) {
        rc = s->err;
        if (at)
            *at = s->err_at;
    }
    return rc;
}

int kvt_rstream_read(struct kvt_rstream *s, void *dst, size_t len, kvt_piece_fn fn, void *ud,
                     uint64_t *at)
{
    return kvt_rstream_read_blocks(s, dst, 1, len, 0, fn, ud, at);
}

void kvt_rstream_close(struct kvt_rstream *s)
{
    if (!s)
        return;
    kvt_restore_helper_stop(s->pf);
    kvt_stream_fast_release(&s->q, s->dfd, s->staging, s->staging_bytes);
    free(s->bounce);
    free(s->ring);
    free(s->r);
    free(s);
}
