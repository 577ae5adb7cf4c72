/*
 * An entry's .mlxkv bytes in memory, for a sender that needs them as a byte stream (the
 * remote tier's uploads) without a file in between: the save plan lays the file out, one
 * pass over the tensors hashes them and notes their contiguous runs, and the header is
 * rendered with those hashes. The image is then a list of segments in file order (the
 * header, zero padding, the runs of the entry's own memory), handed out as iovecs.
 */
#include "format/format.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "tensor/tensor_parts.h"

/* Zero padding is handed out from this many bytes of zeros at a time. */
#define ZEROS ((size_t)16384)
static const uint8_t zeros[ZEROS];

struct segment {
    uint64_t off, len;
    const uint8_t *p; /* NULL: zeros */
};

struct kvt_image {
    struct kvt_save_plan *plan; /* holds the views, so the runs' memory stays alive */
    uint8_t *head;
    uint64_t bytes, header_hash;
    struct segment *seg;
    size_t n_seg, cap;
};

static int add(struct kvt_image *im, uint64_t off, uint64_t len, const uint8_t *p)
{
    if (len == 0)
        return 0;
    if (im->n_seg == im->cap) {
        size_t cap = im->cap ? 2 * im->cap : 64;
        struct segment *s = realloc(im->seg, cap * sizeof(*s));
        if (!s)
            return kvt_fail(-ENOMEM, "entry: out of memory for its image");
        im->seg = s;
        im->cap = cap;
    }
    im->seg[im->n_seg++] = (struct segment){off, len, p};
    return 0;
}

/* The runs of one view: hashed and noted, in order, from file offset pos. */
struct runs {
    struct kvt_image *im;
    struct kvt_wyhash_state st;
    uint64_t pos;
};

static int take_run(void *ud, const void *p, size_t n)
{
    struct runs *r = ud;
    kvt_wyhash_update(&r->st, p, n);
    int rc = add(r->im, r->pos, n, p);
    r->pos += n;
    return rc;
}

/* Hash the @p n views @p v of slots @p slot, note their runs and the zeros before each. */
static int lay_out(struct kvt_image *im, const struct kvt_tensor *v, struct kvt_slot *const *slot,
                   size_t n, const struct kvt_header *h)
{
    uint64_t at = h->data_start; /* the head covers [0, data_start) */
    for (size_t k = 0; k < n; k++) {
        if (kvt_tensor_on_device(&v[k]))
            return kvt_fail(KVT_E_UNSUPPORTED, "entry: a tensor in device memory has no image");
        uint64_t abs = kvt_slot_abs(h, slot[k]);
        struct runs r = {.im = im, .pos = abs};
        kvt_wyhash_init(&r.st, 0);
        int rc = slot[k]->bytes ? add(im, at, abs - at, NULL) : 0;
        if (rc == 0 && slot[k]->bytes)
            rc = kvt_tensor_for_each_run(&v[k], take_run, &r);
        if (rc)
            return rc;
        if (r.pos != abs + slot[k]->bytes)
            return kvt_fail(KVT_E_STATE, "entry: a tensor's bytes differ from its plan");
        slot[k]->hash = kvt_wyhash_final(&r.st);
        if (slot[k]->bytes)
            at = r.pos;
    }
    im->bytes = kvt_save_plan_bytes(im->plan);
    return add(im, at, im->bytes - at, NULL); /* up to F after an empty last tensor */
}

int kvt_image_new(const struct kvt_entry *e, const struct kvt_save_opts *o, struct kvt_image **out)
{
    *out = NULL;
    struct kvt_image *im = calloc(1, sizeof(*im));
    if (!im)
        return kvt_fail(-ENOMEM, "entry: out of memory for its image");
    int rc = kvt_save_plan_new(e, o, &im->plan);
    if (rc == 0) {
        const struct kvt_tensor *v;
        struct kvt_slot *const *slot;
        const struct kvt_header *h;
        size_t n = kvt_save_plan_views(im->plan, &v, &slot, &h);
        rc = add(im, 0, h->data_start, NULL); /* the head: rendered once the hashes are in */
        if (rc == 0)
            rc = lay_out(im, v, slot, n, h);
    }
    if (rc == 0 && !(im->head = kvt_save_plan_head(im->plan, &im->header_hash)))
        rc = kvt_fail(-ENOMEM, "entry: out of memory for its header");
    if (rc) {
        kvt_image_free(im);
        return rc;
    }
    im->seg[0].p = im->head;
    *out = im;
    return 0;
}

uint64_t kvt_image_bytes(const struct kvt_image *im)
{
    return im->bytes;
}

uint64_t kvt_image_header_hash(const struct kvt_image *im)
{
    return im->header_hash;
}

/* The segment holding byte @p off (segments are sorted and leave no gap). */
static size_t find(const struct kvt_image *im, uint64_t off)
{
    size_t lo = 0, hi = im->n_seg;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (im->seg[mid].off <= off)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

size_t kvt_image_iov(const struct kvt_image *im, uint64_t off, uint64_t len, struct iovec *iov,
                     size_t max, uint64_t *covered)
{
    size_t n = 0;
    uint64_t done = 0;
    for (size_t i = find(im, off); done < len && n < max && i < im->n_seg;) {
        const struct segment *s = &im->seg[i];
        uint64_t in = off + done - s->off, m = s->len - in;
        if (m > len - done)
            m = len - done;
        if (!s->p && m > ZEROS)
            m = ZEROS;
        iov[n++] = (struct iovec){(void *)(s->p ? s->p + in : zeros), (size_t)m};
        done += m;
        if (off + done == s->off + s->len)
            i++;
    }
    *covered = done;
    return n;
}

void kvt_image_free(struct kvt_image *im)
{
    if (!im)
        return;
    kvt_save_plan_free(im->plan);
    free(im->head);
    free(im->seg);
    free(im);
}
