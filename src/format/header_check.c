/*
 * Validation passes over a decoded header (FORMAT.md §11.2): the V10 value sets, and V14-V20
 * (sizes, alignment, overlap, bounds, dtype roles, shapes, rings), which need only the
 * decoded numbers. The reader runs them after its JSON passes; the writer runs them on its
 * own plan (kvt_header_check_writable) so it never produces a file the reader rejects.
 * Also the header predicates of the public API and kvt_header_free().
 */
#include "format/format.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

static const struct kvt_scalar ring_scalars[] = {
    {"idx", offsetof(struct kvt_cache_info, idx)},
    {"maxSize", offsetof(struct kvt_cache_info, max_size)},
};
static const struct kvt_scalar qkv_scalars[] = {
    {"groupSize", offsetof(struct kvt_cache_info, group_size)},
    {"bits", offsetof(struct kvt_cache_info, bits)},
};
static const struct kvt_scalar ring_qkv_scalars[] = {
    {"idx", offsetof(struct kvt_cache_info, idx)},
    {"maxSize", offsetof(struct kvt_cache_info, max_size)},
    {"groupSize", offsetof(struct kvt_cache_info, group_size)},
    {"bits", offsetof(struct kvt_cache_info, bits)},
};
static const struct kvt_scalar tq_scalars[] = {
    {"kBits", offsetof(struct kvt_cache_info, k_bits)},
    {"vBits", offsetof(struct kvt_cache_info, v_bits)},
    {"headDim", offsetof(struct kvt_cache_info, head_dim)},
};

const struct kvt_scalar *kvt_kind_scalars(int kind, int *n)
{
    switch (kind) {
    case KVT_KIND_ROTATING: *n = 2; return ring_scalars;
    case KVT_KIND_QKV: *n = 2; return qkv_scalars;
    case KVT_KIND_ROTATING_QKV: *n = 4; return ring_qkv_scalars;
    case KVT_KIND_TURBOQUANT: *n = 3; return tq_scalars;
    default: *n = 0; return NULL;
    }
}

int kvt_slot_rank(int kind, int slot)
{
    return kind == KVT_KIND_SSM && slot == 0 ? 3 : 4;
}

const char *kvt_slot_name(char *buf, size_t n, size_t cache, int slot)
{
    snprintf(buf, n, "caches[%zu].tensors[%d]", cache, slot);
    return buf;
}

bool kvt_qkv_bits_ok(int64_t bits)
{
    return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}

bool kvt_qkv_group_ok(int64_t group_size)
{
    return group_size == 32 || group_size == 64 || group_size == 128;
}

bool kvt_tq_bits_ok(int64_t bits)
{
    return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 8;
}

bool kvt_tq_head_dim_ok(int64_t head_dim)
{
    return head_dim == 64 || head_dim == 128 || head_dim == 256 || head_dim == 512;
}

static const char *nm(const char *name)
{
    return name ? name : "header";
}

static bool is_qkv(int kind)
{
    return kind == KVT_KIND_QKV || kind == KVT_KIND_ROTATING_QKV;
}

static bool is_ring(int kind)
{
    return kind == KVT_KIND_ROTATING || kind == KVT_KIND_ROTATING_QKV;
}

int kvt_header_check_values(const struct kvt_header *h, const char *name)
{
    for (size_t i = 0; i < h->n_caches; i++) {
        const struct kvt_cache_header *c = &h->caches[i];
        const struct kvt_cache_info *in = &c->info;
        if (!kvt_kind_name(in->kind))
            return kvt_fail(KVT_E_UNSUPPORTED, "%s: V10: caches[%zu].kind %d is not known",
                            nm(name), i, in->kind);
        if (is_qkv(in->kind) && !kvt_qkv_bits_ok(in->bits))
            return kvt_fail(KVT_E_UNSUPPORTED,
                            "%s: V10: caches[%zu].bits %" PRId64 " is not supported", nm(name), i,
                            in->bits);
        if (is_qkv(in->kind) && !kvt_qkv_group_ok(in->group_size))
            return kvt_fail(KVT_E_UNSUPPORTED,
                            "%s: V10: caches[%zu].groupSize %" PRId64 " is not supported", nm(name),
                            i, in->group_size);
        if (in->kind == KVT_KIND_TURBOQUANT) {
            if (!kvt_tq_bits_ok(in->k_bits) || !kvt_tq_bits_ok(in->v_bits))
                return kvt_fail(KVT_E_UNSUPPORTED,
                                "%s: V10: caches[%zu] kBits %" PRId64 " / vBits %" PRId64
                                " is not supported",
                                nm(name), i, in->k_bits, in->v_bits);
            if (!kvt_tq_head_dim_ok(in->head_dim))
                return kvt_fail(KVT_E_UNSUPPORTED,
                                "%s: V10: caches[%zu].headDim %" PRId64 " is not supported",
                                nm(name), i, in->head_dim);
        }
        for (int j = 0; j < c->n_slots; j++)
            if (c->slots[j].dtype < 0 || c->slots[j].dtype >= KVT_DTYPE_COUNT)
                return kvt_fail(KVT_E_UNSUPPORTED,
                                "%s: V10: caches[%zu].tensors[%d].dtype %d is not known", nm(name),
                                i, j, c->slots[j].dtype);
    }
    return 0;
}

