/*
 * The device limits `kvtier bench` compares against, measured in the same run on the same
 * directory: raw durable writes of the same bytes (buffered pwrite + fsync, and O_DIRECT with
 * several writes in flight), a raw best-effort read (O_DIRECT, several reads in flight through
 * io_uring where the build has liburing, else reader threads), and the helpers that make a
 * file cold or warm. Nothing here uses the library: these are the baselines it is held to.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef KVT_HAVE_URING
#include <liburing.h>
#endif

#include "bench.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define RAW_ALIGN 4096u
#define RAW_CHUNK ((size_t)4 << 20)   /* bytes per read request */
#define RAW_DEPTH 8u                  /* read requests in flight */
#define RAW_WCHUNK ((size_t)16 << 20) /* bytes per direct write request */
#define RAW_WDEPTH 4u                 /* direct write requests in flight */
#define HUGE ((size_t)2 << 20)
#define RAW_BUFFERED_PIECE ((size_t)64 << 20)

double bench_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, size_t n)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

const char *bench_raw_engine(void)
{
#ifdef KVT_HAVE_URING
    return "io_uring";
#else
    return "threads";
#endif
}

uint64_t bench_round_up(uint64_t len)
{
    return (len + RAW_ALIGN - 1) & ~(uint64_t)(RAW_ALIGN - 1);
}

void *bench_map(uint64_t len, bool prefault)
{
    size_t n = (size_t)bench_round_up(len ? len : 1);
    /* from 2 MiB on, on huge pages, as kvtier's large buffers and staging: over scattered
     * 4 KiB pages a direct request is split at the device's segment limit */
    size_t extra = n >= HUGE ? HUGE : 0;
    uint8_t *m = mmap(NULL, n + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    uint8_t *p = extra ? (uint8_t *)(((uintptr_t)m + HUGE - 1) & ~(uintptr_t)(HUGE - 1)) : m;
    if (p > m) /* keep exactly [p, p + n): bench_unmap() unmaps that */
        munmap(m, (size_t)(p - m));
    if (p + n < m + n + extra)
        munmap(p + n, (size_t)(m + n + extra - (p + n)));
    if (extra)
        madvise(p, n & ~(HUGE - 1), MADV_HUGEPAGE);
    if (prefault) {
        /* not inherited by the measuring children: a fork would make every page copy-on-write
         * again and the next write here would fault it back in */
        madvise(p, n, MADV_DONTFORK);
        if (madvise(p, n, MADV_POPULATE_WRITE) != 0)
            memset(p, 0, n);
    }
    return p;
}

void bench_level_memory(uint64_t bytes)
{
    /* in huge pages (bench_map), as restores use them: memory freed in 4 KiB pieces comes back
     * slowly to a huge-page fault on this kind of VM, and 2 MiB blocks serve 4 KiB faults too */
    void *p = bench_map(bytes, false);
    if (!p)
        return;
    if (madvise(p, (size_t)bench_round_up(bytes), MADV_POPULATE_WRITE) != 0)
        memset(p, 0, (size_t)bytes);
    bench_unmap(p, bytes);
}

void bench_unmap(void *p, uint64_t len)
{
    if (p)
        munmap(p, (size_t)bench_round_up(len ? len : 1));
}

static int write_all(int fd, const void *buf, size_t n, uint64_t off)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n > RAW_BUFFERED_PIECE ? RAW_BUFFERED_PIECE : n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        if (w == 0)
            return -EIO;
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t n, uint64_t off, size_t *got)
{
    char *p = buf;
    *got = 0;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            break; /* end of file */
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
        *got += (size_t)r;
    }
    return 0;
}

/* fsync the directory @p dir, or with @p whole_fs commit its whole file system (syncfs). */
static int sync_dir(const char *dir, bool whole_fs)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = (whole_fs ? syncfs(fd) : fsync(fd)) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

static int fsync_parent(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (n >= sizeof(dir))
        return -ENAMETOOLONG;
    if (slash && n == 0)
        n = 1; /* "/file" */
    memcpy(dir, slash ? path : ".", slash ? n : 1);
    dir[slash ? n : 1] = '\0';
    return sync_dir(dir, false);
}

/* One staging chunk of a direct write: the bytes of a span piece padded to the granule. */
struct stage {
    void *buf;
    uint64_t off;
    size_t len;
};

/* Fill @p st with the piece of @p s starting at @p pos; zero padding to the granule. */
static void stage_fill(struct stage *st, const struct bench_span *s, size_t pos)
{
    size_t n = s->len - pos < RAW_WCHUNK ? s->len - pos : RAW_WCHUNK;
    memcpy(st->buf, (const char *)s->data + pos, n);
    size_t padded = (size_t)bench_round_up(n);
    memset((char *)st->buf + n, 0, padded - n);
    st->off = s->off + pos;
    st->len = padded;
}

