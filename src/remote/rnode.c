/*
 * One server connection: hiredis connects (TCP or unix socket, within the call's deadline) and
 * parses replies, kvtier's own socket I/O sends and receives them (no SIGPIPE, one deadline per
 * call across every partial read and write), AUTH (password or ACL user), and a short
 * backoff after a failure so that a dead server costs one refused connect per interval
 * instead of one per request.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "common/clock.h"
#include "common/error.h"
#include "remote/remote_parts.h"

#define BACKOFF_MS 500

static struct timeval tv_of(int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

static int auth(struct kvt_rnode *n, const struct kvt_rcfg *cfg, int64_t deadline_ms)
{
    if (!cfg->password)
        return 0;
    const char *argv[3];
    int argc = 0;
    argv[argc++] = "AUTH";
    if (cfg->user)
        argv[argc++] = cfg->user;
    argv[argc++] = cfg->password;
    int rc = 0;
    redisReply *r = kvt_rnode_cmd(n, argc, argv, NULL, deadline_ms, &rc);
    if (!r)
        return rc;
    if (r->type == REDIS_REPLY_ERROR)
        rc = kvt_fail(-EACCES, "redis: authentication refused: %s", r->str);
    freeReplyObject(r);
    if (rc < 0)
        kvt_rnode_close(n);
    return rc;
}

int kvt_rnode_connect(struct kvt_rnode *n, const struct kvt_rcfg *cfg, int64_t deadline_ms)
{
    if (n->c)
        return 0;
    int64_t now = kvt_mono_ms();
    if (now < n->retry_at_ms)
        return kvt_fail(-EAGAIN, "%s (not retried yet)", n->why);
    int64_t left = deadline_ms - now;
    if (left <= 0)
        return kvt_fail(-ETIMEDOUT, "redis: the call's deadline passed before a connect");
    struct timeval tv = tv_of(left < cfg->timeout_ms ? (int)left : cfg->timeout_ms);
    redisContext *c = n->host ? redisConnectWithTimeout(n->host, n->port, tv)
                              : redisConnectUnixWithTimeout(cfg->unix_path, tv);
    if (!c || c->err) {
        int rc =
            kvt_fail(-ECONNREFUSED, "redis: connect %s:%d: %s", n->host ? n->host : cfg->unix_path,
                     n->port, c ? c->errstr : "out of memory");
        redisFree(c);
        kvt_rnode_fail(n);
        return rc;
    }
    if (redisSetTimeout(c, tv) != REDIS_OK) {
        redisFree(c);
        int rc = kvt_fail(-EIO, "redis: cannot set socket timeouts");
        kvt_rnode_fail(n);
        return rc;
    }
    n->c = c;
    n->used = false;
    return auth(n, cfg, deadline_ms);
}

void kvt_rnode_fail(struct kvt_rnode *n)
{
    snprintf(n->why, sizeof(n->why), "%s", kvt_last_error());
    kvt_rnode_close(n);
    n->retry_at_ms = kvt_mono_ms() + BACKOFF_MS;
}

void kvt_rnode_close(struct kvt_rnode *n)
{
    if (n->c)
        redisFree(n->c);
    n->c = NULL;
}

/* Send the request, then feed what arrives to the connection's hiredis reader until it holds
 * a whole reply: kvtier's own socket I/O, so no write raises SIGPIPE and the call's deadline
 * bounds the whole exchange, not each read. 0 or -errno. */
static int exchange(struct kvt_rnode *n, const char *req, size_t len, int64_t deadline_ms,
                    void **reply)
{
    struct iovec iov = {(void *)req, len};
    int rc = kvt_rio_send(n->c->fd, &iov, 1, deadline_ms);
    while (rc == 0) {
        if (redisReaderGetReply(n->c->reader, reply) != REDIS_OK)
            return -EPROTO;
        if (*reply)
            return 0;
        char buf[16384];
        size_t got;
        rc = kvt_rio_recv(n->c->fd, buf, sizeof(buf), &got, deadline_ms);
        if (rc == 0 && redisReaderFeed(n->c->reader, buf, got) != REDIS_OK)
            rc = -EPROTO;
    }
    return rc;
}

/* Error text a server sends lands in messages and logs: printable ASCII only, at most
 * ERR_MAX bytes, so that a hostile or broken server cannot write control sequences into a
 * terminal or a log, or flood it. */
#define ERR_MAX 240
static void clean_errors(redisReply *r)
{
    if (r->type == REDIS_REPLY_ERROR && r->str) {
        if (r->len > ERR_MAX)
            r->len = ERR_MAX, r->str[ERR_MAX] = '\0';
        for (size_t i = 0; i < r->len; i++)
            if ((unsigned char)r->str[i] < 0x20 || (unsigned char)r->str[i] > 0x7e)
                r->str[i] = '?';
    }
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++)
        if (r->element[i])
            clean_errors(r->element[i]);
}

redisReply *kvt_rnode_cmd(struct kvt_rnode *n, int argc, const char **argv, const size_t *len,
                          int64_t deadline_ms, int *err)
{
    char *req = NULL;
    int rl = redisFormatCommandArgv(&req, argc, argv, len);
    if (rl < 0) {
        *err = kvt_fail(-ENOMEM, "redis: %s: out of memory", argv[0]);
        return NULL;
    }
    void *r = NULL;
    int rc = exchange(n, req, (size_t)rl, deadline_ms, &r);
    redisFreeCommand(req);
    if (rc < 0) {
        *err = kvt_fail(rc, "redis: %s: %s", argv[0],
                        rc == -ETIMEDOUT ? "timed out"
                        : rc == -EPROTO  ? "protocol error"
                                         : strerror(-rc));
        kvt_rnode_fail(n);
        return NULL;
    }
    n->used = true;
    clean_errors(r);
    return r;
}
