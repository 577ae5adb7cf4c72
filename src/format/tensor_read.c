/*
 * Streaming reads of tensor bytes for the loader and the verifier. One read-ahead stream
 * (io/stream.h) covers every slot of the header in header order, so the device keeps
 * reading the next tensors while this one is copied into place and hashed, and while the
 * loader allocates the next buffer. Blocks land straight in their destination (row blocks
 * of a capacity buffer one by one), each piece is hashed as soon as it is in place, and
 * nothing is read outside the validated ranges of the slots (FORMAT.md V16, V17). Nothing is
 * mapped. A caller that reads slots out of order gets a new stream from that slot on.
 *
 * A load whose slots are all in the page cache has no device to wait for: the copy out of
 * the cache, the first touch of the fresh destination pages and the hash are all CPU work,
 * so kvt_tensor_read_all() spreads whole slots over several cores instead (each slot's hash
 * runs in order on the thread that copies it). A load from the device whose destinations are
 * off the file's block grid copies every byte out of staging and hashes it in the same pass
 * (kvt_piece_hash), which keeps one core ahead of the device. Which way a load goes is
 * kvt_read_choose()'s call (io/read_way.c), the same that the read stream takes at open.
 */
#include "format/format.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "io/io.h"
#include "io/stream.h"
#include "threads/par_for.h"

void kvt_tensor_reader_free(struct kvt_tensor_reader *r)
{
    kvt_rstream_close(r->rs);
    r->rs = NULL;
}

/* What ended the read of a slot: each has its message (job_err()). */
enum { J_READ, J_HASH, J_GEOMETRY, J_NOMEM, J_OPEN };

/* One slot of a load: where it is, and how its read ended. */
struct slot_job {
    size_t f; /* the file (kvt_tensor_read_files()) */
    size_t o; /* the slot's ordinal in its file's header order */
    size_t ci;
    int sj;
    int rc;       /* 0 or the error */
    int kind;     /* with rc: J_* */
    uint64_t at;  /* J_READ: file offset of the failed read */
    uint64_t got; /* J_HASH: the hash of the bytes read */
};

static int read_err(const struct kvt_tensor_reader *r, int rc, uint64_t off)
{
    return kvt_fail(rc, "%s: read at offset %" PRIu64 ": %s", r->name, off, kvt_strerror(rc));
}

/* A parallel load copies each slot in pieces of this size, hashed while they are in L2. */
#define PAR_PIECE ((size_t)256 << 10)

static int hash_err(const struct kvt_tensor_reader *r, size_t ci, int sj, uint64_t got)
{
    const struct kvt_slot *s = &r->h->caches[ci].slots[sj];
    return kvt_fail(KVT_E_CORRUPT,
                    "%s: L3: tensor hash mismatch at offset %" PRIu64
                    " (caches[%zu].tensors[%d]: stored %016" PRIx64 ", read %016" PRIx64 ")",
                    r->name, kvt_slot_abs(r->h, s), ci, sj, s->hash, got);
}

static int geometry_err(const struct kvt_tensor_reader *r, size_t ci, int sj)
{
    return kvt_fail(-EINVAL, "%s: caches[%zu].tensors[%d]: bad read geometry", r->name, ci, sj);
}

/* The message of the failure @p j recorded (j->rc != 0). */
static int job_err(const struct kvt_tensor_reader *r, const struct slot_job *j)
{
    switch (j->kind) {
    case J_HASH: return hash_err(r, j->ci, j->sj, j->got);
    case J_GEOMETRY: return geometry_err(r, j->ci, j->sj);
    case J_NOMEM: return kvt_fail(j->rc, "%s: out of memory for the read stream", r->name);
    case J_OPEN:
        return kvt_fail(j->rc, "%s: cannot open the read stream: %s", r->name, kvt_strerror(j->rc));
    default: return read_err(r, j->rc, j->at);
    }
}

/* Record failure @p rc of kind @p kind in @p j; returns @p rc. */
static int job_fail(struct slot_job *j, int rc, int kind)
{
    j->rc = rc;
    j->kind = kind;
    return rc;
}

static bool bad_geometry(const struct kvt_slot *s, const uint8_t *dst, uint64_t blocks,
                         uint64_t dst_stride)
{
    uint64_t blk = blocks ? s->bytes / blocks : 0;
    return blocks == 0 || blk * blocks != s->bytes || (dst && dst_stride < blk) ||
           s->bytes > SIZE_MAX;
}

