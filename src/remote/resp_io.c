/*
 * RESP I/O for the bulk payloads, on the socket of a hiredis connection while hiredis has
 * nothing buffered: requests go out with writev straight from the entry's bytes, and a bulk
 * reply is read straight into its destination once its announced length has been checked
 * against the length expected, so a hostile or confused server can never make us allocate
 * or write past what the index record promised.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/error.h"
#include "remote/remote_parts.h"

static int io_errno(void)
{
    return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
}

/* Wait until @p fd is ready for @p events or @p deadline_ms (monotonic; 0 = no deadline, the
 * socket's own timeout applies) has passed: 0 or -ETIMEDOUT. */
static int wait_ready(int fd, short events, int64_t deadline_ms)
{
    if (!deadline_ms)
        return 0;
    for (;;) {
        int64_t left = deadline_ms - kvt_mono_ms();
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd p = {fd, events, 0};
        int k = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
        if (k > 0)
            return 0;
        if (k < 0 && errno != EINTR)
            return -errno;
    }
}

int kvt_rio_send(int fd, struct iovec *iov, int n, int64_t deadline_ms)
{
    while (n > 0) {
        /* MSG_NOSIGNAL: a peer that went away is an error code, never a SIGPIPE for the host */
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)(n > IOV_MAX ? IOV_MAX : n)};
        ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL | (deadline_ms ? MSG_DONTWAIT : 0));
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && deadline_ms && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_ready(fd, POLLOUT, deadline_ms);
            if (rc < 0)
                return rc;
            continue;
        }
        if (w < 0)
            return io_errno();
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

