/*
 * Restores into device memory (kvt_file_load_to_device, kvt_store_restore_to_device): after the
 * header passes V1-V20 and the expectations, every slot streams from the file (read ahead, O_DIRECT
 * where possible) through the device's ring of page-locked staging slots: a slot is filled, hashed
 * (L3), and its copy to the device queued, while the next is filled; a slot is reused once its
 * copy is done. Large files are split into runs of slots loaded by several threads at once,
 * as kvt_read_choose() (io/read_way.c) splits them.
 * A hash mismatch fails the load after the copies in flight have finished, so nothing the caller
 * owns is touched after the call returns.
 */
#include "device/device_parts.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "format/format.h"
#include "io/io.h"
#include "io/stream.h"
#include "threads/par_for.h"
#include "store/store_parts.h"

/* One slot of the file, in header order, and where it goes (0: only checked). A slot cut to
 * a prefix keeps the first @p keep bytes of each @p row bytes (row 0: all of it). */
struct dslot {
    const struct kvt_slot *s;
    size_t ci;
    int sj;
    uint64_t dst;
    uint64_t row, keep;
};

/* A run of consecutive slots loaded by one thread through its own read stream. */
struct run {
    size_t first, end;
    int rc;
    char msg[512]; /* the failing thread's message, raised again by the caller */
};

struct dev_load {
    const char *name;
    const struct kvt_header *h;
    kvt_device *d;
    int fd;
    bool verify;
    struct dslot *slot;
    struct kvt_range *rg; /* each slot's bytes in the file */
    size_t n_slots;
    struct run run[KVT_DEVICE_MAX_SLOTS];
    unsigned n_runs;
};

/* Queue the copy of the chunk at slot offset @p off: whole, or the kept part of each row. */
static int send(kvt_device *d, const struct dslot *ds, uint64_t off, uint8_t *mem, size_t k,
                unsigned slot)
{
    if (!ds->row)
        return d->ops->h2d(d, ds->dst + off, mem, k, slot);
    int rc = 0;
    for (uint64_t r = off / ds->row; rc == 0 && r * ds->row < off + k; r++) {
        uint64_t lo = r * ds->row > off ? r * ds->row : off;
        uint64_t hi = r * ds->row + ds->keep < off + k ? r * ds->row + ds->keep : off + k;
        if (lo < hi)
            rc = d->ops->h2d(d, ds->dst + r * ds->keep + (lo - r * ds->row), mem + (lo - off),
                             (size_t)(hi - lo), slot);
    }
    return rc;
}

/* Slot @p ds: read through @p rs, hash, and send each chunk to the device. */
static int load_slot(struct dev_load *l, struct kvt_rstream *rs, const struct dslot *ds)
{
    const struct kvt_slot *s = ds->s;
    struct kvt_wyhash_state hs;
    kvt_wyhash_init(&hs, 0);
    for (uint64_t off = 0; off < s->bytes;) {
        size_t k = s->bytes - off < l->d->chunk ? (size_t)(s->bytes - off) : l->d->chunk;
        uint8_t *mem;
        unsigned slot;
        uint64_t at = 0;
        int rc = kvt_dstage_take(l->d, &mem, &slot);
        if (rc)
            return rc;
        if ((rc = kvt_rstream_read(rs, mem, k, NULL, NULL, &at))) {
            kvt_dstage_give(l->d, slot, false);
            return kvt_fail(rc, "%s: read at offset %" PRIu64 ": %s", l->name, at,
                            kvt_strerror(rc));
        }
        if (l->verify)
            kvt_wyhash_update(&hs, mem, k);
        rc = ds->dst ? send(l->d, ds, off, mem, k, slot) : 0;
        kvt_dstage_give(l->d, slot, ds->dst && rc == 0);
        if (rc)
            return rc;
        off += k;
    }
    uint64_t got = kvt_wyhash_final(&hs);
    if (l->verify && got != s->hash)
        return kvt_fail(KVT_E_CORRUPT,
                        "%s: L3: tensor hash mismatch at offset %" PRIu64
                        " (caches[%zu].tensors[%d]: stored %016" PRIx64 ", read %016" PRIx64 ")",
                        l->name, kvt_slot_abs(l->h, s), ds->ci, ds->sj, s->hash, got);
    return 0;
}

