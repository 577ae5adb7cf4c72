/*
 * The client over one server or a Redis Cluster. The mode is detected on the first
 * connection (CLUSTER SLOTS answers, or the server says cluster support is disabled). In a
 * cluster every key goes to the master of its slot (CRC16 of the key or of its {hash tag});
 * MOVED updates the slot and schedules a full refresh of the map, ASK retries once on the
 * named node after ASKING, TRYAGAIN and CLUSTERDOWN retry after a short wait while the call's
 * deadline allows, and a connection failure marks the map stale so that a failover's new
 * master is found on the next request.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/error.h"
#include "remote/remote_parts.h"

#define NO_NODE 0xffff
#define MAX_REDIRECTS 4
#define BUSY_WAIT_MS                                                                               \
    20 /* before a command the cluster answered TRYAGAIN or CLUSTERDOWN goes again */

/* CRC16-CCITT (XMODEM), as Redis Cluster hashes keys. */
static uint16_t crc16(const char *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)((uint8_t)p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    return crc;
}

uint16_t kvt_key_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);
    if (open) {
        size_t rest = len - (size_t)(open - key) - 1;
        const char *close = memchr(open + 1, '}', rest);
        if (close && close > open + 1)
            return crc16(open + 1, (size_t)(close - open - 1)) & (KVT_SLOTS - 1);
    }
    return crc16(key, len) & (KVT_SLOTS - 1);
}

static int node_index(struct kvt_rclient *rc, const char *host, int port);

/* The URL's further seeds ("host:port,host:port"): tried in turn when the first is down. */
static void add_seeds(struct kvt_rclient *rc, const char *seeds)
{
    while (seeds && *seeds) {
        char host[256];
        int port, used = 0;
        if (sscanf(seeds, "%255[^:,]:%d%n", host, &port, &used) == 2 && port > 0 && port < 65536)
            node_index(rc, host, port);
        seeds = strchr(seeds, ',');
        if (seeds)
            seeds++;
    }
}

void kvt_rclient_arm(struct kvt_rclient *rc, uint64_t bytes)
{
    rc->deadline_ms = kvt_mono_ms() + rc->cfg.timeout_ms + (int64_t)(bytes / KVT_RATE_FLOOR);
}

int kvt_rclient_init(struct kvt_rclient *rc, const struct kvt_rcfg *cfg)
{
    memset(rc, 0, sizeof(*rc));
    rc->cfg = *cfg;
    rc->nodes = calloc(1, sizeof(*rc->nodes));
    rc->slots = malloc(KVT_SLOTS * sizeof(*rc->slots));
    if (!rc->nodes || !rc->slots) {
        free(rc->nodes);
        free(rc->slots);
        return kvt_fail(-ENOMEM, "redis: out of memory");
    }
    rc->n_nodes = 1; /* node 0: the seed */
    rc->nodes[0].host = cfg->host ? strdup(cfg->host) : NULL;
    rc->nodes[0].port = cfg->port;
    memset(rc->slots, 0xff, KVT_SLOTS * sizeof(*rc->slots));
    add_seeds(rc, cfg->seeds);
    return 0;
}

void kvt_rclient_free(struct kvt_rclient *rc)
{
    for (size_t i = 0; i < rc->n_nodes; i++) {
        kvt_rnode_close(&rc->nodes[i]);
        free(rc->nodes[i].host);
    }
    free(rc->nodes);
    free(rc->slots);
    memset(rc, 0, sizeof(*rc));
}

static int node_index(struct kvt_rclient *rc, const char *host, int port)
{
    for (size_t i = 0; i < rc->n_nodes; i++)
        if (rc->nodes[i].host && !strcmp(rc->nodes[i].host, host) && rc->nodes[i].port == port)
            return (int)i;
    if (rc->n_nodes >= NO_NODE - 1)
        return -1;
    struct kvt_rnode *v = realloc(rc->nodes, (rc->n_nodes + 1) * sizeof(*v));
    if (!v)
        return -1;
    rc->nodes = v;
    memset(&v[rc->n_nodes], 0, sizeof(*v));
    if (!(v[rc->n_nodes].host = strdup(host)))
        return -1;
    v[rc->n_nodes].port = port;
    return (int)rc->n_nodes++;
}

