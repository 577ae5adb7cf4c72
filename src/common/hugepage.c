/*
 * Huge-page advice (common/hugepage.h).
 */
#include "common/hugepage.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

bool kvt_hugepage_on(void)
{
    const char *v = getenv("KVT_HUGEPAGE");
    return !(v && !strcmp(v, "0"));
}

void kvt_hugepage_advise(void *p, size_t bytes)
{
    size_t whole = bytes & ~(KVT_HUGE_PAGE - 1);
    if (whole)
        madvise(p, whole, MADV_HUGEPAGE);
}
