/*
 * Huge-page advice and aligned mappings (mem/hugepage.h).
 */
#include "mem/hugepage.h"

#include "settings/settings.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Advise the whole huge pages of [p, p + bytes) (p on a huge-page boundary), before anything
 * touches them. Advisory: errors are ignored. */
static void advise(void *p, size_t bytes)
{
    size_t whole = bytes & ~(KVT_HUGE_PAGE - 1);
    if (whole)
        madvise(p, whole, MADV_HUGEPAGE);
}

void *kvt_hugepage_map(size_t bytes)
{
    bool huge = kvt_mem_hugepages() && bytes >= KVT_HUGE_PAGE;
    size_t extra = huge ? KVT_HUGE_PAGE : 0;
    uint8_t *m =
        mmap(NULL, bytes + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    if (!huge)
        return m;
    uint8_t *p = (uint8_t *)(((uintptr_t)m + KVT_HUGE_PAGE - 1) & ~(uintptr_t)(KVT_HUGE_PAGE - 1));
    /* keep exactly [p, p + bytes): the owner unmaps that */
    if (p > m)
        munmap(m, (size_t)(p - m));
    if (p + bytes < m + bytes + extra)
        munmap(p + bytes, (size_t)(m + bytes + extra - (p + bytes)));
    advise(p, bytes);
    return p;
}
