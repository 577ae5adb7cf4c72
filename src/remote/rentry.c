/*
 * An entry's bytes as chunk keys on the master of its hash tag: SETs go out pipelined with
 * writev straight from the entry's memory (its file image), each with a time to live that
 * PERSISTs (pipelined the same way) lift once the entry is published; GET replies go in order
 * to a sink (a fed load), each checked against the chunk length the index record promised
 * before a byte is read. A window bounds the requests in flight. A redirection (resharding,
 * failover) restarts the whole transfer once on the node it names; a connection failure
 * fails the node and the transfer; a sink that refuses its bytes ends the transfer and drops
 * the connection, which has replies left unread.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/error.h"
#include "format/format.h"
#include "remote/remote.h"

#define WINDOW 8
#define KEY_MAX 256

enum op { PUT, GET, PERSIST };

struct xfer {
    struct kvt_rclient *rc;
    const struct kvt_rkeys *k;
    const struct kvt_rentry *e;
    enum op op;
    const struct kvt_image *im;   /* PUT: the entry's bytes */
    uint64_t ttl_ms;              /* PUT: the chunks' time to live until PERSIST */
    const struct kvt_rsink *sink; /* GET */
};

static size_t chunk_len(const struct kvt_rentry *e, uint32_t i)
{
    uint64_t off = (uint64_t)i * e->chunk;
    return (size_t)(e->bytes - off < e->chunk ? e->bytes - off : e->chunk);
}

/* Send request @p i (ASKING first when @p ask): a SET's value goes out as pieces of the
 * entry's memory, IOV pieces per writev, followed by its PX argument. */
static int send_req(const struct xfer *x, int fd, uint32_t i, bool ask)
{
    enum { IOV = 64 };
    char key[KEY_MAX], head[KEY_MAX + 96], tail[64];
    kvt_rkeys_chunk(x->k, x->e->ns, x->e->uuid, i, key, sizeof(key));
    size_t kl = strlen(key), vl = chunk_len(x->e, i);
    const char *asking = ask ? "*1\r\n$6\r\nASKING\r\n" : "";
    int hl = x->op == GET ? snprintf(head, sizeof(head), "%s*2\r\n$3\r\nGET\r\n$%zu\r\n%s\r\n",
                                     asking, kl, key)
             : x->op == PERSIST
                 ? snprintf(head, sizeof(head), "%s*2\r\n$7\r\nPERSIST\r\n$%zu\r\n%s\r\n", asking,
                            kl, key)
                 : snprintf(head, sizeof(head), "%s*5\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n",
                            asking, kl, key, vl);
    struct iovec iov[IOV + 2] = {{head, (size_t)hl}};
    if (x->op != PUT)
        return kvt_rio_send(fd, iov, 1);
    char ttl[24];
    int tl = snprintf(ttl, sizeof(ttl), "%llu", (unsigned long long)x->ttl_ms);
    int sl = snprintf(tail, sizeof(tail), "\r\n$2\r\nPX\r\n$%d\r\n%s\r\n", tl, ttl);
    int n = 1;
    for (uint64_t at = (uint64_t)i * x->e->chunk, left = vl;;) {
        uint64_t covered;
        n += (int)kvt_image_iov(x->im, at, left, iov + n, IOV, &covered);
        at += covered;
        left -= covered;
        if (left == 0) {
            iov[n++] = (struct iovec){tail, (size_t)sl};
            return kvt_rio_send(fd, iov, n);
        }
        int rc = kvt_rio_send(fd, iov, n);
        if (rc < 0)
            return rc;
        n = 0;
    }
}

/* Reply @p i; @p ok: every reply so far was a chunk, so this one goes on into the sink (else
 * it is read and dropped, keeping the connection in step). */
static int recv_reply(const struct xfer *x, struct kvt_rio *io, uint32_t i, bool ask, bool ok)
{
    if (ask) {
        int rc = kvt_rio_reply(io, NULL, 0);
        if (rc != KVT_R_OK)
            return rc < 0 ? rc : kvt_fail(-EPROTO, "redis: ASKING refused: %s", io->err);
    }
    if (x->op != GET)
        return kvt_rio_reply(io, NULL, 0);
    return kvt_rio_reply_sink(io, chunk_len(x->e, i), ok ? x->sink : NULL);
}

