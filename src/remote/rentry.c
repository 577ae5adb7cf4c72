/*
 * An entry's bytes as chunk keys on the master of its hash tag: SETs go out pipelined with
 * writev straight from the entry's memory (its file image), each with a time to live that
 * PERSISTs (pipelined the same way) lift once the entry is published; GET replies go in order
 * to a sink (a fed load), each checked against the chunk length the index record promised
 * before a byte is read. A window bounds the requests in flight. Redirections are followed
 * per command: an ASK fetches that one chunk from the node it names while the pipeline goes on,
 * MOVED and a busy cluster (TRYAGAIN, CLUSTERDOWN) go on from that chunk on the slot's node, so
 * no transfer restarts into chunks the other node does not have. A connection that went stale
 * since its last use (a server restart) is reconnected once; any other connection failure
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
#include "remote/remote_parts.h"

#define WINDOW 8
#define DEL_BATCH 256u /* chunks per DEL */
#define MAX_HOPS 8     /* redirections and busy waits of one transfer */
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
    int64_t dl = x->rc->deadline_ms;
    if (x->op != PUT)
        return kvt_rio_send(fd, iov, 1, dl);
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
            return kvt_rio_send(fd, iov, n, dl);
        }
        int rc = kvt_rio_send(fd, iov, n, dl);
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

/* Node @p n's connection is unusable after @p rc (replies left unread, out of step, or a
 * connection fault, which also marks the map stale): closed. Returns @p rc. */
static int broken(const struct xfer *x, struct kvt_rnode *n, int rc)
{
    if (rc == KVT_R_SINK || rc <= -1000 || rc == -EPROTO) {
        kvt_rnode_close(n); /* the server itself is fine: reconnect at once */
        return rc;
    }
    rc = kvt_fail(rc, "redis: %s:%d: %s", n->host ? n->host : "unix socket", n->port,
                  rc == -ETIMEDOUT ? "the call's deadline passed" : strerror(-rc));
    kvt_rnode_fail(n);
    x->rc->stale = x->rc->cluster;
    return rc;
}

/* Chunk @p i alone on @p n, the node an ASK named (ASKING first): the pipeline on the slot's
 * own node goes on afterwards. KVT_R_OK, KVT_R_NIL, KVT_R_SINK (its code in io->sink_rc) or
 * < 0; any other error reply is an error (a second redirection is not chased). */
static int asked(const struct xfer *x, struct kvt_rnode *n, uint32_t i, struct kvt_rio *io)
{
    if (n->c->reader->len != n->c->reader->pos)
        return broken(x, n, kvt_fail(-EPROTO, "redis: unread reply bytes on the connection"));
    struct kvt_rio *a = malloc(sizeof(*a));
    if (!a)
        return kvt_fail(-ENOMEM, "redis: out of memory");
    *a = (struct kvt_rio){.fd = n->c->fd, .deadline_ms = x->rc->deadline_ms};
    int rc = send_req(x, a->fd, i, true);
    if (rc == 0)
        rc = recv_reply(x, a, i, true, true);
    if (rc == KVT_R_ERR)
        rc = kvt_fail(-EIO, "redis: %s", a->err);
    else if (rc >= 0 && rc != KVT_R_SINK && kvt_rio_pending(a))
        rc = kvt_fail(-EPROTO, "redis: extra reply bytes");
    if (rc == KVT_R_SINK || (rc < 0 && rc != -EIO))
        rc = broken(x, n, rc);
    io->sink_rc = a->sink_rc;
    free(a);
    return rc;
}

/* pass(): the chunk must go again, from the slot's node now (MOVED, TRYAGAIN, CLUSTERDOWN) */
#define AGAIN 5

/* Error reply @p err to chunk @p i, followed for this one command: ASK fetches it from the
 * named node, MOVED (the map updated) and a busy cluster say AGAIN; anything else is an error. */
static int follow(const struct xfer *x, const char *err, uint32_t i, struct kvt_rio *io)
{
    if (kvt_rclient_busy(x->rc, err))
        return AGAIN;
    bool ask;
    struct kvt_rnode *to = kvt_rclient_redirect(x->rc, err, &ask);
    if (!to)
        return kvt_fail(-EIO, "redis: %s", err);
    return ask ? asked(x, to, i, io) : AGAIN;
}

/*
 * Chunks [from, n_chunks) pipelined on node @p n, each reply in order into the sink. At the
 * first reply that is not a chunk the sends stop and the replies in flight are read and
 * dropped (the connection stays in step); *@p next is then that chunk. KVT_R_OK, KVT_R_NIL,
 * AGAIN, KVT_R_SINK or < 0 (a connection that is out of step is closed).
 */