#ifdef KVT_HAVE_URING
/* Submit what is queued and wait for one completion: its slot in *k, its result in *res. */
static int reap_one(struct io_uring *ring, unsigned *k, int *res)
{
    int rc = io_uring_submit(ring);
    if (rc < 0)
        return rc;
    struct io_uring_cqe *cqe;
    rc = io_uring_wait_cqe(ring, &cqe);
    if (rc < 0)
        return rc;
    *k = (unsigned)io_uring_cqe_get_data64(cqe);
    *res = cqe->res;
    io_uring_cqe_seen(ring, cqe);
    return 0;
}

/* Wait for the @p inflight requests left after an error, so none outlives its buffer. */
static void drain_and_exit(struct io_uring *ring, unsigned inflight)
{
    if (inflight > 0)
        io_uring_submit(ring);
    for (; inflight > 0; inflight--) {
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(ring, &cqe) < 0)
            break;
        io_uring_cqe_seen(ring, cqe);
    }
    io_uring_queue_exit(ring);
}

static int direct_write_spans(int fd, const struct bench_span *s, size_t n, void *staging)
{
    struct io_uring ring;
    struct stage st[RAW_WDEPTH];
    unsigned free_slots[RAW_WDEPTH], nfree = RAW_WDEPTH, inflight = 0;
    int rc = io_uring_queue_init(RAW_WDEPTH, &ring, 0);
    if (rc < 0)
        return rc;
    for (unsigned i = 0; i < RAW_WDEPTH; i++) {
        st[i].buf = (char *)staging + (size_t)i * RAW_WCHUNK;
        free_slots[i] = i;
    }
    size_t si = 0, pos = 0;
    while (rc == 0 && (si < n || inflight > 0)) {
        while (nfree > 0 && si < n) {
            if (pos >= s[si].len) {
                si++;
                pos = 0;
                continue;
            }
            unsigned k = free_slots[--nfree];
            stage_fill(&st[k], &s[si], pos);
            pos += RAW_WCHUNK;
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            io_uring_prep_write(sqe, fd, st[k].buf, (unsigned)st[k].len, st[k].off);
            io_uring_sqe_set_data64(sqe, k);
            inflight++;
        }
        if (inflight == 0)
            break;
        unsigned k;
        int res;
        if ((rc = reap_one(&ring, &k, &res)) < 0)
            break;
        if (res < 0)
            rc = res;
        else if ((size_t)res != st[k].len)
            rc = -EIO; /* a short direct write: the device is full or failing */
        free_slots[nfree++] = k;
        inflight--;
    }
    drain_and_exit(&ring, inflight);
    return rc;
}
#else
static int direct_write_spans(int fd, const struct bench_span *s, size_t n, void *staging)
{
    struct stage st = {.buf = staging};
    for (size_t i = 0; i < n; i++) {
        for (size_t pos = 0; pos < s[i].len; pos += RAW_WCHUNK) {
            stage_fill(&st, &s[i], pos);
            int rc = write_all(fd, st.buf, st.len, st.off);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}
#endif

int bench_raw_write(const char *path, const struct bench_span *s, size_t n, uint64_t file_size,
                    bool direct, double *secs)
{
    void *staging = NULL;
    int rc = 0;
    *secs = 0;
    if (direct) {
        for (size_t i = 0; i < n; i++)
            if (s[i].off % RAW_ALIGN)
                return -EINVAL;
        staging = bench_map((uint64_t)RAW_WCHUNK * RAW_WDEPTH, true);
        if (!staging)
            return -ENOMEM;
    }
    double t0 = bench_now();
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC | (direct ? O_DIRECT : 0), 0644);
    if (fd < 0) {
        rc = -errno;
        goto out;
    }
    if (direct) {
        rc = direct_write_spans(fd, s, n, staging);
    } else {
        for (size_t i = 0; i < n && rc == 0; i++)
            rc = write_all(fd, s[i].data, s[i].len, s[i].off);
    }
    if (rc == 0 && ftruncate(fd, (off_t)file_size) != 0)
        rc = -errno;
    if (rc == 0 && fsync(fd) != 0)
        rc = -errno;
    close(fd);
    if (rc == 0)
        rc = fsync_parent(path);
    *secs = bench_now() - t0;
out:
    bench_unmap(staging, (uint64_t)RAW_WCHUNK * RAW_WDEPTH);
    return rc;
}

/* Cuts spans into requests of at most RAW_CHUNK bytes (the last of a span rounded up). */
struct cursor {
    const struct bench_span *s;
    size_t n, i;
    uint64_t pos;
};

static bool cursor_next(struct cursor *c, struct stage *req)
{
    while (c->i < c->n && c->pos >= c->s[c->i].len) {
        c->i++;
        c->pos = 0;
    }
    if (c->i >= c->n)
        return false;
    const struct bench_span *sp = &c->s[c->i];
    uint64_t left = bench_round_up(sp->len) - c->pos;
    req->buf = (char *)sp->data + c->pos;
    req->off = sp->off + c->pos;
    req->len = left < RAW_CHUNK ? (size_t)left : RAW_CHUNK;
    c->pos += req->len;
    return true;
}

#ifdef KVT_HAVE_URING
static int read_spans(int fd, const struct bench_span *sp, size_t n)
{
    struct io_uring ring;
    struct stage req[RAW_DEPTH];
    struct cursor cur = {.s = sp, .n = n};
    unsigned free_slots[RAW_DEPTH], nfree = RAW_DEPTH, inflight = 0;
    bool more = true;
    int rc = io_uring_queue_init(RAW_DEPTH, &ring, 0);
    if (rc < 0)
        return rc;
    for (unsigned i = 0; i < RAW_DEPTH; i++)
        free_slots[i] = i;
    while (rc == 0 && (more || inflight > 0)) {
        while (nfree > 0 && more) {
            unsigned k = free_slots[nfree - 1];
            if (!(more = cursor_next(&cur, &req[k])))
                break;
            nfree--;
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            io_uring_prep_read(sqe, fd, req[k].buf, (unsigned)req[k].len, req[k].off);
            io_uring_sqe_set_data64(sqe, k);
            inflight++;
        }
        if (inflight == 0)
            break;
        unsigned k;
        int res;
        if ((rc = reap_one(&ring, &k, &res)) < 0)
            break;
        free_slots[nfree++] = k;
        inflight--;
        if (res < 0) {
            rc = res;
        } else if ((size_t)res < req[k].len) {
            /* short: the end of the file, or a request to finish synchronously */
            size_t got;
            rc = read_all(fd, (char *)req[k].buf + res, req[k].len - (size_t)res,
                          req[k].off + (uint64_t)res, &got);
        }
    }
    drain_and_exit(&ring, inflight);
    return rc;
}
#else
struct reader {
    int fd;
    struct cursor cur;
    pthread_mutex_t mu;
    int rc;
};

static void *reader_main(void *arg)
{
    struct reader *r = arg;
    for (;;) {
        struct stage req;
        pthread_mutex_lock(&r->mu);
        bool more = r->rc == 0 && cursor_next(&r->cur, &req);
        pthread_mutex_unlock(&r->mu);
        if (!more)
            return NULL;
        size_t got;
        int rc = read_all(r->fd, req.buf, req.len, req.off, &got);
        if (rc < 0) {
            pthread_mutex_lock(&r->mu);
            r->rc = r->rc ? r->rc : rc;
            pthread_mutex_unlock(&r->mu);
        }
    }
}

static int read_spans(int fd, const struct bench_span *sp, size_t n)
{
    struct reader r = {.fd = fd, .cur = {.s = sp, .n = n}};
    pthread_t th[RAW_DEPTH];
    unsigned started = 0;
    pthread_mutex_init(&r.mu, NULL);
    for (; started < RAW_DEPTH; started++)
        if (pthread_create(&th[started], NULL, reader_main, &r) != 0)
            break;
    if (started == 0)
        reader_main(&r);
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&r.mu);
    return r.rc;
}
#endif

