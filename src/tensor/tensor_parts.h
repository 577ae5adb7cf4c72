/*
 * Internal tensor-layer API: view validation, row-major run iteration over strided views
 * (what the file writer and reader stream), strided copies, hashing, and the buffer facts the
 * cache layer needs for copy-on-write (wrapped or not, exposed-rows high-water mark).
 */
#ifndef KVT_TENSOR_H
#define KVT_TENSOR_H

#include "kvtier.h"

/** 0 when @p t is a well-formed view (known dtype, rank 0..8, shape >= 0, fits in its buffer,
 *  size math without overflow); -EINVAL with a message otherwise. */
int kvt_tensor_check(const struct kvt_tensor *t);

/** Byte range [*lo, *hi) of the buffer that @p t addresses (empty: lo == hi == offset). */
void kvt_tensor_extent(const struct kvt_tensor *t, size_t *lo, size_t *hi);

/**
 * Call @p fn on the contiguous byte runs of @p t in row-major order: the concatenation of the
 * runs is exactly the C-contiguous bytes of the tensor (kvt_tensor_nbytes() in all). Inner
 * dimensions that are contiguous are merged, so a contiguous tensor is one run and a
 * [B,H,offset,D] slice of a [B,H,cap,D] buffer is B·H runs of offset·D·itemsize bytes.
 * Runs are never empty; a tensor with no elements has no runs.
 * @return 0, or the first non-zero value @p fn returned (iteration stops there).
 */
typedef int (*kvt_run_fn)(void *ud, const void *p, size_t n);
int kvt_tensor_for_each_run(const struct kvt_tensor *t, kvt_run_fn fn, void *ud);

/** The same runs as writable destinations, for filling @p t from a row-major byte stream. */
typedef int (*kvt_run_mut_fn)(void *ud, void *p, size_t n);
int kvt_tensor_for_each_run_mut(const struct kvt_tensor *t, kvt_run_mut_fn fn, void *ud);

/** Bytes of the largest run (0 for an empty tensor): the natural I/O chunk for @p t. */
size_t kvt_tensor_run_bytes(const struct kvt_tensor *t);

/** Fill @p dst from @p src, which holds kvt_tensor_nbytes(dst) bytes in row-major order. */
void kvt_tensor_copy_in(const struct kvt_tensor *dst, const void *src);

/**
 * Copy the elements of @p src into @p dst (same shape and item size; the views must not
 * overlap). @return 0 or -EINVAL.
 */
int kvt_tensor_copy(const struct kvt_tensor *dst, const struct kvt_tensor *src);

/** Wyhash (seed 0) of the row-major bytes of @p t, streamed over its runs (no copy). */
uint64_t kvt_tensor_hash(const struct kvt_tensor *t);

/**
 * Memory the host cannot address (a device's): its bytes are reached only through
 * @p read_out, which passes host copies of [@p addr, @p addr + @p n) to @p fn in order.
 */
struct kvt_buf_ext {
    int (*read_out)(void *ctx, uint64_t addr, uint64_t n, kvt_run_fn fn, void *ud);
    void *ctx;
    uint64_t addr;
};
/** A buffer over such memory; @p release(ud, NULL) runs exactly once, as for kvt_buf_wrap(). */
int kvt_buf_wrap_ext(const struct kvt_buf_ext *ext, size_t bytes, kvt_release_fn release, void *ud,
                     kvt_buf **out);
/** The buffer's device memory, or NULL for host memory. */
const struct kvt_buf_ext *kvt_buf_ext_of(const kvt_buf *b);
/** Whether @p t lies in device memory (only saves read such tensors). */
bool kvt_tensor_on_device(const struct kvt_tensor *t);

/** Whether @p b wraps engine memory (the cache layer never writes into such buffers). */
bool kvt_buf_is_wrapped(const kvt_buf *b);

/**
 * Where the small-page tail of @p b begins: a buffer-cache mapping whose length is not a whole
 * number of huge pages has its last part in 4 KiB pages (all of it, under 2 MiB), and a direct
 * read into those costs the device one segment per page. SIZE_MAX when there is no such tail
 * (the buffer is wholly on huge pages, is no mapping of its own or fresh memory, or huge
 * pages are off).
 */
size_t kvt_buf_small_tail(const kvt_buf *b);
/**
 * A buffer of @p bytes about to be filled except for some bytes that must read zero (a
 * restore's capacity slack): zero-filled where that costs little (under 1 MiB) or nothing (a
 * fresh mapping), otherwise as kvt_buf_new_uninit(); kvt_buf_zeroed() tells which, so the
 * caller clears those bytes only when it must and never faults in fresh pages to do it.
 */
int kvt_buf_new_for_fill(size_t bytes, kvt_buf **out);
/** Whether @p b was all zeros when allocated (fresh memory, or cleared): only until something
 * writes into it. */
bool kvt_buf_zeroed(const kvt_buf *b);

/*
 * Exposed rows: a per-buffer high-water mark, in token rows of the views the cache layer
 * keeps, of what holders other than the buffer's writer may read (CACHES.md §13). Atomic;
 * INT64_MAX means every row.
 */
#define KVT_ROWS_ALL INT64_MAX
void kvt_buf_expose(kvt_buf *b, int64_t rows);
int64_t kvt_buf_exposed(const kvt_buf *b);
/** Forget the mark; only for a holder that owns every reference. */
void kvt_buf_unexpose(kvt_buf *b);

#endif
