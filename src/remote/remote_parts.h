/*
 * Internal interface of the remote tier (REMOTE.md): a Redis / Redis Cluster client built on
 * hiredis connections with its own RESP I/O for the bulk payloads (rnode.c, resp_io.c,
 * rcluster.c), the key layout (rkeys.c), entries as chunked .mlxkv bytes (rentry.c), the
 * remote index and its change counter (rindex.c), its records (rrec.c) and its local view
 * (rview.c). The kvt_remote object built on them is remote_obj.h's.
 */
#ifndef KVT_REMOTE_PARTS_H
#define KVT_REMOTE_PARTS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "kvtier.h"

struct redisContext;
struct redisReply;
struct kvt_index;

/* ---- connection settings ---------------------------------------------------------------- */

struct kvt_rcfg {
    char *host; /* TCP seed node; NULL with unix_path */
    int port;
    char *seeds;     /* more cluster seed nodes, "host:port,host:port" (may be NULL) */
    char *unix_path; /* unix socket (single server only) */
    char *user, *password;
    int timeout_ms; /* one call's deadline (kvt_rclient_arm()) */
};

/* ---- one server connection (rnode.c) ---------------------------------------------------- */

struct kvt_rnode {
    char *host; /* NULL: the unix socket of the config */
    int port;
    struct redisContext *c; /* NULL while disconnected */
    int64_t retry_at_ms;    /* no new connection attempt before this (backoff) */
    bool used;              /* a reply came on this connection (it may since have gone stale) */
    char why[200];          /* the last failure, named again while backing off */
};

/** Connect (with AUTH) unless connected, before @p deadline_ms (monotonic). 0, -ECONNREFUSED /
 * -ETIMEDOUT / -EAGAIN (backing off), or -EACCES (authentication refused: message in
 * kvt_last_error()). */
int kvt_rnode_connect(struct kvt_rnode *n, const struct kvt_rcfg *cfg, int64_t deadline_ms);
/** Close the connection after a failure; the next attempt waits out a short backoff. */
void kvt_rnode_fail(struct kvt_rnode *n);
void kvt_rnode_close(struct kvt_rnode *n);
/** One command, done by @p deadline_ms. NULL on a connection failure (the node is failed,
 * *err set). */
struct redisReply *kvt_rnode_cmd(struct kvt_rnode *n, int argc, const char **argv,
                                 const size_t *len, int64_t deadline_ms, int *err);

/* ---- own RESP I/O for pipelined bulk payloads (resp_io.c) --------------------------------- */

/* KVT_R_SINK: a bulk reply's sink refused its bytes (its error in kvt_rio.sink_rc). */
enum { KVT_R_OK = 0, KVT_R_NIL = 1, KVT_R_ERR = 2, KVT_R_SINK = 3 };

struct kvt_rio {
    int fd;
    int64_t deadline_ms; /* monotonic; 0 = none (the socket's own timeout applies) */
    uint8_t buf[16384];
    size_t pos, len;
    char err[256]; /* the last error reply's text */
    int sink_rc;
};

/**
 * Where a bulk reply's bytes go, piece by piece (a fed load, format.h): next() names the
 * place for the next bytes, wrote() says how many of them landed there, restart() goes back
 * to the first byte (a transfer that starts over). 0 or an error that stops the read.
 */
struct kvt_rsink {
    int (*next)(void *ud, uint8_t **at, size_t *len);
    int (*wrote)(void *ud, size_t n);
    void (*restart)(void *ud);
    void *ud;
};

/** Write every byte of @p iov before @p deadline_ms (monotonic; 0 = none), never raising
 * SIGPIPE; 0 or -errno (-ETIMEDOUT when the deadline or the socket timeout ran out). */
int kvt_rio_send(int fd, struct iovec *iov, int n, int64_t deadline_ms);
/** One read of up to @p n bytes (EINTR retried) before @p deadline_ms: *@p got > 0, or -errno
 * (-ECONNRESET when the server closed the connection, -ETIMEDOUT past the deadline). */
int kvt_rio_recv(int fd, void *dst, size_t n, size_t *got, int64_t deadline_ms);
/**
 * Read one reply. A bulk string must be exactly @p want bytes long and lands in @p dst (NULL:
 * a status or integer reply is expected); its length is checked before a byte is read.
 * @return KVT_R_OK, KVT_R_NIL, KVT_R_ERR (text in r->err), KVT_E_CORRUPT (wrong length or
 * protocol) or -errno.
 */
int kvt_rio_reply(struct kvt_rio *r, void *dst, size_t want);
/**
 * kvt_rio_reply() whose bulk of @p want bytes goes to @p sink (NULL: read and dropped), large
 * pieces straight from the socket. @return as kvt_rio_reply(), or KVT_R_SINK: the reply is
 * not read to its end, so the connection must be dropped.
 */
int kvt_rio_reply_sink(struct kvt_rio *r, size_t want, const struct kvt_rsink *sink);
/** Whether bytes are left over (a protocol fault: the connection must be dropped). */
bool kvt_rio_pending(const struct kvt_rio *r);

