/*
 * Devices (kvtier.h, "Devices"): memory the host cannot address, reached through copies that
 * run asynchronously on the device's queue. Two backends behind one table: CUDA through the
 * driver API loaded at run time (device_cuda.c), and a host-memory stand-in whose copies run
 * on a worker thread (device_host.c), so that the staging ring and its overlap of reads and
 * copies are tested on machines without a GPU.
 */
#ifndef KVT_DEVICE_H
#define KVT_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>

#include "kvtier.h"

struct kvt_device_ops {
    int (*alloc)(kvt_device *d, size_t bytes, uint64_t *addr);
    void (*free)(kvt_device *d, uint64_t addr);
    /* the allocation holding @p addr: 0 and its extent, 1 when the backend cannot tell */
    int (*range)(kvt_device *d, uint64_t addr, uint64_t *base, size_t *size);
    /* page-locked host memory, the source and target of asynchronous copies */
    int (*host_alloc)(kvt_device *d, size_t bytes, void **out);
    void (*host_free)(kvt_device *d, void *p);
    /* queue a copy; completion is tracked per ring slot @p slot (< KVT_DEVICE_MAX_SLOTS), or
     * not at all with KVT_DEVICE_UNTRACKED (a later tracked copy on the queue covers it) */
    int (*h2d)(kvt_device *d, uint64_t dst, const void *src, size_t n, unsigned slot);
    int (*d2h)(kvt_device *d, void *dst, uint64_t src, size_t n, unsigned slot);
    /* queue @p rows host-to-device copies of @p n bytes, the host's @p pitch bytes apart,
     * the device's @p dpitch bytes apart (one strided copy) */
    int (*h2d_rows)(kvt_device *d, uint64_t dst, const void *src, size_t pitch, size_t dpitch,
                    size_t n, size_t rows, unsigned slot);
    /* wait for every copy queued for @p slot */
    int (*wait)(kvt_device *d, unsigned slot);
    /* copies queued from now on go to the side stream (@p on; it first waits for the work
     * queued so far on the legacy default stream), or back to the device's stream */
    int (*side)(kvt_device *d, bool on);
    /* a mark after everything queued so far on the stream in use; made to be waited for by
     * CUDA stream @p stream (the stand-in waits on the host), waited for, freed */
    int (*mark)(kvt_device *d, void **ev);
    int (*mark_wait)(kvt_device *d, void *ev, uint64_t stream);
    int (*mark_sync)(kvt_device *d, void *ev);
    void (*mark_free)(kvt_device *d, void *ev);
    void (*close)(kvt_device *d);
};

#define KVT_DEVICE_MAX_SLOTS 16
#define KVT_DEVICE_UNTRACKED KVT_DEVICE_MAX_SLOTS

struct kvt_device {
    const struct kvt_device_ops *ops;
    char name[128];
    int ordinal;    /* CUDA ordinal; -1 for the stand-in */
    size_t chunk;   /* bytes per staging slot */
    unsigned depth; /* staging slots */
    void *impl;
    /* The staging ring: allocated at the first copy, kept until close. Slots are handed to
     * one holder at a time (the threads of one parallel load share the ring). */
    pthread_mutex_t op_lock; /* one load, save piece or copy at a time uses the ring */
    pthread_mutex_t stage_lock;
    pthread_cond_t stage_free;
    uint8_t *slot[KVT_DEVICE_MAX_SLOTS];
    bool held[KVT_DEVICE_MAX_SLOTS]; /* taken and not given back */
    bool busy[KVT_DEVICE_MAX_SLOTS]; /* copies queued from or into it may still run */
    unsigned next;
};

int kvt_device_cuda_open(int ordinal, kvt_device *d);
int kvt_device_host_open(const struct kvt_device_opts *o, kvt_device *d);

/* One copy between page-locked host memory and the device: @p rows rows of @p n bytes, on the
 * host @p pitch bytes apart, on the device @p dpitch apart (0: consecutive; rows 1: one run of
 * n bytes). */