/* V14: bytes = prod(shape) * itemsize, every intermediate below 2^53. */
static int check_bytes(const struct kvt_header *h, const char *name)
{
    char sn[64];
    for (size_t i = 0; i < h->n_caches; i++) {
        const struct kvt_cache_header *c = &h->caches[i];
        for (int j = 0; j < c->n_slots; j++) {
            const struct kvt_slot *s = &c->slots[j];
            uint64_t p = 1;
            bool over = false;
            for (int d = 0; d < s->rank && !over; d++) {
                uint64_t dim = (uint64_t)s->shape[d];
                if (dim != 0 && p > (KVT_SAFE_INT_LIMIT - 1) / dim)
                    over = true;
                else
                    p *= dim;
            }
            uint64_t item = kvt_dtype_size(s->dtype);
            if (!over && item != 0 && p > (KVT_SAFE_INT_LIMIT - 1) / item)
                over = true;
            if (over)
                return kvt_fail(KVT_E_CORRUPT, "%s: V14: %s size overflows 2^53", nm(name),
                                kvt_slot_name(sn, sizeof(sn), i, j));
            if (p * item != s->bytes)
                return kvt_fail(KVT_E_CORRUPT,
                                "%s: V14: %s.bytes %" PRIu64
                                " != prod(shape) * itemsize = %" PRIu64,
                                nm(name), kvt_slot_name(sn, sizeof(sn), i, j), s->bytes, p * item);
        }
    }
    return 0;
}

/* V15-V17: alignment, non-overlap in header order, bounds. */
static int check_placement(const struct kvt_header *h, const char *name)
{
    char sn[64];
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++)
            if (h->caches[i].slots[j].off % KVT_ALIGN)
                return kvt_fail(
                    KVT_E_CORRUPT, "%s: V15: %s.off %" PRIu64 " is not a multiple of %u", nm(name),
                    kvt_slot_name(sn, sizeof(sn), i, j), h->caches[i].slots[j].off, KVT_ALIGN);
    uint64_t prev_end = 0;
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++) {
            const struct kvt_slot *s = &h->caches[i].slots[j];
            if (s->off < prev_end)
                return kvt_fail(KVT_E_CORRUPT,
                                "%s: V16: %s.off %" PRIu64
                                " overlaps the previous tensor (ends at %" PRIu64 ")",
                                nm(name), kvt_slot_name(sn, sizeof(sn), i, j), s->off, prev_end);
            prev_end = s->off + s->bytes; /* both < 2^53 */
        }
    for (size_t i = 0; i < h->n_caches; i++)
        for (int j = 0; j < h->caches[i].n_slots; j++) {
            const struct kvt_slot *s = &h->caches[i].slots[j];
            if (s->bytes == 0)
                continue;
            uint64_t end = (uint64_t)h->data_start + s->off + s->bytes;
            if (end > h->file_size)
                return kvt_fail(KVT_E_CORRUPT,
                                "%s: V17: %s ends at %" PRIu64 ", beyond the file size %" PRIu64,
                                nm(name), kvt_slot_name(sn, sizeof(sn), i, j), end, h->file_size);
        }
    return 0;
}

static int role_fail(const char *name, size_t i, int j, int dtype, const char *want)
{
    return kvt_fail(KVT_E_CORRUPT, "%s: V18: caches[%zu].tensors[%d].dtype %d (%s) must be %s",
                    nm(name), i, j, dtype, kvt_dtype_name(dtype), want);
}

