/*
 * Refcounted byte buffers: 64-byte aligned host memory (page aligned from 64 KiB on, on a huge
 * page from 4 MiB on; header and data in one block) or wrapped engine memory with a release
 * callback that runs exactly once. Refcounts and the exposed-rows mark are atomic so holders
 * may live on different threads.
 */
#include "common/error.h"
#include "common/hugepage.h"
#include "tensor/alloc.h"
#include "tensor/tensor.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>

#define BUF_ALIGN 64
/* Large buffers start on a page, so that a restore can read file blocks straight into them
 * (O_DIRECT needs block-aligned memory); the waste is under one page per buffer. */
#define PAGE_ALIGN ((size_t)4096)
#define PAGE_ALIGN_MIN ((size_t)64 << 10)
/* Buffers from 4 MiB on start on a 2 MiB boundary and ask for transparent huge pages, as
 * numpy does for its large arrays: filling fresh memory, most of a restore's cost, takes one
 * fault per 2 MiB instead of 512 (PERFORMANCE.md). KVT_HUGEPAGE=0 turns this off. */
#define HUGE_ALIGN KVT_HUGE_PAGE
#define HUGE_ALIGN_MIN ((size_t)4 << 20)

struct kvt_buf {
    atomic_int refs;
    _Atomic int64_t exposed;
    void *data;
    size_t size;
    kvt_release_fn release;
    void *ud;
    bool wrapped;
};

static bool huge_pages_wanted(size_t bytes)
{
    return bytes >= HUGE_ALIGN_MIN && kvt_hugepage_on();
}

static int buf_alloc(size_t bytes, bool zero, kvt_buf **out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_buf_new: out is NULL");
    *out = NULL;
    bool huge = huge_pages_wanted(bytes);
    size_t total, align = huge ? HUGE_ALIGN : bytes >= PAGE_ALIGN_MIN ? PAGE_ALIGN : BUF_ALIGN;
    if (__builtin_add_overflow(sizeof(struct kvt_buf) + align, bytes, &total))
        return kvt_fail(-ENOMEM, "kvt_buf_new: %zu bytes overflow", bytes);
    /* calloc of a large block maps fresh zero pages: no memset pass for big buffers */
    struct kvt_buf *b = zero ? kvt_calloc(1, total) : kvt_malloc(total);
    if (!b)
        return kvt_fail(-ENOMEM, "kvt_buf_new: cannot allocate %zu bytes", bytes);
    uintptr_t p = (uintptr_t)(b + 1);
    p = (p + align - 1) & ~(uintptr_t)(align - 1);
    atomic_init(&b->refs, 1);
    atomic_init(&b->exposed, 0);
    b->data = (void *)p;
    b->size = bytes;
    b->release = NULL;
    b->ud = NULL;
    b->wrapped = false;
    if (huge) /* before the first touch, which would fault 4 KiB pages */
        kvt_hugepage_advise(b->data, bytes);
    *out = b;
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
    atomic_init(&b->refs, 1);
    atomic_init(&b->exposed, 0);
    b->data = data;
    b->size = bytes;
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
