/*
 * Sequence state blobs of llama.cpp 0.5.0 <-> kvtier caches (llama_state.h). The blob
 * layout (llama-context.cpp, llama-kv-cache.cpp, llama-memory-recurrent.cpp):
 *   u32 magic 0xaf143cd8, i32 seq id, then the memory's part:
 *   attention: u32 n_stream; per stream u32 cells, and when cells > 0: per cell i32 pos,
 *     u32 n_seq_id (1), i32 seq id; u32 v_trans, u32 n_layer; per layer K: i32 type,
 *     u64 row bytes, cells rows; per layer V: the same, or when transposed i32 type,
 *     u32 element bytes, u32 elements per cell, then elements x cells, element-major.
 *   sliding window (llama-kv-cache-iswa.cpp): two attention parts, the full-attention
 *     layers' and then the window's, whose cells are the last min(n, n_swa) positions.
 *   recurrent: u32 cells; per cell i32 pos, u32 n_seq_id (0); u32 s_trans (0), u32 n_layer;
 *     per layer r: i32 type, u64 row bytes, cells rows; per layer s: the same.
 */
#include "llama_state.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SEQ_MAGIC 0xaf143cd8u
#define GGML_F32 0
#define GGML_F16 1
#define GGML_BF16 30

/* ---- reading a blob ---------------------------------------------------------------------- */

struct rd {
    const uint8_t *p;
    size_t size, at;
    bool bad;
};

static uint32_t rd_u32(struct rd *r)
{
    uint32_t v = 0;
    if (r->size - r->at < 4 || r->at > r->size) {
        r->bad = true;
        return 0;
    }
    memcpy(&v, r->p + r->at, 4);
    r->at += 4;
    return v;
}

static uint64_t rd_u64(struct rd *r)
{
    uint64_t v = 0;
    if (r->size - r->at < 8 || r->at > r->size) {
        r->bad = true;
        return 0;
    }
    memcpy(&v, r->p + r->at, 8);
    r->at += 8;
    return v;
}

/* Skip @p n items of @p each bytes; records where they start. */
static size_t rd_skip(struct rd *r, uint64_t n, uint64_t each)
{
    size_t at = r->at;
    uint64_t bytes;
    if (__builtin_mul_overflow(n, each, &bytes) || bytes > r->size - r->at || r->at > r->size) {
        r->bad = true;
        return at;
    }
    r->at += (size_t)bytes;
    return at;
}

static int unsupported(const char *what)
{
    return kvt_set_error(KVT_E_UNSUPPORTED, "llama state: %s", what);
}

/* One layer's i32 type and u64 row bytes, then the rows of @p cells cells. */
static void rd_rows(struct rd *r, uint32_t cells, int32_t want_type, struct blob_part *part)
{
    int32_t type = (int32_t)rd_u32(r);
    part->row = rd_u64(r);
    part->n_embd = 0;
    if (type != want_type)
        r->bad = true;
    part->off = rd_skip(r, cells, part->row);
    part->bytes = (size_t)(part->row * cells);
}

/*
 * One stream's cells and layers of an attention part: the cells must hold positions
 * @p first .. first + cells - 1, in order, each in this sequence alone; the layers go to
 * m->a/m->b from index m->n_layer on.
 */
