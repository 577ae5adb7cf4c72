/*
 * The .mlxkv loader (FORMAT.md §11.3, STORE.md §8, CACHES.md §11-§12). After the header
 * passes V1-V20 and the caller's expectations (L1, L2), every tensor is read straight into
 * its own newly allocated buffer, hashed in the same pass (L3), and its file range dropped
 * from the page cache. Token-axis kinds (kv, qkv, turboquant) get restore capacity
 * ceil((offset + 1) / 256) * 256 rows so that the first append after a restore writes in
 * place; the file holds [B, H, offset, D] contiguously, so that is B*H row blocks read into
 * a [B, H, cap, D] buffer with the slack zeroed. On any failure everything built is freed.
 */
#include "format/format.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "io/io.h"
#include "tensor/alloc.h"

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
 * Rows on the token axis for cache @p c: ceil((offset + 1) / 256) * 256 for token-axis kinds
 * while the entry's zeroed slack stays within @p budget (the file's tensor bytes or 64 MiB,
 * whichever is larger), else exactly offset. The header sizes B, H and D freely even at
 * offset 0, so without this bound a 16 KiB file could make a load allocate gigabytes.
 */
static uint64_t restore_rows(const struct kvt_cache_header *c, uint64_t *budget)
{
    uint64_t offset = (uint64_t)c->info.offset;
    if (!has_capacity(c->info.kind))
        return offset;
    uint64_t cap = (offset + KVT_STEP) / KVT_STEP * KVT_STEP, slack = 0;
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

/* Allocate the destination of slot @p sj and read it; @p t receives an owned tensor. */
static int load_tensor(struct kvt_tensor_reader *r, size_t ci, int sj, uint64_t cap,
                       struct kvt_tensor *t)
{
    const struct kvt_cache_header *c = &r->h->caches[ci];
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
                            r->name, ci, sj);
        shape[2] = (int64_t)cap;
        if (blocks == 0) {
            blocks = 1;
            stride = 0;
        }
    }
    kvt_buf *buf;
    int rc = kvt_buf_new_uninit((size_t)total, &buf);
    if (rc < 0)
        return kvt_fail(rc, "%s: caches[%zu].tensors[%d]: cannot allocate %llu bytes", r->name, ci,
                        sj, (unsigned long long)total);
    rc = kvt_tensor_init(t, buf, 0, s->dtype, s->rank, shape);
    kvt_buf_unref(buf);
    if (rc < 0)
        return kvt_fail(rc, "%s: caches[%zu].tensors[%d]: bad tensor geometry", r->name, ci, sj);
    if (total == 0)
        return kvt_tensor_read(r, ci, sj, NULL, 1, 0); /* nothing to place; still verify */
    rc = kvt_tensor_read(r, ci, sj, kvt_buf_data(t->buf), blocks, stride);
    if (rc)
        kvt_tensor_release(t);
    return rc;
}

static int load_cache(struct kvt_tensor_reader *r, size_t ci, uint64_t *budget, kvt_cache **out)
{
    const struct kvt_cache_header *c = &r->h->caches[ci];
    struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
    memset(t, 0, sizeof(t));
    int n = 0, rc = 0;
    uint64_t cap = restore_rows(c, budget);
    for (; n < c->n_slots; n++) {
        rc = load_tensor(r, ci, n, cap, &t[n]);
        if (rc)
            goto out;
    }
    kvt_clear_error();
    rc = kvt_cache_from_state(&c->info, t, n, out);
    if (rc == -ENOMEM) {
        kvt_fail(rc, "%s: caches[%zu]: out of memory", r->name, ci);
    } else if (rc < 0) {
        /* valid per V1-V20, but the cache layer cannot take it */
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", kvt_last_error());
        rc = kvt_fail(KVT_E_UNSUPPORTED, "%s: caches[%zu] (%s) cannot be restored: %s", r->name, ci,
                      kvt_kind_name(c->info.kind), msg[0] ? msg : kvt_strerror(rc));
    }
out:
    for (int k = 0; k < n; k++)
        kvt_tensor_release(&t[k]);
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

    const struct kvt_io *io = kvt_io();
    int fd = io->openat(AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return kvt_fail(fd, "%s: open: %s", path, kvt_strerror(fd));
    struct kvt_read_opts ro = {.max_header_bytes = x ? x->max_header_bytes : 0};
    struct kvt_header *h = NULL;
    kvt_cache **caches = NULL;
    size_t built = 0;
    int rc = kvt_header_read_fd(fd, &ro, path, &h);
    if (rc)
        goto out;
    rc = kvt_header_check_expect(h, x, path);
    if (rc)
        goto out;
    caches = calloc(h->n_caches, sizeof(*caches));
    if (!caches) {
        rc = kvt_fail(-ENOMEM, "%s: out of memory", path);
        goto out;
    }
    struct kvt_tensor_reader r = {
        .fd = fd,
        .name = path,
        .h = h,
        .verify = !(x && x->no_verify),
        .keep_cache = x && x->keep_cache,
    };
    uint64_t budget = slack_budget(h);
    for (; built < h->n_caches; built++) {
        rc = load_cache(&r, built, &budget, &caches[built]);
        if (rc)
            break;
    }
    kvt_tensor_reader_free(&r);
    if (rc)
        goto out;
    struct kvt_entry *e;
    rc = kvt_entry_new(h->tokens, h->n_tokens, caches, h->n_caches, h->ns, &e);
    if (rc < 0) {
        rc = kvt_fail(rc, "%s: cannot build the entry: %s", path, kvt_strerror(rc));
        goto out;
    }
    free(caches); /* the entry owns the caches now */
    caches = NULL;
    built = 0;
    rc = set_meta(e, h, path);
    if (rc)
        kvt_entry_free(e);
    else
        *out = e;
out:
    for (size_t i = 0; i < built; i++)
        kvt_cache_free(caches[i]);
    free(caches);
    io->close(fd);
    if (rc == 0 && out_header)
        *out_header = h;
    else
        kvt_header_free(h);
    return rc;
}
