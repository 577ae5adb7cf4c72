/*
 * Synthetic entries derived from their tokens (support/synth.h).
 */
#include "support/synth.h"

/* Row i of a tensor: the wyhash chain of tokens 0..i under @p seed, spread over the row. */
static void fill_rows(uint8_t *p, const int32_t *tok, size_t n, uint64_t seed, size_t row_bytes)
{
    uint64_t h = seed;
    for (size_t i = 0; i < n; i++) {
        h = kvt_wyhash(h, &tok[i], sizeof(tok[i]));
        for (size_t j = 0; j < row_bytes; j++)
            p[i * row_bytes + j] = (uint8_t)(h >> (8 * (j % 8)));
    }
}

static uint8_t *data(const struct kvt_tensor *t)
{
    return (uint8_t *)kvt_buf_data(t->buf) + t->offset;
}

/* Two fresh zeroed tensors; on failure neither is held. */
static int two_tensors(struct kvt_tensor t[2], const int dtype[2], const int ndim[2],
                       const int64_t *const shape[2])
{
    int rc = kvt_tensor_zeros(&t[0], dtype[0], ndim[0], shape[0]);
    if (rc == 0 && (rc = kvt_tensor_zeros(&t[1], dtype[1], ndim[1], shape[1])))
        kvt_tensor_release(&t[0]);
    return rc;
}

/* A cache of @p kind over the two tensors (released here on every path). */
static int cache_of(int kind, size_t n, struct kvt_tensor t[2], kvt_cache **out)
{
    struct kvt_cache_info info = {.kind = kind, .offset = (int64_t)n};
    int rc = kvt_cache_from_state(&info, t, 2, out);
    kvt_tensor_release(&t[0]);
    kvt_tensor_release(&t[1]);
    return rc;
}

int synth_kv(const int32_t *tok, size_t n, int layer, kvt_cache **out)
{
    const int64_t shape[4] = {1, 1, (int64_t)n, SYNTH_HEAD_DIM};
    struct kvt_tensor t[2];
    int rc = two_tensors(t, (const int[]){KVT_BFLOAT16, KVT_BFLOAT16}, (const int[]){4, 4},
                         (const int64_t *const[]){shape, shape});
    if (rc)
        return rc;
    for (int w = 0; w < 2; w++)
        fill_rows(data(&t[w]), tok, n, (uint64_t)(layer * 2 + w + 1), SYNTH_HEAD_DIM * 2);
    return cache_of(KVT_KIND_KV, n, t, out);
}

int synth_ssm(const int32_t *tok, size_t n, kvt_cache **out)
{
    const int64_t conv_shape[3] = {1, 2, 4}, rec_shape[4] = {1, 1, 2, 2};
    struct kvt_tensor t[2];
    int rc = two_tensors(t, (const int[]){KVT_BFLOAT16, KVT_FLOAT32}, (const int[]){3, 4},
                         (const int64_t *const[]){conv_shape, rec_shape});
    if (rc)
        return rc;
    uint64_t h = kvt_wyhash(77, tok, n * sizeof(*tok));
    for (int w = 0; w < 2; w++)
        for (size_t j = 0; j < 16; j++) /* both states are 16 bytes */
            data(&t[w])[j] = (uint8_t)(h >> (8 * (j % 8))) ^ (uint8_t)w;
    return cache_of(KVT_KIND_SSM, n, t, out);
}

int synth_entry(const int32_t *tok, size_t n, const char *ns, bool trimmable,
                struct kvt_entry **out)
{
    kvt_cache *c[2] = {NULL, NULL};
    int rc = synth_kv(tok, n, 0, &c[0]);
    if (rc == 0 && !trimmable)
        rc = synth_ssm(tok, n, &c[1]);
    if (rc == 0)
        rc = kvt_entry_new(tok, n, c, trimmable ? 1 : 2, ns, out);
    if (rc) { /* on failure the caches stay ours */
        kvt_cache_free(c[0]);
        kvt_cache_free(c[1]);
    }
    return rc;
}
