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
#include <stdint.h>

#include "kvtier.h"

struct kvt_device_ops {
    int (*alloc)(kvt_device *d, size_t bytes, uint64_t *addr);
    void (*free)(kvt_device *d, uint64_t addr);
    /* page-locked host memory, the source and target of asynchronous copies */
    int (*host_alloc)(kvt_device *d, size_t bytes, void **out);
    void (*host_free)(kvt_device *d, void *p);
    /* queue a copy; completion is tracked per ring slot @p slot (< KVT_DEVICE_MAX_SLOTS) */
    int (*h2d)(kvt_device *d, uint64_t dst, const void *src, size_t n, unsigned slot);
    int (*d2h)(kvt_device *d, void *dst, uint64_t src, size_t n, unsigned slot);
    /* wait for every copy queued for @p slot */
    int (*wait)(kvt_device *d, unsigned slot);
    void (*close)(kvt_device *d);
};

#define KVT_DEVICE_MAX_SLOTS 16

struct kvt_device {
    const struct kvt_device_ops *ops;
    char name[128];
    size_t chunk;   /* bytes per staging slot */
    unsigned depth; /* staging slots */
    void *impl;
};

int kvt_device_cuda_open(int ordinal, kvt_device *d);
int kvt_device_host_open(const struct kvt_device_opts *o, kvt_device *d);

/** A ring of d->depth page-locked staging slots of d->chunk bytes. */
struct kvt_dstage {
    kvt_device *d;
    uint8_t *slot[KVT_DEVICE_MAX_SLOTS];
    bool busy[KVT_DEVICE_MAX_SLOTS];
    unsigned next;
};

int kvt_dstage_open(kvt_device *d, struct kvt_dstage *st);
/** The next slot, once the copies queued from it before are done; *@p k is its index. */
int kvt_dstage_take(struct kvt_dstage *st, uint8_t **mem, unsigned *k);
/** Wait for every slot's copies (the ring stays usable). */
int kvt_dstage_drain(struct kvt_dstage *st);
void kvt_dstage_close(struct kvt_dstage *st);

#endif