/* ---- the client: single server or cluster (rcluster.c) ---------------------------------- */

#define KVT_SLOTS 16384

struct kvt_rclient {
    struct kvt_rcfg cfg;
    bool cluster;  /* known after the first connection */
    bool detected; /* whether the mode is known */
    bool stale;    /* the slot map needs a refresh */
    struct kvt_rnode *nodes;
    size_t n_nodes;
    uint16_t *slots;     /* node index per slot (cluster) */
    int64_t deadline_ms; /* the current call's end (monotonic), set by kvt_rclient_arm() */
};

/* Bytes per ms a transfer is allowed at least: a call moving @p bytes gets timeout_ms plus
 * bytes / KVT_RATE_FLOOR ms (1 s per 64 MiB) for its deadline. */
#define KVT_RATE_FLOOR ((uint64_t)64 << 10)

uint16_t kvt_key_slot(const char *key, size_t len);
int kvt_rclient_init(struct kvt_rclient *rc, const struct kvt_rcfg *cfg);
void kvt_rclient_free(struct kvt_rclient *rc);
/** Start a call: every command until the next arm ends by timeout_ms from now, plus the
 * transfer time of @p bytes at KVT_RATE_FLOOR. */
void kvt_rclient_arm(struct kvt_rclient *rc, uint64_t bytes);
/** Connect to the node serving @p key (detecting the mode, refreshing the map as needed). */
int kvt_rclient_node(struct kvt_rclient *rc, const char *key, struct kvt_rnode **out);
/**
 * One command on the node serving @p key, following MOVED and ASK. @return the reply (caller
 * frees; an error reply other than a redirection is returned as is) or NULL with *err.
 */
struct redisReply *kvt_rclient_cmd(struct kvt_rclient *rc, const char *key, int argc,
                                   const char **argv, const size_t *len, int *err);
/** Apply a MOVED / ASK error text; returns the node to retry on (ASK: *asking set), or NULL. */
struct kvt_rnode *kvt_rclient_redirect(struct kvt_rclient *rc, const char *err, bool *asking);
/** After the error reply @p err: TRYAGAIN or CLUSTERDOWN (a slot being migrated or a
 * failover) waits a little and says true (send the command again) while the deadline allows. */
bool kvt_rclient_busy(struct kvt_rclient *rc, const char *err);
/** After error @p err on node @p n: whether it was a stale connection (@p was_used: it had
 * answered before) that is now connected again, once, with no backoff. */
bool kvt_rclient_reconnect(struct kvt_rclient *rc, struct kvt_rnode *n, bool was_used, int err);
/** Every master once (for gc's SCAN and stats); 0 or -errno. */
int kvt_rclient_masters(struct kvt_rclient *rc, struct kvt_rnode ***out, size_t *n);

/* ---- keys (rkeys.c) --------------------------------------------------------------------- */

/** The index keys of an identity: "<prefix>:{<ident>}:<what>" */
struct kvt_rkeys {
    char *prefix;
    char ident[17]; /* wyhash of model, fingerprint and tokenizer, hex */
    char ver[160], idx[160], log[160];
    char gone[160], bytes[160], floor[160]; /* removal log, byte total, trimmed-removals mark */
    char objs[160], refs[160]; /* shared prefix objects: id -> object, id -> records needing it */
};

int kvt_rkeys_init(struct kvt_rkeys *k, const char *prefix, const char *model, const char *fp,
                   const char *tok);
void kvt_rkeys_free(struct kvt_rkeys *k);
/** Chunk @p i of entry @p uuid in namespace @p ns: "<prefix>:<ident>:<nsHash>:{<uuid>}:<i>". */
void kvt_rkeys_chunk(const struct kvt_rkeys *k, const char *ns, const char *uuid, uint32_t i,
                     char *out, size_t cap);
/** A fresh random entry id (32 hex digits). */
void kvt_rkeys_uuid(char out[33]);

/* ---- entries as chunked bytes (rentry.c) -------------------------------------------------- */

struct kvt_rentry {
    const char *ns, *uuid;
    uint64_t bytes;
    uint64_t chunk;
    uint32_t n_chunks;
};

struct kvt_image;
/** SET every chunk of the file image @p im (pipelined, one node), each expiring after
 * @p ttl_ms: chunks of an upload that never publishes vanish by themselves. 0 or < 0. */
int kvt_rentry_put(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rentry *e,
                   const struct kvt_image *im, uint64_t ttl_ms);
/** PERSIST every chunk (pipelined): a published entry's chunks stay. 0 or < 0. */
int kvt_rentry_persist(struct kvt_rclient *rc, const struct kvt_rkeys *k,
                       const struct kvt_rentry *e);
/** GET every chunk, in order, into @p sink. 0, KVT_R_NIL (a chunk is missing), the sink's
 * error, or a negative code. */
int kvt_rentry_get(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rentry *e,
                   const struct kvt_rsink *sink);
