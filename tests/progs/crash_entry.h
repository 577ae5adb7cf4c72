/*
 * Synthetic entries whose every byte derives from their tokens, shared by the crash writer
 * (tests/progs/crash_writer.c), the crash and I/O-error suites and the corruption sweep: a
 * checker rebuilds the entry a writer stored from its tokens alone and compares bytes.
 *
 * The caches are built from state (kvt_cache_from_state), with small shapes that satisfy
 * FORMAT.md §5 for all six kinds. Every non-ssm layer covers all the tokens (offset =
 * token count), so the store indexes the entry (V21). Header-only helpers (static inline):
 * there is no library of test programs to link them from.
 */
#ifndef KVT_CRASH_ENTRY_H
#define KVT_CRASH_ENTRY_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"

#define SYNTH_MODEL "reliability/model"
#define SYNTH_FP "fp-reliability"
#define SYNTH_TOK "tk-reliability"
#define SYNTH_HEADS 2
#define SYNTH_RING 8 /* maxSize of the ring kinds */

/* Kinds of a layer list; SYNTH_ALL_KINDS lists all six (the last is the untrimmable ssm). */
static const int SYNTH_ALL_KINDS[] = {KVT_KIND_KV,         KVT_KIND_ROTATING,     KVT_KIND_QKV,
                                      KVT_KIND_TURBOQUANT, KVT_KIND_ROTATING_QKV, KVT_KIND_SSM};
static const int SYNTH_TRIMMABLE_KINDS[] = {KVT_KIND_KV, KVT_KIND_QKV, KVT_KIND_TURBOQUANT};

/* Fill @p t (a new contiguous tensor) with bytes derived from @p tok and @p seed. */
static inline int synth_tensor(struct kvt_tensor *t, int dtype, int rank, const int64_t *shape,
                               const int32_t *tok, size_t n, uint64_t seed)
{
    int rc = kvt_tensor_zeros(t, dtype, rank, shape);
    if (rc)
        return rc;
    uint8_t *p = (uint8_t *)kvt_buf_data(t->buf) + t->offset;
    size_t bytes = kvt_tensor_nbytes(t);
    uint64_t x = kvt_wyhash(seed, tok, n * sizeof(*tok)) | 1;
    for (size_t i = 0; i < bytes; i++) {
        if (i % 8 == 0) {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
        }
        p[i] = (uint8_t)((x * 0x2545F4914F6CDD1DULL) >> (8 * (i % 8)));
    }
    return 0;
}

/*
 * One cache of @p kind over @p n tokens (n >= 1), layer @p layer (varies the bytes).
 * @p heads 0 gives a layer whose tensors hold no bytes (kv only: a zero-byte last slot).
 */
static inline int synth_cache_heads(int kind, const int32_t *tok, size_t n, int layer,
                                    int64_t heads, kvt_cache **out)
{
    struct kvt_cache_info info = {.kind = kind, .offset = (int64_t)n};
    int64_t rows = (int64_t)n, ring = (int64_t)n < SYNTH_RING ? (int64_t)n : SYNTH_RING;
    int64_t shapes[KVT_MAX_CACHE_TENSORS][4];
    int dtypes[KVT_MAX_CACHE_TENSORS], ranks[KVT_MAX_CACHE_TENSORS] = {4, 4, 4, 4, 4, 4};
    int nt = kvt_kind_tensor_count(kind);
#define SHAPE(i, r, d, dt)                                                                         \
    do {                                                                                           \
        shapes[i][0] = 1;                                                                          \
        shapes[i][1] = heads;                                                                      \
        shapes[i][2] = (r);                                                                        \
        shapes[i][3] = (d);                                                                        \
        dtypes[i] = (dt);                                                                          \
    } while (0)
    switch (kind) {
    case KVT_KIND_KV: /* Dk 16, Dv 8 */
        SHAPE(0, rows, 16, KVT_BFLOAT16);
        SHAPE(1, rows, 8, KVT_BFLOAT16);
        break;
    case KVT_KIND_ROTATING:
        info.max_size = SYNTH_RING;
        info.idx = (int64_t)n < SYNTH_RING ? (int64_t)n : (int64_t)n % SYNTH_RING;
        SHAPE(0, ring, 16, KVT_BFLOAT16);
        SHAPE(1, ring, 16, KVT_BFLOAT16);
        break;
    case KVT_KIND_QKV: /* D 64, group 32, 4 bits */
        info.group_size = 32;
        info.bits = 4;
        for (int k = 0; k < 6; k += 3) {
            SHAPE(k, rows, 8, KVT_UINT32);
            SHAPE(k + 1, rows, 2, KVT_FLOAT16);
            SHAPE(k + 2, rows, 2, KVT_FLOAT16);
        }
        break;
    case KVT_KIND_ROTATING_QKV: /* D 128, group 64, 8 bits */
        info.max_size = SYNTH_RING;
        info.idx = (int64_t)n < SYNTH_RING ? (int64_t)n : (int64_t)n % SYNTH_RING;
        info.group_size = 64;
        info.bits = 8;
        for (int k = 0; k < 6; k += 3) {
            SHAPE(k, ring, 32, KVT_UINT32);
            SHAPE(k + 1, ring, 2, KVT_BFLOAT16);
            SHAPE(k + 2, ring, 2, KVT_BFLOAT16);
        }
        break;
    case KVT_KIND_TURBOQUANT: /* headDim 64, kBits 4, vBits 2 */
        info.k_bits = 4;
        info.v_bits = 2;
        info.head_dim = 64;
        SHAPE(0, rows, 32, KVT_UINT8);
        SHAPE(1, rows, 2, KVT_FLOAT16);
        SHAPE(2, rows, 2, KVT_FLOAT16);
        SHAPE(3, rows, 16, KVT_UINT8);
        SHAPE(4, rows, 2, KVT_FLOAT16);
        break;
    case KVT_KIND_SSM: /* conv [1, 3, 16], recurrent [1, H, 4, 4] float32 */
        shapes[0][0] = 1;
        shapes[0][1] = 3;
        shapes[0][2] = 16;
        ranks[0] = 3;
        dtypes[0] = KVT_BFLOAT16;
        SHAPE(1, 4, 4, KVT_FLOAT32);
        break;
    default: return -EINVAL;
    }
#undef SHAPE
    struct kvt_tensor t[KVT_MAX_CACHE_TENSORS];
    memset(t, 0, sizeof(t));
    int rc = 0, made = 0;
    for (; made < nt && rc == 0; made++)
        rc = synth_tensor(&t[made], dtypes[made], ranks[made], shapes[made], tok, n,
                          (uint64_t)(layer * 16 + made + 1));
    if (rc == 0)
        rc = kvt_cache_from_state(&info, t, nt, out);
    for (int i = 0; i < made; i++)
        kvt_tensor_release(&t[i]);
    return rc;
}

