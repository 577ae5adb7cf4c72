/*
 * A helper thread that faults in destination memory ahead of the copy that fills it, so that
 * on a machine where first-touch page faults are slow they run on a second core in parallel
 * with the I/O and the hashing instead of in series with them. It also runs the per-piece
 * work (the hash) of pieces already in place, so the copying thread can go on copying.
 * Purely an accelerator: every failure (old kernel, no thread) leaves the copy to fault the
 * pages itself, and the copying thread to run its pieces.
 */
#ifndef KVT_RESTORE_HELPER_H
#define KVT_RESTORE_HELPER_H

#include <stdbool.h>
#include <stddef.h>

struct kvt_restore_helper;

/**
 * Whether some page of [@p addr, @p addr + @p len) is not resident (asked with mincore(2); true
 * where it cannot be asked): memory the process already holds, such as a buffer taken back
 * from the buffer cache, needs no helper, and handing work to one would only cost wake-ups.
 */
bool kvt_restore_helper_wanted(const void *addr, size_t len);
/** Start a helper, or return NULL when the kernel cannot populate memory in advance. */
struct kvt_restore_helper *kvt_restore_helper_start(void);
/**
 * Queue [@p addr, @p addr + @p len) to be faulted in writable, in address order. Only the
 * whole pages inside the range are touched, and never their contents. No-op on NULL.
 * @return false when the queue is full and the range was not taken (try again later).
 */
bool kvt_restore_helper_add(struct kvt_restore_helper *p, void *addr, size_t len);
/**
 * Make sure the queued pages of [@p addr, @p addr + @p len) are faulted in before the caller
 * writes there: waits for a block the helper is populating, populates on this thread what the
 * helper has not reached yet, and drops the queued part of that range before @p addr (the
 * caller fills its ranges in order). Memory never queued is left alone. No-op on NULL.
 */
void kvt_restore_helper_ensure(struct kvt_restore_helper *p, void *addr, size_t len);
/**
 * Run @p fn(@p ud, @p data, @p len) on the helper, after every piece deferred before it: the
 * pieces of one helper run one at a time, in order. @p data must stay valid and unchanged,
 * and @p ud untouched by the caller, until kvt_restore_helper_drain(). Waits while the queue of
 * pieces is full. @return false on NULL (the caller runs @p fn itself).
 */
bool kvt_restore_helper_defer(struct kvt_restore_helper *p,
                              void (*fn)(void *ud, const void *data, size_t len), void *ud,
                              const void *data, size_t len);
/**
 * Return once every deferred piece has run, running those the helper has not started on
 * this thread. No-op on NULL.
 */
void kvt_restore_helper_drain(struct kvt_restore_helper *p);
/** Drop every range not yet started (call before the memory may be freed). */
void kvt_restore_helper_cancel(struct kvt_restore_helper *p);
/** Drain, cancel, wait for the block in progress and end the helper. Accepts NULL. */
void kvt_restore_helper_stop(struct kvt_restore_helper *p);

#endif
