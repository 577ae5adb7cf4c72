/*
 * Streams of large sequential I/O for the format's restore and save paths, running at the
 * device's pace: reads are issued ahead with several in flight (O_DIRECT where the file system
 * takes it) while the caller copies and hashes what has already arrived; writes are staged in
 * aligned buffers and go out with several in flight while the caller hashes and stages the
 * next chunk. Memory stays bounded: depth x chunk bytes of staging (by default 16 MiB for a
 * read stream, 64 MiB for a write stream).
 *
 * Both paths go through the io vtable: the fast one asks it for the O_DIRECT descriptor and
 * the asynchronous queue, the plain one for pread/pwrite one after the other. The backend
 * says which the streams take (kvt_io()->fast), and the results are byte-for-byte the same.
 */
#ifndef KVT_STREAM_H
#define KVT_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

/**
 * A byte range of a file, and optionally where its bytes are going: with @p dst set, the
 * consumer will ask for the range in one or more kvt_rstream_read() calls into dst, dst + k
 * ..., and the stream may read the range's whole blocks straight into that memory (direct
 * I/O, no staging copy) before they are asked for. dst must stay valid until the stream is
 * closed, and the stream owns [dst, dst + len) until the range is delivered. With @p dst NULL,
 * @p copy_to may name where the consumer will copy the range (memory on small pages, which a
 * direct read would cost one device segment per page): it is read through staging, and only
 * its pages are faulted in ahead, like a destination's.
 */
struct kvt_range {
    uint64_t off;
    uint64_t len;
    void *dst;
    void *copy_to;
};

/*
 * Stream options. The process's settings (struct kvt_mem_opts) come first: no_direct and
 * no_helper there turn O_DIRECT and the restore helper off for every stream, and io_engine
 * picks the engine when a stream names none.
 */
struct kvt_stream_opts {
    size_t chunk;       /* bytes per request; 0 = 2 MiB reading (1 MiB for reads copied out
                           of staging, kvt_read_choose()), 16 MiB writing (rounded up to 4096) */
    unsigned depth;     /* requests in flight; 0 = 8 reading, 4 writing */
    bool no_direct;     /* never use O_DIRECT */
    bool no_prefault;   /* do not fault destination pages in on a helper thread */
    const char *engine; /* reads: "io_uring", "threads" or NULL (best available); writes
                           always use threads (stream_write.c says why) */
};

/** Whether the streams may take the fast path (the installed io backend says so). */
bool kvt_stream_fast_ok(void);

/** Whether every page of [@p off, @p off + @p len) of @p fd is in the page cache (asked with
 * cachestat(2), Linux 6.5+; false where it cannot be asked). */
bool kvt_stream_cached(int fd, uint64_t off, uint64_t len);

/* ---- choosing how to read (read_way.c) ---------------------------------------------------- */

/* Destinations at least this large get the prefault helper. */
#define KVT_PREFAULT_MIN ((size_t)256 << 10)

/** Where range @p r's bytes will be written (its destination, or its copy target), or NULL. */
static inline void *kvt_range_target(const struct kvt_range *r)
{
    return r->dst ? r->dst : r->copy_to;
}

/** Whether a direct read can land the bytes of @p r in place: it has a destination on the
 *  file's 4096-byte block grid (else they are copied out of staging). */
static inline bool kvt_range_on_grid(const struct kvt_range *r)
{
    return r->dst && ((uintptr_t)r->dst - (uintptr_t)r->off) % 4096 == 0;
}

enum kvt_read_path {
    KVT_READ_PLAIN,    /* pread one piece after the other */
    KVT_READ_RING,     /* the read-ahead ring (direct or through the page cache) */
    KVT_READ_PARALLEL, /* whole ranges copied out of the page cache on several cores */
    KVT_READ_RUNS,     /* runs of whole ranges, one per thread, each through its own stream */
};

/*
 * What a reader can do with its ranges besides reading them in order through one stream:
 * kvt_read_choose()'s @p split (NULL: nothing else, as for kvt_rstream_open()).
 */
struct kvt_read_split {
    bool copies;          /* whole ranges can be copied on several cores (KVT_READ_PARALLEL) */
    unsigned stage_slots; /* > 0: the bytes go on from a ring of this many host staging slots
                             of stage_chunk bytes each (device memory), read in runs of whole
                             ranges, one per thread (KVT_READ_RUNS, always) */
    size_t stage_chunk;
};

