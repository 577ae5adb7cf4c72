/*
 * The .mlxkv loader (FORMAT.md §11.3, STORE.md §8, CACHES.md §11-§12). After the header
 * passes V1-V20 and the caller's expectations (L1, L2), a newly allocated buffer is made for
 * every tensor, then the tensors are read straight into them (the read stream knows every
 * destination up front, so its direct reads land in place ahead of the hashing), hashed in
 * the same pass (L3), and their file ranges dropped from the page cache. Token-axis kinds
 * (kv, qkv, turboquant) get restore capacity beyond offset (kvt_restore_cap()) so that the first
 * appends after a restore write in place; the file holds [B, H, offset, D] contiguously, so
 * that is B*H row blocks read into a [B, H, cap, D] buffer with the slack zeroed. On any
 * failure everything built is freed.
 */
#include "format/format.h"
#include "io/stream.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "io/io.h"
#include "tensor/alloc.h"
#include "tensor/tensor_parts.h"

static bool has_capacity(int kind)
{
    return kind == KVT_KIND_KV || kind == KVT_KIND_QKV || kind == KVT_KIND_TURBOQUANT;
}

static bool mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

/* Restore slack a whole entry may always take, whatever its file holds. */
#define FREE_SLACK_BYTES (64ull << 20)

/*
 * Restore capacity of a token-axis cache of @p offset rows: a margin of an eighth of the
 * entry (rounded up, at least one row), never past the next 256-row step (CACHES.md §12's
 * capacity, which is what large entries get). Proportional, so that a small entry is not
 * restored into buffers mostly of slack (8 tokens into 256 rows: 32 times the entry); at
 * least one row, so that the first decode step writes in place.
 */
uint64_t kvt_restore_cap(uint64_t offset)
{
    uint64_t step = (offset + KVT_STEP) / KVT_STEP * KVT_STEP;
    uint64_t margin = offset > 8 ? (offset + 7) / 8 : 1;
    return offset + margin < step ? offset + margin : step;
}

/*
 * Rows on the token axis for cache @p c: kvt_restore_cap() for token-axis kinds while the
 * entry's zeroed slack stays within @p budget (the file's tensor bytes or 64 MiB, whichever
 * is larger), else exactly offset. The header sizes B, H and D freely even at offset 0, so
 * without this bound a 16 KiB file could make a load allocate gigabytes.
 */
static uint64_t restore_rows(const struct kvt_cache_header *c, uint64_t *budget)
{
    uint64_t offset = (uint64_t)c->info.offset;
    if (!has_capacity(c->info.kind))
        return offset;
    uint64_t cap = kvt_restore_cap(offset), slack = 0;
    for (int i = 0; i < c->n_slots; i++) {
        const struct kvt_slot *s = &c->slots[i];
        uint64_t row = kvt_dtype_size(s->dtype), extra;
        if (!mul_ok(row, (uint64_t)s->shape[0], &row) ||
            !mul_ok(row, (uint64_t)s->shape[1], &row) ||
            !mul_ok(row, (uint64_t)s->shape[3], &row) || !mul_ok(row, cap - offset, &extra) ||
            __builtin_add_overflow(slack, extra, &slack))
            return offset;
    }
    if (slack > *budget)
        return offset;
    *budget -= slack;
    return cap;
}

static uint64_t slack_budget(const struct kvt_header *h)
{
    uint64_t live = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++)
            live += h->caches[i].slots[j].bytes; /* each bounded by the file size (V17) */
    return live > FREE_SLACK_BYTES ? live : FREE_SLACK_BYTES;
}

/*
 * Allocate the destination of slot @p sj of cache @p ci of @p h with @p cap rows on the token
 * axis; @p t receives an owned tensor and @p d where the slot's bytes go.
 */
