/*
 * The thread-pool engine of the asynchronous I/O queue (aq.h), and the queue front end that
 * picks an engine. Workers (one per slot of depth, up to a small cap) take requests from a
 * FIFO and run a blocking pread/pwrite each; completions go to a second FIFO that
 * kvt_aq_wait() drains. Works wherever pthreads do, so it is the fallback of io_uring.
 */
#include "io/aq.h"
#include "io/io.h"
#include "settings/settings.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_WORKERS 8

struct req {
    int fd, write;
    void *buf;
    size_t len;
    const struct iovec *iov; /* a vectored read: iovcnt buffers instead of buf */
    int iovcnt;
    uint64_t off, tag;
    int64_t res;
};

struct pool {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    struct req todo[KVT_AQ_MAX_DEPTH], fin[KVT_AQ_MAX_DEPTH];
    unsigned todo_head, todo_n, fin_head, fin_n;
    bool stop;
    pthread_t th[MAX_WORKERS];
    unsigned n_th;
};

static int64_t run_req(const struct req *r)
{
    if (r->len > 0x7ffff000u || r->off > (uint64_t)INT64_MAX)
        return -EINVAL;
    for (;;) {
        ssize_t n = r->iov     ? preadv(r->fd, r->iov, r->iovcnt, (off_t)r->off)
                    : r->write ? pwrite(r->fd, r->buf, r->len, (off_t)r->off)
                               : pread(r->fd, r->buf, r->len, (off_t)r->off);
        if (n >= 0)
            return n;
        if (errno != EINTR)
            return -errno;
    }
}

static void *worker(void *arg)
{
    struct pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->todo_n == 0)
            pthread_cond_wait(&p->work, &p->mu);
        if (p->todo_n == 0)
            break; /* stopping, and nothing left to do */
        struct req r = p->todo[p->todo_head];
        p->todo_head = (p->todo_head + 1) % KVT_AQ_MAX_DEPTH;
        p->todo_n--;
        pthread_mutex_unlock(&p->mu);
        r.res = run_req(&r);
        pthread_mutex_lock(&p->mu);
        p->fin[(p->fin_head + p->fin_n) % KVT_AQ_MAX_DEPTH] = r;
        p->fin_n++;
        pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void pool_close(void *impl)
{
    struct pool *p = impl;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (unsigned i = 0; i < p->n_th; i++)
        pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static int pool_open(unsigned depth, void **impl)
{
    struct pool *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->done, NULL);
    unsigned want = depth < MAX_WORKERS ? depth : MAX_WORKERS;
    while (p->n_th < want && kvt_mem_thread_start(&p->th[p->n_th], "kvt-io", worker, p) == 0)
        p->n_th++;
    if (p->n_th == 0) {
        pool_close(p);
        return -EAGAIN;
    }
    *impl = p;
    return 0;
}

