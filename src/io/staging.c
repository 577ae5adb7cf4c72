/*
 * The staging cache (staging.h): a couple of mappings kept after use, handed out again to a
 * stream that asks for the same size. Bounded: anything beyond the cache's slots is unmapped.
 */
#include "io/staging.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "common/hugepage.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define SLOTS 2
#define POPULATE_PIECE ((size_t)2 << 20)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    void *p;
    size_t bytes;
} cache[SLOTS];

/*
 * @p bytes of fresh memory on huge pages where they are on: each 2 MiB page is one physically
 * contiguous piece, so a direct request over it is a few large segments. Over 4 KiB pages the
 * device gets one segment per page, and once the process has churned memory those pages are
 * scattered: the block layer then splits each 4 MiB request at its segment limit (254 on
 * virtio-blk), and a 1 GiB save went out as about 2000 requests of 0.5 MiB instead of 340
 * of 3 MiB.
 */
static void *map_aligned(size_t bytes)
{
    bool huge = kvt_hugepage_on() && bytes >= KVT_HUGE_PAGE;
    size_t extra = huge ? KVT_HUGE_PAGE : 0;
    uint8_t *m =
        mmap(NULL, bytes + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    if (!huge)
        return m;
    uint8_t *p = (uint8_t *)(((uintptr_t)m + KVT_HUGE_PAGE - 1) & ~(uintptr_t)(KVT_HUGE_PAGE - 1));
    /* keep exactly [p, p + bytes): kvt_staging_put() unmaps that */
    if (p > m)
        munmap(m, (size_t)(p - m));
    if (p + bytes < m + bytes + extra)
        munmap(p + bytes, (size_t)(m + bytes + extra - (p + bytes)));
    kvt_hugepage_advise(p, bytes);
    return p;
}

void *kvt_staging_get(size_t bytes)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < SLOTS; i++) {
        if (cache[i].p && cache[i].bytes == bytes) {
            void *p = cache[i].p;
            cache[i].p = NULL;
            pthread_mutex_unlock(&mu);
            return p;
        }
    }
    pthread_mutex_unlock(&mu);
    void *p = map_aligned(bytes);
    if (!p)
        return NULL;
    /* Fault the pages in now, 2 MiB at a time: populating holds the process's mmap lock, and
     * one call over tens of megabytes would stall every other thread's mmap and page fault
     * (an engine's decode step among them) for as long as it takes. */
    for (size_t at = 0; at < bytes; at += POPULATE_PIECE) {
        size_t n = bytes - at < POPULATE_PIECE ? bytes - at : POPULATE_PIECE;
        if (madvise((char *)p + at, n, MADV_POPULATE_WRITE) != 0)
            memset((char *)p + at, 0, n);
    }
    return p;
}

void kvt_staging_put(void *p, size_t bytes)
{
    if (!p)
        return;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < SLOTS; i++) {
        if (!cache[i].p) {
            cache[i].p = p;
            cache[i].bytes = bytes;
            pthread_mutex_unlock(&mu);
            return;
        }
    }
    pthread_mutex_unlock(&mu);
    munmap(p, bytes);
}