static int parse_attention_stream(const struct llama_shape *sh, struct rd *r, uint32_t cells,
                                  int32_t seq, int32_t first, struct blob_map *m)
{
    for (uint32_t i = 0; i < cells && !r->bad; i++) {
        int32_t pos = (int32_t)rd_u32(r);
        uint32_t n_seq = rd_u32(r);
        int32_t id = (int32_t)rd_u32(r);
        if (pos != first + (int32_t)i || n_seq != 1 || id != seq)
            return kvt_set_error(KVT_E_STATE,
                                 "llama state: cell %u holds position %d of %u sequence(s), "
                                 "not position %d of this sequence alone",
                                 i, pos, n_seq, first + (int32_t)i);
    }
    uint32_t v_trans = rd_u32(r), n_layer = rd_u32(r);
    if (r->bad)
        return unsupported("truncated cell list");
    if (n_layer == 0 || n_layer > sh->n_layer - m->n_layer || (v_trans != 0) != sh->v_trans)
        return unsupported("layer count or V layout differs from the context's");
    struct blob_part *a = m->a + m->n_layer, *b = m->b + m->n_layer;
    for (uint32_t il = 0; il < n_layer; il++)
        rd_rows(r, cells, sh->type_k, &a[il]);
    for (uint32_t il = 0; il < n_layer && !r->bad; il++) {
        struct blob_part *v = &b[il];
        if (!v_trans) {
            rd_rows(r, cells, sh->type_v, v);
            continue;
        }
        int32_t type = (int32_t)rd_u32(r);
        v->row = rd_u32(r);
        v->n_embd = rd_u32(r);
        if (type != sh->type_v)
            r->bad = true;
        uint64_t n;
        if (__builtin_mul_overflow((uint64_t)v->n_embd, (uint64_t)cells, &n))
            r->bad = true;
        v->off = rd_skip(r, n, v->row);
        v->bytes = (size_t)(n * v->row);
    }
    if (r->bad)
        return unsupported("layer types or sizes differ from the context's K/V types");
    m->n_layer += n_layer;
    return 0;
}

/* An attention part (llama_kv_cache::state_write): its one non-empty stream. *@p cells and
 * the layers it holds are recorded; positions start at @p first. */
static int parse_attention(const struct llama_shape *sh, struct rd *r, int32_t seq, int32_t first,
                           uint32_t *cells, struct blob_map *m)
{
    uint32_t n_stream = rd_u32(r);
    if (r->bad || n_stream != sh->n_stream)
        return unsupported("stream count differs from the context's");
    *cells = 0;
    for (uint32_t s = 0; s < n_stream; s++) {
        uint32_t c = rd_u32(r);
        if (r->bad)
            return unsupported("truncated");
        if (c == 0)
            continue;
        if (*cells)
            return unsupported("one sequence in several streams");
        if (c > INT32_MAX - (uint32_t)first)
            return unsupported("more cells than positions");
        *cells = c;
        int rc = parse_attention_stream(sh, r, c, seq, first, m);
        if (rc)
            return rc;
    }
    if (!*cells)
        return kvt_set_error(KVT_E_STATE, "llama state: the sequence holds no cells");
    return 0;
}

/* Attention memory: the full-attention part, then with a sliding window the window's part
 * (llama_kv_cache_iswa::state_write), holding the last min(n, n_swa) positions. */
static int parse_attention_memory(const struct llama_shape *sh, struct rd *r, int32_t seq,
                                  struct blob_map *m)
{
    int rc = parse_attention(sh, r, seq, 0, &m->cells, m);
    if (rc)
        return rc;
    m->last_pos = (int32_t)m->cells - 1;
    m->n_base = m->n_layer;
    if (!sh->n_swa)
        return 0;
    uint32_t w = m->cells < sh->n_swa ? m->cells : sh->n_swa;
    rc = parse_attention(sh, r, seq, (int32_t)(m->cells - w), &m->swa_cells, m);
    if (rc == 0 && m->swa_cells != w)
        rc = unsupported("the sliding window holds other positions than the last n_swa");
    return rc;
}

static int parse_recurrent(const struct llama_shape *sh, struct rd *r, struct blob_map *m)
{
    uint32_t cells = rd_u32(r);
    if (cells != 1)
        return kvt_set_error(KVT_E_STATE, "llama state: %u recurrent cells, expected 1", cells);
    int32_t pos = (int32_t)rd_u32(r);
    uint32_t n_seq = rd_u32(r), s_trans = rd_u32(r), n_layer = rd_u32(r);
    if (r->bad || n_seq != 0 || s_trans != 0 || n_layer != sh->n_layer)
        return unsupported("recurrent state layout differs from the context's");
    for (uint32_t il = 0; il < n_layer; il++)
        rd_rows(r, cells, GGML_F32, &m->a[il]);
    for (uint32_t il = 0; il < n_layer; il++)
        rd_rows(r, cells, GGML_F32, &m->b[il]);
    if (r->bad)
        return unsupported("recurrent layers are not all F32 rows of one cell");
    m->cells = cells;
    m->last_pos = pos;
    m->n_layer = n_layer;
    return 0;
}