static inline int synth_cache(int kind, const int32_t *tok, size_t n, int layer, kvt_cache **out)
{
    return synth_cache_heads(kind, tok, n, layer, SYNTH_HEADS, out);
}

/* Replace a library-made entry's metadata with the synthetic store identity. */
static inline int synth_set_meta(struct kvt_entry *e)
{
    const char *v[3] = {SYNTH_MODEL, SYNTH_FP, SYNTH_TOK};
    const char **dst[3] = {&e->meta.model_id, &e->meta.config_fingerprint, &e->meta.tokenizer_hash};
    for (int i = 0; i < 3; i++) {
        free((char *)*dst[i]);
        *dst[i] = strdup(v[i]);
        if (!*dst[i])
            return -ENOMEM;
    }
    return 0;
}

/*
 * The entry of caches @p c (made with result @p rc: on any failure every one is freed), with
 * the synthetic metadata.
 */
static inline int synth_entry_of(const int32_t *tok, size_t n, kvt_cache **c, size_t nc,
                                 const char *ns, int rc, struct kvt_entry **out)
{
    *out = NULL;
    if (rc == 0)
        rc = kvt_entry_new(tok, n, c, nc, ns, out);
    if (rc) {
        for (size_t i = 0; i < nc; i++)
            kvt_cache_free(c[i]);
        return rc;
    }
    rc = synth_set_meta(*out);
    if (rc) {
        kvt_entry_free(*out);
        *out = NULL;
    }
    return rc;
}

/*
 * A library-owned entry of @p nk layers of @p kinds over @p tok, in namespace @p ns, with the
 * synthetic metadata. Free with kvt_entry_free().
 */
static inline int synth_entry(const int32_t *tok, size_t n, const int *kinds, size_t nk,
                              const char *ns, struct kvt_entry **out)
{
    kvt_cache *c[16] = {0};
    *out = NULL;
    if (nk > 16)
        return -EINVAL;
    int rc = 0;
    for (size_t i = 0; i < nk && rc == 0; i++)
        rc = synth_cache(kinds[i], tok, n, (int)i, &c[i]);
    return synth_entry_of(tok, n, c, nk, ns, rc, out);
}

/*
 * The tokens of entry @p id: @p id itself first (so no two ids share a first token and no
 * entry is a prefix of another), then tokens derived from it. @return the count (4..35).
 */
static inline size_t synth_tokens(uint32_t id, int32_t *tok, size_t max)
{
    uint64_t x = kvt_wyhash(id, "tokens", 6) | 1;
    size_t n = 4 + (size_t)(x % 32);
    if (n > max)
        n = max;
    tok[0] = (int32_t)(id & 0x7fffffff);
    for (size_t i = 1; i < n; i++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        tok[i] = (int32_t)((x * 0x2545F4914F6CDD1DULL) % 50000);
    }
    return n;
}

/* The namespace of entry @p id: every third id is stored under an adapter namespace. */
static inline const char *synth_id_ns(uint32_t id)
{
    return id % 3 == 0 ? "lora-crash" : "";
}

/*
 * Entry @p id: synth_tokens(@p id) in synth_id_ns(@p id), odd ids with all six kinds (not
 * trimmable), even ids with the trimmable kinds.
 */