/* One range of a CLUSTER SLOTS reply: [start, end, [host, port, ...], replicas...]. */
static void apply_range(struct kvt_rclient *rc, const redisReply *e, const char *seed_host)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3)
        return;
    const redisReply *a = e->element[0], *b = e->element[1], *m = e->element[2];
    if (a->type != REDIS_REPLY_INTEGER || b->type != REDIS_REPLY_INTEGER ||
        m->type != REDIS_REPLY_ARRAY || m->elements < 2 || a->integer < 0 ||
        b->integer >= KVT_SLOTS || a->integer > b->integer ||
        m->element[0]->type != REDIS_REPLY_STRING || m->element[1]->type != REDIS_REPLY_INTEGER)
        return;
    const char *host = m->element[0]->len ? m->element[0]->str : seed_host;
    int ix = node_index(rc, host, (int)m->element[1]->integer);
    for (long long s = a->integer; ix >= 0 && s <= b->integer; s++)
        rc->slots[s] = (uint16_t)ix;
}

/* Ask @p n for the slot map; 1 = cluster (map applied), 0 = not a cluster, < 0 = failure. */
static int load_map(struct kvt_rclient *rc, size_t n)
{
    const char *argv[2] = {"CLUSTER", "SLOTS"};
    int err = 0;
    redisReply *r = kvt_rnode_cmd(&rc->nodes[n], 2, argv, NULL, rc->deadline_ms, &err);
    if (!r)
        return err;
    int rc_ = 0;
    if (r->type == REDIS_REPLY_ARRAY) {
        char *seed = rc->nodes[n].host ? strdup(rc->nodes[n].host) : strdup("127.0.0.1");
        memset(rc->slots, 0xff, KVT_SLOTS * sizeof(*rc->slots));
        for (size_t i = 0; seed && i < r->elements; i++)
            apply_range(rc, r->element[i], seed);
        free(seed);
        rc_ = 1;
    } else if (r->type != REDIS_REPLY_ERROR) {
        rc_ = kvt_fail(KVT_E_CORRUPT, "redis: unexpected CLUSTER SLOTS reply");
    } else if (!strncmp(r->str, "NOAUTH", 6)) { /* a password is needed and none was given */
        rc_ = kvt_fail(-EACCES, "redis: authentication required: %s", r->str);
    }
    freeReplyObject(r);
    return rc_;
}

/* Detect the mode / refresh the map from the first node that answers. */
static int refresh(struct kvt_rclient *rc)
{
    int rc_ = -ECONNREFUSED;
    for (size_t i = 0; i < rc->n_nodes; i++) {
        rc_ = kvt_rnode_connect(&rc->nodes[i], &rc->cfg, rc->deadline_ms);
        if (rc_ == -EACCES)
            return rc_;
        if (rc_ < 0)
            continue;
        rc_ = load_map(rc, i);
        if (rc_ == -EACCES)
            return rc_;
        if (rc_ < 0)
            continue;
        rc->cluster = rc_ == 1;
        rc->detected = true;
        rc->stale = false;
        return 0;
    }
    return rc_;
}

int kvt_rclient_node(struct kvt_rclient *rc, const char *key, struct kvt_rnode **out)
{
    *out = NULL;
    if (!rc->detected || rc->stale) {
        int r = refresh(rc);
        if (r < 0 && !rc->detected)
            return r;
    }
    size_t ix = 0;
    if (rc->cluster) {
        uint16_t s = rc->slots[kvt_key_slot(key, strlen(key))];
        if (s == NO_NODE) {
            rc->stale = true;
            return kvt_fail(-EAGAIN, "redis: no master serves the slot of %s", key);
        }
        ix = s;
    }
    int r = kvt_rnode_connect(&rc->nodes[ix], &rc->cfg, rc->deadline_ms);
    if (r < 0) {
        rc->stale = rc->cluster;
        return r;
    }
    *out = &rc->nodes[ix];
    return 0;
}

struct kvt_rnode *kvt_rclient_redirect(struct kvt_rclient *rc, const char *err, bool *asking)
{
    char kind[8], addr[200];
    unsigned slot;
    *asking = false;
    if (!rc->cluster || sscanf(err, "%7s %u %199s", kind, &slot, addr) != 3 || slot >= KVT_SLOTS)
        return NULL;
    bool moved = !strcmp(kind, "MOVED");
    if (!moved && strcmp(kind, "ASK"))
        return NULL;
    char *colon = strrchr(addr, ':');
    if (!colon)
        return NULL;
    *colon = '\0';
    int ix = node_index(rc, addr, atoi(colon + 1));
    if (ix < 0)
        return NULL;
    if (moved) {
        rc->slots[slot] = (uint16_t)ix;
        rc->stale = true; /* other slots probably moved with it */
    }
    *asking = !moved;
    if (kvt_rnode_connect(&rc->nodes[ix], &rc->cfg, rc->deadline_ms) < 0)
        return NULL;
    return &rc->nodes[ix];
}

