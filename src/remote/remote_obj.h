/*
 * The kvt_remote object shared by its files: remote.c (lifecycle, poll thread, find, stats),
 * remote_put.c (uploads), remote_get.c (restores), remote_gc.c (gc), remote_url.c (URL), and
 * remote_obj.c (the helpers below that uploads, restores and gc share).
 */
#ifndef KVT_REMOTE_OBJ_H
#define KVT_REMOTE_OBJ_H

#include "remote/remote_parts.h"

struct kvt_write_queue;

#define KVT_GET_IDLE 4

struct kvt_remote {
    char *model, *fp, *tok;
    int poll_ms;
    uint64_t max_bytes, max_entry_bytes, chunk_bytes;
    bool no_verify;
    bool share;      /* upload shared prefixes once (SHARING.md "The remote tier") */
    uint32_t serial; /* kvt_hit.store of the hits this remote finds */
    kvt_log_fn log;
    void *log_ud;
    struct kvt_rcfg cfg;
    struct kvt_rkeys keys;

    pthread_mutex_t mu; /* view and stats */
    struct kvt_rview view;
    struct kvt_remote_stats st;

    /* one client per thread role, each used under its own lock; a restore takes a client of
     * its own (remote_get.c), so that restores on one handle run at once */
    pthread_mutex_t poll_mu, put_mu, get_mu;
    struct kvt_rclient poll_rc, put_rc;
    struct kvt_rclient *get_idle[KVT_GET_IDLE]; /* clients kept for the next restores */
    size_t n_get_idle;

    struct kvt_write_queue *q;
    pthread_t poller;
    bool poller_started;
    pthread_mutex_t stop_mu;
    pthread_cond_t stop_cv;
    bool stop;
};

int kvt_remote_parse_url(const char *url, struct kvt_rcfg *c, char **prefix);
void kvt_remote_cfg_free(struct kvt_rcfg *c);

/** Bump a stats counter under the lock. */
#define KVT_RSTAT(r, field, n)                                                                     \
    do {                                                                                           \
        pthread_mutex_lock(&(r)->mu);                                                              \
        (r)->st.field += (n);                                                                      \
        pthread_mutex_unlock(&(r)->mu);                                                            \
    } while (0)

/** Remove entry @p rec everywhere: the index record first (no new readers), then its chunks,
 * then the local view. @p rc is the caller's client (its lock held). */
void kvt_remote_delete(struct kvt_remote *r, struct kvt_rclient *rc, const struct kvt_rrec *rec);
/** A copy of @p s (NULL when out of memory); the caller holds r->mu if @p s is in the view. */
struct kvt_rrec *kvt_remote_rec_copy_locked(const struct kvt_rrec *s);
/** A copy of the record of hit id @p id (NULL when gone). */
struct kvt_rrec *kvt_remote_rec_copy(struct kvt_remote *r, uint64_t id);
void kvt_remote_logf(struct kvt_remote *r, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * The time to live of an upload's chunks until the PERSISTs after its publish: long enough
 * for any upload (ten minutes, and a second per megabyte), so that the chunks of a writer
 * that dies before it publishes expire instead of staying in Redis for good.
 */
uint64_t kvt_remote_orphan_ttl_ms(uint64_t bytes);

struct kvt_feed;
/** A sink feeding a bulk reply's bytes to the fed load @p f. */
struct kvt_rsink kvt_remote_feed_sink(struct kvt_feed *f);
/** A client for one restore: an idle one or a new one (NULL when out of memory); given back
 * to be kept for the next restore (up to KVT_GET_IDLE) or freed. */
struct kvt_rclient *kvt_remote_client_take(struct kvt_remote *r);
void kvt_remote_client_give(struct kvt_remote *r, struct kvt_rclient *c);

struct kvt_rout;
/** Make room for @p need bytes under @p cap, or, with @p publish, publish @p rec under it;
 * what was removed is deleted and counted, the rest of the script's report goes to @p out
 * (may be NULL; free with kvt_rout_free()). put_mu held. 0 or < 0. */
int kvt_remote_admit(struct kvt_remote *r, const struct kvt_rrec *rec, uint64_t need, uint64_t cap,
                     bool publish, struct kvt_rout *out);
/** Delete the keys of the objects an index script freed (best effort). */
void kvt_remote_free_objs(struct kvt_remote *r, struct kvt_rclient *rc, const struct kvt_rout *o);
/** Upload @p e (kvt_share_applies()) as its prefix objects, written only where no record
 * lists them yet, and its tail under @p rec (remote_share_put.c). 0 or < 0. */
int kvt_remote_put_shared(struct kvt_remote *r, const struct kvt_entry *e, struct kvt_rrec *rec);
/** Fetch the objects of @p rec into the loaded tail @p t, composing the whole entry
 * (remote_share_get.c). 0 or the failure; *@p bad: the object at fault, or -1. */
int kvt_remote_get_shared(struct kvt_remote *r, struct kvt_rclient *c, const struct kvt_rrec *rec,
                          struct kvt_entry *t, int *bad);
/** Object @p k of @p rec failed for good: unlist it, so that no new record takes it, and drop
 * every record of the view that needs it (remote_share_get.c). */
void kvt_remote_condemn(struct kvt_remote *r, const struct kvt_rrec *rec, int k);

#endif
