/*
 * Entries in device memory for the device and tier suites: host entries copied into
 * allocations of a device, each wrapped so that its release frees it (counted).
 */
#include "support/support.h"

#include <stdlib.h>
#include <string.h>

int synth_device_live;

struct dev_alloc {
    kvt_device *d;
    uint64_t addr;
};

void *synth_device_hold(kvt_device *d, uint64_t addr)
{
    struct dev_alloc *a = malloc(sizeof(*a));
    *a = (struct dev_alloc){d, addr};
    synth_device_live++;
    return a;
}

void synth_device_release(void *ud, void *data)
{
    struct dev_alloc *a = ud;
    assert_null(data);
    kvt_device_free(a->d, a->addr);
    free(a);
    synth_device_live--;
}

kvt_buf *synth_device_buf(kvt_device *d, uint64_t addr, size_t n)
{
    kvt_buf *b;
    assert_int_equal(
        kvt_buf_wrap_device(d, addr, n, synth_device_release, synth_device_hold(d, addr), &b), 0);
    return b;
}

/* Cache @p c's state copied into device memory, as a cache over it. */
static kvt_cache *device_cache(kvt_device *d, const kvt_cache *c)
{
    struct kvt_cache_info info;
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS], dt[KVT_MAX_CACHE_TENSORS];
    kvt_cache_get_info(c, &info);
    int nt = kvt_cache_state(c, st);
    assert_true(nt > 0);
    for (int k = 0; k < nt; k++) {
        size_t n = kvt_tensor_nbytes(&st[k]);
        uint8_t *flat = malloc(n + 1);
        kvt_tensor_copy_out(&st[k], flat);
        uint64_t addr;
        assert_int_equal(kvt_device_alloc(d, n, &addr), 0);
        assert_int_equal(kvt_device_upload(d, addr, flat, n), 0);
        kvt_buf *b = synth_device_buf(d, addr, n);
        assert_int_equal(kvt_tensor_init(&dt[k], b, 0, st[k].dtype, st[k].rank, st[k].shape), 0);
        kvt_buf_unref(b);
        kvt_tensor_release(&st[k]);
        free(flat);
    }
    kvt_cache *out;
    assert_int_equal(kvt_cache_from_state(&info, dt, nt, &out), 0);
    for (int k = 0; k < nt; k++)
        kvt_tensor_release(&dt[k]);
    return out;
}

struct kvt_entry *synth_device_twin(kvt_device *d, const struct kvt_entry *e, const char *model,
                                    const char *fp, const char *tok_hash)
{
    kvt_cache *c[64];
    assert_true(e->n_caches <= 64);
    for (size_t i = 0; i < e->n_caches; i++)
        c[i] = device_cache(d, e->caches[i]);
    struct kvt_entry *out;
    assert_int_equal(kvt_entry_new(e->tokens, e->n_tokens, c, e->n_caches, "", &out), 0);
    out->meta.model_id = strdup(model);
    out->meta.config_fingerprint = strdup(fp);
    out->meta.tokenizer_hash = strdup(tok_hash);
    return out;
}