/* V18: dtype roles per kind (FORMAT.md §5). */
static int check_dtypes(const struct kvt_header *h, const char *name)
{
    for (size_t i = 0; i < h->n_caches; i++) {
        const struct kvt_cache_header *c = &h->caches[i];
        const struct kvt_slot *s = c->slots;
        switch (c->info.kind) {
        case KVT_KIND_KV:
        case KVT_KIND_ROTATING:
            if (!kvt_dtype_is_activation(s[0].dtype))
                return role_fail(name, i, 0, s[0].dtype, "an activation dtype");
            if (s[1].dtype != s[0].dtype)
                return role_fail(name, i, 1, s[1].dtype, "the dtype of K");
            break;
        case KVT_KIND_QKV:
        case KVT_KIND_ROTATING_QKV:
            for (int t = 0; t < 6; t += 3) {
                if (s[t].dtype != KVT_UINT32)
                    return role_fail(name, i, t, s[t].dtype, "uint32");
                if (!kvt_dtype_is_activation(s[t + 1].dtype))
                    return role_fail(name, i, t + 1, s[t + 1].dtype, "an activation dtype");
                if (s[t + 2].dtype != s[t + 1].dtype)
                    return role_fail(name, i, t + 2, s[t + 2].dtype, "the dtype of its scales");
            }
            break;
        case KVT_KIND_TURBOQUANT: {
            int kidx = c->info.k_bits == 8 ? KVT_INT8 : KVT_UINT8;
            if (s[0].dtype != kidx)
                return role_fail(name, i, 0, s[0].dtype, kidx == KVT_INT8 ? "int8" : "uint8");
            if (s[3].dtype != KVT_UINT8)
                return role_fail(name, i, 3, s[3].dtype, "uint8");
            for (int j = 1; j < 5; j++)
                if (j != 3 && s[j].dtype != KVT_FLOAT16)
                    return role_fail(name, i, j, s[j].dtype, "float16");
            break;
        }
        case KVT_KIND_SSM:
            for (int j = 0; j < 2; j++)
                if (!kvt_dtype_is_activation(s[j].dtype))
                    return role_fail(name, i, j, s[j].dtype, "an activation dtype");
            break;
        default: break;
        }
    }
    return 0;
}

static int shape_fail(const char *name, size_t i, int j, int dim, int64_t got, const char *what,
                      int64_t want)
{
    return kvt_fail(KVT_E_CORRUPT,
                    "%s: V19: caches[%zu].tensors[%d].shape[%d] %" PRId64 " != %s %" PRId64,
                    nm(name), i, j, dim, got, what, want);
}

/* V19: shapes per kind (FORMAT.md §5). */
static int check_shapes(const struct kvt_header *h, const char *name)
{
    static const char *const axis_name[3] = {"batch", "heads", "token axis"};
    for (size_t i = 0; i < h->n_caches; i++) {
        const struct kvt_cache_header *c = &h->caches[i];
        const struct kvt_cache_info *in = &c->info;
        const struct kvt_slot *s = c->slots;
        if (in->kind == KVT_KIND_SSM) {
            if (s[1].shape[0] != s[0].shape[0])
                return shape_fail(name, i, 1, 0, s[1].shape[0], "conv batch", s[0].shape[0]);
            continue;
        }
        /* token-axis kinds: every tensor agrees with tensor 0 on B, H and the token axis */
        for (int j = 1; j < c->n_slots; j++)
            for (int d = 0; d < 3; d++)
                if (s[j].shape[d] != s[0].shape[d])
                    return shape_fail(name, i, j, d, s[j].shape[d], axis_name[d], s[0].shape[d]);
        if (!is_ring(in->kind) && s[0].shape[2] != in->offset)
            return shape_fail(name, i, 0, 2, s[0].shape[2], "offset", in->offset);
        if (is_qkv(in->kind)) {
            for (int t = 0; t < 6; t += 3) {
                uint64_t packed = (uint64_t)s[t].shape[3] * 32;
                uint64_t scales =
                    (uint64_t)s[t + 1].shape[3] * (uint64_t)in->group_size * (uint64_t)in->bits;
                if (packed != scales)
                    return kvt_fail(KVT_E_CORRUPT,
                                    "%s: V19: caches[%zu].tensors[%d] packed last dim %" PRId64
                                    " * 32 != scales last dim %" PRId64 " * groupSize * bits",
                                    nm(name), i, t, s[t].shape[3], s[t + 1].shape[3]);
                if (s[t + 2].shape[3] != s[t + 1].shape[3])
                    return shape_fail(name, i, t + 2, 3, s[t + 2].shape[3], "scales last dim",
                                      s[t + 1].shape[3]);
            }
        }
        if (in->kind == KVT_KIND_TURBOQUANT) {
            int64_t want[5] = {in->head_dim * in->k_bits / 8, in->head_dim / 32, in->head_dim / 32,
                               in->head_dim * in->v_bits / 8, in->head_dim / 32};
            for (int j = 0; j < 5; j++)
                if (s[j].shape[3] != want[j])
                    return shape_fail(name, i, j, 3, s[j].shape[3], "the headDim-derived size",
                                      want[j]);
        }
    }
    return 0;
}