/* One pass over every chunk on node @p n: KVT_R_OK, KVT_R_NIL, KVT_R_ERR (io->err) or < 0. */
static int pass(const struct xfer *x, struct kvt_rnode *n, bool ask, struct kvt_rio *io)
{
    if (n->c->reader->len != n->c->reader->pos)
        return kvt_fail(-EPROTO, "redis: unread reply bytes on the connection");
    io->fd = n->c->fd;
    io->pos = io->len = 0;
    if (x->op == GET)
        x->sink->restart(x->sink->ud);
    uint32_t sent = 0, got = 0;
    int result = KVT_R_OK;
    while (got < x->e->n_chunks) {
        while (sent < x->e->n_chunks && sent - got < WINDOW) {
            int rc = send_req(x, io->fd, sent++, ask);
            if (rc < 0)
                return kvt_fail(rc, "redis: %s:%d: %s", n->host ? n->host : "unix socket", n->port,
                                strerror(-rc));
        }
        int rc = recv_reply(x, io, got++, ask, result == KVT_R_OK);
        if (rc == KVT_R_SINK)
            return rc;
        if (rc < 0 && rc > -1000)
            return kvt_fail(rc, "redis: %s:%d: %s", n->host ? n->host : "unix socket", n->port,
                            strerror(-rc));
        if (rc < 0)
            return rc;
        if (rc != KVT_R_OK && result == KVT_R_OK)
            result = rc; /* keep reading: the connection stays in step */
    }
    return kvt_rio_pending(io) ? kvt_fail(-EPROTO, "redis: extra reply bytes") : result;
}

static int run(const struct xfer *x)
{
    char key[KEY_MAX];
    kvt_rkeys_chunk(x->k, x->e->ns, x->e->uuid, 0, key, sizeof(key));
    struct kvt_rnode *n;
    int rc = kvt_rclient_node(x->rc, key, &n);
    bool ask = false;
    struct kvt_rio io;
    for (int hop = 0; rc == 0 && hop < 3; hop++) {
        rc = pass(x, n, ask, &io);
        if (rc != KVT_R_ERR)
            break;
        n = kvt_rclient_redirect(x->rc, io.err, &ask);
        if (!n)
            return kvt_fail(-EIO, "redis: %s", io.err);
        rc = 0;
    }
    if (rc == KVT_R_ERR)
        return kvt_fail(-ELOOP, "redis: too many redirections for %s", key);
    if (rc == KVT_R_SINK) { /* the server is fine; the connection has unread replies */
        kvt_rnode_close(n);
        return io.sink_rc;
    }
    if (rc < 0 && n) { /* out of step: reconnect, at once when the server itself is fine */
        bool protocol = rc == KVT_E_CORRUPT || rc == -EPROTO;
        if (protocol)
            kvt_rnode_close(n);
        else
            kvt_rnode_fail(n);
        x->rc->stale = x->rc->cluster && !protocol;
    }
    return rc;
}

int kvt_rentry_put(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rentry *e,
                   const struct kvt_image *im, uint64_t ttl_ms)
{
    int r = run(&(struct xfer){rc, k, e, PUT, im, ttl_ms, NULL});
    return r == KVT_R_NIL ? kvt_fail(-EPROTO, "redis: nil reply to SET") : r;
}

int kvt_rentry_persist(struct kvt_rclient *rc, const struct kvt_rkeys *k,
                       const struct kvt_rentry *e)
{
    int r = run(&(struct xfer){rc, k, e, PERSIST, NULL, 0, NULL});
    return r == KVT_R_NIL ? kvt_fail(-EPROTO, "redis: nil reply to PERSIST") : r;
}

int kvt_rentry_get(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rentry *e,
                   const struct kvt_rsink *sink)
{
    return run(&(struct xfer){rc, k, e, GET, NULL, 0, sink});
}

int kvt_rentry_del(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rentry *e)
{
    char key[KEY_MAX];
    const char *argv[2] = {"DEL", key};
    int err = 0;
    for (uint32_t i = 0; i < e->n_chunks; i++) {
        kvt_rkeys_chunk(k, e->ns, e->uuid, i, key, sizeof(key));
        redisReply *r = kvt_rclient_cmd(rc, key, 2, argv, NULL, &err);
        if (!r)
            return err;
        freeReplyObject(r);
    }
    return 0;
}
