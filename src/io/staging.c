/*
 * The staging cache (staging.h): a couple of mappings kept after use, handed out again to a
 * stream that asks for the same size. Bounded: anything beyond the cache's slots is unmapped.
 */
#include "io/staging.h"

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define SLOTS 2

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
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (madvise(p, bytes, MADV_POPULATE_WRITE) != 0)
        memset(p, 0, bytes);
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
