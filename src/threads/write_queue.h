/*
 * The write-behind queue: bounded, FIFO, one writer thread. The tier's spill queue (TIER.md §3)
 * and the remote tier's uploads are each one.
 */
#ifndef KVT_WRITE_QUEUE_H
#define KVT_WRITE_QUEUE_H

#include <sched.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvtier.h"

struct kvt_write_queue;

/* What the queue does with its items (the tier binds these to its cache and cold ops). */
struct kvt_write_queue_ops {
    size_t (*bytes_of)(void *ud, const struct kvt_entry *e);
    /* Writer thread: persist @p e (borrowed). 0 = stored, negative = failed. */
    int (*store)(void *ud, const struct kvt_entry *e);
    /* Release an item's entry (its owned clones). Runs exactly once per item. */
    void (*dispose)(void *ud, struct kvt_entry *e);
    /* Optional: whether a queued item may be dropped to honor the cap (under the lock). */
    bool (*can_drop)(void *ud, const struct kvt_entry *e);
    void *ud;
};

/** Settles an item exactly once: true = stored, false = dropped, failed or shut down. */
typedef void (*kvt_write_settle_fn)(void *ud, bool stored);

struct kvt_write_queue_stats {
    uint64_t pending_count; /* queued plus the one in flight */
    uint64_t pending_bytes;
    uint64_t dropped, failed, stored; /* monotonic */
};

/**
 * Create the queue and start its writer thread on @p cpus (NULL = the creator's CPUs).
 * @p cap_bytes: soft cap on pending bytes, >= 0.
 */
int kvt_write_queue_new(const struct kvt_write_queue_ops *ops, int64_t cap_bytes,
                        const cpu_set_t *cpus, struct kvt_write_queue **out);

/**
 * Stop: the writer finishes the item in flight, then every queued item is disposed and
 * settled false (not counted as dropped). No other call may be in progress. NULL allowed.
 */
void kvt_write_queue_free(struct kvt_write_queue *q);

/**
 * Append @p e (owned from here on, on every path) and drop the oldest droppable queued items
 * while the pending bytes exceed the cap. @p settle (may be NULL) is called once when the
 * item settles — on the writer thread, or on this thread if the item is dropped at once;
 * never under the queue's lock. Victims of the cap are settled before this returns.
 * @return 0, or KVT_E_STATE after shutdown / -ENOMEM (@p e disposed, @p settle not called).
 */
int kvt_write_queue_enqueue(struct kvt_write_queue *q, struct kvt_entry *e,
                            kvt_write_settle_fn settle, void *settle_ud);

/**
 * Wait until every item enqueued before this call has settled (its settle callback returned).
 * @p deadline_ms: kvt_mono_ms() value to give up at, or < 0 for no limit.
 * @return 0 or KVT_E_TIMEOUT.
 */
int kvt_write_queue_drain(struct kvt_write_queue *q, int64_t deadline_ms);

void kvt_write_queue_get_stats(struct kvt_write_queue *q, struct kvt_write_queue_stats *st);

#endif
