/*
 * The staging cache (staging.h): a few mappings kept after use, handed out again to a
 * stream that asks for the same size. Bounded: anything beyond the cache's slots is unmapped.
 */
#include "mem/staging.h"

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

#include "mem/hugepage.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* a save's write stream, a restore's read stream, or the read streams of a device load that
 * reads on several cores */
#define SLOTS 3
#define POPULATE_PIECE ((size_t)2 << 20)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    void *p;
    size_t bytes;
} cache[SLOTS];

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
    void *p = kvt_hugepage_map(bytes);
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