static int pool_queue(struct pool *p, const struct req *r)
{
    pthread_mutex_lock(&p->mu);
    if (p->todo_n == KVT_AQ_MAX_DEPTH) {
        pthread_mutex_unlock(&p->mu);
        return -EBUSY;
    }
    p->todo[(p->todo_head + p->todo_n) % KVT_AQ_MAX_DEPTH] = *r;
    p->todo_n++;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

static int pool_submit(void *impl, int fd, int write, void *buf, size_t len, uint64_t off,
                       uint64_t tag)
{
    return pool_queue(
        impl,
        &(struct req){.fd = fd, .write = write, .buf = buf, .len = len, .off = off, .tag = tag});
}

static int pool_readv(void *impl, int fd, const struct iovec *iov, int n, uint64_t off,
                      uint64_t tag)
{
    return pool_queue(impl,
                      &(struct req){.fd = fd, .iov = iov, .iovcnt = n, .off = off, .tag = tag});
}

/* Take the oldest completion, waiting for one when @p wait; -EAGAIN: none yet. */
static int pool_take(struct pool *p, bool wait, uint64_t *tag, int64_t *res)
{
    pthread_mutex_lock(&p->mu);
    while (wait && p->fin_n == 0)
        pthread_cond_wait(&p->done, &p->mu);
    if (p->fin_n == 0) {
        pthread_mutex_unlock(&p->mu);
        return -EAGAIN;
    }
    struct req r = p->fin[p->fin_head];
    p->fin_head = (p->fin_head + 1) % KVT_AQ_MAX_DEPTH;
    p->fin_n--;
    pthread_mutex_unlock(&p->mu);
    *tag = r.tag;
    *res = r.res;
    return 0;
}

static int pool_wait(void *impl, uint64_t *tag, int64_t *res)
{
    return pool_take(impl, true, tag, res);
}

static int pool_poll(void *impl, uint64_t *tag, int64_t *res)
{
    return pool_take(impl, false, tag, res);
}

static const struct kvt_aq_ops pool_ops = {
    .name = "threads",
    .open = pool_open,
    .close = pool_close,
    .submit = pool_submit,
    .readv = pool_readv,
    .wait = pool_wait,
    .poll = pool_poll,
};

const struct kvt_aq_ops *kvt_aq_threads(void)
{
    return &pool_ops;
}

int kvt_aq_open(struct kvt_aq *q, unsigned depth, const char *engine)
{
    return kvt_io()->aq_open(q, depth, engine);
}

int kvt_aq_open_os(struct kvt_aq *q, unsigned depth, const char *engine)
{
    memset(q, 0, sizeof(*q));
    if (depth == 0 || depth > KVT_AQ_MAX_DEPTH)
        return -EINVAL;
    if (!engine)
        engine = kvt_mem_io_engine();
    const struct kvt_aq_ops *order[2] = {kvt_aq_uring(), kvt_aq_threads()};
    if (engine && !strcmp(engine, "threads"))
        order[0] = NULL;
    else if (engine && !strcmp(engine, "io_uring"))
        order[1] = NULL;
    int rc = -ENOSYS;
    for (int i = 0; i < 2; i++) {
        if (!order[i])
            continue;
        rc = order[i]->open(depth, &q->impl);
        if (rc == 0) {
            q->ops = order[i];
            q->depth = depth;
            return 0;
        }
    }
    return rc;
}

void kvt_aq_close(struct kvt_aq *q)
{
    if (!q || !q->ops)
        return;
    while (q->inflight > 0) {
        uint64_t tag;
        int64_t res;
        if (kvt_aq_wait(q, &tag, &res) < 0)
            break;
    }
    q->ops->close(q->impl);
    memset(q, 0, sizeof(*q));
}

int kvt_aq_submit(struct kvt_aq *q, int fd, int write, void *buf, size_t len, uint64_t off,
                  uint64_t tag)
{
    if (q->inflight >= q->depth)
        return -EBUSY;
    int rc = q->ops->submit(q->impl, fd, write, buf, len, off, tag);
    if (rc == 0)
        q->inflight++;
    return rc;
}

int kvt_aq_readv(struct kvt_aq *q, int fd, const struct iovec *iov, int n, uint64_t off,
                 uint64_t tag)
{
    if (q->inflight >= q->depth)
        return -EBUSY;
    if (n <= 0 || n > IOV_MAX)
        return -EINVAL;
    int rc = q->ops->readv(q->impl, fd, iov, n, off, tag);
    if (rc == 0)
        q->inflight++;
    return rc;
}

/* Take one completion, waiting for it when @p wait. */
static int take(struct kvt_aq *q, bool wait, uint64_t *tag, int64_t *res)
{
    if (q->inflight == 0)
        return wait ? -EINVAL : -EAGAIN;
    int rc = (wait ? q->ops->wait : q->ops->poll)(q->impl, tag, res);
    if (rc == 0)
        q->inflight--;
    return rc;
}

int kvt_aq_wait(struct kvt_aq *q, uint64_t *tag, int64_t *res)
{
    return take(q, true, tag, res);
}

int kvt_aq_poll(struct kvt_aq *q, uint64_t *tag, int64_t *res)
{
    return take(q, false, tag, res);
}

const char *kvt_aq_name(const struct kvt_aq *q)
{
    return q->ops ? q->ops->name : "none";
}