int blob_parse(const struct llama_shape *sh, const uint8_t *blob, size_t size, int32_t seq,
               struct blob_map *m)
{
    if (sh->n_layer > KVT_LLAMA_MAX_LAYERS)
        return unsupported("too many layers");
    struct rd r = {.p = blob, .size = size};
    uint32_t magic = rd_u32(&r);
    int32_t id = (int32_t)rd_u32(&r);
    if (r.bad || magic != SEQ_MAGIC || id != seq)
        return unsupported("not a sequence state of this llama.cpp build");
    m->n_layer = 0;
    int rc = sh->recurrent ? parse_recurrent(sh, &r, m) : parse_attention_memory(sh, &r, seq, m);
    if (rc == 0 && m->n_layer != sh->n_layer)
        rc = unsupported("layer count differs from the model's");
    if (rc == 0 && r.at != size)
        rc = unsupported("state has parts the mapping does not know");
    return rc;
}

/* ---- blob -> caches ---------------------------------------------------------------------- */

static int natural_dtype(int32_t type)
{
    return type == GGML_F32    ? KVT_FLOAT32
           : type == GGML_F16  ? KVT_FLOAT16
           : type == GGML_BF16 ? KVT_BFLOAT16
                               : -1;
}

/* The dtype both tensors of an attention layer are stored with (-1: float16 container). */
static int attention_dtype(const struct llama_shape *sh)
{
    return sh->type_k == sh->type_v ? natural_dtype(sh->type_k) : -1;
}

/* A [1, 1, n, row / item] view of @p part; a float16 container when @p dtype is -1. */
static int row_view(kvt_buf *buf, const struct blob_part *part, uint32_t n, int dtype,
                    struct kvt_tensor *t)
{
    int d = dtype < 0 ? KVT_FLOAT16 : dtype;
    size_t item = kvt_dtype_size(d);
    if (part->row % item)
        return unsupported("row bytes do not fill whole items");
    const int64_t shape[4] = {1, 1, n, (int64_t)(part->row / item)};
    return kvt_tensor_init(t, buf, part->off, d, 4, shape);
}

/* The token-major [1, 1, n, n_embd] view of a transposed V (element-major in the blob). */
static int transposed_view(kvt_buf *buf, const struct blob_part *part, uint32_t n, int dtype,
                           struct kvt_tensor *t)
{
    if (dtype < 0 || kvt_dtype_size(dtype) != part->row)
        return unsupported("a transposed V needs K and V of one float type");
    const int64_t shape[4] = {1, 1, n, part->n_embd};
    int rc = kvt_tensor_init(t, buf, part->off, dtype, 4, shape);
    if (rc == 0) {
        t->strides[3] = n; /* element e of cell c lies at e * n + c */
        t->strides[2] = 1;
    }
    return rc;
}

static int layer_cache(const struct llama_shape *sh, const struct blob_map *m, kvt_buf *buf,
                       uint32_t il, size_t n_tokens, kvt_cache **out)
{
    struct kvt_tensor t[2] = {{0}};
    struct kvt_cache_info info = {.kind = sh->recurrent ? KVT_KIND_SSM : KVT_KIND_KV,
                                  .offset = (int64_t)n_tokens};
    int rc;
    if (sh->recurrent) {
        const int64_t conv[3] = {1, m->cells, (int64_t)(m->a[il].row / 4)};
        const int64_t rec[4] = {1, 1, m->cells, (int64_t)(m->b[il].row / 4)};
        rc = kvt_tensor_init(&t[0], buf, m->a[il].off, KVT_FLOAT32, 3, conv);
        if (rc == 0)
            rc = kvt_tensor_init(&t[1], buf, m->b[il].off, KVT_FLOAT32, 4, rec);
    } else {
        /* a sliding-window layer is a ring of n_swa rows holding its cells in temporal order:
         * before it wraps, rows [0, cells) with the next write at cells; once full, the
         * oldest row first and the next write over it (idx 0) */
        uint32_t cells = il < m->n_base ? m->cells : m->swa_cells;
        if (il >= m->n_base)
            info = (struct kvt_cache_info){.kind = KVT_KIND_ROTATING,
                                           .offset = (int64_t)n_tokens,
                                           .max_size = sh->n_swa,
                                           .idx = cells == sh->n_swa ? 0 : cells};
        int dtype = attention_dtype(sh);
        rc = row_view(buf, &m->a[il], cells, dtype, &t[0]);
        if (rc == 0)
            rc = sh->v_trans ? transposed_view(buf, &m->b[il], cells, dtype, &t[1])
                             : row_view(buf, &m->b[il], cells, dtype, &t[1]);
    }
    if (rc == 0)
        rc = kvt_cache_from_state(&info, t, 2, out);
    kvt_tensor_release(&t[0]);
    kvt_tensor_release(&t[1]);
    return rc;
}

