/*
 * The io_uring engine of the asynchronous I/O queue (aq.h): one ring per queue, each request
 * submitted as soon as it is queued so the device never waits for the caller's CPU work
 * (copying, hashing) between submissions. Built only when liburing was found (KVT_HAVE_URING);
 * a kernel that refuses rings (too old, disabled by sysctl or seccomp) makes open fail and the
 * queue falls back to threads.
 */
#include "io/aq.h"

#ifdef KVT_HAVE_URING

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>

static int uring_open(unsigned depth, void **impl)
{
    struct io_uring *ring = calloc(1, sizeof(*ring));
    if (!ring)
        return -ENOMEM;
    int rc = io_uring_queue_init(depth, ring, 0);
    if (rc < 0) {
        free(ring);
        return rc;
    }
    *impl = ring;
    return 0;
}

static void uring_close(void *impl)
{
    io_uring_queue_exit(impl);
    free(impl);
}

/* Tag @p sqe and hand it to the kernel. */
static int submit_tagged(struct io_uring *ring, struct io_uring_sqe *sqe, uint64_t tag)
{
    io_uring_sqe_set_data64(sqe, tag);
    int rc;
    do {
        rc = io_uring_submit(ring);
    } while (rc == -EINTR || rc == -EAGAIN);
    return rc < 0 ? rc : 0;
}

static int uring_submit(void *impl, int fd, int write, void *buf, size_t len, uint64_t off,
                        uint64_t tag)
{
    struct io_uring *ring = impl;
    if (len > 0x7ffff000u)
        return -EINVAL; /* one request moves at most what one read(2) can */
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    if (!sqe)
        return -EBUSY;
    if (write)
        io_uring_prep_write(sqe, fd, buf, (unsigned)len, off);
    else
        io_uring_prep_read(sqe, fd, buf, (unsigned)len, off);
    return submit_tagged(ring, sqe, tag);
}

static int uring_readv(void *impl, int fd, const struct iovec *iov, int n, uint64_t off,
                       uint64_t tag)
{
    struct io_uring *ring = impl;
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    if (!sqe)
        return -EBUSY;
    io_uring_prep_readv(sqe, fd, iov, (unsigned)n, off);
    return submit_tagged(ring, sqe, tag);
}

/* Take the completion @p cqe, or pass on the error @p rc of waiting for one. */
static int take_cqe(struct io_uring *ring, struct io_uring_cqe *cqe, int rc, uint64_t *tag,
                    int64_t *res)
{
    if (rc < 0)
        return rc;
    *tag = io_uring_cqe_get_data64(cqe);
    *res = cqe->res;
    io_uring_cqe_seen(ring, cqe);
    return 0;
}

static int uring_wait(void *impl, uint64_t *tag, int64_t *res)
{
    struct io_uring *ring = impl;
    struct io_uring_cqe *cqe = NULL;
    int rc;
    do {
        rc = io_uring_wait_cqe(ring, &cqe);
    } while (rc == -EINTR || rc == -EAGAIN);
    return take_cqe(ring, cqe, rc, tag, res);
}

static int uring_poll(void *impl, uint64_t *tag, int64_t *res)
{
    struct io_uring *ring = impl;
    struct io_uring_cqe *cqe = NULL;
    int rc = io_uring_peek_cqe(ring, &cqe);
    return take_cqe(ring, cqe, rc == -EINTR ? -EAGAIN : rc, tag, res);
}

static const struct kvt_aq_ops uring_ops = {
    .name = "io_uring",
    .open = uring_open,
    .close = uring_close,
    .submit = uring_submit,
    .readv = uring_readv,
    .wait = uring_wait,
    .poll = uring_poll,
};

const struct kvt_aq_ops *kvt_aq_uring(void)
{
    return &uring_ops;
}

#else

const struct kvt_aq_ops *kvt_aq_uring(void)
{
    return NULL;
}

#endif
