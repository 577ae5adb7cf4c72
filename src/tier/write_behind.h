/*
 * Write-behind snapshots and the durable flush (TIER.md §5).
 */
#ifndef KVT_WRITE_BEHIND_H
#define KVT_WRITE_BEHIND_H

#include "tier/prompt_cache.h"
#include "tier/spill_queue.h"

struct kvt_wb;

struct kvt_wb_cfg {
    struct kvt_pc *pc;
    struct kvt_spill_queue *q;
    const struct kvt_tier_cold_ops *cold;
    void *cold_ud;
    kvt_run_exclusive_fn run_exclusive;
    bool (*busy)(void *engine);
    void *engine;
    bool enabled; /* write_behind: off = schedule() does nothing; flush still drains */
    int64_t debounce_ms, busy_retry_ms;
    void (*wake)(void *ud); /* the timer thread must re-tick (a key was armed) */
    void *wake_ud;
};

int kvt_wb_new(const struct kvt_wb_cfg *cfg, struct kvt_wb **out);
/** Free the keys. The timer thread and the queue must be gone (their settles done). */
void kvt_wb_free(struct kvt_wb *wb);

/** The on_put hook: mark (ns, tokens) dirty and (re)arm its debounce timer. */
void kvt_wb_schedule(struct kvt_wb *wb, const int32_t *tok, size_t n, const char *ns);
/** Timer task: run the due attempts; returns the next due time (monotonic ms). */
int64_t kvt_wb_tick(void *wb, int64_t now_ms);
/** TIER.md §5 flush; @p timeout_ms >= 0. 0 or KVT_E_TIMEOUT; the report is filled either way. */
int kvt_wb_flush(struct kvt_wb *wb, int64_t timeout_ms, struct kvt_flush_report *r);
/** Dirty keys, armed timers included. */
uint64_t kvt_wb_pending(struct kvt_wb *wb);

#endif
