/*
 * The mapping between one llama.cpp sequence's state blob (llama_state_seq_get_data(), the
 * layout of llama.cpp 0.5.0) and kvtier caches (docs/LLAMA.md):
 *  - attention memory: one `kv` cache per layer, K and V [1, 1, n, row] over the blob's rows
 *    (the cells of positions 0..n-1, in order). F32/F16/BF16 K and V of one type keep their
 *    dtype; any other pair (quantized types such as q8_0 or q4_0, or K and V of different
 *    types) is carried as raw row bytes in a float16 container: [1, 1, n, row_bytes / 2].
 *    A transposed V (flash attention off) is a strided view of the blob, so the entry is
 *    token-major either way; restores transpose it back.
 *  - a sliding window (llama_kv_cache_iswa): its layers follow as `rotating` caches of
 *    n_swa rows holding the window's cells in temporal order (docs/LLAMA.md).
 *  - recurrent memory: one `ssm` cache per layer, conv [1, cells, r] and recurrent
 *    [1, 1, cells, s], both F32 as llama.cpp keeps them.
 * Blobs are parsed with every count and size checked against the blob's length.
 */
#ifndef KVT_LLAMA_STATE_H
#define KVT_LLAMA_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

#define KVT_LLAMA_MAX_LAYERS 1024

/** What the context's memory looks like, from the model and the context parameters. */
struct llama_shape {
    bool recurrent;
    uint32_t n_layer;
    uint32_t n_stream;      /* attention: streams of the context's KV cache */
    int32_t type_k, type_v; /* ggml types of attention K and V (recurrent: F32 r and s) */
    bool v_trans;           /* attention V transposed (flash attention off) */
    uint32_t n_swa;         /* sliding window: its size (0: none) */
};

/** One tensor's bytes inside a blob. */
struct blob_part {
    size_t off, bytes;
    uint64_t row;    /* bytes per cell (transposed V: per element) */
    uint32_t n_embd; /* transposed V: elements per cell */
};

/** A parsed blob: where each layer's tensors lie (full-attention layers first, then the
 * sliding-window layers). */
struct blob_map {
    uint32_t cells;
    int32_t last_pos; /* position of the last cell */
    uint32_t n_layer;
    uint32_t n_base;    /* layers of the full-attention part */
    uint32_t swa_cells; /* cells of the sliding-window part: the last min(cells, n_swa) */
    struct blob_part a[KVT_LLAMA_MAX_LAYERS]; /* K, or recurrent conv state */
    struct blob_part b[KVT_LLAMA_MAX_LAYERS]; /* V, or recurrent SSM state */
};

/**
 * Parse @p blob (@p size bytes) of sequence @p seq against @p sh. Attention cells must hold
 * positions 0..cells-1 in order, each in this sequence only.
 * @return 0, KVT_E_UNSUPPORTED (a layout the mapping does not take) or KVT_E_STATE.
 */
int blob_parse(const struct llama_shape *sh, const uint8_t *blob, size_t size, int32_t seq,
               struct blob_map *m);

/**
 * The caches of a parsed blob, as views of @p buf (the blob's buffer; each cache takes its own
 * references): @p out receives m->n_layer caches covering @p n_tokens tokens.
 */
int blob_to_caches(const struct llama_shape *sh, const struct blob_map *m, kvt_buf *buf,
                   size_t n_tokens, kvt_cache **out);

/** The blob a restore builds: its size and where each slot's bytes go. */
struct blob_plan {
    size_t size;
    uint32_t n_tokens;
    uint32_t cells;     /* cells of the full-attention part (recurrent: 1) */
    uint32_t n_base;    /* its layers; the sliding window's follow */
    uint32_t swa_cells; /* cells of the sliding window's part */
    uint32_t n_layer;
    bool v_trans; /* V parts are element-major: fill them with blob_put_transposed() */
    /* slot k of the header (cache k / 2, tensor k % 2): offset of its data in the blob, row
     * bytes (transposed V: element bytes, n_embd elements per cell) */
    struct blob_part part[2 * KVT_LLAMA_MAX_LAYERS];
};

/**
 * Plan the blob of an entry whose validated header is @p h, for a context of shape @p sh.
 * @return 0 or KVT_E_MISMATCH when the entry's caches do not fit the context's memory.
 */
int blob_plan_header(const struct llama_shape *sh, const struct kvt_header *h, struct blob_plan *p);
/** Write everything of the planned blob but the tensor bytes. */
void blob_write_meta(const struct llama_shape *sh, const struct blob_plan *p, int32_t seq,
                     uint8_t *blob);
/**
 * The header-shaped description of entry @p e's live tensors, for planning its blob from
 * RAM: @p h's caches array is malloc'd (free it), @p t receives two owned views per cache
 * (release them), a ring trimmed before it wrapped cut to its live rows.
 * @return 0, KVT_E_MISMATCH (a cache without two tensors) or -ENOMEM.
 */
int blob_describe(const struct kvt_entry *e, struct kvt_header *h, struct kvt_tensor *t);
/** Fill a transposed V part from its token-major bytes (@p cells x part->n_embd elements). */
void blob_put_transposed(const struct blob_part *part, uint32_t cells, const uint8_t *token_major,
                         uint8_t *blob);

#endif