static int pass(const struct xfer *x, struct kvt_rnode *n, uint32_t from, struct kvt_rio *io,
                uint32_t *next)
{
    if (n->c->reader->len != n->c->reader->pos)
        return broken(x, n, kvt_fail(-EPROTO, "redis: unread reply bytes on the connection"));
    io->fd = n->c->fd;
    io->deadline_ms = x->rc->deadline_ms;
    io->pos = io->len = 0;
    if (x->op == GET && from == 0)
        x->sink->restart(x->sink->ud);
    uint32_t sent = from, got = from, total = x->e->n_chunks;
    int result = KVT_R_OK;
    while (got < sent || (result == KVT_R_OK && sent < total)) {
        while (result == KVT_R_OK && sent < total && sent - got < WINDOW) {
            int rc = send_req(x, io->fd, sent++, false);
            if (rc < 0)
                return broken(x, n, rc);
        }
        int rc = recv_reply(x, io, got, false, result == KVT_R_OK);
        if (rc == KVT_R_SINK || rc < 0)
            return broken(x, n, rc);
        n->used = true;
        if (rc == KVT_R_ERR)
            rc = result == KVT_R_OK ? follow(x, io->err, got, io) : KVT_R_OK;
        if (rc == KVT_R_SINK) /* the ASK target's bytes were refused: this one has replies left */
            return broken(x, n, rc);
        if (rc != KVT_R_OK && result == KVT_R_OK) {
            result = rc; /* keep reading: the connection stays in step */
            *next = got;
        }
        got++;
    }
    if (kvt_rio_pending(io))
        return broken(x, n, kvt_fail(-EPROTO, "redis: extra reply bytes"));
    return result;
}

/* Every chunk, following redirections per command and going on from the chunk they named; a
 * connection that went stale since its last use (a server restart) is reconnected once and
 * the transfer starts over. */
static int run(const struct xfer *x)
{
    char key[KEY_MAX];
    kvt_rkeys_chunk(x->k, x->e->ns, x->e->uuid, 0, key, sizeof(key));
    struct kvt_rio *io = malloc(sizeof(*io));
    if (!io)
        return kvt_fail(-ENOMEM, "redis: out of memory");
    uint32_t from = 0;
    bool reconnected = false;
    int rc = AGAIN;
    for (int hop = 0; rc == AGAIN && hop < MAX_HOPS; hop++) {
        struct kvt_rnode *n;
        rc = kvt_rclient_node(x->rc, key, &n);
        if (rc < 0)
            break;
        bool was_used = n->used;
        rc = pass(x, n, from, io, &from);
        if (rc < 0 && !reconnected && kvt_rclient_reconnect(x->rc, n, was_used, rc)) {
            reconnected = true;
            from = 0;
            rc = AGAIN;
        }
    }
    if (rc == AGAIN)
        rc = kvt_fail(-ELOOP, "redis: too many redirections for %s", key);
    if (rc == KVT_R_SINK)
        rc = io->sink_rc;
    free(io);
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

/* DEL of chunks [from, to) in one command: they share the entry's hash tag, so one master
 * holds them all. 0, or < 0 with the error reply (a slot mid-migration) or a failure. */
static int del_batch(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rentry *e,
                     uint32_t from, uint32_t to, char (*keys)[KEY_MAX])
{
    const char *argv[DEL_BATCH + 1] = {"DEL"};
    for (uint32_t i = from; i < to; i++) {
        kvt_rkeys_chunk(k, e->ns, e->uuid, i, keys[i - from], KEY_MAX);
        argv[1 + i - from] = keys[i - from];
    }
    int err = 0;
    redisReply *r = kvt_rclient_cmd(rc, argv[1], (int)(1 + to - from), argv, NULL, &err);
    if (r && r->type == REDIS_REPLY_ERROR)
        err = kvt_fail(-EIO, "redis: DEL: %s", r->str);
    freeReplyObject(r);
    return err;
}

int kvt_rentry_del(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rentry *e)
{
    char(*keys)[KEY_MAX] = malloc(DEL_BATCH * sizeof(*keys));
    if (!keys)
        return kvt_fail(-ENOMEM, "redis: out of memory");
    int err = 0;
    for (uint32_t i = 0; err == 0 && i < e->n_chunks; i += DEL_BATCH) {
        uint32_t to = e->n_chunks - i < DEL_BATCH ? e->n_chunks : i + DEL_BATCH;
        err = del_batch(rc, k, e, i, to, keys);
        if (err == -EIO) { /* keys split between two nodes by a migration: one at a time */
            err = 0;
            for (uint32_t j = i; j < to && err == 0; j++)
                err = del_batch(rc, k, e, j, j + 1, keys);
        }
    }
    free(keys);
    return err;
}
