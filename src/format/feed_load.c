/*
 * A load fed the bytes of a file in order, for files that arrive rather than sit on disk (a
 * remote entry coming off a socket): no staging copy, and every check of the file loader at
 * the moment its bytes are in. The prefix (V1-V5) is checked once its 26 bytes are in, the
 * header (V6-V20) and the caller's expectations (L1, L2) once its JSON is; then the
 * destinations are allocated as kvt_file_load() allocates them, the feeder writes each slot's
 * bytes straight into place, and they are hashed (L3) as they land, while they are still in
 * the cache. Bytes outside the slots (padding, gaps, a tail) go to a scratch buffer, unread.
 * Destinations that are fresh memory are faulted in ahead of the feeder by the restore helper
 * on another core, as a file load does, so the feeder's copies do not stop at every page.
 * The first failed check stops the feed; nothing fed is ever handed out.
 */
#include "format/format.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "io/stream.h"
#include "threads/restore_helper.h"

#define SCRATCH ((size_t)64 << 10)
/* With a prefault helper, destinations are handed out in pieces of at most this size. */
#define PREFAULT_PIECE ((size_t)256 << 10)

struct kvt_feed {
    char *name;
    struct kvt_expect x;
    uint64_t size, pos; /* the file's bytes; how many are in */
    uint8_t prefix[KVT_PREFIX_LEN];
    struct kvt_prefix p;
    uint8_t *json;
    struct kvt_header *h;
    struct kvt_load_bufs b;
    size_t n_slots, slot; /* every slot in header order; the next one with bytes to come */
    size_t ci;            /* slot's cache and index in it */
    int sj;
    uint64_t in_slot;              /* its bytes already in */
    struct kvt_restore_helper *pf; /* faults fresh destinations in ahead, or NULL */
    size_t pf_next;                /* the next slot whose destination it is to be given */
    struct kvt_wyhash_state st;
    kvt_feed_place_fn place; /* the caller's destinations, or NULL: new buffers */
    void *place_ud;
    int rc; /* sticky */
    uint8_t scratch[SCRATCH];
};

static void drop_load(struct kvt_feed *f)
{
    kvt_restore_helper_stop(f->pf); /* before the memory it may be touching is freed */
    f->pf = NULL;
    kvt_load_bufs_free(&f->b);
    kvt_header_free(f->h);
    free(f->json);
    f->h = NULL;
    f->json = NULL;
}

void kvt_feed_reset(struct kvt_feed *f)
{
    drop_load(f);
    f->pos = 0;
    f->rc = 0;
    if (f->size < KVT_PREFIX_LEN) /* V1, as a file this short fails */
        f->rc = kvt_prefix_check(f->prefix, 0, f->size, 0, f->name, &f->p);
}

int kvt_feed_new(uint64_t size, const struct kvt_expect *x, const char *name, struct kvt_feed **out)
{
    *out = NULL;
    struct kvt_feed *f = calloc(1, sizeof(*f));
    if (!f || !(f->name = strdup(name ? name : "entry"))) {
        free(f);
        return kvt_fail(-ENOMEM, "%s: out of memory", name ? name : "entry");
    }
    f->size = size;
    if (x)
        f->x = *x;
    kvt_feed_reset(f);
    *out = f;
    return 0;
}

void kvt_feed_free(struct kvt_feed *f)
{
    if (!f)
        return;
    drop_load(f);
    free(f->name);
    free(f);
}

static const struct kvt_slot *cur_slot(const struct kvt_feed *f)
{
    return &f->h->caches[f->ci].slots[f->sj];
}

static const struct kvt_slot_dst *cur_dst(const struct kvt_feed *f)
{
    return &f->b.d[f->slot];
}

/* The whole destination buffer of slot @p o, and its length (0: nothing to fault in). */
static uint8_t *dst_span(const struct kvt_feed *f, size_t o, size_t *len)
{
    const struct kvt_slot_dst *d = &f->b.d[o];
    *len = d->dst && d->blocks ? (size_t)(d->blocks * d->stride) : 0;
    return d->dst;
}

/* Give the helper the destinations of the next slots, as many as its queue takes. */
static void prefault_ahead(struct kvt_feed *f)
{
    for (; f->pf && f->pf_next < f->n_slots; f->pf_next++) {
        size_t len;
        uint8_t *p = dst_span(f, f->pf_next, &len);
        if (len >= KVT_PREFAULT_MIN && !kvt_restore_helper_add(f->pf, p, len))
            return; /* full: again at the next slot */
    }
}

