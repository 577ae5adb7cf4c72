/*
 * Transparent huge pages for the library's own large memory: tensors a restore allocates and
 * the streams' staging, unless kvt_mem_opts.no_hugepages turns them off (kvt_mem_hugepages()).
 */
#ifndef KVT_HUGEPAGE_H
#define KVT_HUGEPAGE_H

#include <stdbool.h>
#include <stddef.h>

#define KVT_HUGE_PAGE ((size_t)2 << 20)

/**
 * A fresh private anonymous mapping of exactly @p bytes (a multiple of the page size). From
 * KVT_HUGE_PAGE on, where huge pages are on, it starts on a huge-page boundary and is advised
 * for them: each 2 MiB page is one physically contiguous piece, so a direct request over it
 * is a few large segments, and filling it takes one fault per 2 MiB instead of 512.
 * @return the mapping (free it with munmap()), or NULL.
 */
void *kvt_hugepage_map(size_t bytes);

#endif
