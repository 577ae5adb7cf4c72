/*
 * Refcounted byte buffers: 64-byte aligned host memory (page aligned from 64 KiB on, header and
 * data in one block; from 1 MiB on a mapping of the buffer cache, on huge pages where it holds
 * whole ones) or wrapped engine memory with a release callback that runs exactly once.
 * Refcounts and the exposed-rows mark are atomic so holders may live on different threads.
 */
#include "common/error.h"
#include "mem/hugepage.h"
#include "mem/buf_cache.h"
#include "tensor/alloc.h"
#include "tensor/tensor_parts.h"
#include "settings/settings.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define BUF_ALIGN 64
/* Large buffers start on a page, so that a restore can read file blocks straight into them
 * (O_DIRECT needs block-aligned memory); the waste is under one page per buffer. */
#define PAGE_ALIGN ((size_t)4096)
#define PAGE_ALIGN_MIN ((size_t)64 << 10)
/* Buffers from 1 MiB on are mappings of their own: from 2 MiB on they start on a 2 MiB boundary
 * and ask for transparent huge pages, as numpy does for its large arrays, so filling fresh
 * memory takes one fault per 2 MiB instead of 512 (KVT_HUGEPAGE=0 turns this off); and freed
 * ones go to the buffer cache, so the next buffer of a restore or a growing cache uses memory
 * the process holds (PERFORMANCE.md). From 1 MiB, not from 2: the tensors of entries of a few
 * hundred tokens (1.5 MiB for 512 tokens of an 8-head, 128-dim bf16 layer) gain the most,
 * since malloc gives their memory back to the system when they are freed. */
#define MAP_MIN ((size_t)1 << 20)

struct kvt_buf {
    atomic_int refs;
    _Atomic int64_t exposed;
    void *data;
    size_t size;
    kvt_release_fn release;
    void *ud;
    size_t map_len; /* data is a buffer-cache mapping of this length; 0: in the block */
    bool was_kept;  /* the mapping came back from the buffer cache: its pages are resident */
    bool zeroed;    /* all zeros as allocated (fresh memory, or cleared) */
    bool wrapped;
    bool device; /* data is NULL; the bytes are reached through ext */
    struct kvt_buf_ext ext;
};

static struct kvt_buf *init(struct kvt_buf *b, void *data, size_t bytes)
{
    atomic_init(&b->refs, 1);
    atomic_init(&b->exposed, 0);
    b->data = data;
    b->size = bytes;
    b->release = NULL;
    b->ud = NULL;
    b->map_len = 0;
    b->was_kept = false;
    b->zeroed = false;
    b->wrapped = false;
    b->device = false;
    return b;
}

static int map_alloc(size_t bytes, bool zero, kvt_buf **out)
{
    struct kvt_buf *b = kvt_malloc(sizeof(*b));
    size_t len = 0;
    bool kept = false;
    void *p = b ? kvt_buf_cache_take(bytes, &len, &kept) : NULL;
    if (!p) {
        kvt_free(b);
        return kvt_fail(-ENOMEM, "kvt_buf_new: cannot allocate %zu bytes", bytes);
    }
    /* a fresh mapping is zero already; clearing a kept one is cheaper than faulting in new
     * memory (which, where a hypervisor backs guest memory lazily, costs a host fault too) */
    if (zero && kept)
        memset(p, 0, bytes);
    init(b, p, bytes)->map_len = len;
    b->was_kept = kept;
    b->zeroed = zero || !kept;
    *out = b;
    return 0;
}

static int buf_alloc(size_t bytes, bool zero, kvt_buf **out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_buf_new: out is NULL");
    *out = NULL;
    if (bytes >= MAP_MIN)
        return map_alloc(bytes, zero, out);
    size_t total, align = bytes >= PAGE_ALIGN_MIN ? PAGE_ALIGN : BUF_ALIGN;
    if (__builtin_add_overflow(sizeof(struct kvt_buf) + align, bytes, &total))
        return kvt_fail(-ENOMEM, "kvt_buf_new: %zu bytes overflow", bytes);
    /* calloc of a large block maps fresh zero pages: no memset pass for big buffers */
    struct kvt_buf *b = zero ? kvt_calloc(1, total) : kvt_malloc(total);
    if (!b)
        return kvt_fail(-ENOMEM, "kvt_buf_new: cannot allocate %zu bytes", bytes);
    uintptr_t p = (uintptr_t)(b + 1);
    *out = init(b, (void *)((p + align - 1) & ~(uintptr_t)(align - 1)), bytes);
    b->zeroed = zero;
    return 0;
}

int kvt_buf_new(size_t bytes, kvt_buf **out)
{
    return buf_alloc(bytes, true, out);
}