/* A helper when some large destination is not resident yet (fresh memory). */
static void start_prefault(struct kvt_feed *f)
{
    for (size_t o = 0; o < f->n_slots; o++) {
        size_t len;
        uint8_t *p = dst_span(f, o, &len);
        if (len >= KVT_PREFAULT_MIN && kvt_restore_helper_wanted(p, len)) {
            f->pf = kvt_restore_helper_start();
            f->pf_next = 0;
            prefault_ahead(f);
            return;
        }
    }
}

/* Record failure @p rc (its message already set) and return it. */
static int stop(struct kvt_feed *f, int rc)
{
    f->rc = rc;
    return rc;
}

/* Slot (ci, sj) is whole: check its hash. */
static int slot_done(struct kvt_feed *f)
{
    const struct kvt_slot *s = cur_slot(f);
    uint64_t got = kvt_wyhash_final(&f->st);
    if (!f->x.no_verify && got != s->hash)
        return stop(f, kvt_fail(KVT_E_CORRUPT,
                                "%s: L3: tensor hash mismatch at offset %" PRIu64
                                " (caches[%zu].tensors[%d]: stored %016" PRIx64 ", read %016" PRIx64
                                ")",
                                f->name, kvt_slot_abs(f->h, s), f->ci, f->sj, s->hash, got));
    return 0;
}

/* Move to the next slot with bytes to come, checking the empty ones on the way; a new slot's
 * geometry is checked and its slack zeroed before any of its bytes land. */
static int next_slot(struct kvt_feed *f, bool first)
{
    for (;;) {
        if (!first) {
            f->slot++;
            if (++f->sj >= f->h->caches[f->ci].n_slots) {
                f->sj = 0;
                f->ci++;
            }
        }
        first = false;
        while (f->ci < f->h->n_caches && f->h->caches[f->ci].n_slots == 0)
            f->ci++;
        if (f->slot >= f->n_slots)
            return 0;
        f->in_slot = 0;
        kvt_wyhash_init(&f->st, 0);
        prefault_ahead(f);
        const struct kvt_slot *s = cur_slot(f);
        if (s->bytes == 0) {
            int rc = slot_done(f);
            if (rc)
                return rc;
            continue;
        }
        const struct kvt_slot_dst *d = cur_dst(f);
        uint64_t blk = d->blocks ? s->bytes / d->blocks : 0;
        if (!d->dst || blk == 0 || blk * d->blocks != s->bytes || d->stride < blk)
            return stop(f, kvt_fail(-EINVAL, "%s: caches[%zu].tensors[%d]: bad read geometry",
                                    f->name, f->ci, f->sj));
        if (!d->zeroed && d->stride > blk)
            for (uint64_t k = 0; k < d->blocks; k++)
                memset(d->dst + k * d->stride + blk, 0, (size_t)(d->stride - blk));
        return 0;
    }
}

/* The prefix is in: V1-V5, and room for the JSON. */
static int prefix_in(struct kvt_feed *f)
{
    size_t max = f->x.max_header_bytes ? f->x.max_header_bytes : KVT_DEFAULT_MAX_HEADER;
    int rc = kvt_prefix_check(f->prefix, KVT_PREFIX_LEN, f->size, max, f->name, &f->p);
    if (rc)
        return stop(f, rc);
    if (!(f->json = malloc(f->p.header_len)))
        return stop(f, kvt_fail(-ENOMEM, "%s: no memory for a %" PRIu32 "-byte header", f->name,
                                f->p.header_len));
    return 0;
}

void kvt_feed_place(struct kvt_feed *f, kvt_feed_place_fn fn, void *ud)
{
    f->place = fn;
    f->place_ud = ud;
}

/* Every slot's destination: new buffers, or the caller's (it knows its memory: no helper). */
static int make_dsts(struct kvt_feed *f)
{
    if (!f->place) {
        int rc = kvt_load_bufs_new(f->h, f->name, &f->b);
        if (rc == 0)
            start_prefault(f);
        return rc;
    }
    size_t total = 0;
    for (size_t i = 0; i < f->h->n_caches; i++)
        total += (size_t)f->h->caches[i].n_slots;
    if (!(f->b.d = calloc(total ? total : 1, sizeof(*f->b.d))))
        return kvt_fail(-ENOMEM, "%s: out of memory", f->name);
    f->b.made = total;
    return f->place(f->place_ud, f->h, f->b.d, total);
}