static int alloc_tensor(const struct kvt_header *h, const char *name, size_t ci, int sj,
                        uint64_t cap, struct kvt_tensor *t, struct kvt_slot_dst *d)
{
    const struct kvt_cache_header *c = &h->caches[ci];
    const struct kvt_slot *s = &c->slots[sj];
    int64_t shape[KVT_MAX_RANK];
    memcpy(shape, s->shape, sizeof(shape));
    uint64_t blocks = 1, stride = s->bytes, total = s->bytes;
    if (has_capacity(c->info.kind)) {
        /* [B, H, offset, D] -> [B, H, cap, D] */
        uint64_t row = kvt_dtype_size(s->dtype);
        if (!mul_ok(row, (uint64_t)s->shape[3], &row) || !mul_ok(row, cap, &stride) ||
            !mul_ok((uint64_t)s->shape[0], (uint64_t)s->shape[1], &blocks) ||
            !mul_ok(blocks, stride, &total) || total > SIZE_MAX)
            return kvt_fail(-ENOMEM, "%s: caches[%zu].tensors[%d]: restore capacity overflows",
                            name, ci, sj);
        shape[2] = (int64_t)cap;
        if (blocks == 0) {
            blocks = 1;
            stride = 0;
        }
    }
    kvt_buf *buf;
    int rc = kvt_buf_new_for_fill((size_t)total, &buf);
    if (rc < 0)
        return kvt_fail(rc, "%s: caches[%zu].tensors[%d]: cannot allocate %llu bytes", name, ci, sj,
                        (unsigned long long)total);
    rc = kvt_tensor_init(t, buf, 0, s->dtype, s->rank, shape);
    kvt_buf_unref(buf);
    if (rc < 0)
        return kvt_fail(rc, "%s: caches[%zu].tensors[%d]: bad tensor geometry", name, ci, sj);
    /* nothing to place when empty; kvt_tensor_read() still verifies */
    *d = total ? (struct kvt_slot_dst){kvt_buf_data(t->buf), blocks, stride,
                                       kvt_buf_small_tail(t->buf), kvt_buf_zeroed(t->buf)}
               : (struct kvt_slot_dst){NULL, 1, 0, UINT64_MAX, false};
    return 0;
}

int kvt_load_bufs_new(const struct kvt_header *h, const char *name, struct kvt_load_bufs *b)
{
    size_t total = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        total += (size_t)h->caches[i].n_slots;
    *b = (struct kvt_load_bufs){calloc(total ? total : 1, sizeof(*b->t)),
                                calloc(total ? total : 1, sizeof(*b->d)), 0};
    if (!b->t || !b->d) {
        kvt_load_bufs_free(b);
        return kvt_fail(-ENOMEM, "%s: out of memory", name);
    }
    uint64_t budget = slack_budget(h);
    for (size_t i = 0; i < h->n_caches; i++) {
        uint64_t cap = restore_rows(&h->caches[i], &budget);
        for (int j = 0; j < h->caches[i].n_slots; j++) {
            int rc = alloc_tensor(h, name, i, j, cap, &b->t[b->made], &b->d[b->made]);
            if (rc) {
                kvt_load_bufs_free(b);
                return rc;
            }
            b->made++;
        }
    }
    return 0;
}

void kvt_load_bufs_free(struct kvt_load_bufs *b)
{
    for (size_t k = 0; b->t && k < b->made; k++)
        kvt_tensor_release(&b->t[k]);
    free(b->t);
    free(b->d);
    *b = (struct kvt_load_bufs){0};
}

/* Build cache @p ci from its restored tensors @p t (the cache takes its own references). */
static int build_cache(const struct kvt_header *h, const char *name, size_t ci,
                       struct kvt_tensor *t, kvt_cache **out)
{
    const struct kvt_cache_header *c = &h->caches[ci];
    kvt_clear_error();
    int rc = kvt_cache_from_state(&c->info, t, c->n_slots, out);
    if (rc == -ENOMEM) {
        kvt_fail(rc, "%s: caches[%zu]: out of memory", name, ci);
    } else if (rc < 0) {
        /* valid per V1-V20, but the cache layer cannot take it */
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", kvt_last_error());
        rc = kvt_fail(KVT_E_UNSUPPORTED, "%s: caches[%zu] (%s) cannot be restored: %s", name, ci,
                      kvt_kind_name(c->info.kind), msg[0] ? msg : kvt_strerror(rc));
    }
    return rc;
}

