/*
 * An asynchronous I/O queue: positional reads and writes with several requests in flight,
 * completions reaped one at a time in any order. Two engines: io_uring (when the build found
 * liburing and the kernel allows it) and a small pool of threads doing blocking pread/pwrite
 * (everywhere). The stream layer (stream.h) is its only user. Queues are opened through the
 * io backend (io.h: aq_open), so a fault-injecting backend sees their requests too.
 */
#ifndef KVT_AQ_H
#define KVT_AQ_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define KVT_AQ_MAX_DEPTH 32

struct kvt_aq_ops;

struct kvt_aq {
    const struct kvt_aq_ops *ops;
    void *impl;
    unsigned depth;    /* most requests in flight */
    unsigned inflight; /* queued and not yet reaped */
};

struct kvt_aq_ops {
    const char *name;
    int (*open)(unsigned depth, void **impl);
    void (*close)(void *impl); /* every request was reaped */
    int (*submit)(void *impl, int fd, int write, void *buf, size_t len, uint64_t off, uint64_t tag);
    int (*readv)(void *impl, int fd, const struct iovec *iov, int n, uint64_t off, uint64_t tag);
    int (*wait)(void *impl, uint64_t *tag, int64_t *res);
    int (*poll)(void *impl, uint64_t *tag, int64_t *res); /* -EAGAIN: none completed yet */
};

/* The io_uring engine (io_uring.c); NULL when the build has no liburing. */
const struct kvt_aq_ops *kvt_aq_uring(void);
/* The thread-pool engine (aq_threads.c). */
const struct kvt_aq_ops *kvt_aq_threads(void);

/**
 * Open a queue of @p depth (1..KVT_AQ_MAX_DEPTH) requests through the installed io backend.
 * @p engine: "io_uring", "threads", or NULL for the best that works here (io_uring, else
 * threads; kvt_mem_opts.io_engine may name one). @return 0 or -errno.
 */
int kvt_aq_open(struct kvt_aq *q, unsigned depth, const char *engine);
/** The OS engines themselves, as kvt_aq_open() describes (the POSIX backend's aq_open). */
int kvt_aq_open_os(struct kvt_aq *q, unsigned depth, const char *engine);
/** Reap whatever is still in flight, then release the queue. Accepts a zeroed queue. */
void kvt_aq_close(struct kvt_aq *q);
/**
 * Start a read (@p write 0) or write of @p len bytes at @p off; @p tag comes back with the
 * completion. The caller keeps inflight < depth. @return 0 or -errno (nothing was queued).
 */
int kvt_aq_submit(struct kvt_aq *q, int fd, int write, void *buf, size_t len, uint64_t off,
                  uint64_t tag);
/**
 * Start a read of the file bytes at @p off into the @p n buffers of @p iov, in order (one
 * request however many buffers). @p iov must stay valid and unchanged until the completion is
 * reaped. As kvt_aq_submit() otherwise.
 */
int kvt_aq_readv(struct kvt_aq *q, int fd, const struct iovec *iov, int n, uint64_t off,
                 uint64_t tag);
/**
 * Wait for one completion: *@p res is the byte count (possibly short) or -errno of that
 * request. @return 0, -EINVAL when nothing is in flight, or -errno of the queue itself.
 */
int kvt_aq_wait(struct kvt_aq *q, uint64_t *tag, int64_t *res);
/**
 * As kvt_aq_wait(), without waiting: -EAGAIN when no request has completed yet.
 */
int kvt_aq_poll(struct kvt_aq *q, uint64_t *tag, int64_t *res);
/** The engine's name ("io_uring" or "threads"). */
const char *kvt_aq_name(const struct kvt_aq *q);

#endif