/* The JSON is in: V6-V20, L1, L2, then every destination. */
static int header_in(struct kvt_feed *f)
{
    int rc = kvt_header_parse_json(f->json, &f->p, f->size, f->name, &f->h);
    if (rc == 0)
        rc = kvt_header_check_expect(f->h, &f->x, f->name);
    f->slot = f->ci = 0;
    f->sj = 0;
    if (rc == 0)
        rc = make_dsts(f);
    if (rc)
        return stop(f, rc);
    f->n_slots = f->b.made;
    return next_slot(f, true);
}

/* Where byte f->pos goes and how many bytes after it go on contiguously. */
static uint8_t *run(struct kvt_feed *f, size_t *len)
{
    uint64_t left = f->size - f->pos, n;
    uint8_t *at;
    if (f->pos < KVT_PREFIX_LEN) {
        at = f->prefix + f->pos;
        n = KVT_PREFIX_LEN - f->pos;
    } else if (f->pos < KVT_PREFIX_LEN + (uint64_t)f->p.header_len) {
        at = f->json + (f->pos - KVT_PREFIX_LEN);
        n = KVT_PREFIX_LEN + f->p.header_len - f->pos;
    } else if (f->slot < f->n_slots && f->pos >= kvt_slot_abs(f->h, cur_slot(f))) {
        const struct kvt_slot_dst *d = cur_dst(f);
        uint64_t blk = cur_slot(f)->bytes / d->blocks;
        uint64_t k = f->in_slot / blk, within = f->in_slot % blk;
        at = d->dst + k * d->stride + within;
        n = blk - within;
    } else { /* not part of any slot */
        at = f->scratch;
        n = SCRATCH;
        if (f->slot < f->n_slots && kvt_slot_abs(f->h, cur_slot(f)) - f->pos < n)
            n = kvt_slot_abs(f->h, cur_slot(f)) - f->pos;
    }
    *len = (size_t)(n < left ? n : left);
    return at;
}

int kvt_feed_next(struct kvt_feed *f, uint8_t **at, size_t *len)
{
    if (f->rc)
        return f->rc;
    if (f->pos >= f->size)
        return kvt_fail(-EINVAL, "%s: fed past its %" PRIu64 " bytes", f->name, f->size);
    *at = run(f, len);
    if (f->pf && *at != f->scratch && f->pos >= KVT_PREFIX_LEN + (uint64_t)f->p.header_len) {
        /* a piece at a time, so that the helper stays ahead rather than this thread faulting
         * in all the rest of a large block itself */
        if (*len > PREFAULT_PIECE)
            *len = PREFAULT_PIECE;
        kvt_restore_helper_ensure(f->pf, *at, *len);
    }
    return 0;
}

int kvt_feed_wrote(struct kvt_feed *f, size_t n)
{
    if (f->rc)
        return f->rc;
    size_t len;
    uint8_t *at = run(f, &len);
    if (n > len || f->pos >= f->size)
        return kvt_fail(-EINVAL, "%s: %zu bytes fed where %zu were asked for", f->name, n, len);
    bool in_slot = f->pos >= KVT_PREFIX_LEN + (uint64_t)f->p.header_len && f->slot < f->n_slots &&
                   at != f->scratch;
    f->pos += n;
    if (f->pos == KVT_PREFIX_LEN)
        return prefix_in(f);
    if (f->pos == KVT_PREFIX_LEN + (uint64_t)f->p.header_len)
        return header_in(f);
    if (!in_slot)
        return 0;
    kvt_wyhash_update(&f->st, at, n);
    f->in_slot += n;
    if (f->in_slot < cur_slot(f)->bytes)
        return 0;
    int rc = slot_done(f);
    return rc ? rc : next_slot(f, false);
}

int kvt_feed_finish(struct kvt_feed *f, struct kvt_entry **out, struct kvt_header **out_header)
{
    *out = NULL;
    if (out_header)
        *out_header = NULL;
    if (f->rc)
        return f->rc;
    if (f->pos < f->size || !f->h)
        return kvt_fail(-EINVAL, "%s: %" PRIu64 " of %" PRIu64 " bytes fed", f->name, f->pos,
                        f->size);
    kvt_restore_helper_stop(f->pf); /* every byte is in: nothing is left to fault in */
    f->pf = NULL;
    int rc = f->place ? 0 : kvt_load_bufs_entry(f->h, f->name, &f->b, out);
    if (rc)
        return stop(f, rc);
    if (out_header) {
        *out_header = f->h;
        f->h = NULL;
    }
    return 0;
}