int kvt_rio_recv(int fd, void *dst, size_t n, size_t *got, int64_t deadline_ms)
{
    for (;;) {
        int rc = wait_ready(fd, POLLIN, deadline_ms);
        if (rc < 0)
            return rc;
        ssize_t k = read(fd, dst, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return io_errno();
        if (k == 0)
            return -ECONNRESET;
        *got = (size_t)k;
        return 0;
    }
}

static int fill(struct kvt_rio *r)
{
    if (r->pos == r->len)
        r->pos = r->len = 0;
    if (r->len == sizeof(r->buf)) {
        memmove(r->buf, r->buf + r->pos, r->len - r->pos);
        r->len -= r->pos;
        r->pos = 0;
    }
    size_t got;
    int rc = kvt_rio_recv(r->fd, r->buf + r->len, sizeof(r->buf) - r->len, &got, r->deadline_ms);
    if (rc == 0)
        r->len += got;
    return rc;
}

/* One CRLF-terminated line into @p line (without the CRLF). */
static int read_line(struct kvt_rio *r, char *line, size_t cap)
{
    for (;;) {
        uint8_t *s = r->buf + r->pos;
        uint8_t *nl = memchr(s, '\n', r->len - r->pos);
        if (nl) {
            size_t n = (size_t)(nl - s);
            if (n == 0 || s[n - 1] != '\r')
                return kvt_fail(KVT_E_CORRUPT, "redis: malformed reply line");
            n--;
            if (memchr(s, '\0', n)) /* the line is used as a C string: "$3\0..." is no 3 */
                return kvt_fail(KVT_E_CORRUPT, "redis: NUL byte in a reply line");
            if (n >= cap)
                n = cap - 1; /* error texts are truncated, never overrun */
            memcpy(line, s, n);
            line[n] = '\0';
            r->pos += (size_t)(nl - s) + 1;
            return 0;
        }
        if (r->len - r->pos >= sizeof(r->buf) - 1)
            return kvt_fail(KVT_E_CORRUPT, "redis: reply line too long");
        int rc = fill(r);
        if (rc < 0)
            return rc;
    }
}

/* Exactly @p n bytes to @p dst: first what is buffered, then straight from the socket. */
static int read_exact(struct kvt_rio *r, uint8_t *dst, size_t n)
{
    size_t have = r->len - r->pos;
    size_t take = have < n ? have : n;
    memcpy(dst, r->buf + r->pos, take);
    r->pos += take;
    for (size_t done = take, got; done < n; done += got) {
        int rc = kvt_rio_recv(r->fd, dst + done, n - done, &got, r->deadline_ms);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* reply_line(): a bulk's length line was read, its bytes follow */
#define BULK 4

/* Below this, a piece is read through the buffer (one read for many small pieces). */
#define DIRECT_MIN ((size_t)4096)

/* @p want bytes into @p s piece by piece (NULL: dropped). 0, KVT_R_SINK or -errno. */
static int read_sink(struct kvt_rio *r, size_t want, const struct kvt_rsink *s)
{
    while (want > 0) {
        uint8_t *at = NULL;
        size_t len = want;
        if (s && (r->sink_rc = s->next(s->ud, &at, &len)) != 0)
            return KVT_R_SINK;
        if (s && len == 0) { /* no progress could ever be made */
            r->sink_rc = kvt_fail(-EINVAL, "redis: a reply's sink offered no room");
            return KVT_R_SINK;
        }
        len = len < want ? len : want;
        if (r->pos == r->len && (!at || len < DIRECT_MIN)) {
            int rc = fill(r);
            if (rc < 0)
                return rc;
        }
        size_t got = r->len - r->pos;
        if (got) {
            got = got < len ? got : len;
            if (at)
                memcpy(at, r->buf + r->pos, got);
            r->pos += got;
        } else {
            int rc = kvt_rio_recv(r->fd, at, len, &got, r->deadline_ms);
            if (rc < 0)
                return rc;
        }
        if (s && (r->sink_rc = s->wrote(s->ud, got)) != 0)
            return KVT_R_SINK;
        want -= got;
    }
    return 0;
}

/* Whether @p s is a length as Redis writes it: -1, or digits with no leading zero (strtoll
 * alone would take "", " 5", "+5" and "-0"). */
static bool canonical_len(const char *s)
{
    size_t n = strspn(s, "0123456789");
    return !strcmp(s, "-1") || (n > 0 && s[n] == '\0' && (s[0] != '0' || n == 1));
}

/* The bulk's announced length, checked against @p want. */
static int bulk_len(const char *line, bool have_dst, size_t want)
{
    errno = 0;
    long long len = strtoll(line + 1, NULL, 10);
    if (!canonical_len(line + 1) || errno)
        return kvt_fail(KVT_E_CORRUPT, "redis: bad bulk length \"%.32s\"", line);
    if (len == -1)
        return KVT_R_NIL;
    if (!have_dst || (unsigned long long)len != want)
        return kvt_fail(KVT_E_CORRUPT, "redis: bulk of %lld bytes where %zu were expected", len,
                        want);
    return KVT_R_OK;
}

static int read_crlf(struct kvt_rio *r)
{
    char crlf[2];
    int rc = read_exact(r, (uint8_t *)crlf, 2);
    if (rc == 0 && (crlf[0] != '\r' || crlf[1] != '\n'))
        rc = kvt_fail(KVT_E_CORRUPT, "redis: bulk not terminated");
    return rc;
}

static int read_bulk(struct kvt_rio *r, const char *line, void *dst, size_t want)
{
    int rc = bulk_len(line, dst != NULL, want);
    if (rc == KVT_R_OK)
        rc = read_exact(r, dst, want);
    return rc == KVT_R_OK ? read_crlf(r) : rc;
}

/* One reply line into @p line: a bulk's length line, or the whole reply. */
static int reply_line(struct kvt_rio *r, char *line, size_t cap, bool bulk_wanted)
{
    int rc = read_line(r, line, cap);
    if (rc < 0)
        return rc;
    switch (line[0]) {
    case '+':
    case ':':
        return bulk_wanted ? kvt_fail(KVT_E_CORRUPT, "redis: status where a bulk was expected")
                           : KVT_R_OK;
    case '-': snprintf(r->err, sizeof(r->err), "%s", line + 1); return KVT_R_ERR;
    case '$': return BULK;
    default:
        return isgraph((unsigned char)line[0])
                   ? kvt_fail(KVT_E_CORRUPT, "redis: unexpected reply type '%c'", line[0])
                   : kvt_fail(KVT_E_CORRUPT, "redis: unexpected reply type 0x%02x",
                              (unsigned char)line[0]);
    }
}

int kvt_rio_reply(struct kvt_rio *r, void *dst, size_t want)
{
    char line[256];
    int rc = reply_line(r, line, sizeof(line), dst != NULL);
    return rc == BULK ? read_bulk(r, line, dst, want) : rc;
}

int kvt_rio_reply_sink(struct kvt_rio *r, size_t want, const struct kvt_rsink *sink)
{
    char line[256];
    int rc = reply_line(r, line, sizeof(line), true);
    if (rc == BULK)
        rc = bulk_len(line, true, want);
    if (rc == KVT_R_OK)
        rc = read_sink(r, want, sink);
    return rc == KVT_R_OK ? read_crlf(r) : rc;
}

bool kvt_rio_pending(const struct kvt_rio *r)
{
    return r->pos != r->len;
}
