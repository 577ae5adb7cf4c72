/*
 * Whether a destination a placement gives may receive a slot's bytes (load_into, restores into
 * memory the caller owns, restores into device memory). A 1-D uint8 destination (bytearray,
 * memoryview of bytes, a uint8 vector) is raw bytes and needs room for the slot. Anything
 * typed must be exactly the slot's tensor: its dtype and shape, so that no row lands where
 * the caller's indexing does not expect it. Where a library cannot express the slot's dtype
 * (numpy has no bfloat16, torch 1.13 no uint16/32/64), an integer of the same item size
 * holding the bit patterns stands in, as the views kvtier hands out do.
 */
#include "ext.h"

#include <stdio.h>

static bool dtype_fits(int slot, int dest)
{
    if (dest == slot)
        return true;
    bool no_peer =
        slot == KVT_BFLOAT16 || slot == KVT_UINT16 || slot == KVT_UINT32 || slot == KVT_UINT64;
    bool integer = dest >= KVT_UINT8 && dest <= KVT_INT64;
    return no_peer && integer && kvt_dtype_size(dest) == kvt_dtype_size(slot);
}

/* "[1, 4, 200, 64]" */
static void shape_str(char *out, size_t cap, int ndim, const int64_t *shape)
{
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < ndim && i < KVT_MAX_RANK && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap)
        snprintf(out + n, cap - n, "%s]", ndim > KVT_MAX_RANK ? ", ..." : "");
}

int kvtpy_dest_fits(size_t k, const struct kvt_header *h, size_t ci, int sj, int dtype, int ndim,
                    const int64_t *shape, size_t bytes)
{
    const struct kvt_slot *s = &h->caches[ci].slots[sj];
    if (dtype == KVT_UINT8 && ndim <= 1) {
        if (bytes >= s->bytes)
            return 0;
        PyErr_Format(PyExc_ValueError,
                     "destination %zu (layer %zu, tensor %d) holds %zu bytes, the slot has %llu", k,
                     ci, sj, bytes, (unsigned long long)s->bytes);
        return -1;
    }
    bool same_shape = ndim == s->rank;
    for (int i = 0; same_shape && i < ndim; i++)
        same_shape = shape[i] == s->shape[i];
    if (same_shape && dtype_fits(s->dtype, dtype))
        return 0;
    char have[160], want[160];
    shape_str(have, sizeof(have), ndim, shape);
    shape_str(want, sizeof(want), s->rank, s->shape);
    PyErr_Format(PyExc_ValueError,
                 "destination %zu (layer %zu, tensor %d) is %s %s, the slot is %s %s: a typed "
                 "destination must have the slot's dtype and shape (raw bytes: a 1-D uint8 "
                 "buffer)",
                 k, ci, sj, dtype < 0 ? "of an unknown dtype" : kvt_dtype_name(dtype), have,
                 kvt_dtype_name(s->dtype), want);
    return -1;
}
