/*
 * The timer thread: one library thread that runs periodic and debounced work
 * (write-behind snapshots, idle demotion) until it is stopped.
 */
#ifndef KVT_TIMER_THREAD_H
#define KVT_TIMER_THREAD_H

#include <sched.h>
#include <stdint.h>

struct kvt_timer_thread;

/*
 * One task: @p tick runs whatever is due at @p now_ms (kvt_mono_ms()) and returns the
 * time it next wants to run (INT64_MAX = only when woken). It runs on the timer thread,
 * never under the thread's own lock, and may block (e.g. waiting for the engine).
 */
struct kvt_timer_task {
    int64_t (*tick)(void *ud, int64_t now_ms);
    void *ud;
};

#define KVT_TIMER_MAX_TASKS 4

/** Start the thread on @p cpus (NULL = the caller's); every task ticks once at start. */
int kvt_timer_thread_start(const struct kvt_timer_task *tasks, int n, const cpu_set_t *cpus,
                           struct kvt_timer_thread **out);
/** Make the thread re-run every task now (a task has new work or an earlier deadline). */
void kvt_timer_thread_wake(struct kvt_timer_thread *t);
/** Stop: waits for a running tick to return, then joins. NULL allowed. */
void kvt_timer_thread_stop(struct kvt_timer_thread *t);

#endif
