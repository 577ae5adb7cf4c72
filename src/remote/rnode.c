/*
 * One server connection through hiredis: connect with a timeout (TCP or unix socket), the
 * same timeout on every later read and write, AUTH (password or ACL user), and a short
 * backoff after a failure so that a dead server costs one refused connect per interval
 * instead of one per request.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "remote/remote.h"
#include "tier/tier.h"

#define BACKOFF_MS 500

static struct timeval tv_of(int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

static int auth(struct kvt_rnode *n, const struct kvt_rcfg *cfg)
{
    if (!cfg->password)
        return 0;
    const char *argv[3];
    int argc = 0;
    argv[argc++] = "AUTH";
    if (cfg->user)
        argv[argc++] = cfg->user;
    argv[argc++] = cfg->password;
    redisReply *r = redisCommandArgv(n->c, argc, argv, NULL);
    if (!r) {
        kvt_rnode_fail(n);
        return kvt_fail(-ECONNRESET, "redis: AUTH: connection lost");
    }
    int rc = 0;
    if (r->type == REDIS_REPLY_ERROR)
        rc = kvt_fail(-EACCES, "redis: authentication refused: %s", r->str);
    freeReplyObject(r);
    if (rc < 0) {
        redisFree(n->c);
        n->c = NULL;
    }
    return rc;
}

int kvt_rnode_connect(struct kvt_rnode *n, const struct kvt_rcfg *cfg)
{
    if (n->c)
        return 0;
    int64_t now = kvt_tier_mono_ms();
    if (now < n->retry_at_ms)
        return kvt_fail(-EAGAIN, "redis: backing off after a failure");
    struct timeval tv = tv_of(cfg->timeout_ms);
    redisContext *c = n->host ? redisConnectWithTimeout(n->host, n->port, tv)
                              : redisConnectUnixWithTimeout(cfg->unix_path, tv);
    if (!c || c->err) {
        int rc =
            kvt_fail(-ECONNREFUSED, "redis: connect %s:%d: %s", n->host ? n->host : cfg->unix_path,
                     n->port, c ? c->errstr : "out of memory");
        redisFree(c);
        n->retry_at_ms = now + BACKOFF_MS;
        return rc;
    }
    if (redisSetTimeout(c, tv) != REDIS_OK) {
        redisFree(c);
        n->retry_at_ms = now + BACKOFF_MS;
        return kvt_fail(-EIO, "redis: cannot set socket timeouts");
    }
    n->c = c;
    return auth(n, cfg);
}

void kvt_rnode_fail(struct kvt_rnode *n)
{
    kvt_rnode_close(n);
    n->retry_at_ms = kvt_tier_mono_ms() + BACKOFF_MS;
}

void kvt_rnode_close(struct kvt_rnode *n)
{
    if (n->c)
        redisFree(n->c);
    n->c = NULL;
}

redisReply *kvt_rnode_cmd(struct kvt_rnode *n, int argc, const char **argv, const size_t *len,
                          int *err)
{
    redisReply *r = redisCommandArgv(n->c, argc, argv, len);
    if (!r) {
        bool timeout = n->c->err == REDIS_ERR_IO &&
                       (errno == EAGAIN || errno == EWOULDBLOCK || errno == ETIMEDOUT);
        *err = kvt_fail(timeout ? -ETIMEDOUT : -ECONNRESET, "redis: %s: %s", argv[0],
                        timeout ? "timed out" : n->c->errstr);
        kvt_rnode_fail(n);
    }
    return r;
}
