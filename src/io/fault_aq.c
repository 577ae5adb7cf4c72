/*
 * The fault backend's asynchronous queue: a queue of the OS engines (io_uring or threads)
 * whose every request is first counted and decided like a pread or pwrite (io_fault.h). A
 * failed request never reaches the OS: it completes at once with the error. A short one is
 * sent whole and completes short, at least 512 bytes and a multiple of them (a direct
 * transfer stops on a sector), so the fast streams see what a device can do to them.
 */
#include <errno.h>
#include <stdlib.h>

#include "io/aq.h"
#include "io/io_fault.h"

struct fault_aq {
    struct kvt_aq inner;
    struct kvt_aq_ops ops; /* the inner engine's name, these functions */
    size_t clip[KVT_AQ_MAX_DEPTH * 2];
    uint64_t clip_tag[KVT_AQ_MAX_DEPTH * 2];
    uint64_t failed_tag[KVT_AQ_MAX_DEPTH];
    int64_t failed_res[KVT_AQ_MAX_DEPTH];
    unsigned n_clip, n_failed;
};

/* Decide one request of @p len bytes: 0 = send it, else it has completed with the error. */
static int admit(struct fault_aq *f, int write, size_t len, uint64_t tag)
{
    size_t limit = len;
    int err = kvt_fault_decide(write ? KVT_FAULT_PWRITE : KVT_FAULT_PREAD, NULL, &limit, true);
    if (err) {
        if (f->n_failed == KVT_AQ_MAX_DEPTH)
            return -EBUSY;
        f->failed_tag[f->n_failed] = tag;
        f->failed_res[f->n_failed++] = -err;
        return 1;
    }
    if (limit < len && f->n_clip < KVT_AQ_MAX_DEPTH * 2) {
        size_t sectors = limit / 512 ? limit / 512 : 1;
        f->clip_tag[f->n_clip] = tag;
        f->clip[f->n_clip++] = sectors * 512;
    }
    return 0;
}

static int fa_submit(void *impl, int fd, int write, void *buf, size_t len, uint64_t off,
                     uint64_t tag)
{
    struct fault_aq *f = impl;
    int rc = admit(f, write, len, tag);
    if (rc)
        return rc < 0 ? rc : 0;
    return kvt_aq_submit(&f->inner, fd, write, buf, len, off, tag);
}

static int fa_readv(void *impl, int fd, const struct iovec *iov, int n, uint64_t off, uint64_t tag)
{
    struct fault_aq *f = impl;
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += iov[i].iov_len;
    int rc = admit(f, 0, len, tag);
    if (rc)
        return rc < 0 ? rc : 0;
    return kvt_aq_readv(&f->inner, fd, iov, n, off, tag);
}

/* A completion of the inner queue, shortened if its request was chosen to be short. */
static void clip(struct fault_aq *f, uint64_t tag, int64_t *res)
{
    for (unsigned i = 0; i < f->n_clip; i++)
        if (f->clip_tag[i] == tag) {
            if (*res > (int64_t)f->clip[i])
                *res = (int64_t)f->clip[i];
            f->clip_tag[i] = f->clip_tag[--f->n_clip];
            f->clip[i] = f->clip[f->n_clip];
            return;
        }
}

static int take(struct fault_aq *f, bool wait, uint64_t *tag, int64_t *res)
{
    if (f->n_failed > 0) { /* the failed requests complete first: they never waited */
        *tag = f->failed_tag[0];
        *res = f->failed_res[0];
        f->n_failed--;
        for (unsigned i = 0; i < f->n_failed; i++) {
            f->failed_tag[i] = f->failed_tag[i + 1];
            f->failed_res[i] = f->failed_res[i + 1];
        }
        return 0;
    }
    int rc = wait ? kvt_aq_wait(&f->inner, tag, res) : kvt_aq_poll(&f->inner, tag, res);
    if (rc == 0)
        clip(f, *tag, res);
    return rc;
}

static int fa_wait(void *impl, uint64_t *tag, int64_t *res)
{
    return take(impl, true, tag, res);
}

static int fa_poll(void *impl, uint64_t *tag, int64_t *res)
{
    return take(impl, false, tag, res);
}

static void fa_close(void *impl)
{
    struct fault_aq *f = impl;
    kvt_aq_close(&f->inner);
    free(f);
}

int kvt_fault_aq_open(struct kvt_aq *q, unsigned depth, const char *engine)
{
    struct fault_aq *f = calloc(1, sizeof(*f));
    if (!f)
        return -ENOMEM;
    int rc = kvt_aq_open_os(&f->inner, depth, engine);
    if (rc < 0) {
        free(f);
        return rc;
    }
    f->ops = (struct kvt_aq_ops){
        .name = kvt_aq_name(&f->inner),
        .close = fa_close,
        .submit = fa_submit,
        .readv = fa_readv,
        .wait = fa_wait,
        .poll = fa_poll,
    };
    *q = (struct kvt_aq){.ops = &f->ops, .impl = f, .depth = depth};
    return 0;
}