int bench_raw_read(const char *path, const struct bench_span *s, size_t n, double *secs,
                   bool *was_direct)
{
    *secs = 0;
    *was_direct = true;
    for (size_t i = 0; i < n; i++)
        if ((uintptr_t)s[i].data % RAW_ALIGN || s[i].off % RAW_ALIGN)
            return -EINVAL;
    double t0 = bench_now();
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd < 0 && errno == EINVAL) {
        *was_direct = false;
        fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0)
        return -errno;
    int rc = read_spans(fd, s, n);
    close(fd);
    *secs = bench_now() - t0;
    return rc;
}

int bench_make_cold(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    /* fdatasync: dirty pages cannot be dropped, but a restore's LRU bump of the file's times
     * must not become a journal commit and a device flush just before the next timed step */
    int rc = fdatasync(fd) == 0 ? 0 : -errno;
    if (rc == 0)
        rc = -posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return rc;
}

int bench_settle_disk(const char *dir)
{
    return sync_dir(dir, true);
}

int bench_make_warm(const char *path)
{
    size_t n = (size_t)8 << 20;
    char *buf = malloc(n);
    if (!buf)
        return -ENOMEM;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int rc = fd < 0 ? -errno : 0;
    for (uint64_t off = 0; rc == 0;) {
        size_t got;
        rc = read_all(fd, buf, n, off, &got);
        if (got < n)
            break;
        off += got;
    }
    if (fd >= 0)
        close(fd);
    free(buf);
    return rc;
}