/* The caches of @p h from its filled tensors @p t; @p caches receives h->n_caches. */
static int build_caches(const struct kvt_header *h, const char *name, struct kvt_tensor *t,
                        kvt_cache **caches)
{
    size_t built = 0;
    int rc = 0;
    for (size_t o = 0; built < h->n_caches && rc == 0;) {
        rc = build_cache(h, name, built, &t[o], &caches[built]);
        o += (size_t)h->caches[built].n_slots;
        built += rc == 0;
    }
    if (rc)
        for (size_t i = 0; i < built; i++)
            kvt_cache_free(caches[i]);
    return rc;
}

/* Copy the header's identity metadata and creation time into a library-made entry. */
static int set_meta(struct kvt_entry *e, const struct kvt_header *h, const char *name)
{
    struct {
        const char **dst;
        const char *src;
    } meta[3] = {{&e->meta.model_id, h->model_id},
                 {&e->meta.config_fingerprint, h->config_fingerprint},
                 {&e->meta.tokenizer_hash, h->tokenizer_hash}};
    for (int k = 0; k < 3; k++) {
        int rc;
        *meta[k].dst = kvt_strdup(meta[k].src, &rc);
        if (rc)
            return kvt_fail(rc, "%s: out of memory", name);
    }
    e->created_at = h->created_at;
    return 0;
}

int kvt_placement_ask(const struct kvt_placement *p, const struct kvt_header *h, const char *name,
                      void **dst)
{
    size_t n = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        n += (size_t)h->caches[i].n_slots;
    *dst = p->host ? calloc(n ? n : 1, sizeof(void *)) : calloc(n ? n : 1, sizeof(uint64_t));
    if (!*dst)
        return kvt_fail(-ENOMEM, "%s: out of memory", name);
    kvt_clear_error();
    int rc = p->host ? p->host(p->ud, h, *dst) : p->device(p->ud, h, *dst);
    if (p->refused)
        *p->refused = rc != 0;
    if (rc && !kvt_last_error()[0])
        kvt_fail(rc, "%s: the destination was refused: %s", name, kvt_strerror(rc));
    return rc;
}

/*
 * Read every slot of @p r->h into the caller's memory that @p p names (FORMAT.md order),
 * hashes checked in the same pass. Slots the caller leaves NULL are only checked.
 */
static int load_placed(struct kvt_tensor_reader *r, const struct kvt_placement *p)
{
    const struct kvt_header *h = r->h;
    size_t total = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        total += (size_t)h->caches[i].n_slots;
    void *placed = NULL;
    struct kvt_slot_dst *d = calloc(total ? total : 1, sizeof(*d));
    int rc = d ? kvt_placement_ask(p, h, r->name, &placed)
               : kvt_fail(-ENOMEM, "%s: out of memory", r->name);
    void **dst = placed;
    for (size_t i = 0, o = 0; rc == 0 && i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++, o++) {
            uint64_t bytes = h->caches[i].slots[j].bytes;
            /* caller memory: its pages are whatever they are, so nothing is assumed zero */
            d[o] =
                (struct kvt_slot_dst){dst[o] && bytes ? dst[o] : NULL, 1, bytes, UINT64_MAX, false};
        }
    if (rc == 0) {
        r->dst = d;
        rc = kvt_tensor_read_all(r);
        kvt_tensor_reader_free(r); /* no read may land after this */
        r->dst = NULL;
    }
    free(placed);
    free(d);
    return rc;
}

/* The reader of an opened file, as the caller's expectations ask. */
static struct kvt_tensor_reader reader_of(int fd, const char *path, const struct kvt_header *h,
                                          const struct kvt_expect *x)
{
    return (struct kvt_tensor_reader){
        .fd = fd,
        .name = path,
        .h = h,
        .verify = !(x && x->no_verify),
        .keep_cache = kvt_read_keeps_cache(fd, h->data_start, h->file_size - h->data_start,
                                           x && x->keep_cache),
    };
}

