/*
 * Fuzz target: the llama.cpp integration's state mapping (integrations/llama/llama_state.c)
 * on sequence-state blobs. The first byte picks the context's shape (attention F16 or a
 * q8_0 container, V transposed or not, one or two streams, a sliding window; or recurrent);
 * the rest is the blob. Whatever the parser accepts is turned into caches, described, planned
 * and written back as a blob; that blob must parse again into caches holding the same tensor
 * bytes, and rebuild to the same blob.
 */
#include "fuzz.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"
#include "../integrations/llama/llama_state.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x))                                                                                  \
            fuzz_fail(#x);                                                                         \
    } while (0)

static struct llama_shape shape_of(uint8_t sel)
{
    struct llama_shape sh = {.n_layer = 2, .n_stream = (sel & 8) ? 2 : 1, .type_k = 1, .type_v = 1};
    switch (sel & 3) {
    case 1: sh.type_k = sh.type_v = 8; break; /* q8_0: a float16 container */
    case 2: sh = (struct llama_shape){.recurrent = true, .n_layer = 2}; break;
    case 3: sh.n_layer = 4, sh.n_swa = 32; break; /* two full layers, two of a window */
    }
    sh.v_trans = !sh.recurrent && (sel & 4) && sh.type_k == 1;
    return sh;
}

/* Rebuild the blob of @p n tokens from caches @p c the way a RAM-tier load does. */
static uint8_t *rebuild(const struct llama_shape *sh, kvt_cache **c, size_t n, size_t *size)
{
    int32_t *tok = calloc(n, sizeof(*tok));
    struct kvt_entry e = {.tokens = tok, .n_tokens = n, .caches = c, .n_caches = sh->n_layer};
    struct kvt_tensor t[2 * 4];
    struct kvt_header h;
    struct blob_plan *p = malloc(sizeof(*p));
    uint8_t *out = NULL;
    CHECK(blob_describe(&e, &h, t) == 0);
    CHECK(blob_plan_header(sh, &h, p) == 0);
    out = calloc(1, p->size + 1);
    blob_write_meta(sh, p, 0, out);
    for (size_t k = 0; k < 2 * sh->n_layer; k++) {
        if (p->v_trans && k % 2) {
            uint8_t *tm = malloc(kvt_tensor_nbytes(&t[k]) + 1);
            kvt_tensor_copy_out(&t[k], tm);
            uint32_t cells = k / 2 < p->n_base ? p->cells : p->swa_cells;
            blob_put_transposed(&p->part[k], cells, tm, out);
            free(tm);
        } else {
            kvt_tensor_copy_out(&t[k], out + p->part[k].off);
        }
        kvt_tensor_release(&t[k]);
    }
    *size = p->size;
    free(h.caches);
    free(p);
    free(tok);
    return out;
}

static void release(void *ud, void *data)
{
    (void)ud;
    free(data);
}

/* Parse @p blob and build its caches; 0 tokens when the parser refuses it. */
static size_t caches_of(const struct llama_shape *sh, const uint8_t *blob, size_t size,
                        kvt_cache **c, kvt_buf **buf)
{
    struct blob_map *m = calloc(1, sizeof(*m));
    size_t n = 0;
    /* a recurrent cell's position is the caller's token count; keep it to what fits here */
    if (blob_parse(sh, blob, size, 0, m) == 0 && m->last_pos >= 0 && m->last_pos < (1 << 20)) {
        n = (size_t)m->last_pos + 1;
        void *copy = malloc(size);
        memcpy(copy, blob, size);
        CHECK(kvt_buf_wrap(copy, size, release, NULL, buf) == 0);
        if (blob_to_caches(sh, m, *buf, n, c)) {
            kvt_buf_unref(*buf);
            n = 0;
        }
    }
    free(m);
    return n;
}

/* Whether caches @p a and @p b hold the same persisted bytes. */
static bool same_state(kvt_cache **a, kvt_cache **b, size_t n)
{
    bool same = true;
    for (size_t i = 0; i < n && same; i++) {
        struct kvt_tensor ta[KVT_MAX_CACHE_TENSORS], tb[KVT_MAX_CACHE_TENSORS];
        int na = kvt_cache_state(a[i], ta), nb = kvt_cache_state(b[i], tb);
        same = na == nb && na > 0;
        for (int j = 0; j < na && j < nb; j++) {
            size_t bytes = kvt_tensor_nbytes(&ta[j]);
            uint8_t *x = malloc(bytes + 1), *y = malloc(bytes + 1);
            same = same && bytes == kvt_tensor_nbytes(&tb[j]);
            if (same) {
                kvt_tensor_copy_out(&ta[j], x);
                kvt_tensor_copy_out(&tb[j], y);
                same = memcmp(x, y, bytes) == 0;
            }
            free(x);
            free(y);
        }
        for (int j = 0; j < na; j++)
            kvt_tensor_release(&ta[j]);
        for (int j = 0; j < nb; j++)
            kvt_tensor_release(&tb[j]);
    }
    return same;
}

static void free_caches(kvt_cache **c, size_t n, kvt_buf *buf)
{
    for (size_t i = 0; i < n; i++)
        kvt_cache_free(c[i]);
    kvt_buf_unref(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (1u << 22))
        return 0;
    struct llama_shape sh = shape_of(data[0]);
    kvt_cache *c[4], *c2[4];
    kvt_buf *buf, *buf2;
    size_t n = caches_of(&sh, data + 1, size - 1, c, &buf);
    if (n == 0)
        return 0;
    size_t n1, n2;
    uint8_t *b1 = rebuild(&sh, c, n, &n1);
    CHECK(caches_of(&sh, b1, n1, c2, &buf2) == n);
    CHECK(same_state(c, c2, sh.n_layer));
    uint8_t *b2 = rebuild(&sh, c2, n, &n2);
    CHECK(n1 == n2 && memcmp(b1, b2, n1) == 0);
    free_caches(c2, sh.n_layer, buf2);
    free_caches(c, sh.n_layer, buf);
    free(b1);
    free(b2);
    return 0;
}