struct kvt_dcopy {
    void *host;
    uint64_t dev;
    size_t n;
    size_t rows, pitch, dpitch;
};

/** Queue every copy of @p c straight on the device's queue (the host sides are page-locked,
 * e.g. a kvt_dpool's) and wait for them all; @p up: host to device. */
int kvt_device_copies(kvt_device *d, const struct kvt_dcopy *c, size_t n, bool up);
/** Queue copies @p c on the side stream, marks[k] after copies up to ends[k] (exclusive), for
 * k < @p n_marks; nothing waited for. On failure the queued ones are finished, no mark left. */
int kvt_device_copies_marked(kvt_device *d, const struct kvt_dcopy *c, const size_t *ends,
                             size_t n_marks, void **marks);

/* A take whose copies may still run (kvtier.h, kvt_dtake): a mark per slot, and the host
 * entries the copies read from (an entry, or a shared one's tail and its n_parts chunks),
 * freed once they are done. */
struct kvt_dtake {
    kvt_device *d;
    void **marks;
    size_t n;
    struct kvt_entry *src;
    struct kvt_entry **parts;
    size_t n_parts;
};

/** kvt_device_copies() without the wait: 0 with *@p slot the ring slot held until
 * kvt_device_copies_wait(), which waits for the copies and gives it back (KVT_DEVICE_UNTRACKED
 * when nothing was queued); on failure nothing is held. */
int kvt_device_copies_queue(kvt_device *d, const struct kvt_dcopy *c, size_t n, bool up,
                            unsigned *slot);
int kvt_device_copies_wait(kvt_device *d, unsigned slot);

/*
 * The page-locked pool of a RAM tier (device_pool.c): one region of @p cap bytes, allocated at
 * the first buffer and freed once the pool is closed and its last buffer released. Thread-safe.
 */
struct kvt_dpool;
int kvt_dpool_new(kvt_device *d, size_t cap, struct kvt_dpool **out);
void kvt_dpool_close(struct kvt_dpool *p);
/** A host buffer of @p bytes in the pool; -ENOSPC when no free range is large enough. */
int kvt_dpool_buf(struct kvt_dpool *p, size_t bytes, kvt_buf **out);
/** Whether the region is allocated (false while the pool is busy: never waits);
 * kvt_dpool_prepare() allocates it (page-locking: slow). */
bool kvt_dpool_ready(struct kvt_dpool *p);
int kvt_dpool_prepare(struct kvt_dpool *p);
/** Whether @p mem lies in the pool's region. */
bool kvt_dpool_owns(const struct kvt_dpool *p, const void *mem);
/** Bytes handed out and not yet released. */
size_t kvt_dpool_used(struct kvt_dpool *p);

/** Allocate the staging ring if it is not yet (page-locked: slow, so once per device). */
int kvt_dstage_ready(kvt_device *d);
/** A free slot, once the copies queued with it before are done; *@p k is its index. Waits
 * while every slot is held. Thread-safe. */
int kvt_dstage_take(kvt_device *d, uint8_t **mem, unsigned *k);
/** Give slot @p k back; @p queued: a copy queued with it may still run. Thread-safe. */
void kvt_dstage_give(kvt_device *d, unsigned k, bool queued);
/** Wait for every slot's copies (call with no slot held). */
int kvt_dstage_drain(kvt_device *d);

/**
 * kvt_file_load_to_device() of a shared entry: its files composed in host memory
 * (kvt_share_read()), then uploaded to the addresses the device placement @p p sets for the
 * whole entry's header, or, with @p keep (0 < keep < n), for that header cut to its first
 * keep tokens (kvt_header_cut_prefix()). *@p out_header is the whole header. @return as
 * kvt_share_open() (store/share.h), @p p's refusal, or the device's error.
 */
struct kvt_placement;
int kvt_share_load_to_device(const char *tail_path, const struct kvt_expect *x, kvt_device *d,
                             const struct kvt_placement *p, size_t keep,
                             struct kvt_header **out_header, char **bad_chunk);

#endif