/*
 * The ring's chunk when nearly every byte is copied out of staging (destinations off the
 * block grid, or none): its staging (8 chunks) then stays in the last-level cache while it
 * is copied out. Cold restores of a 64 MiB llama.cpp state, kvtier-llama bench, four paired
 * runs: 20.0-24.2 ms with 1 MiB chunks against 24.6-28.6 ms with the 2 MiB default.
 */
#define KVT_COPY_CHUNK ((size_t)1 << 20)

struct kvt_read_way {
    enum kvt_read_path path;
    bool direct;      /* ring: read with O_DIRECT (where the file system takes it) */
    bool helper;      /* ring: fault destinations in on the prefault helper thread */
    unsigned threads; /* parallel, runs: the cores to copy or read on (1 otherwise) */
    size_t chunk;     /* ring: the chunk size it should read in (0: the stream's default) */
};

/**
 * How to read @p n ranges of @p fd (ascending, valid) with stream options @p o (NULL: the
 * defaults): the one place that picks between the plain path, the read-ahead ring (and on it
 * O_DIRECT and the prefault helper), a parallel copy out of the page cache and runs on
 * several threads, and how many threads, from the bytes asked for, their destinations, what
 * the page cache holds, the options, the process's memory settings and the io backend.
 * @p split: what else than one stream the caller can do (NULL: nothing, so neither
 * KVT_READ_PARALLEL nor KVT_READ_RUNS).
 */
struct kvt_read_way kvt_read_choose(int fd, const struct kvt_range *r, size_t n,
                                    const struct kvt_stream_opts *o,
                                    const struct kvt_read_split *split);
/**
 * kvt_read_choose() for ranges of several files, range i of file @p fd[i] (a restore read from
 * several files as one), by a caller that can copy whole ranges on several cores: the
 * parallel copy is its to do; the plain path and the ring are one stream per file.
 */
struct kvt_read_way kvt_read_choose_files(const int *fd, const struct kvt_range *r, size_t n,
                                          const struct kvt_stream_opts *o);
/** Cut @p n ranges into at most @p threads runs of consecutive ranges, of about equal bytes,
 * for KVT_READ_RUNS: run k ends before range @p end[k]. @return the number of runs (0 when
 * @p n is 0). */
unsigned kvt_read_runs(const struct kvt_range *r, size_t n, unsigned threads, size_t *end);
/** Whether a restore of [@p off, +@p len) of @p fd leaves the pages it read in the page cache:
 * when the caller asks (@p keep), or when they were all resident before it read them (the
 * next restore reads them at memory speed too). Pages a cold read brought in are dropped. */
bool kvt_read_keeps_cache(int fd, uint64_t off, uint64_t len, bool keep);

/* ---- reading ------------------------------------------------------------------------------ */

struct kvt_rstream;

/** Called with each piece of a kvt_rstream_read() in order, once it is in place (one call at
 * a time, not always on the calling thread). */
typedef void (*kvt_piece_fn)(void *ud, const void *data, size_t len);
/** The piece function that hashes: @p ud is a struct kvt_wyhash_state. With it, a piece the
 * stream copies out of staging is copied and hashed in one pass over its bytes. */
void kvt_piece_hash(void *ud, const void *data, size_t len);

/**
 * A read-ahead stream over @p n ranges of @p fd, ascending and not overlapping; the stream's
 * bytes are those of the ranges concatenated, consumed in order by kvt_rstream_read().
 * Reading ahead starts at once. @p fd stays the caller's (it must stay open until close).
 * @return 0, -EINVAL (bad ranges) or -ENOMEM.
 */
int kvt_rstream_open(int fd, const struct kvt_range *r, size_t n, const struct kvt_stream_opts *o,
                     struct kvt_rstream **out);
/**
 * Allocate and fault in the staging of a default read stream that copies its bytes out
 * (KVT_COPY_CHUNK chunks), kept for the next stream: the first restore after a start, the one
 * a user waits on, then pays no fresh memory (1-20 ms for 8 MiB here). Best effort.
 */