static bool asking(struct kvt_rclient *rc, struct kvt_rnode *n, int *err)
{
    const char *argv[1] = {"ASKING"};
    redisReply *r = kvt_rnode_cmd(n, 1, argv, NULL, rc->deadline_ms, err);
    freeReplyObject(r);
    return r != NULL;
}

bool kvt_rclient_busy(struct kvt_rclient *rc, const char *err)
{
    if (!rc->cluster || (strncmp(err, "TRYAGAIN", 8) && strncmp(err, "CLUSTERDOWN", 11)))
        return false;
    rc->stale = rc->stale || !strncmp(err, "CLUSTERDOWN", 11);
    int64_t left = rc->deadline_ms - kvt_mono_ms();
    if (left <= BUSY_WAIT_MS)
        return false;
    struct timespec ts = {0, BUSY_WAIT_MS * 1000000L};
    nanosleep(&ts, NULL);
    if (rc->stale)
        refresh(rc);
    return true;
}

bool kvt_rclient_reconnect(struct kvt_rclient *rc, struct kvt_rnode *n, bool was_used, int err)
{
    if (!was_used || (err != -ECONNRESET && err != -EPIPE))
        return false;
    n->retry_at_ms = 0; /* the connection went stale (a server restart): once, at once */
    return kvt_rnode_connect(n, &rc->cfg, rc->deadline_ms) == 0;
}

/* The reply to one command on @p n, or NULL with *err: a stale connection is reconnected
 * once, at once (a server restarted since this client last used it). */
static redisReply *node_cmd(struct kvt_rclient *rc, struct kvt_rnode *n, int argc,
                            const char **argv, const size_t *len, int *err)
{
    bool was_used = n->used;
    redisReply *r = kvt_rnode_cmd(n, argc, argv, len, rc->deadline_ms, err);
    if (!r && kvt_rclient_reconnect(rc, n, was_used, *err))
        r = kvt_rnode_cmd(n, argc, argv, len, rc->deadline_ms, err);
    if (!r)
        rc->stale = rc->cluster;
    return r;
}

redisReply *kvt_rclient_cmd(struct kvt_rclient *rc, const char *key, int argc, const char **argv,
                            const size_t *len, int *err)
{
    struct kvt_rnode *n;
    *err = kvt_rclient_node(rc, key, &n);
    if (*err < 0)
        return NULL;
    for (int hop = 0; hop < MAX_REDIRECTS;) {
        redisReply *r = node_cmd(rc, n, argc, argv, len, err);
        if (!r || r->type != REDIS_REPLY_ERROR)
            return r;
        if (kvt_rclient_busy(rc, r->str)) { /* the same command again, after a short wait */
            freeReplyObject(r);
            continue;
        }
        bool ask;
        struct kvt_rnode *to = kvt_rclient_redirect(rc, r->str, &ask);
        if (!to)
            return r;
        freeReplyObject(r);
        n = to;
        hop++;
        if (ask && !asking(rc, n, err))
            return NULL;
    }
    *err = kvt_fail(-ELOOP, "redis: too many redirections for %s", key);
    return NULL;
}

int kvt_rclient_masters(struct kvt_rclient *rc, struct kvt_rnode ***out, size_t *n)
{
    *out = NULL;
    *n = 0;
    struct kvt_rnode *first;
    int r = kvt_rclient_node(rc, "x", &first);
    if (r < 0)
        return r;
    bool *seen = calloc(rc->n_nodes, sizeof(*seen));
    struct kvt_rnode **v = calloc(rc->n_nodes, sizeof(*v));
    if (!seen || !v) {
        free(seen);
        free(v);
        return kvt_fail(-ENOMEM, "redis: out of memory");
    }
    if (!rc->cluster)
        v[(*n)++] = first;
    for (size_t s = 0; rc->cluster && s < KVT_SLOTS; s++) {
        uint16_t ix = rc->slots[s];
        if (ix != NO_NODE && !seen[ix] &&
            kvt_rnode_connect(&rc->nodes[ix], &rc->cfg, rc->deadline_ms) == 0)
            v[(*n)++] = &rc->nodes[ix];
        if (ix != NO_NODE)
            seen[ix] = true;
    }
    free(seen);
    *out = v;
    return 0;
}