/* Run @p ru: its own stream over its slots (read-ahead stays inside the run). */
static int load_run(struct dev_load *l, const struct run *ru)
{
    struct kvt_rstream *rs;
    int rc = kvt_rstream_open(l->fd, l->rg + ru->first, ru->end - ru->first, NULL, &rs);
    if (rc)
        return kvt_fail(rc, "%s: cannot open the read stream: %s", l->name, kvt_strerror(rc));
    for (size_t o = ru->first; o < ru->end && rc == 0; o++)
        rc = load_slot(l, rs, &l->slot[o]);
    kvt_rstream_close(rs);
    return rc;
}

static bool run_job(void *ud, size_t w)
{
    struct dev_load *l = ud;
    struct run *ru = &l->run[w];
    ru->rc = load_run(l, ru);
    if (ru->rc)
        snprintf(ru->msg, sizeof(ru->msg), "%s", kvt_last_error());
    return true; /* the other runs finish: their copies must land before the call returns */
}

/* The runs of slots, one per thread, as kvt_read_choose() splits the file's bytes going on
 * through the device's staging. */
static void plan_runs(struct dev_load *l)
{
    struct kvt_read_split split = {.stage_slots = l->d->depth, .stage_chunk = l->d->chunk};
    struct kvt_read_way way = kvt_read_choose(l->fd, l->rg, l->n_slots, NULL, &split);
    size_t end[KVT_DEVICE_MAX_SLOTS];
    l->n_runs = kvt_read_runs(l->rg, l->n_slots, way.threads, end);
    for (unsigned k = 0; k < l->n_runs; k++)
        l->run[k] = (struct run){.first = k ? end[k - 1] : 0, .end = end[k]};
}

static int load_slots(struct dev_load *l, bool keep_cache)
{
    pthread_mutex_lock(&l->d->op_lock);
    int rc = kvt_dstage_ready(l->d);
    if (rc) {
        pthread_mutex_unlock(&l->d->op_lock);
        return rc;
    }
    plan_runs(l);
    if (l->n_runs > 1)
        kvt_par_for(l->n_runs, l->n_runs, run_job, l);
    else if (l->n_runs == 1)
        run_job(l, 0);
    int rd = kvt_dstage_drain(l->d); /* no copy may land after the call returns */
    pthread_mutex_unlock(&l->d->op_lock);
    for (unsigned w = 0; w < l->n_runs && rc == 0; w++) /* the first failure in file order */
        if ((rc = l->run[w].rc))
            kvt_fail(rc, "%s", l->run[w].msg);
    for (size_t o = 0; o < l->n_slots && !keep_cache; o++)
        kvt_io()->fadvise_dontneed(l->fd, l->rg[o].off, kvt_align_up(l->rg[o].len));
    return rc ? rc : rd;
}

/* The file's slots in header order, with the addresses the placement gave and, for a load
 * cut to the prefix of @p cut (NULL: whole), the rows kept. */
static int list_slots(struct dev_load *l, const uint64_t *dst, const struct kvt_header *cut)
{
    size_t n = 0;
    for (size_t i = 0; i < l->h->n_caches; i++)
        n += (size_t)l->h->caches[i].n_slots;
    l->slot = calloc(n ? n : 1, sizeof(*l->slot));
    l->rg = calloc(n ? n : 1, sizeof(*l->rg));
    if (!l->slot || !l->rg)
        return kvt_fail(-ENOMEM, "%s: out of memory", l->name);
    for (size_t i = 0; i < l->h->n_caches; i++)
        for (int j = 0; j < l->h->caches[i].n_slots; j++, l->n_slots++) {
            const struct kvt_slot *s = &l->h->caches[i].slots[j];
            l->slot[l->n_slots] = (struct dslot){s, i, j, dst[l->n_slots], 0, 0};
            l->rg[l->n_slots] = (struct kvt_range){kvt_slot_abs(l->h, s), s->bytes, NULL, NULL};
        }
    for (size_t o = 0; cut && o < l->n_slots; o++) {
        const struct kvt_slot *s = l->slot[o].s,
                              *c = &cut->caches[l->slot[o].ci].slots[l->slot[o].sj];
        uint64_t rows = (uint64_t)(s->shape[0] * s->shape[1]);
        l->slot[o].row = rows ? s->bytes / rows : 0;
        l->slot[o].keep = rows ? c->bytes / rows : 0;
    }
    return 0;
}