/* V20: ring scalars against the ring length S. */
static int check_rings(const struct kvt_header *h, const char *name)
{
    for (size_t i = 0; i < h->n_caches; i++) {
        const struct kvt_cache_info *in = &h->caches[i].info;
        if (!is_ring(in->kind))
            continue;
        int64_t S = h->caches[i].slots[0].shape[2];
        if (in->max_size < 1)
            return kvt_fail(KVT_E_CORRUPT, "%s: V20: caches[%zu].maxSize %" PRId64 " < 1", nm(name),
                            i, in->max_size);
        if (S < 1)
            return kvt_fail(KVT_E_CORRUPT, "%s: V20: caches[%zu] ring length %" PRId64 " < 1",
                            nm(name), i, S);
        if (in->idx > S)
            return kvt_fail(KVT_E_CORRUPT,
                            "%s: V20: caches[%zu].idx %" PRId64 " > ring length %" PRId64, nm(name),
                            i, in->idx, S);
        if (in->offset < in->max_size && S < in->offset)
            return kvt_fail(KVT_E_CORRUPT,
                            "%s: V20: caches[%zu] ring length %" PRId64 " < offset %" PRId64
                            " before the ring wrapped",
                            nm(name), i, S, in->offset);
    }
    return 0;
}

int kvt_header_check_layout(const struct kvt_header *h, const char *name)
{
    int rc = check_bytes(h, name);
    if (!rc)
        rc = check_placement(h, name);
    if (!rc)
        rc = check_dtypes(h, name);
    if (!rc)
        rc = check_shapes(h, name);
    if (!rc)
        rc = check_rings(h, name);
    return rc;
}

bool kvt_utf8_valid(const char *str, size_t *bad_at)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (s[i]) {
        unsigned c = s[i];
        size_t need;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            need = 1, cp = c & 0x1f, min = 0x80;
        } else if (c >= 0xe0 && c <= 0xef) {
            need = 2, cp = c & 0x0f, min = 0x800;
        } else if (c >= 0xf0 && c <= 0xf4) {
            need = 3, cp = c & 0x07, min = 0x10000;
        } else {
            goto bad;
        }
        for (size_t k = 1; k <= need; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                goto bad; /* also stops at the terminating NUL */
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            goto bad;
        i += need + 1;
    }
    return true;
bad:
    if (bad_at)
        *bad_at = i;
    return false;
}

static int check_meta(const char *key, const char *value)
{
    size_t at;
    if (value && !kvt_utf8_valid(value, &at))
        return kvt_fail(-EINVAL, "%s is not valid UTF-8 (byte %zu)", key, at);
    return 0;
}

