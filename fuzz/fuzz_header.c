/*
 * Fuzz target: the header reader on bytes in memory (FORMAT.md V1-V20) and the serializer on
 * whatever the reader accepts.
 *
 * Each input is tried twice. First as a whole file image (kvt_header_parse on the bytes, and
 * kvt_file_read_header on the same bytes as a file: both must agree). Then as header JSON
 * behind a prefix built here, with the right headerLen, dataStart and header hash, so the
 * mutations reach the JSON and structural checks instead of stopping at V6: the JSON is the
 * input itself when it starts with '{', or the JSON region of a file image.
 *
 * Properties checked on every accepted header: the predicates run; the header passes the
 * writer's own checks; serializing it and reading the result back gives the same fields, and
 * serializing that again gives the same bytes.
 */
#include "fuzz.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"
#include "kvtier.h"

#define VIRTUAL_DATA ((uint64_t)1 << 20) /* data region behind a bare JSON input */

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Prefix + @p json in a new buffer (*n receives its length); *file_size for @p data_bytes. */
static uint8_t *build_image(const uint8_t *json, size_t len, uint64_t data_bytes, size_t *n,
                            uint64_t *file_size)
{
    if (len == 0 || len > UINT32_MAX - 2 * KVT_ALIGN)
        return NULL;
    uint8_t *img = malloc(KVT_PREFIX_LEN + len);
    if (!img)
        return NULL;
    uint64_t ds = kvt_align_up(KVT_PREFIX_LEN + (uint64_t)len);
    memcpy(img, KVT_MAGIC, KVT_MAGIC_LEN);
    put_le32(img + 10, (uint32_t)len);
    put_le32(img + 14, (uint32_t)ds);
    put_le64(img + 18, kvt_wyhash(0, json, len));
    memcpy(img + KVT_PREFIX_LEN, json, len);
    *n = KVT_PREFIX_LEN + len;
    *file_size = ds + data_bytes;
    return img;
}

static bool str_eq(const char *a, const char *b)
{
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

static bool same_header(const struct kvt_header *a, const struct kvt_header *b)
{
    if (a->format_version != b->format_version || a->created_at != b->created_at ||
        !str_eq(a->model_id, b->model_id) ||
        !str_eq(a->config_fingerprint, b->config_fingerprint) ||
        !str_eq(a->tokenizer_hash, b->tokenizer_hash) || !str_eq(a->ns, b->ns) ||
        a->n_tokens != b->n_tokens || a->n_caches != b->n_caches)
        return false;
    if (a->n_tokens && memcmp(a->tokens, b->tokens, a->n_tokens * sizeof(*a->tokens)) != 0)
        return false;
    for (size_t i = 0; i < a->n_caches; i++) {
        const struct kvt_cache_header *x = &a->caches[i], *y = &b->caches[i];
        if (memcmp(&x->info, &y->info, sizeof(x->info)) != 0 || x->n_slots != y->n_slots)
            return false;
        for (int j = 0; j < x->n_slots; j++) {
            const struct kvt_slot *s = &x->slots[j], *t = &y->slots[j];
            if (s->off != t->off || s->bytes != t->bytes || s->dtype != t->dtype ||
                s->rank != t->rank || s->hash != t->hash ||
                memcmp(s->shape, t->shape, (size_t)s->rank * sizeof(s->shape[0])) != 0)
                return false;
        }
    }
    return true;
}

/* Serialize @p h, read it back, compare; serialize again, compare bytes. */
static void check_round_trip(const struct kvt_header *h)
{
    if (kvt_header_check_writable(h) != 0)
        fuzz_fail("a header the reader accepts fails the writer's checks");
    struct kvt_sbuf j1 = {0}, j2 = {0};
    if (kvt_header_to_json(h, &j1) != 0) {
        kvt_sbuf_free(&j1);
        return; /* out of memory */
    }
    size_t n;
    uint64_t fsize;
    uint8_t *img =
        build_image((const uint8_t *)j1.data, j1.len, h->file_size - h->data_start, &n, &fsize);
    if (!img) {
        kvt_sbuf_free(&j1);
        return;
    }
    struct kvt_header *back = NULL;
    int rc = kvt_header_parse(img, n, fsize, NULL, "round-trip", &back);
    if (rc != 0)
        fuzz_fail("the serialized form of an accepted header does not read back");
    if (!same_header(h, back))
        fuzz_fail("a header read back from its serialized form differs");
    if (kvt_header_to_json(back, &j2) == 0 &&
        (j2.len != j1.len || memcmp(j1.data, j2.data, j1.len) != 0))
        fuzz_fail("serializing a header twice gives different bytes");
    kvt_header_free(back);
    free(img);
    kvt_sbuf_free(&j1);
    kvt_sbuf_free(&j2);
}

static void accepted(const struct kvt_header *h)
{
    (void)kvt_header_is_trimmable(h);
    (void)kvt_header_is_indexable(h);
    check_round_trip(h);
}

static void as_file(const uint8_t *data, size_t size)
{
    struct kvt_header *h = NULL;
    int rc = kvt_header_parse(data, size, size, NULL, "fuzz", &h);
    if (rc == 0)
        accepted(h);
    else if (h)
        fuzz_fail("a failed parse left an output");

    const char *path = fuzz_memfile(data, size);
    if (path) {
        struct kvt_header *h2 = NULL;
        int rc2 = kvt_file_read_header(path, NULL, &h2);
        if (rc2 != rc && rc2 != -ENOMEM && rc != -ENOMEM)
            fuzz_fail("reading a header from memory and from a file disagree");
        if (rc == 0 && rc2 == 0 && !same_header(h, h2))
            fuzz_fail("reading a header from memory and from a file give different fields");
        kvt_header_free(h2);
    }
    kvt_header_free(h);
}

static void as_json(const uint8_t *data, size_t size)
{
    const uint8_t *json = data;
    size_t len = size;
    uint64_t data_bytes = VIRTUAL_DATA;
    if (size >= KVT_PREFIX_LEN && memcmp(data, KVT_MAGIC, KVT_MAGIC_LEN) == 0) {
        uint64_t hl = get_le32(data + 10);
        uint64_t ds = get_le32(data + 14);
        json = data + KVT_PREFIX_LEN;
        len = size - KVT_PREFIX_LEN;
        if (hl < len)
            len = (size_t)hl;
        data_bytes = size > ds ? size - ds : 0;
    } else if (size == 0 || data[0] != '{') {
        return;
    }
    size_t n;
    uint64_t fsize;
    uint8_t *img = build_image(json, len, data_bytes, &n, &fsize);
    if (!img)
        return;
    struct kvt_header *h = NULL;
    if (kvt_header_parse(img, n, fsize, NULL, "fuzz-json", &h) == 0)
        accepted(h);
    kvt_header_free(h);
    free(img);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    as_file(data, size);
    as_json(data, size);
    return 0;
}