/* kvt_file_load_to_device() of the first @p keep tokens (0: all of them); *@p out_header is
 * the whole header. */
static int load_to_device(const char *path, const struct kvt_expect *x, kvt_device *d,
                          const struct kvt_placement *p, size_t keep,
                          struct kvt_header **out_header)
{
    int fd;
    struct kvt_header *h, *cut = NULL;
    void *dst = NULL;
    int rc = kvt_file_open_header(path, x, &fd, &h);
    if (rc)
        return rc;
    if (keep && keep < h->n_tokens)
        rc = kvt_header_cut_prefix(h, keep, &cut);
    if (rc == 0)
        rc = kvt_placement_ask(p, cut ? cut : h, path, &dst);
    struct dev_load l = {.name = path, .h = h, .d = d, .fd = fd, .verify = !(x && x->no_verify)};
    if (rc == 0 && (rc = list_slots(&l, dst, cut)) == 0)
        rc = load_slots(&l, kvt_read_keeps_cache(fd, h->data_start, h->file_size - h->data_start,
                                                 x && x->keep_cache));
    free(l.slot);
    free(l.rg);
    free(dst);
    kvt_io()->close(fd);
    kvt_header_free(cut); /* the store checks the whole header against its index */
    if (rc == 0)
        *out_header = h;
    else
        kvt_header_free(h);
    return rc;
}

int kvt_file_load_to_device(const char *path, const struct kvt_expect *x, kvt_device *d,
                            kvt_device_place_fn place, void *ud, struct kvt_header **out_header)
{
    if (!out_header)
        return kvt_fail(-EINVAL, "kvt_file_load_to_device: no output");
    *out_header = NULL;
    if (!path || !d || !place)
        return kvt_fail(-EINVAL, "kvt_file_load_to_device: no path, device or placement");
    return load_to_device(path, x, d, &(struct kvt_placement){.device = place, .ud = ud}, 0,
                          out_header);
}

/* kvt_store_restore_to_device()'s loader: the caller's placement, its refusal told apart. */
struct dev_placed {
    kvt_device *d;
    struct kvt_placement place;
    size_t keep;
};

static int load_placed(void *ud, const char *path, const struct kvt_expect *x,
                       struct kvt_header **h, bool *refused, char **bad_chunk)
{
    struct dev_placed *p = ud;
    p->place.refused = refused;
    if (kvt_is_tail(path)) /* a shared entry: its files are composed first */
        return kvt_share_load_to_device(path, x, p->d, &p->place, p->keep, h, bad_chunk);
    return load_to_device(path, x, p->d, &p->place, p->keep, h);
}

int kvt_store_restore_to_device(kvt_store *s, const struct kvt_hit *hit, kvt_device *d,
                                kvt_device_place_fn place, void *ud, struct kvt_header **out_header)
{
    if (!out_header)
        return kvt_fail(-EINVAL, "kvt_store_restore_to_device: no output");
    *out_header = NULL;
    if (!s || !hit || !d || !place)
        return kvt_fail(-EINVAL, "kvt_store_restore_to_device: no store, hit, device or "
                                 "placement");
    struct dev_placed p = {.d = d, .place = {.device = place, .ud = ud}};
    return kvt_store_restore_with(s, hit, load_placed, &p, out_header);
}

int kvt_store_restore_prefix_to_device(kvt_store *s, const struct kvt_hit *hit, kvt_device *d,
                                       kvt_device_place_fn place, void *ud,
                                       struct kvt_header **out_header)
{
    if (!out_header)
        return kvt_fail(-EINVAL, "kvt_store_restore_prefix_to_device: no output");
    *out_header = NULL;
    if (!s || !hit || !d || !place)
        return kvt_fail(-EINVAL, "kvt_store_restore_prefix_to_device: no store, hit, device or "
                                 "placement");
    struct dev_placed p = {.d = d, .place = {.device = place, .ud = ud}, .keep = hit->prefix_len};
    struct kvt_header *h = NULL;
    int rc = kvt_store_restore_with(s, hit, load_placed, &p, &h);
    if (rc == 0 && h && hit->prefix_len < h->n_tokens) { /* what landed: cut as placed */
        rc = kvt_header_cut_prefix(h, hit->prefix_len, out_header);
        kvt_header_free(h);
    } else if (rc == 0) {
        *out_header = h;
    }
    return rc;
}