int blob_to_caches(const struct llama_shape *sh, const struct blob_map *m, kvt_buf *buf,
                   size_t n_tokens, kvt_cache **out)
{
    for (uint32_t il = 0; il < m->n_layer; il++) {
        int rc = layer_cache(sh, m, buf, il, n_tokens, &out[il]);
        if (rc) {
            for (uint32_t k = 0; k < il; k++)
                kvt_cache_free(out[k]);
            return rc;
        }
    }
    return 0;
}

/* ---- header -> blob ---------------------------------------------------------------------- */

static int mismatch(uint32_t il, const char *what)
{
    return kvt_set_error(KVT_E_MISMATCH, "llama state: cache %u: %s", il, what);
}

static bool add_ok(size_t *at, uint64_t bytes)
{
    return bytes <= SIZE_MAX && !__builtin_add_overflow(*at, (size_t)bytes, at);
}

/* Row bytes of a slot that must be [1, 1, cells, d] (rank 4) or, for conv, [1, cells, d]. */
static int slot_row(const struct kvt_slot *s, int dtype, uint32_t cells, uint64_t *row)
{
    if (s->dtype != dtype || s->rank < 3 || s->shape[0] != 1 ||
        (s->rank == 4 && s->shape[1] != 1) || s->shape[s->rank - 2] != (int64_t)cells)
        return -1;
    *row = (uint64_t)s->shape[s->rank - 1] * kvt_dtype_size(dtype);
    return 0;
}

/*
 * The parts of a blob: recurrent memory is one; attention memory is one (full attention) or
 * two (then the sliding window's), each with its own count of streams, cell list, V layout
 * and layers, its K rows then its V rows.
 */
struct part_geom {
    uint32_t first_layer, n_layer, cells;
    int32_t first_pos;
};

static int parts_of(const struct llama_shape *sh, const struct blob_plan *p, struct part_geom g[2])
{
    if (sh->recurrent) {
        g[0] = (struct part_geom){0, sh->n_layer, 1, (int32_t)p->n_tokens - 1};
        return 1;
    }
    g[0] = (struct part_geom){0, p->n_base, p->cells, 0};
    g[1] = (struct part_geom){p->n_base, sh->n_layer - p->n_base, p->swa_cells,
                              (int32_t)(p->cells - p->swa_cells)};
    return p->n_base < sh->n_layer ? 2 : 1;
}

/* Bytes of a part before its first layer's data: counts, the cell list, V layout, layers. */
static size_t part_head_bytes(const struct llama_shape *sh, const struct part_geom *g)
{
    if (sh->recurrent) /* cells, pos, n_seq_id, s_trans, n_layer */
        return 5 * 4;
    /* n_stream, the first stream's cells, per cell pos/n_seq_id/seq, v_trans, n_layer */
    return 2 * 4 + (size_t)g->cells * 12 + 2 * 4;
}

/* What cache @p il of an entry must be: its kind and its rows, from the header. */
static int check_cache(const struct llama_shape *sh, const struct blob_plan *p,
                       const struct kvt_cache_header *c, uint32_t il, uint32_t *rows)
{
    if (sh->recurrent) {
        *rows = 1;
        return c->info.kind == KVT_KIND_SSM ? 0 : mismatch(il, "not an ssm cache");
    }
    if (il < p->n_base) {
        *rows = p->cells;
        return c->info.kind == KVT_KIND_KV ? 0 : mismatch(il, "not a kv cache");
    }
    *rows = p->swa_cells;
    uint32_t idx = p->swa_cells == sh->n_swa ? 0 : p->swa_cells;
    if (c->info.kind != KVT_KIND_ROTATING || c->info.max_size != (int64_t)sh->n_swa ||
        c->info.offset != (int64_t)p->n_tokens || c->info.idx != (int64_t)idx)
        return mismatch(il, "not the sliding window's ring in temporal order");
    return 0;
}

