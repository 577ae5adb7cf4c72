/*
 * How a read goes: the one decision every reader takes (the read stream at open, the tensor
 * reader for a whole file, the device loader for a whole file). From the bytes asked for,
 * where they go, what the page cache holds, the stream options, the process's memory
 * settings and the io backend it picks one of four paths, and the threads they run on:
 *
 *   runs      bytes that go on from host staging (device memory): runs of whole ranges of
 *             about equal bytes, each read, hashed and sent on by a thread through its own
 *             stream (whose path is picked here when it opens), so reads from a fast page
 *             cache are not bound to one core; one run for fewer bytes than eight staging
 *             slots hold, else up to half as many threads as staging slots, so that each
 *             has a slot to fill while its last slot's copy runs;
 *   plain     pread one piece after the other: small reads (threads and rings would cost
 *             more than they save) or a backend without the fast path (the fault tables);
 *   parallel  every byte in the page cache and every range with a destination: nothing to
 *             wait for but the copy, the first touch of the destination pages and the hash,
 *             so whole ranges are copied on several cores;
 *   ring      the read-ahead ring, with O_DIRECT unless it is turned off or every byte is in
 *             the page cache (a direct read would go to the disk for bytes memory holds; the
 *             stream also falls back to the page cache, "buffered", where the file system
 *             refuses O_DIRECT), and the
 *             prefault helper where some destination page is not resident yet; in smaller
 *             chunks when nearly every byte is copied out of its staging.
 */
#include "io/stream.h"

#include <errno.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "io/io.h"
#include "settings/settings.h"
#include "threads/par_for.h"
#include "threads/restore_helper.h"

/* Reads smaller than this take the plain path. */
#define FAST_MIN ((uint64_t)1 << 20)
/* Reads of at least this many bytes, all in the page cache, are copied on up to PAR_THREADS
 * cores. */
#define PAR_MIN ((uint64_t)8 << 20)
#define PAR_THREADS 4u

bool kvt_stream_fast_ok(void)
{
    return kvt_io()->fast;
}

/* cachestat(2) came with Linux 6.5; older C library headers do not name it yet. */
#if !defined(__NR_cachestat) &&                                                                    \
    (defined(__x86_64__) || defined(__aarch64__) || (defined(__riscv) && __riscv_xlen == 64))
#define __NR_cachestat 451
#endif

bool kvt_stream_cached(int fd, uint64_t off, uint64_t len)
{
#ifdef __NR_cachestat
    struct {
        uint64_t off, len;
    } range = {off, len};
    struct {
        uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
    } cs;
    static atomic_int works = 1;
    if (!works)
        return false;
    if (syscall(__NR_cachestat, fd, &range, &cs, 0) != 0) {
        if (errno == ENOSYS || errno == EPERM)
            works = 0;
        return false;
    }
    uint64_t pages = (off + len + 4095) / 4096 - off / 4096;
    return cs.nr_cache >= pages;
#else
    (void)fd;
    (void)off;
    (void)len;
    return false;
#endif
}

/*
 * Whether a ring wants the prefault helper: some destination page is not resident yet, or no
 * range has a destination (later reads may bring destinations of their own). With every
 * destination resident the consumer hashes what it consumes itself: on two cores, waking a
 * helper for each piece cost 3-5 % of a cold restore that needed no faulting.
 */
static bool prefault_wanted(const struct kvt_range *r, size_t n)
{
    bool any = false;
    for (size_t i = 0; i < n; i++) {
        void *to = kvt_range_target(&r[i]);
        if (!to || r[i].len < KVT_PREFAULT_MIN)
            continue;
        if (kvt_restore_helper_wanted(to, (size_t)r[i].len))
            return true;
        any = true;
    }
    return !any;
}

/* The cores a parallel copy of @p r (range i of file fd[i * fstep]) may use; 1 when it should
 * not be parallel. */
static unsigned parallel_threads(const int *fd, size_t fstep, const struct kvt_range *r, size_t n,
                                 uint64_t total)
{
    if (n < 2 || total < PAR_MIN || !kvt_mem_parallel())
        return 1;
    unsigned t = kvt_par_cpus();
    if (t < 2)
        return 1;
    for (size_t i = 0; i < n; i++)
        if (r[i].len > 0 && (!r[i].dst || !kvt_stream_cached(fd[i * fstep], r[i].off, r[i].len)))
            return 1;
    return t < PAR_THREADS ? t : PAR_THREADS;
}

