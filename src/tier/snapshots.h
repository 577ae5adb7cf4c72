/*
 * Write-behind snapshots and the durable flush (TIER.md §5).
 */
#ifndef KVT_SNAPSHOTS_H
#define KVT_SNAPSHOTS_H

#include "tier/ram_lru.h"
#include "threads/write_queue.h"

struct kvt_snapshots;

/**
 * Uses cfg->cold, store, run_exclusive, busy, engine, write_behind (off = schedule() does
 * nothing; flush still drains) and the snapshot delays. @p wake asks the timer thread to
 * re-tick (a key was armed).
 */
int kvt_snapshots_new(const struct kvt_tier_cfg *cfg, struct kvt_ram_lru *ram,
                      struct kvt_write_queue *q, void (*wake)(void *ud), void *wake_ud,
                      struct kvt_snapshots **out);
/** Free the keys. The timer thread and the queue must be gone (their settles done). */
void kvt_snapshots_free(struct kvt_snapshots *wb);

/** The on_put hook: mark (ns, tokens) dirty and (re)arm its debounce timer. */
void kvt_snapshots_schedule(struct kvt_snapshots *wb, const int32_t *tok, size_t n, const char *ns);
/** Timer task: run the due attempts; returns the next due time (monotonic ms). */
int64_t kvt_snapshots_tick(void *wb, int64_t now_ms);
/** TIER.md §5 flush; @p timeout_ms >= 0. 0 or KVT_E_TIMEOUT; the report is filled either way. */
int kvt_snapshots_flush(struct kvt_snapshots *wb, int64_t timeout_ms, struct kvt_flush_report *r);
/** Dirty keys, armed timers included. */
uint64_t kvt_snapshots_pending(struct kvt_snapshots *wb);

#endif