/* Zero the slack bytes after each of the @p blocks blocks of @p blk bytes at @p dst. */
static void zero_slack(uint8_t *dst, uint64_t blocks, uint64_t blk, uint64_t dst_stride)
{
    if (dst && dst_stride > blk)
        for (uint64_t k = 0; k < blocks; k++)
            memset(dst + k * dst_stride + blk, 0, (size_t)(dst_stride - blk));
}

/* Let the kernel drop slot @p s from the page cache (advisory: the result does not matter). */
static void drop_cache(const struct kvt_tensor_reader *r, const struct kvt_slot *s)
{
    uint64_t abs = kvt_slot_abs(r->h, s), len = kvt_align_up(s->bytes);
    if (len > r->h->file_size - abs)
        len = r->h->file_size - abs;
    kvt_io()->fadvise_dontneed(r->fd, abs, len);
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

/*
 * The ranges of slot @p s in a stream with destination @p d, written to @p out unless it is
 * NULL; returns how many. One range per block of a strided destination, one for a contiguous
 * one, each cut where the destination's small-page tail begins: the part past it gets no
 * destination, only a copy target, so it is read through staging (huge pages, one segment)
 * and copied. One range without a destination when @p d has none (or a geometry
 * kvt_tensor_read() will refuse).
 */
static size_t slot_ranges(const struct kvt_header *h, const struct kvt_slot *s,
                          const struct kvt_slot_dst *d, struct kvt_range *out)
{
    uint64_t abs = kvt_slot_abs(h, s);
    size_t nr = dst_ranges(s, d), n = 0;
    if (nr == 0) {
        if (out)
            out[0] = (struct kvt_range){abs, s->bytes, NULL, NULL};
        return 1;
    }
    uint64_t blk = s->bytes / nr;
    for (size_t k = 0; k < nr; k++) {
        uint64_t at = k * d->stride; /* where block k starts in the destination */
        uint64_t in_place = d->small_tail <= at ? 0 : d->small_tail - at;
        if (in_place > blk)
            in_place = blk;
        if (in_place && out)
            out[n] = (struct kvt_range){abs + k * blk, in_place, d->dst + at, NULL};
        n += in_place > 0;
        if (in_place < blk && out)
            out[n] = (struct kvt_range){abs + k * blk + in_place, blk - in_place, NULL,
                                        d->dst + at + in_place};
        n += in_place < blk;
    }
    return n;
}

/* The ordinal of slot (@p ci, @p sj) in header order (its index in r->dst). */
static size_t slot_ordinal(const struct kvt_header *h, size_t ci, int sj)
{
    size_t ord = (size_t)sj;
    for (size_t i = 0; i < ci; i++)
        ord += (size_t)h->caches[i].n_slots;
    return ord;
}

/* A new stream over slot @p sj of cache @p ci and every slot after it in header order. */
static int open_stream(struct kvt_tensor_reader *r, size_t ci, int sj, struct slot_job *j)
{
    const struct kvt_header *h = r->h;
    size_t n = 0, ord = slot_ordinal(h, ci, sj); /* ranges; where (ci, sj) is in r->dst */
    kvt_rstream_close(r->rs);
    r->rs = NULL;
    for (size_t i = ci, o = ord; i < h->n_caches; i++)
        for (int k = i == ci ? sj : 0; k < h->caches[i].n_slots; k++, o++)
            n += slot_ranges(h, &h->caches[i].slots[k], r->dst ? &r->dst[o] : NULL, NULL);
    struct kvt_range *rg = malloc((n ? n : 1) * sizeof(*rg));
    if (!rg)
        return job_fail(j, -ENOMEM, J_NOMEM);
    n = 0;
    for (size_t i = ci, o = ord; i < h->n_caches; i++)
        for (int k = i == ci ? sj : 0; k < h->caches[i].n_slots; k++, o++)
            n += slot_ranges(h, &h->caches[i].slots[k], r->dst ? &r->dst[o] : NULL, rg + n);
    int rc = kvt_rstream_open(r->fd, rg, n, NULL, &r->rs);
    free(rg);
    if (rc < 0)
        return job_fail(j, rc, J_OPEN);
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

/* kvt_tensor_read() with its failure recorded in @p j (not reported). */
static int read_one(struct kvt_tensor_reader *r, size_t ci, int sj, uint8_t *dst, uint64_t blocks,
                    uint64_t dst_stride, struct slot_job *j)
{
    const struct kvt_slot *s = &r->h->caches[ci].slots[sj];
    uint64_t n = s->bytes;
    if (bad_geometry(s, dst, blocks, dst_stride))
        return job_fail(j, -EINVAL, J_GEOMETRY);
    uint64_t blk = n / blocks;
    if (!(r->dst && r->dst[slot_ordinal(r->h, ci, sj)].zeroed))
        zero_slack(dst, blocks, blk, dst_stride);
    bool due = r->rs && r->next_ci == ci && r->next_sj == sj;
    if (n == 0) {
        if (due)
            advance(r, ci, sj);
        if (!r->verify)
            return 0;
    } else {
        int rc = due ? 0 : open_stream(r, ci, sj, j);
        if (rc)
            return rc;
    }

    struct kvt_wyhash_state st;
    kvt_wyhash_init(&st, 0);
    kvt_piece_fn fn = r->verify ? kvt_piece_hash : NULL;
    uint64_t at = kvt_slot_abs(r->h, s);
    int rc = 0;
    if (n == 0)
        rc = 0;
    else if (!dst || dst_stride == blk)
        rc = kvt_rstream_read(r->rs, dst, (size_t)n, fn, &st, &at);
    else
        rc = kvt_rstream_read_blocks(r->rs, dst, (size_t)blocks, (size_t)blk, (size_t)dst_stride,
                                     fn, &st, &at);
    if (rc) {
        j->at = at;
        return job_fail(j, rc, J_READ);
    }
    if (n > 0)
        advance(r, ci, sj);
    if (!r->keep_cache && n > 0)
        drop_cache(r, s);
    if (r->verify && (j->got = kvt_wyhash_final(&st)) != s->hash)
        return job_fail(j, KVT_E_CORRUPT, J_HASH);
    return 0;
}

int kvt_tensor_read(struct kvt_tensor_reader *r, size_t ci, int sj, uint8_t *dst, uint64_t blocks,
                    uint64_t dst_stride)
{
    struct slot_job j = {.ci = ci, .sj = sj};
    return read_one(r, ci, sj, dst, blocks, dst_stride, &j) ? job_err(r, &j) : 0;
}

struct par_load {
    const struct kvt_tensor_reader *r; /* the files */
    struct slot_job *job;
};

/* Copy slot @p o of the load (in its file's header order) from the page cache into its
 * destination and check its hash. */
static bool load_slot(void *ud, size_t o)
{
    const struct par_load *pl = ud;
    struct slot_job *j = &pl->job[o];
    const struct kvt_tensor_reader *r = &pl->r[j->f];
    const struct kvt_slot *s = &r->h->caches[j->ci].slots[j->sj];
    const struct kvt_slot_dst *d = &r->dst[j->o];
    uint64_t abs = kvt_slot_abs(r->h, s), blk = s->bytes / d->blocks;
    struct kvt_wyhash_state st;
    kvt_wyhash_init(&st, 0);
    if (!d->zeroed)
        zero_slack(d->dst, d->blocks, blk, d->stride);
    for (uint64_t k = 0; k < d->blocks && blk > 0; k++)
        for (uint64_t p = 0; p < blk; p += PAR_PIECE) {
            size_t m = blk - p < PAR_PIECE ? (size_t)(blk - p) : PAR_PIECE;
            uint8_t *to = d->dst + k * d->stride + p;
            int rc = kvt_io_read_full(r->fd, to, m, abs + k * blk + p);
            if (rc) {
                j->at = abs + k * blk + p;
                job_fail(j, rc, J_READ);
                return false;
            }
            if (r->verify)
                kvt_wyhash_update(&st, to, m);
        }
    if (!r->keep_cache && s->bytes > 0)
        drop_cache(r, s);
    if (r->verify && (j->got = kvt_wyhash_final(&st)) != s->hash)
        job_fail(j, KVT_E_CORRUPT, J_HASH);
    return j->rc == 0;
}

static size_t slot_count(const struct kvt_header *h)
{
    size_t n = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        n += (size_t)h->caches[i].n_slots;
    return n;
}

/* How a load of the @p n slots of files @p r[0, nf) goes: kvt_read_choose_files() over one
 * range per slot with its destination; one slot after the other unless it picks the parallel
 * copy out of the page cache. */
static struct kvt_read_way read_way(const struct kvt_tensor_reader *r, size_t nf, size_t n)
{
    struct kvt_read_way one = {.path = KVT_READ_RING, .threads = 1}, way = one;
    struct kvt_range *rg = n < 2 ? NULL : malloc(n * sizeof(*rg));
    int *fd = rg ? malloc(n * sizeof(*fd)) : NULL;
    bool all_dst = fd != NULL;
    for (size_t f = 0, o = 0; f < nf && all_dst; f++) {
        all_dst = r[f].dst != NULL;
        for (size_t i = 0, so = 0; all_dst && i < r[f].h->n_caches; i++)
            for (int j = 0; j < r[f].h->caches[i].n_slots; j++, o++, so++) {
                const struct kvt_slot *s = &r[f].h->caches[i].slots[j];
                rg[o] =
                    (struct kvt_range){kvt_slot_abs(r[f].h, s), s->bytes, r[f].dst[so].dst, NULL};
                fd[o] = r[f].fd;
            }
    }
    if (all_dst)
        way = kvt_read_choose_files(fd, rg, n, NULL);
    free(rg);
    free(fd);
    return way;
}

/* Every slot of file @p r in order through its read-ahead stream, the stream of @p next (may
 * be NULL) opened once this one is under way, so that the device reads it meanwhile. */
static int read_in_order(struct kvt_tensor_reader *r, struct kvt_tensor_reader *next)
{
    const struct kvt_header *h = r->h;
    int rc = 0;
    for (size_t i = 0, o = 0; i < h->n_caches && rc == 0; i++)
        for (int j = 0; j < h->caches[i].n_slots && rc == 0; j++, o++) {
            rc = kvt_tensor_read(r, i, j, r->dst ? r->dst[o].dst : NULL,
                                 r->dst ? r->dst[o].blocks : 1, r->dst ? r->dst[o].stride : 0);
            if (o == 0 && next && !next->rs && next->h->n_caches && next->h->caches[0].n_slots) {
                struct slot_job nj = {0};
                open_stream(next, 0, 0, &nj); /* best effort: a failure reopens at the read */
            }
        }
    return rc;
}

/* Every slot of every file copied out of the page cache on @p threads cores. */
static int read_parallel(struct kvt_tensor_reader *r, size_t nf, size_t n, unsigned threads,
                         size_t *failed)
{
    struct slot_job *job = calloc(n, sizeof(*job));
    if (!job)
        return kvt_fail(-ENOMEM, "%s: out of memory", r->name);
    int rc = 0;
    for (size_t f = 0, o = 0; f < nf && rc == 0; f++)
        for (size_t i = 0, so = 0; i < r[f].h->n_caches && rc == 0; i++)
            for (int j = 0; j < r[f].h->caches[i].n_slots && rc == 0; j++, o++, so++) {
                job[o] = (struct slot_job){.f = f, .o = so, .ci = i, .sj = j};
                const struct kvt_slot_dst *d = &r[f].dst[so];
                if (bad_geometry(&r[f].h->caches[i].slots[j], d->dst, d->blocks, d->stride))
                    rc = geometry_err(&r[f], i, j);
                *failed = f;
            }
    if (rc == 0) {
        kvt_par_for(n, threads, load_slot, &(struct par_load){r, job});
        /* slots are handed out in order, so every slot before the first failure ran: the
         * error reported is the one a load in order would have met first */
        for (size_t o = 0; o < n && rc == 0; o++)
            if (job[o].rc)
                rc = job_err(&r[ *failed = job[o].f], &job[o]);
    }
    free(job);
    return rc;
}

int kvt_tensor_read_files(struct kvt_tensor_reader *r, size_t nf, size_t *failed)
{
    size_t n = 0, at = 0;
    for (size_t f = 0; f < nf; f++)
        n += slot_count(r[f].h);
    struct kvt_read_way way = read_way(r, nf, n);
    int rc = 0;
    if (way.path == KVT_READ_PARALLEL && way.threads > 1) {
        rc = read_parallel(r, nf, n, way.threads, &at);
    } else {
        for (; at < nf && rc == 0; at++) {
            rc = read_in_order(&r[at], at + 1 < nf ? &r[at + 1] : NULL);
            if (rc == 0)
                kvt_tensor_reader_free(&r[at]);
        }
        at -= at > 0;
    }
    for (size_t f = 0; f < nf; f++) /* no read may land after this */
        kvt_tensor_reader_free(&r[f]);
    if (failed)
        *failed = at;
    return rc;
}

int kvt_tensor_read_all(struct kvt_tensor_reader *r)
{
    size_t n = slot_count(r->h);
    struct kvt_read_way way = read_way(r, 1, n);
    if (way.path == KVT_READ_PARALLEL && way.threads > 1) {
        size_t failed;
        return read_parallel(r, 1, n, way.threads, &failed);
    }
    return read_in_order(r, NULL);
}
