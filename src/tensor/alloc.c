/*
 * The allocation shim behind alloc.h: plain malloc/calloc plus a process-wide countdown that
 * tests use to fail a chosen allocation and exercise cleanup paths.
 */
#include "tensor/alloc.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static atomic_long fail_countdown = -1;

static int should_fail(void)
{
    long v = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
    while (v >= 0) {
        if (v == 0)
            return 1;
        if (atomic_compare_exchange_weak(&fail_countdown, &v, v - 1))
            return 0;
    }
    return 0;
}

void kvt_alloc_fail_after(long n)
{
    atomic_store(&fail_countdown, n < 0 ? -1 : n);
}

void *kvt_malloc(size_t n)
{
    if (should_fail())
        return NULL;
    return malloc(n ? n : 1);
}

void *kvt_calloc(size_t count, size_t size)
{
    if (should_fail())
        return NULL;
    if (count == 0 || size == 0)
        return calloc(1, 1);
    return calloc(count, size);
}

void kvt_free(void *p)
{
    free(p);
}

char *kvt_strdup(const char *s, int *rc)
{
    *rc = 0;
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *d = kvt_malloc(n);
    if (!d) {
        *rc = -ENOMEM;
        return NULL;
    }
    memcpy(d, s, n);
    return d;
}
