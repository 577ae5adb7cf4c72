/*
 * Restores into device memory (kvt_file_load_to_device, kvt_store_restore_to_device): after the
 * header passes V1-V20 and the expectations, every slot streams from the file (read ahead, O_DIRECT
 * where possible) through a ring of page-locked staging slots: a slot is filled, hashed (L3), and
 * its copy to the device queued, while the next is filled; a slot is reused once its copy is done.
 * A hash mismatch fails the load after the copies in flight have finished, so nothing the caller
 * owns is touched after the call returns.
 */
#include "device/device.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>

#include "common/error.h"
#include "format/format.h"
#include "io/io.h"
#include "io/stream.h"
#include "store/store.h"

struct dev_load {
    const char *name;
    const struct kvt_header *h;
    kvt_device *d;
    struct kvt_dstage st;
    struct kvt_rstream *rs;
    bool verify;
};

/* Slot @p s of cache @p ci: read, hash and send to @p dst (0: only checked). */
static int load_slot(struct dev_load *l, size_t ci, int sj, uint64_t dst)
{
    const struct kvt_slot *s = &l->h->caches[ci].slots[sj];
    struct kvt_wyhash_state hs;
    kvt_wyhash_init(&hs, 0);
    for (uint64_t off = 0; off < s->bytes;) {
        size_t k = s->bytes - off < l->d->chunk ? (size_t)(s->bytes - off) : l->d->chunk;
        uint8_t *mem;
        unsigned slot;
        uint64_t at = 0;
        int rc = kvt_dstage_take(&l->st, &mem, &slot);
        if (rc == 0 && (rc = kvt_rstream_read(l->rs, mem, k, NULL, NULL, &at)))
            return kvt_fail(rc, "%s: read at offset %" PRIu64 ": %s", l->name, at,
                            kvt_strerror(rc));
        if (rc)
            return rc;
        if (l->verify)
            kvt_wyhash_update(&hs, mem, k);
        if (dst) {
            rc = l->d->ops->h2d(l->d, dst + off, mem, k, slot);
            if (rc)
                return rc;
            l->st.busy[slot] = true;
        }
        off += k;
    }
    uint64_t got = kvt_wyhash_final(&hs);
    if (l->verify && got != s->hash)
        return kvt_fail(KVT_E_CORRUPT,
                        "%s: L3: tensor hash mismatch at offset %" PRIu64
                        " (caches[%zu].tensors[%d]: stored %016" PRIx64 ", read %016" PRIx64 ")",
                        l->name, kvt_slot_abs(l->h, s), ci, sj, s->hash, got);
    return 0;
}

static int load_slots(struct dev_load *l, int fd, const uint64_t *dst, bool keep_cache)
{
    const struct kvt_header *h = l->h;
    size_t n = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        n += (size_t)h->caches[i].n_slots;
    struct kvt_range *rg = calloc(n ? n : 1, sizeof(*rg));
    if (!rg)
        return kvt_fail(-ENOMEM, "%s: out of memory", l->name);
    size_t o = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++, o++)
            rg[o] = (struct kvt_range){kvt_slot_abs(h, &h->caches[i].slots[j]),
                                       h->caches[i].slots[j].bytes, NULL, NULL};
    int rc = kvt_rstream_open(fd, rg, n, NULL, &l->rs);
    free(rg);
    if (rc)
        return kvt_fail(rc, "%s: cannot open the read stream: %s", l->name, kvt_strerror(rc));
    o = 0;
    for (size_t i = 0; i < h->n_caches && rc == 0; i++)
        for (int j = 0; j < h->caches[i].n_slots && rc == 0; j++, o++)
            rc = load_slot(l, i, j, dst[o]);
    int rd = kvt_dstage_drain(&l->st); /* no copy may land after the call returns */
    kvt_rstream_close(l->rs);
    l->rs = NULL;
    for (size_t i = 0; i < h->n_caches && !keep_cache; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++) {
            const struct kvt_slot *s = &h->caches[i].slots[j];
            kvt_io()->fadvise_dontneed(fd, kvt_slot_abs(h, s), kvt_align_up(s->bytes));
        }
    return rc ? rc : rd;
}

int kvt_file_load_to_device(const char *path, const struct kvt_expect *x, kvt_device *d,
                            kvt_device_place_fn place, void *ud, struct kvt_header **out_header)
{
    if (!out_header)
        return kvt_fail(-EINVAL, "kvt_file_load_to_device: no output");
    *out_header = NULL;
    if (!path || !d || !place)
        return kvt_fail(-EINVAL, "kvt_file_load_to_device: no path, device or placement");
    const struct kvt_io *io = kvt_io();
    int fd = io->openat(AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return kvt_fail(fd, "%s: open: %s", path, kvt_strerror(fd));
    struct kvt_read_opts ro = {.max_header_bytes = x ? x->max_header_bytes : 0};
    struct kvt_header *h = NULL;
    uint64_t *dst = NULL;
    int rc = kvt_header_read_fd(fd, &ro, path, &h);
    if (rc == 0)
        rc = kvt_header_check_expect(h, x, path);
    if (rc == 0) {
        size_t n = 0;
        for (size_t i = 0; i < h->n_caches; i++)
            n += (size_t)h->caches[i].n_slots;
        dst = calloc(n ? n : 1, sizeof(*dst));
        rc = dst ? 0 : kvt_fail(-ENOMEM, "%s: out of memory", path);
    }
    if (rc == 0) {
        kvt_clear_error();
        rc = place(ud, h, dst);
        if (rc && !kvt_last_error()[0])
            kvt_fail(rc, "%s: the destination was refused: %s", path, kvt_strerror(rc));
    }
    struct dev_load l = {.name = path, .h = h, .d = d, .verify = !(x && x->no_verify)};
    if (rc == 0 && (rc = kvt_dstage_open(d, &l.st)) == 0) {
        rc = load_slots(&l, fd, dst, x && x->keep_cache);
        kvt_dstage_close(&l.st);
    }
    free(dst);
    io->close(fd);
    if (rc == 0)
        *out_header = h;
    else
        kvt_header_free(h);
    return rc;
}

/* kvt_store_restore_to_device()'s loader: the caller's placement, its refusal told apart. */
struct dev_placed {
    kvt_device *d;
    kvt_device_place_fn place;
    void *ud;
    bool *refused;
};

static int dev_placement(void *ud, const struct kvt_header *h, uint64_t *dst)
{
    struct dev_placed *p = ud;
    int rc = p->place(p->ud, h, dst);
    *p->refused = rc != 0;
    return rc;
}

static int load_placed(void *ud, const char *path, const struct kvt_expect *x,
                       struct kvt_header **h, bool *refused)
{
    struct dev_placed *p = ud;
    p->refused = refused;
    return kvt_file_load_to_device(path, x, p->d, dev_placement, p, h);
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
    struct dev_placed p = {.d = d, .place = place, .ud = ud};
    return kvt_store_restore_with(s, hit, load_placed, &p, out_header);
}