int blob_plan_header(const struct llama_shape *sh, const struct kvt_header *h, struct blob_plan *p)
{
    if (h->n_caches != sh->n_layer || h->n_caches > KVT_LLAMA_MAX_LAYERS)
        return mismatch((uint32_t)h->n_caches, "layer count differs from the model's");
    if (h->n_tokens == 0 || h->n_tokens > INT32_MAX)
        return mismatch(0, "token count out of range");
    p->n_tokens = (uint32_t)h->n_tokens;
    p->cells = sh->recurrent ? 1 : p->n_tokens;
    p->n_base = 0;
    while (p->n_base < h->n_caches && h->caches[p->n_base].info.kind == KVT_KIND_KV)
        p->n_base++;
    if (sh->recurrent || !sh->n_swa)
        p->n_base = sh->recurrent ? sh->n_layer : p->n_base;
    p->swa_cells = p->cells < sh->n_swa ? p->cells : sh->n_swa;
    int dtype = sh->recurrent ? KVT_FLOAT32 : attention_dtype(sh);
    int d = dtype < 0 ? KVT_FLOAT16 : dtype;
    struct part_geom g[2];
    int np = parts_of(sh, p, g);
    size_t at = 2 * 4; /* magic, seq */
    for (int q = 0; q < np; q++) {
        if (!add_ok(&at, part_head_bytes(sh, &g[q])))
            return mismatch(0, "state size overflows");
        for (int j = 0; j < 2; j++) /* the part's K (or conv) rows, then its V (or SSM) rows */
            for (uint32_t il = g[q].first_layer; il < g[q].first_layer + g[q].n_layer; il++) {
                const struct kvt_cache_header *c = &h->caches[il];
                struct blob_part *part = &p->part[2 * il + (uint32_t)j];
                uint32_t rows;
                uint64_t row;
                int rc = check_cache(sh, p, c, il, &rows);
                if (rc)
                    return rc;
                if (c->n_slots != 2 || slot_row(&c->slots[j], d, rows, &row))
                    return mismatch(il, "tensor shape or dtype does not fit the context");
                bool trans = !sh->recurrent && j == 1 && sh->v_trans;
                part->n_embd = trans ? (uint32_t)c->slots[j].shape[3] : 0;
                part->row = trans ? kvt_dtype_size(d) : row;
                part->bytes = (size_t)c->slots[j].bytes;
                if (!add_ok(&at, 12)) /* i32 type + u64 row, or i32 type + u32 el + u32 n */
                    return mismatch(il, "state size overflows");
                part->off = at;
                if (!add_ok(&at, c->slots[j].bytes))
                    return mismatch(il, "state size overflows");
            }
        /* the context's other streams follow, each holding no cells */
        if (!sh->recurrent && !add_ok(&at, (uint64_t)(sh->n_stream - 1) * 4))
            return mismatch(0, "state size overflows");
    }
    p->size = at;
    p->v_trans = !sh->recurrent && sh->v_trans;
    p->n_layer = sh->n_layer;
    return 0;
}

struct wr {
    uint8_t *p;
    size_t at;
};

static void wr32(struct wr *w, uint32_t v)
{
    memcpy(w->p + w->at, &v, 4);
    w->at += 4;
}

static void wr64(struct wr *w, uint64_t v)
{
    memcpy(w->p + w->at, &v, 8);
    w->at += 8;
}

/* A part's counts and cell list, at w->at. */
static void write_part_head(const struct llama_shape *sh, const struct part_geom *g, int32_t seq,
                            struct wr *w)
{
    if (sh->recurrent) {
        wr32(w, 1);
        wr32(w, (uint32_t)g->first_pos);
        wr32(w, 0); /* no sequence ids: the restore assigns its own */
        wr32(w, 0); /* s_trans */
        wr32(w, g->n_layer);
        return;
    }
    /* the restoring context maps the sequence to its own stream whichever count this is */
    wr32(w, sh->n_stream);
    wr32(w, g->cells);
    for (uint32_t i = 0; i < g->cells; i++) {
        wr32(w, (uint32_t)(g->first_pos + (int32_t)i));
        wr32(w, 1);
        wr32(w, (uint32_t)seq);
    }
    wr32(w, sh->v_trans);
    wr32(w, g->n_layer);
}