int kvt_header_check_writable(const struct kvt_header *h)
{
    int rc;
    if ((rc = check_meta("modelId", h->model_id)) || (rc = check_meta("ns", h->ns)) ||
        (rc = check_meta("configFingerprint", h->config_fingerprint)) ||
        (rc = check_meta("tokenizerHash", h->tokenizer_hash)))
        return rc;
    if (h->created_at >= (int64_t)KVT_SAFE_INT_LIMIT)
        return kvt_fail(-EINVAL, "createdAt %" PRId64 " is not below 2^53", h->created_at);
    if (h->n_caches == 0)
        return kvt_fail(-EINVAL, "an entry needs at least one cache");
    for (size_t i = 0; i < h->n_tokens; i++)
        if (h->tokens[i] < 0)
            return kvt_fail(-EINVAL, "token %zu is negative (%" PRId32 ")", i, h->tokens[i]);
    const char *name = "cannot save";
    if (kvt_header_check_values(h, name))
        return -EINVAL;
    for (size_t i = 0; i < h->n_caches; i++) {
        const struct kvt_cache_header *c = &h->caches[i];
        int n;
        const struct kvt_scalar *sc = kvt_kind_scalars(c->info.kind, &n);
        if (c->info.offset < 0 || (uint64_t)c->info.offset >= KVT_SAFE_INT_LIMIT)
            return kvt_fail(-EINVAL, "%s: V11: caches[%zu].offset %" PRId64 " out of range", name,
                            i, c->info.offset);
        for (int k = 0; k < n; k++) {
            int64_t v = kvt_scalar_get(&c->info, &sc[k]);
            if (v < 0 || (uint64_t)v >= KVT_SAFE_INT_LIMIT)
                return kvt_fail(-EINVAL, "%s: V11: caches[%zu].%s %" PRId64 " out of range", name,
                                i, sc[k].key, v);
        }
        if (c->n_slots != kvt_kind_tensor_count(c->info.kind))
            return kvt_fail(-EINVAL, "%s: V12: caches[%zu] has %d tensors, %s needs %d", name, i,
                            c->n_slots, kvt_kind_name(c->info.kind),
                            kvt_kind_tensor_count(c->info.kind));
        for (int j = 0; j < c->n_slots; j++) {
            const struct kvt_slot *s = &c->slots[j];
            if (s->rank != kvt_slot_rank(c->info.kind, j))
                return kvt_fail(-EINVAL, "%s: V13: caches[%zu].tensors[%d] has rank %d, not %d",
                                name, i, j, s->rank, kvt_slot_rank(c->info.kind, j));
            for (int d = 0; d < s->rank; d++)
                if (s->shape[d] < 0 || (uint64_t)s->shape[d] >= KVT_SAFE_INT_LIMIT)
                    return kvt_fail(-EINVAL,
                                    "%s: V13: caches[%zu].tensors[%d].shape[%d] "
                                    "out of range",
                                    name, i, j, d);
            if (s->off >= KVT_SAFE_INT_LIMIT || s->bytes >= KVT_SAFE_INT_LIMIT)
                return kvt_fail(-EINVAL, "%s: V13: caches[%zu].tensors[%d] is too large", name, i,
                                j);
        }
    }
    if (h->file_size >= KVT_SAFE_INT_LIMIT)
        return kvt_fail(KVT_E_TOO_LARGE, "the file would exceed 2^53 bytes");
    if (kvt_header_check_layout(h, name))
        return -EINVAL;
    return 0;
}

void kvt_header_free(struct kvt_header *h)
{
    if (!h)
        return;
    free(h->model_id);
    free(h->config_fingerprint);
    free(h->tokenizer_hash);
    free(h->ns);
    free(h->tokens);
    free(h->caches);
    free(h);
}

bool kvt_header_is_trimmable(const struct kvt_header *h)
{
    if (!h)
        return false;
    for (size_t i = 0; i < h->n_caches; i++) {
        const struct kvt_cache_info *in = &h->caches[i].info;
        if (!kvt_kind_is_trimmable(in->kind, in->offset, in->max_size))
            return false;
    }
    return true;
}

bool kvt_header_is_indexable(const struct kvt_header *h)
{
    if (!h)
        return false;
    for (size_t i = 0; i < h->n_caches; i++) {
        const struct kvt_cache_info *in = &h->caches[i].info;
        if (in->kind != KVT_KIND_SSM && (uint64_t)in->offset != h->n_tokens)
            return false;
    }
    return true;
}

static int expect_key(const char *name, const char *key, const char *file, const char *want)
{
    if (!want || (file && !strcmp(file, want)))
        return 0;
    return kvt_fail(KVT_E_MISMATCH, "%s: L1: %s mismatch (file %s%s%s, expected \"%s\")", nm(name),
                    key, file ? "\"" : "", file ? file : "(absent)", file ? "\"" : "", want);
}

int kvt_header_check_expect(const struct kvt_header *h, const struct kvt_expect *x,
                            const char *name)
{
    if (!x)
        return 0;
    int rc;
    if ((rc = expect_key(name, "modelId", h->model_id, x->model_id)) ||
        (rc =
             expect_key(name, "configFingerprint", h->config_fingerprint, x->config_fingerprint)) ||
        (rc = expect_key(name, "tokenizerHash", h->tokenizer_hash, x->tokenizer_hash)) ||
        (rc = expect_key(name, "ns", h->ns ? h->ns : "", x->ns)))
        return rc;
    if (x->n_layers && h->n_caches != x->n_layers)
        return kvt_fail(KVT_E_MISMATCH, "%s: L2: %zu cached layers but model has %zu", nm(name),
                        h->n_caches, x->n_layers);
    return 0;
}