/** DEL every chunk (best effort). */
int kvt_rentry_del(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rentry *e);

/* ---- the remote index (rindex.c) --------------------------------------------------------- */

/**
 * A shared prefix object (SHARING.md "The remote tier"): chunk k of an entry's tokens, the
 * rows [256k, 256(k + 1)) of its cut layers as .mlxkv bytes, named by the disk chunk id and
 * stored by the upload whose uuid is its generation. Its wire form is KVT_ROBJ_WIRE bytes.
 */
struct kvt_robj {
    char id[33];  /* hash of the tokens up to the chunk's end (kvt_share_each_chunk()) */
    char gen[33]; /* uuid of the upload that wrote it: its keys are {<id>.<gen>} */
    uint64_t bytes, chunk, header_hash;
    uint32_t n_chunks;
};

#define KVT_ROBJ_WIRE 88

/** An index record: what a reader needs to find, fetch and check an entry. */
struct kvt_rrec {
    char uuid[33];
    char *ns;
    uint64_t bytes, chunk;
    uint32_t n_chunks;
    uint64_t header_hash;
    int64_t created_ms;
    bool trimmable;
    int32_t *tokens;
    size_t n_tokens;
    struct kvt_robj *objs; /* shared prefix objects, chunk order; the bytes are then the tail's */
    uint32_t n_objs;
};

void kvt_rrec_free(struct kvt_rrec *r);
/** Free what @p r points to, not @p r itself. */
void kvt_rrec_free_fields(struct kvt_rrec *r);
/** Free an array of @p n records (their fields, then the array). */
void kvt_rrecs_free(struct kvt_rrec *v, size_t n);
/** Whether @p a and @p b describe the same entry bytes (uuid, sizes, header hash, time). */
bool kvt_rrec_same(const struct kvt_rrec *a, const struct kvt_rrec *b);
/** Encode @p r (malloc'd, *len bytes). */
uint8_t *kvt_rrec_encode(const struct kvt_rrec *r, size_t *len);
/** Decode untrusted bytes, every count bounded. 0 or KVT_E_CORRUPT. */
int kvt_rrec_decode(const uint8_t *p, size_t len, uint64_t max_bytes, struct kvt_rrec *out);

/**
 * In one atomic script: remove the oldest records until @p need bytes and @p r fit under
 * @p cap (0 = no cap), then publish @p r (NULL: only make room). The records removed are
 * decoded (bounded by @p max_rec) into *@p gone, n of them (NULL: not wanted; free with
 * kvt_rrecs_free()), so that their chunks can be deleted. 0 or < 0.
 */
int kvt_rindex_admit(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rrec *r,
                     uint64_t need, uint64_t cap, uint64_t max_rec, struct kvt_rrec **gone,
                     size_t *n_gone);
/** Publish @p r with no cap: record, change log, byte total and version at once. */
int kvt_rindex_publish(struct kvt_rclient *rc, const struct kvt_rkeys *k, const struct kvt_rrec *r);
/** The changes since version @p last (-1 = everything), read atomically: {version, full,
 * uuids published since (all when full), uuids removed since}, checked in shape. */
struct redisReply *kvt_rindex_changes(struct kvt_rclient *rc, const struct kvt_rkeys *k,
                                      int64_t last, int *err);
/** Read the record @p uuid into @p out: 1, 0 (absent), 2 (present but undecodable) or < 0. */
int kvt_rindex_get(struct kvt_rclient *rc, const struct kvt_rkeys *k, const char *uuid,
                   uint64_t max_bytes, struct kvt_rrec *out);
/** Remove the record @p uuid (idempotent). */
int kvt_rindex_unpublish(struct kvt_rclient *rc, const struct kvt_rkeys *k, const char *uuid);

/** The local copy of the remote index, merged by polling the version counter. */
struct kvt_rview {
    struct kvt_index *ix; /* rec->path = uuid, rec->owner = struct kvt_rrec * */
    int64_t ver;          /* last version applied; -1 = never synced */
};

int kvt_rview_init(struct kvt_rview *v);
void kvt_rview_free(struct kvt_rview *v);
/** Add (or replace) a record; takes ownership of @p r on every path. */
int kvt_rview_add(struct kvt_rview *v, struct kvt_rrec *r);
/** Drop the record @p uuid if present. */
void kvt_rview_drop(struct kvt_rview *v, const char *uuid);
/** The distinct shared prefix objects the records of @p v need, and their bytes once. */
void kvt_rview_objs(const struct kvt_rview *v, uint64_t *n, uint64_t *bytes);

/**
 * Bring @p v up to date (poll thread): GET the version; when it moved, fetch the records
 * published since (or everything after a reset). @p mu guards @p v; network I/O runs
 * without it. 0 or a negative code.
 */
int kvt_rview_sync(struct kvt_rview *v, pthread_mutex_t *mu, struct kvt_rclient *rc,
                   const struct kvt_rkeys *k, uint64_t max_bytes);

#endif
