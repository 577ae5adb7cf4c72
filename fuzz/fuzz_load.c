/*
 * Fuzz target: the full load path on a file image (FORMAT.md §11, STORE.md §8). The input is
 * written to an in-memory file and loaded with tensor hashes checked and unchecked, and
 * verified with kvt_file_verify. A file image whose JSON region is intact apart from its hash
 * is also tried with the header hash fixed, so mutations of the JSON get past V6 and reach
 * the structural checks, the capacity arithmetic and the tensor reads.
 *
 * The same bytes are also fed in odd-sized pieces to the fed loader (what remote restores
 * use), which must give the file loader's result code and, on success, the same entry.
 *
 * Properties checked: a load that checks hashes and succeeds implies that the unchecked load
 * succeeds with the same scalars and tensor bytes and that kvt_file_verify accepts the file;
 * every restored tensor hashes to its slot's hash; a failed load leaves no output; a load
 * allocates at most twice the file's size plus 64 MiB of restore slack.
 */
#include "fuzz.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format/format.h"
#include "kvtier.h"
#include "tensor/tensor_parts.h"

/* A load may allocate the file's tensor bytes, as much again in slack, or 64 MiB of slack. */
#define FREE_SLACK_BYTES ((uint64_t)64 << 20)

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

/* The fed load of @p data (pieces of up to 4093 bytes): its result, *@p out on success. */
static int feed_image(const uint8_t *data, size_t size, struct kvt_entry **out)
{
    struct kvt_feed *f;
    int rc = kvt_feed_new(size, NULL, "fed", &f);
    for (size_t at = 0; rc == 0 && at < size;) {
        uint8_t *dst;
        size_t len;
        rc = kvt_feed_next(f, &dst, &len);
        if (rc)
            break;
        len = len < 4093 ? len : 4093;
        memcpy(dst, data + at, len);
        rc = kvt_feed_wrote(f, len);
        at += len;
    }
    *out = NULL;
    if (f) {
        int done = kvt_feed_finish(f, out, NULL);
        rc = rc ? rc : done;
    }
    kvt_feed_free(f);
    return rc;
}

static void load_image(const uint8_t *data, size_t size)
{
    const char *path = fuzz_memfile(data, size);
    if (!path)
        return;
    struct kvt_header *h = NULL;
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
    struct kvt_entry *e_fed = NULL;
    int rc_fed = feed_image(data, size, &e_fed);
    if (rc_fed != rc_on && rc_fed != -ENOMEM && rc_on != -ENOMEM)
        fuzz_fail("the fed load and the file load disagree");
    if (rc_fed != 0 && e_fed)
        fuzz_fail("a failed fed load left an output");
    if (rc_on == 0 && rc_fed == 0)
        check_entry(h, e_on, e_fed);
    kvt_entry_free(e_fed);
    if (rc_on == 0) {
        if (rc_off != 0 && rc_off != -ENOMEM)
            fuzz_fail("a file loads with hash checks but not without");
        if (rc_verify != 0 && rc_verify != -ENOMEM)
            fuzz_fail("a file that loads with hash checks fails kvt_file_verify");
        if (rc_off == 0)
            check_entry(h, e_on, e_off);
        if (kvt_entry_bytes(e_on) > 2 * (uint64_t)size + FREE_SLACK_BYTES)
            fuzz_fail("a load allocated more than the file can justify");
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
