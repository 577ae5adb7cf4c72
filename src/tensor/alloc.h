/*
 * Heap allocation for the value layers (tensors, caches, entries), with a fault switch so
 * tests can make the Nth allocation fail and check that every error path frees what it built.
 */
#ifndef KVT_ALLOC_H
#define KVT_ALLOC_H

#include <stddef.h>

void *kvt_malloc(size_t n);
void *kvt_calloc(size_t count, size_t size);
void kvt_free(void *p);
/** Duplicate a NUL-terminated string; NULL stays NULL; *rc = 0 or -ENOMEM. */
char *kvt_strdup(const char *s, int *rc);

/**
 * Let the next @p n allocations succeed and fail every one after them; a negative @p n turns
 * failures off again. Process-wide; for tests.
 */
void kvt_alloc_fail_after(long n);

#endif