int kvt_buf_new_uninit(size_t bytes, kvt_buf **out)
{
    return buf_alloc(bytes, false, out);
}

int kvt_buf_new_for_fill(size_t bytes, kvt_buf **out)
{
    /* calloc costs nothing for memory malloc maps afresh and a memset of under 1 MiB for a
     * reused block; a mapping is zero exactly when it is fresh */
    return buf_alloc(bytes, bytes < MAP_MIN, out);
}

int kvt_buf_wrap(void *data, size_t bytes, kvt_release_fn release, void *ud, kvt_buf **out)
{
    int rc;
    if (out)
        *out = NULL;
    if (!out) {
        rc = kvt_fail(-EINVAL, "kvt_buf_wrap: out is NULL");
        goto out_release;
    }
    if (!data && bytes) {
        rc = kvt_fail(-EINVAL, "kvt_buf_wrap: NULL data for %zu bytes", bytes);
        goto out_release;
    }
    struct kvt_buf *b = kvt_malloc(sizeof(*b));
    if (!b) {
        rc = kvt_fail(-ENOMEM, "kvt_buf_wrap: cannot allocate the buffer header");
        goto out_release;
    }
    init(b, data, bytes);
    b->release = release;
    b->ud = ud;
    b->wrapped = true;
    *out = b;
    return 0;

out_release:
    if (release)
        release(ud, data);
    return rc;
}

int kvt_buf_wrap_ext(const struct kvt_buf_ext *ext, size_t bytes, kvt_release_fn release, void *ud,
                     kvt_buf **out)
{
    struct kvt_buf *b = kvt_malloc(sizeof(*b));
    if (!b) {
        if (release)
            release(ud, NULL);
        return kvt_fail(-ENOMEM, "kvt_buf_wrap_device: cannot allocate the buffer header");
    }
    init(b, NULL, bytes);
    b->release = release;
    b->ud = ud;
    b->wrapped = true;
    b->device = true;
    b->ext = *ext;
    *out = b;
    return 0;
}

const struct kvt_buf_ext *kvt_buf_ext_of(const kvt_buf *b)
{
    return b && b->device ? &b->ext : NULL;
}

bool kvt_tensor_on_device(const struct kvt_tensor *t)
{
    return t && kvt_buf_ext_of(t->buf);
}

kvt_buf *kvt_buf_ref(kvt_buf *b)
{
    if (b)
        atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
    return b;
}

void kvt_buf_unref(kvt_buf *b)
{
    if (!b)
        return;
    if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (b->wrapped && b->release)
        b->release(b->ud, b->data);
    kvt_buf_cache_give(b->map_len ? b->data : NULL, b->map_len);
    kvt_free(b);
}

void *kvt_buf_data(const kvt_buf *b)
{
    return b ? b->data : NULL;
}

size_t kvt_buf_size(const kvt_buf *b)
{
    return b ? b->size : 0;
}

int kvt_buf_refcount(const kvt_buf *b)
{
    /* acquire: a holder that sees itself alone also sees the others' last reads as done */
    return b ? atomic_load_explicit(&((struct kvt_buf *)b)->refs, memory_order_acquire) : 0;
}

bool kvt_buf_is_wrapped(const kvt_buf *b)
{
    return b && b->wrapped;
}

size_t kvt_buf_small_tail(const kvt_buf *b)
{
    /* a mapping is advised in whole huge pages from its start (also each piece the buffer
     * cache cuts, which it cuts on a huge-page boundary); one under 2 MiB has none. Fresh
     * memory has no tail to avoid: a direct read faults its pages in as it pins them, and
     * 64 MiB entries (1.5 MiB tensors) restored in a new process took twice as long when
     * read through staging and copied into fresh pages. */
    if (!b || !b->map_len || !b->was_kept || !kvt_mem_hugepages())
        return SIZE_MAX;
    size_t whole = b->map_len & ~(KVT_HUGE_PAGE - 1);
    return whole < b->size ? whole : SIZE_MAX;
}

bool kvt_buf_zeroed(const kvt_buf *b)
{
    return b && b->zeroed;
}

void kvt_buf_expose(kvt_buf *b, int64_t rows)
{
    if (!b)
        return;
    int64_t cur = atomic_load_explicit(&b->exposed, memory_order_relaxed);
    while (cur < rows && !atomic_compare_exchange_weak_explicit(
                             &b->exposed, &cur, rows, memory_order_acq_rel, memory_order_relaxed))
        ;
}

int64_t kvt_buf_exposed(const kvt_buf *b)
{
    return b ? atomic_load_explicit(&((struct kvt_buf *)b)->exposed, memory_order_acquire) : 0;
}

void kvt_buf_unexpose(kvt_buf *b)
{
    if (b)
        atomic_store_explicit(&b->exposed, 0, memory_order_release);
}