/* Whether at least three quarters of the bytes of a ring reading @p direct are copied out of
 * staging: all of them without O_DIRECT, else those of ranges off the block grid. */
static bool mostly_copied(const struct kvt_range *r, size_t n, uint64_t total, bool direct)
{
    uint64_t copied = 0;
    for (size_t i = 0; i < n; i++)
        if (!direct || !kvt_range_on_grid(&r[i]))
            copied += r[i].len;
    return copied >= total - total / 4;
}

/* The threads runs of @p n ranges going on through staging @p s are read on: 1 when the
 * bytes are too few (threads would cost more than they save). */
static unsigned staged_threads(size_t n, uint64_t total, const struct kvt_read_split *s)
{
    if (total < (uint64_t)s->stage_chunk * 8)
        return 1;
    unsigned t = kvt_mem_parallel() ? kvt_par_cpus() : 1;
    if (t > s->stage_slots / 2)
        t = s->stage_slots / 2 ? s->stage_slots / 2 : 1;
    return n < t ? (n ? (unsigned)n : 1) : t;
}

/* kvt_read_choose() with range i in file fd[i * fstep]. */
static struct kvt_read_way choose(const int *fd, size_t fstep, const struct kvt_range *r, size_t n,
                                  const struct kvt_stream_opts *o,
                                  const struct kvt_read_split *split)
{
    static const struct kvt_stream_opts def;
    uint64_t total = 0;
    if (!o)
        o = &def;
    for (size_t i = 0; i < n; i++)
        total += r[i].len;
    if (split && split->stage_slots) /* the backend aside: plain reads, too, run in parallel */
        return (struct kvt_read_way){.path = KVT_READ_RUNS,
                                     .threads = staged_threads(n, total, split)};
    if (!kvt_stream_fast_ok() || total < FAST_MIN)
        return (struct kvt_read_way){.path = KVT_READ_PLAIN, .threads = 1};
    unsigned t = split && split->copies ? parallel_threads(fd, fstep, r, n, total) : 1;
    if (t > 1)
        return (struct kvt_read_way){.path = KVT_READ_PARALLEL, .threads = t};
    bool resident = true;
    for (size_t i = 0; i < n && resident; i++)
        resident = r[i].len == 0 || kvt_stream_cached(fd[i * fstep], r[i].off, r[i].len);
    bool direct = kvt_mem_direct() && !o->no_direct && !resident;
    return (struct kvt_read_way){
        .path = KVT_READ_RING,
        .direct = direct,
        .helper = kvt_mem_helper() && !o->no_prefault && prefault_wanted(r, n),
        .threads = 1,
        .chunk = mostly_copied(r, n, total, direct) ? KVT_COPY_CHUNK : 0,
    };
}

struct kvt_read_way kvt_read_choose(int fd, const struct kvt_range *r, size_t n,
                                    const struct kvt_stream_opts *o,
                                    const struct kvt_read_split *split)
{
    return choose(&fd, 0, r, n, o, split);
}

struct kvt_read_way kvt_read_choose_files(const int *fd, const struct kvt_range *r, size_t n,
                                          const struct kvt_stream_opts *o)
{
    static const struct kvt_read_split copies = {.copies = true};
    return choose(fd, 1, r, n, o, &copies);
}

bool kvt_read_keeps_cache(int fd, uint64_t off, uint64_t len, bool keep)
{
    return keep || kvt_stream_cached(fd, off, len);
}

unsigned kvt_read_runs(const struct kvt_range *r, size_t n, unsigned threads, size_t *end)
{
    uint64_t total = 0, acc = 0;
    unsigned k = 0;
    for (size_t i = 0; i < n; i++)
        total += r[i].len;
    for (size_t i = 0; i < n; i++) {
        acc += r[i].len;
        if (i + 1 == n || (k + 1 < threads && acc * threads >= total * (k + 1)))
            end[k++] = i + 1;
    }
    return k;
}