static inline int synth_id_entry(uint32_t id, struct kvt_entry **out)
{
    int32_t tok[64];
    size_t n = synth_tokens(id, tok, 64);
    if (id % 2)
        return synth_entry(tok, n, SYNTH_ALL_KINDS, 6, synth_id_ns(id), out);
    return synth_entry(tok, n, SYNTH_TRIMMABLE_KINDS, 3, synth_id_ns(id), out);
}

/* Whether @p a and @p b hold the same scalars and state bytes in every layer. */
static inline bool synth_same_caches(const struct kvt_entry *a, const struct kvt_entry *b)
{
    if (a->n_caches != b->n_caches || a->n_tokens != b->n_tokens ||
        memcmp(a->tokens, b->tokens, a->n_tokens * sizeof(*a->tokens)) != 0)
        return false;
    bool same = true;
    for (size_t i = 0; i < a->n_caches && same; i++) {
        struct kvt_cache_info ia, ib;
        kvt_cache_get_info(a->caches[i], &ia);
        kvt_cache_get_info(b->caches[i], &ib);
        if (memcmp(&ia, &ib, sizeof(ia)) != 0)
            return false;
        struct kvt_tensor ta[KVT_MAX_CACHE_TENSORS], tb[KVT_MAX_CACHE_TENSORS];
        int na = kvt_cache_state(a->caches[i], ta), nb = kvt_cache_state(b->caches[i], tb);
        same = na == nb;
        for (int k = 0; k < na && k < nb && same; k++) {
            size_t bytes = kvt_tensor_nbytes(&ta[k]);
            same = bytes == kvt_tensor_nbytes(&tb[k]) && ta[k].dtype == tb[k].dtype &&
                   ta[k].rank == tb[k].rank &&
                   memcmp(ta[k].shape, tb[k].shape, sizeof(ta[k].shape[0]) * ta[k].rank) == 0;
            if (same && bytes) {
                uint8_t *x = malloc(bytes), *y = malloc(bytes);
                same = x && y;
                if (same) {
                    kvt_tensor_copy_out(&ta[k], x);
                    kvt_tensor_copy_out(&tb[k], y);
                    same = memcmp(x, y, bytes) == 0;
                }
                free(x);
                free(y);
            }
        }
        for (int k = 0; k < na; k++)
            kvt_tensor_release(&ta[k]);
        for (int k = 0; k < nb; k++)
            kvt_tensor_release(&tb[k]);
    }
    return same;
}

/* ---- entries that share prefixes (docs/SHARING.md) ------------------------------------ */

#define SYNTH_SHARED_PREFIX 520 /* two whole chunks and a few tokens */

/*
 * A token-axis layer whose rows [256k, 256(k + 1)) derive only from the tokens up to 256(k +
 * 1), and the rows past the last whole chunk from all of them: what the chunks of a shared
 * store hold, whichever entry wrote them.
 */
static inline int synth_shared_layer(int kind, const int32_t *tok, size_t n, int layer,
                                     kvt_cache **out)
{
    struct kvt_cache_info p = {.kind = kind, .group_size = 32, .bits = 4};
    int rc = kvt_cache_new(&p, out);
    size_t cut = (n - 1) / 256 * 256;
    for (size_t a = 0, b; rc == 0 && a < n; a = b) {
        b = a < cut ? a + 256 : n;
        kvt_cache *seg;
        struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
        if ((rc = synth_cache(kind, tok, b, layer, &seg)) != 0)
            break;
        int nt = kvt_cache_state(seg, st);
        for (int i = 0; i < nt && rc == 0; i++)
            rc = kvt_tensor_slice(&st[i], &st[i], 2, (int64_t)a, (int64_t)b);
        if (rc == 0)
            rc = nt < 0 ? nt : kvt_cache_append(*out, st, nt);
        for (int i = 0; i < nt; i++)
            kvt_tensor_release(&st[i]);
        kvt_cache_free(seg);
    }
    if (rc) {
        kvt_cache_free(*out);
        *out = NULL;
    }
    return rc;
}

/*
 * Entry @p id for a store with sharing on: one of three 520-token prompts (id % 3), then the
 * id and tokens derived from it; a kv and a qkv layer cut into chunks, and for odd ids an ssm
 * layer (kept whole, not trimmable). Namespace "".
 */
static inline int synth_shared_entry(uint32_t id, struct kvt_entry **out)
{
    int32_t tok[SYNTH_SHARED_PREFIX + 64];
    for (size_t i = 0; i < SYNTH_SHARED_PREFIX; i++)
        tok[i] = (int32_t)(60000 + (id % 3) * 1000 + i % 997);
    size_t own = synth_tokens(id, tok + SYNTH_SHARED_PREFIX, 64), n = SYNTH_SHARED_PREFIX + own;
    kvt_cache *c[3] = {0};
    int rc = synth_shared_layer(KVT_KIND_KV, tok, n, 0, &c[0]);
    if (rc == 0)
        rc = synth_shared_layer(KVT_KIND_QKV, tok, n, 1, &c[1]);
    if (rc == 0 && id % 2)
        rc = synth_cache(KVT_KIND_SSM, tok, n, 2, &c[2]);
    return synth_entry_of(tok, n, c, id % 2 ? 3 : 2, "", rc, out);
}

#endif