/* Open @p path, check its header, run @p body over a reader of it and close it. On success
 * the header goes to *@p out_header (NULL: freed); on failure it is freed. */
static int with_reader(const char *path, const struct kvt_expect *x,
                       int (*body)(struct kvt_tensor_reader *r, void *arg), void *arg,
                       struct kvt_header **out_header)
{
    int fd;
    struct kvt_header *h;
    int rc = kvt_file_open_header(path, x, &fd, &h);
    if (rc)
        return rc;
    struct kvt_tensor_reader r = reader_of(fd, path, h, x);
    rc = body(&r, arg);
    kvt_io()->close(fd);
    if (rc == 0 && out_header)
        *out_header = h;
    else
        kvt_header_free(h);
    return rc;
}

static int placed_body(struct kvt_tensor_reader *r, void *arg)
{
    return load_placed(r, arg);
}

int kvt_file_load_placed(const char *path, const struct kvt_expect *x,
                         const struct kvt_placement *p, struct kvt_header **out_header)
{
    return with_reader(path, x, placed_body, (void *)p, out_header);
}

int kvt_file_load_into(const char *path, const struct kvt_expect *x, kvt_place_fn place, void *ud,
                       struct kvt_header **out_header)
{
    if (!out_header)
        return kvt_fail(-EINVAL, "kvt_file_load_into: no output");
    *out_header = NULL;
    if (!path || !place)
        return kvt_fail(-EINVAL, "kvt_file_load_into: no path or placement");
    return kvt_file_load_placed(path, x, &(struct kvt_placement){.host = place, .ud = ud},
                                out_header);
}

int kvt_load_bufs_entry(const struct kvt_header *h, const char *name, struct kvt_load_bufs *b,
                        struct kvt_entry **out)
{
    kvt_cache **caches = calloc(h->n_caches, sizeof(*caches));
    if (!caches)
        return kvt_fail(-ENOMEM, "%s: out of memory", name);
    int rc = build_caches(h, name, b->t, caches);
    if (rc)
        goto out;
    struct kvt_entry *e;
    rc = kvt_entry_new(h->tokens, h->n_tokens, caches, h->n_caches, h->ns, &e);
    if (rc < 0) {
        rc = kvt_fail(rc, "%s: cannot build the entry: %s", name, kvt_strerror(rc));
        for (size_t i = 0; i < h->n_caches; i++)
            kvt_cache_free(caches[i]);
        goto out;
    }
    rc = set_meta(e, h, name); /* the entry owns the caches now */
    if (rc)
        kvt_entry_free(e);
    else
        *out = e;
out:
    free(caches);
    return rc;
}

/* The entry of an opened file: every tensor allocated first, so the read stream knows every
 * destination and reads ahead straight into place; then read and hashed in order. */
static int entry_body(struct kvt_tensor_reader *r, void *arg)
{
    struct kvt_load_bufs b;
    int rc = kvt_load_bufs_new(r->h, r->name, &b);
    if (rc)
        return rc;
    r->dst = b.d;
    rc = kvt_tensor_read_all(r);
    kvt_tensor_reader_free(r); /* no read may land after this */
    r->dst = NULL;
    if (rc == 0)
        rc = kvt_load_bufs_entry(r->h, r->name, &b, arg);
    kvt_load_bufs_free(&b);
    return rc;
}

int kvt_file_load(const char *path, const struct kvt_expect *x, struct kvt_entry **out,
                  struct kvt_header **out_header)
{
    if (out_header)
        *out_header = NULL;
    if (!out)
        return kvt_fail(-EINVAL, "kvt_file_load: no output");
    *out = NULL;
    if (!path)
        return kvt_fail(-EINVAL, "kvt_file_load: no path");
    return with_reader(path, x, entry_body, out, out_header);
}
