/*
 * Internal cache-layer structures shared by the per-kind files: the cache object, its arrays,
 * validation of appended tensors and restored state, and the copy-on-write rules.
 *
 * Sharing model (CACHES.md §13). Each array is an owned view of a refcounted buffer. The cache
 * that allocated a buffer is its "owner" and may write rows that no other holder can read;
 * every view handed out (clone, state, window) raises the buffer's exposed-rows mark to the
 * rows it covers (all rows for rings and ssm). A write of rows [r, ...) goes in place when
 * the writer holds every reference of the buffer (then the mark is cleared), or when it is
 * the owner and r >= mark; otherwise it copies first. Wrapped engine memory is never written.
 */
#ifndef KVT_CACHE_H
#define KVT_CACHE_H

#include "kvtier.h"
#include "tensor/tensor_parts.h"

struct kvt_arr {
    struct kvt_tensor t; /* owned; token-axis kinds [B, H, rows, ·], rows >= the cache's cap */
    bool owner;          /* may write rows beyond the buffer's exposed mark */
};

struct kvt_cache {
    struct kvt_cache_info info;
    int nt;          /* tensors of the kind */
    bool has_buf;    /* false until the first append (or update) */
    bool exact_cap;  /* step kinds: cap is a clone's [0, offset) region, not STEP growth */
    bool last_multi; /* rings: the last append had L > 1 */
    int64_t cap;     /* step kinds: capacity in rows; rings: S */
    struct kvt_arr a[KVT_MAX_CACHE_TENSORS];
};

/* kv, qkv, turboquant: STEP growth along axis 2. */
bool kvt_kind_is_step(int kind);
/* rotating, rotating-qkv */
bool kvt_kind_is_ring(int kind);

/** Validate kind parameters (max_size, group_size/bits, k_bits/v_bits). -EINVAL. */
int kvt_cache_check_params(const struct kvt_cache_info *p);
/** Validate appended tensors against the kind's roles and the cache's current layout. */
/** FORMAT.md V21: the first cache of @p e (no NULL ones) other than ssm whose offset is not
 *  the entry's token count, or -1 when every one covers every token. */
long kvt_entry_uncovered(const struct kvt_entry *e);
/** Whether a tensor of @p e lies in device memory. */
bool kvt_entry_on_device(const struct kvt_entry *e);
/** KVT_E_UNSUPPORTED when @p c or one of @p in lies in device memory (saved, never changed). */
int kvt_cache_check_host(const char *what, const kvt_cache *c, const struct kvt_tensor *in,
                         int nin);
int kvt_cache_check_input(const kvt_cache *c, const struct kvt_tensor *in, int nin);
/** Validate a tensor set of kind info->kind alone (roles, shapes, no overlap); @p what
 *  starts the message. */
int kvt_cache_check_tensors(const char *what, const struct kvt_cache_info *info,
                            const struct kvt_tensor *t, int nt);
/** Validate tensors and scalars handed to kvt_cache_from_state(). */
int kvt_cache_check_state(const struct kvt_cache_info *info, const struct kvt_tensor *t, int nt);

/* copy-on-write helpers (cow.c) */
bool kvt_arr_sole(const kvt_cache *c, int i);
bool kvt_arr_writable(kvt_cache *c, int i, int64_t row0);
/** Raise the exposed mark of every array to @p rows. */
void kvt_cache_expose(const kvt_cache *c, int64_t rows);
/** A zero-filled (or uninitialized) tensor shaped like @p like with @p rows on axis 2. */
int kvt_arr_alloc(struct kvt_tensor *t, const struct kvt_tensor *like, int64_t rows, bool zero);
/** Copy rows [s0, s0 + n) of @p src to rows [d0, d0 + n) of @p dst along axis 2. */
void kvt_rows_copy(const struct kvt_tensor *dst, int64_t d0, const struct kvt_tensor *src,
                   int64_t s0, int64_t n);
/** Replace array @p i by @p t (taking over its reference) as a buffer this cache owns. */
void kvt_arr_replace(kvt_cache *c, int i, struct kvt_tensor *t);
void kvt_tensors_release(struct kvt_tensor *t, int n);

/* per kind */
int kvt_step_append(kvt_cache *c, const struct kvt_tensor *in, int64_t l);
int kvt_ring_append(kvt_cache *c, const struct kvt_tensor *in, int64_t l);
int kvt_ring_trim(kvt_cache *c, int64_t n);

#endif
