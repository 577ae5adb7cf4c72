/*
 * Fuzz target: the full load path on a file image (FORMAT.md §11, STORE.md §8). The input is
 * written to an in-memory file and loaded with tensor hashes checked and unchecked, and
 * verified with kvt_file_verify. A file image whose JSON region is intact apart from its hash
 * is also tried with the header hash fixed, so mutations of the JSON get past V6 and reach
 * the structural checks, the capacity arithmetic and the tensor reads.
 *
 * Properties checked: a load that checks hashes and succeeds implies that the unchecked load
 * succeeds with the same scalars and tensor bytes and that kvt_file_verify accepts the file;
 * every restored tensor hashes to its slot's hash; a failed load leaves no output.
 */
#include "fuzz.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"
#include "kvtier.h"
#include "tensor/tensor.h"

/* A load larger than this is skipped (the header is read first to size it). */
#define MAX_RESTORE_BYTES ((uint64_t)256 << 20)

static bool mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

/* The bytes a load of @p h allocates (token-axis kinds get STEP capacity), or UINT64_MAX. */
static uint64_t restore_bytes(const struct kvt_header *h)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < h->n_caches; i++) {
        const struct kvt_cache_header *c = &h->caches[i];
        int kind = c->info.kind;
        bool step = kind == KVT_KIND_KV || kind == KVT_KIND_QKV || kind == KVT_KIND_TURBOQUANT;
        for (int j = 0; j < c->n_slots; j++) {
            const struct kvt_slot *s = &c->slots[j];
            uint64_t b = s->bytes;
            if (step) {
                uint64_t cap = ((uint64_t)c->info.offset + KVT_STEP) / KVT_STEP * KVT_STEP;
                b = kvt_dtype_size(s->dtype);
                for (int d = 0; d < s->rank; d++)
                    if (!mul_ok(b, d == 2 ? cap : (uint64_t)s->shape[d], &b))
                        return UINT64_MAX;
            }
            if (__builtin_add_overflow(sum, b, &sum))
                return UINT64_MAX;
        }
    }
    return sum;
}

static void check_entry(const struct kvt_header *h, const struct kvt_entry *on,
                        const struct kvt_entry *off)
{
    if (on->n_caches != h->n_caches || off->n_caches != h->n_caches ||
        on->n_tokens != h->n_tokens || off->n_tokens != h->n_tokens)
        fuzz_fail("a loaded entry does not match its header's counts");
    if (h->n_tokens && (memcmp(on->tokens, h->tokens, h->n_tokens * sizeof(int32_t)) != 0 ||
                        memcmp(off->tokens, h->tokens, h->n_tokens * sizeof(int32_t)) != 0))
        fuzz_fail("a loaded entry's tokens differ from its header's");
    for (size_t i = 0; i < h->n_caches; i++) {
        struct kvt_cache_info a, b;
        kvt_cache_get_info(on->caches[i], &a);
        kvt_cache_get_info(off->caches[i], &b);
        if (memcmp(&a, &b, sizeof(a)) != 0 || a.offset != h->caches[i].info.offset ||
            a.kind != h->caches[i].info.kind)
            fuzz_fail("loads with and without hash checks give different scalars");
        struct kvt_tensor ta[KVT_MAX_CACHE_TENSORS], tb[KVT_MAX_CACHE_TENSORS];
        int na = kvt_cache_state(on->caches[i], ta);
        int nb = kvt_cache_state(off->caches[i], tb);
        if (na != nb)
            fuzz_fail("loads with and without hash checks give different states");
        if (na > 0 && na != h->caches[i].n_slots)
            fuzz_fail("a restored cache persists a different number of tensors");
        for (int j = 0; j < na; j++) {
            const struct kvt_slot *s = &h->caches[i].slots[j];
            if (kvt_tensor_nbytes(&ta[j]) != s->bytes || kvt_tensor_nbytes(&tb[j]) != s->bytes)
                fuzz_fail("a restored tensor's size differs from its slot's");
            if (kvt_tensor_hash(&ta[j]) != s->hash || kvt_tensor_hash(&tb[j]) != s->hash)
                fuzz_fail("restored tensor bytes differ from the file's");
        }
        for (int j = 0; j < na; j++)
            kvt_tensor_release(&ta[j]);
        for (int j = 0; j < nb; j++)
            kvt_tensor_release(&tb[j]);
    }
}

static void load_image(const uint8_t *data, size_t size)
{
    const char *path = fuzz_memfile(data, size);
    if (!path)
        return;
    struct kvt_header *h = NULL;
    if (kvt_header_parse(data, size, size, NULL, "fuzz", &h) == 0 &&
        restore_bytes(h) > MAX_RESTORE_BYTES) {
        kvt_header_free(h);
        return;
    }
    kvt_header_free(h);
    h = NULL;

    struct kvt_expect on = {.keep_cache = true};
    struct kvt_expect off = {.keep_cache = true, .no_verify = true};
    struct kvt_entry *e_on = NULL, *e_off = NULL;
    int rc_on = kvt_file_load(path, &on, &e_on, &h);
    if (rc_on != 0 && (e_on || h))
        fuzz_fail("a failed load left an output");
    int rc_off = kvt_file_load(path, &off, &e_off, NULL);
    if (rc_off != 0 && e_off)
        fuzz_fail("a failed load left an output");
    int rc_verify = kvt_file_verify(path, &on);
    if (rc_on == 0) {
        if (rc_off != 0 && rc_off != -ENOMEM)
            fuzz_fail("a file loads with hash checks but not without");
        if (rc_verify != 0 && rc_verify != -ENOMEM)
            fuzz_fail("a file that loads with hash checks fails kvt_file_verify");
        if (rc_off == 0)
            check_entry(h, e_on, e_off);
    }
    kvt_entry_free(e_on);
    kvt_entry_free(e_off);
    kvt_header_free(h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    load_image(data, size);
    if (size < KVT_PREFIX_LEN || memcmp(data, KVT_MAGIC, KVT_MAGIC_LEN) != 0)
        return 0;
    uint32_t hl = (uint32_t)data[10] | (uint32_t)data[11] << 8 | (uint32_t)data[12] << 16 |
                  (uint32_t)data[13] << 24;
    if (hl == 0 || hl > size - KVT_PREFIX_LEN)
        return 0;
    uint64_t hash = kvt_wyhash(0, data + KVT_PREFIX_LEN, hl);
    uint8_t stored[8];
    for (int i = 0; i < 8; i++)
        stored[i] = (uint8_t)(hash >> (8 * i));
    if (memcmp(data + 18, stored, 8) == 0)
        return 0; /* already tried as is */
    uint8_t *fixed = malloc(size);
    if (!fixed)
        return 0;
    memcpy(fixed, data, size);
    memcpy(fixed + 18, stored, 8);
    load_image(fixed, size);
    free(fixed);
    return 0;
}