void blob_write_meta(const struct llama_shape *sh, const struct blob_plan *p, int32_t seq,
                     uint8_t *blob)
{
    struct wr w = {blob, 0};
    wr32(&w, SEQ_MAGIC);
    wr32(&w, (uint32_t)seq);
    struct part_geom g[2];
    int np = parts_of(sh, p, g);
    for (int q = 0; q < np; q++) {
        write_part_head(sh, &g[q], seq, &w);
        size_t end = w.at;
        for (int j = 0; j < 2; j++)
            for (uint32_t il = g[q].first_layer; il < g[q].first_layer + g[q].n_layer; il++) {
                const struct blob_part *part = &p->part[2 * il + (uint32_t)j];
                int32_t type = sh->recurrent ? GGML_F32 : j ? sh->type_v : sh->type_k;
                w.at = part->off - 12;
                wr32(&w, (uint32_t)type);
                if (part->n_embd) {
                    wr32(&w, (uint32_t)part->row);
                    wr32(&w, part->n_embd);
                } else {
                    wr64(&w, part->row);
                }
                end = part->off + part->bytes;
            }
        w.at = end;
        for (uint32_t s = 1; !sh->recurrent && s < sh->n_stream; s++)
            wr32(&w, 0); /* the other streams hold no cells */
    }
}

int blob_describe(const struct kvt_entry *e, struct kvt_header *h, struct kvt_tensor *t)
{
    memset(h, 0, sizeof(*h));
    h->n_tokens = e->n_tokens;
    h->n_caches = e->n_caches;
    h->caches = calloc(e->n_caches ? e->n_caches : 1, sizeof(*h->caches));
    if (!h->caches)
        return kvt_set_error(-ENOMEM, "out of memory");
    for (size_t i = 0; i < e->n_caches; i++) {
        struct kvt_cache_header *c = &h->caches[i];
        kvt_cache_get_info(e->caches[i], &c->info);
        int nt = kvt_cache_state(e->caches[i], &t[2 * i]);
        if (nt != 2) {
            for (int j = 0; j < nt; j++)
                kvt_tensor_release(&t[2 * i + (size_t)j]);
            return kvt_set_error(KVT_E_MISMATCH, "llama state: cache %zu has %d tensors", i, nt);
        }
        /* a ring trimmed before it wrapped keeps its buffer: only rows [0, offset) are live */
        for (int j = 0;
             j < 2 && c->info.kind == KVT_KIND_ROTATING && c->info.offset < c->info.max_size &&
             t[2 * i + (size_t)j].shape[2] > c->info.offset;
             j++) {
            struct kvt_tensor live;
            if (kvt_tensor_slice(&live, &t[2 * i + (size_t)j], 2, 0, c->info.offset))
                return kvt_set_error(-ENOMEM, "out of memory");
            kvt_tensor_release(&t[2 * i + (size_t)j]);
            t[2 * i + (size_t)j] = live;
        }
        c->n_slots = 2;
        for (int j = 0; j < 2; j++) {
            const struct kvt_tensor *x = &t[2 * i + (size_t)j];
            struct kvt_slot *s = &c->slots[j];
            s->dtype = x->dtype;
            s->rank = x->rank;
            memcpy(s->shape, x->shape, sizeof(s->shape));
            s->bytes = kvt_tensor_nbytes(x);
        }
    }
    return 0;
}

void blob_put_transposed(const struct blob_part *part, uint32_t cells, const uint8_t *token_major,
                         uint8_t *blob)
{
    size_t el = (size_t)part->row, n = part->n_embd;
    uint8_t *dst = blob + part->off;
    /* cell c's element e goes to e * cells + c; cells outer keeps the reads sequential */
    for (size_t c = 0; c < cells; c++) {
        const uint8_t *src = token_major + c * n * el;
        if (el == 2)
            for (size_t e = 0; e < n; e++)
                memcpy(dst + (e * cells + c) * 2, src + e * 2, 2);
        else
            for (size_t e = 0; e < n; e++)
                memcpy(dst + (e * cells + c) * el, src + e * el, el);
    }
}
