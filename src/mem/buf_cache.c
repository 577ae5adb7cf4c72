/*
 * The buffer cache (mem/buf_cache.h): a small table of kept mappings under one lock. A take
 * picks the smallest kept mapping that is large enough and keeps its tail beyond the request
 * (cut on a huge-page boundary) for later takes; a take that finds none unmaps as much of the
 * longest-kept memory as it asks for before mapping afresh; a give that pushes the cache over
 * its limit unmaps the longest-kept mappings. Unmapping happens outside the lock.
 */
#include "mem/buf_cache.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mem/hugepage.h"
#include "kvtier.h"

#define SLOTS 256
/* Default limit: an eighth of physical memory, at most this. */
#define DEFAULT_MAX ((size_t)8 << 30)

struct kept {
    uint8_t *p;
    size_t len;
    uint64_t seq; /* when it was kept: the oldest goes first */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct kept kept[SLOTS];
static size_t n_kept, held, limit;
static uint64_t seq;

/* Off by default under AddressSanitizer: a use after free then faults on the unmapped buffer. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

/* A fork never finds the lock held by a thread that does not exist in the child. */
static void fork_prepare(void)
{
    pthread_mutex_lock(&mu);
}

static void fork_done(void)
{
    pthread_mutex_unlock(&mu);
}

size_t kvt_buf_cache_default_limit(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t d = pages > 0 && page > 0 && !SANITIZED ? (size_t)pages / 8 * (size_t)page : 0;
    return d > DEFAULT_MAX ? DEFAULT_MAX : d;
}

static void init_limit(void)
{
    pthread_atfork(fork_prepare, fork_done, fork_done);
    limit = kvt_buf_cache_default_limit();
}

/* @p bytes rounded up to whole pages; 0 when that leaves no room to align the mapping. */
static size_t page_round(size_t bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (bytes > SIZE_MAX - 2 * KVT_HUGE_PAGE)
        return 0;
    return (bytes + page - 1) & ~(page - 1);
}

static void drop(size_t i)
{
    held -= kept[i].len;
    kept[i] = kept[--n_kept];
}

/* Keep [p, p + len) (the lock held); false when the table is full. */
static bool keep(uint8_t *p, size_t len)
{
    if (n_kept == SLOTS)
        return false;
    kept[n_kept++] = (struct kept){p, len, ++seq};
    held += len;
    return true;
}

/* Take the oldest kept mappings out while more than @p max bytes or @p slots entries stay (the
 * lock held); they go to @p out. */
static size_t shrink_to(size_t max, size_t slots, struct kept *out)
{
    size_t n = 0;
    while ((held > max || n_kept > slots) && n_kept) {
        size_t old = 0;
        for (size_t i = 1; i < n_kept; i++)
            if (kept[i].seq < kept[old].seq)
                old = i;
        out[n++] = kept[old];
        drop(old);
    }
    return n;
}

/* Unmap the @p n mappings taken out into @p out (the lock not held). */
static void unmap_all(const struct kept *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        munmap(out[i].p, out[i].len);
}

void *kvt_buf_cache_take(size_t bytes, size_t *len, bool *was_kept)
{
    pthread_once(&once, init_limit);
    size_t want = page_round(bytes);
    *was_kept = false;
    if (want == 0)
        return NULL;
    pthread_mutex_lock(&mu);
    size_t best = n_kept;
    for (size_t i = 0; i < n_kept; i++)
        if (kept[i].len >= want && (best == n_kept || kept[i].len < kept[best].len))
            best = i;
    if (best < n_kept) {
        struct kept k = kept[best];
        drop(best);
        /* the tail past the next huge-page boundary stays kept, still on huge pages */
        size_t cut = (want + KVT_HUGE_PAGE - 1) & ~(KVT_HUGE_PAGE - 1);
        if (cut < k.len && keep(k.p + cut, k.len - cut))
            k.len = cut;
        pthread_mutex_unlock(&mu);
        *len = k.len;
        *was_kept = true;
        return k.p;
    }
    /* None fits (a cache growing past every kept size): give back at least as much of the
     * longest-kept memory first, so the new mapping can fault in those pages, which are
     * backed and warm, rather than memory the host may have taken back. */
    struct kept out[SLOTS];
    size_t n = shrink_to(held > want ? held - want : 0, SLOTS, out);
    pthread_mutex_unlock(&mu);
    unmap_all(out, n);
    void *p = kvt_hugepage_map(want);
    *len = want;
    return p;
}

void kvt_buf_cache_give(void *p, size_t len)
{
    if (!p)
        return;
    pthread_once(&once, init_limit);
    struct kept out[SLOTS];
    size_t n = 0;
    pthread_mutex_lock(&mu);
    if (len <= limit) {
        n = shrink_to(limit - len, SLOTS - 1, out);
        keep(p, len);
    } else {
        out[n++] = (struct kept){p, len, 0};
    }
    pthread_mutex_unlock(&mu);
    unmap_all(out, n);
}

size_t kvt_buf_cache_limit(size_t bytes)
{
    pthread_once(&once, init_limit);
    struct kept out[SLOTS];
    pthread_mutex_lock(&mu);
    size_t old = limit;
    limit = bytes;
    size_t n = shrink_to(limit, SLOTS, out);
    pthread_mutex_unlock(&mu);
    unmap_all(out, n);
    return old;
}

size_t kvt_buf_cache_bytes(void)
{
    pthread_once(&once, init_limit);
    pthread_mutex_lock(&mu);
    size_t n = held;
    pthread_mutex_unlock(&mu);
    return n;
}