void kvt_rstream_warm(void);
/**
 * Deliver the next @p len bytes of the stream into @p dst (NULL: only pass them to @p fn),
 * calling @p fn (may be NULL) on every piece once it is in place, in order: pieces already
 * in @p dst may be passed to @p fn on the stream's helper thread while the next ones are
 * copied, and every call has returned when this does. For a range opened with a
 * destination, @p dst should be that destination (another one gets a copy).
 * @return 0, -EIO when the file ends early (*@p at receives the file offset), or -errno of
 * the failed read (the stream is then broken: every later call returns the same error).
 */
int kvt_rstream_read(struct kvt_rstream *s, void *dst, size_t len, kvt_piece_fn fn, void *ud,
                     uint64_t *at);
/**
 * kvt_rstream_read() of @p blocks runs of @p len bytes, run k into @p dst + k * @p stride
 * (@p dst NULL: only to @p fn), as one call: the pieces of a run are still being passed to
 * @p fn while the next run is read, and all calls have returned when this does.
 */
int kvt_rstream_read_blocks(struct kvt_rstream *s, void *dst, size_t blocks, size_t len,
                            size_t stride, kvt_piece_fn fn, void *ud, uint64_t *at);
/** Stop reading ahead, wait for requests in flight and free the stream. Accepts NULL. */
void kvt_rstream_close(struct kvt_rstream *s);
/** How the stream reads: "io_uring+direct", "threads+direct", "buffered" (no O_DIRECT), "plain". */
const char *kvt_rstream_engine(const struct kvt_rstream *s);

/* ---- writing ------------------------------------------------------------------------------ */

struct kvt_wstream;

/**
 * A write stream into @p fd (open for writing; it stays the caller's). Writes must come at
 * non-decreasing offsets with gaps of at least 4096 bytes or none at all between them
 * (the format's 16 KiB-aligned slots satisfy this); bytes of gaps read back as zero.
 * @return 0 or -ENOMEM.
 */
int kvt_wstream_open(int fd, const struct kvt_stream_opts *o, struct kvt_wstream **out);
/**
 * Allocate and fault in the staging memory of a direct write stream with options @p o (NULL:
 * the defaults) and keep it for the next stream, so that a process about to serve pays for
 * tens of megabytes of fresh memory up front, not while another thread is busy. Best effort.
 */
void kvt_wstream_warm(const struct kvt_stream_opts *o);
/**
 * Write @p len bytes of @p src at @p off, hashing them into @p h (may be NULL) in order. When
 * this returns, @p src is no longer needed (the bytes are staged or written); errors of
 * earlier writes may surface here. @return 0, -EINVAL (offset order) or -errno (sticky).
 * *@p at (may be NULL) receives the file offset of a failed write.
 */
int kvt_wstream_write(struct kvt_wstream *w, uint64_t off, const void *src, size_t len,
                      struct kvt_wyhash_state *h, uint64_t *at);
/**
 * Wait for the device until staging has room for @p len more bytes (as much as the stream
 * holds at most), so that the kvt_wstream_write() of those bytes only copies: a caller that
 * writes inside someone else's exclusion waits here, outside it. @return 0 or the sticky error.
 */
int kvt_wstream_room(struct kvt_wstream *w, size_t len);
/**
 * Send what is staged (the last chunk padded to a whole block) without waiting for the
 * device; no write may follow. @return 0 or the sticky error; *@p at as below.
 */
int kvt_wstream_flush(struct kvt_wstream *w, uint64_t *at);
/**
 * Write out what is staged, wait for every write and cut the file at the end of the last
 * byte written (direct writes are padded to whole blocks). No fsync: the caller syncs.
 * @return 0 or the first error (sticky); *@p at: the lowest offset that failed with it, all
 * writes having completed.
 */
int kvt_wstream_finish(struct kvt_wstream *w, uint64_t *at);
/** Wait for requests in flight and free the stream. Accepts NULL. */
void kvt_wstream_free(struct kvt_wstream *w);
/** The bytes the stream has been asked to write up to (the logical end of the file). */
uint64_t kvt_wstream_end(const struct kvt_wstream *w);

/* ---- shared by the two streams -------------------------------------------------------- */

struct kvt_aq;
/** Release a stream's fast path: reap the queue, then close the O_DIRECT descriptor (if >= 0)
 * and give the staging back (if any). */
void kvt_stream_fast_release(struct kvt_aq *q, int dfd, void *staging, size_t staging_bytes);

#endif
