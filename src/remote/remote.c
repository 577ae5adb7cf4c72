/*
 * The kvt_remote object: options, the poll thread that (re)connects and merges the remote
 * index into the local view every poll_ms, find on that view, stats and listing. Uploads
 * (remote_put.c) run on a write-behind queue (threads/write_queue.h); restores (remote_get.c) on
 * the caller's thread.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/serial.h"
#include "remote/remote_obj.h"
#include "store/index.h"
#include "threads/write_queue.h"

void kvt_remote_opts_init(struct kvt_remote_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->timeout_ms = 2000;
    o->poll_ms = 500;
    o->max_bytes = (uint64_t)8 << 30;
    o->max_entry_bytes = (uint64_t)64 << 30;
    o->chunk_bytes = ((uint64_t)1 << 20) - 64; /* a value of 1 MiB takes 1.25 MiB in Redis */
    o->queue_max_bytes = (int64_t)2 << 30;
}

/* ---- poll thread ---------------------------------------------------------------------- */

static int sync_once(struct kvt_remote *r)
{
    pthread_mutex_lock(&r->poll_mu);
    kvt_rclient_arm(&r->poll_rc, 0);
    int rc = kvt_rview_sync(&r->view, &r->mu, &r->poll_rc, &r->keys, r->max_entry_bytes);
    pthread_mutex_unlock(&r->poll_mu);
    pthread_mutex_lock(&r->mu);
    r->st.connected = rc == 0;
    r->st.syncs += rc == 0;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

static void *poll_main(void *arg)
{
    struct kvt_remote *r = arg;
    pthread_mutex_lock(&r->stop_mu);
    while (!r->stop) {
        pthread_mutex_unlock(&r->stop_mu);
        sync_once(r);
        pthread_mutex_lock(&r->stop_mu);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t ns = ts.tv_nsec + (int64_t)(r->poll_ms % 1000) * 1000000;
        ts.tv_sec += r->poll_ms / 1000 + ns / 1000000000;
        ts.tv_nsec = ns % 1000000000;
        while (!r->stop && pthread_cond_timedwait(&r->stop_cv, &r->stop_mu, &ts) == 0) {
        }
    }
    pthread_mutex_unlock(&r->stop_mu);
    return NULL;
}

int kvt_remote_refresh(kvt_remote *r)
{
    return r ? sync_once(r) : kvt_fail(-EINVAL, "kvt_remote_refresh: NULL remote");
}

/* ---- lifecycle ------------------------------------------------------------------------ */

static size_t q_bytes(void *ud, const struct kvt_entry *e)
{
    (void)ud;
    return kvt_entry_bytes(e);
}

static int q_store(void *ud, const struct kvt_entry *e)
{
    return kvt_remote_put(ud, e);
}

static void q_dispose(void *ud, struct kvt_entry *e)
{
    (void)ud;
    kvt_entry_free(e);
}

static int copy_opts(struct kvt_remote *r, const struct kvt_remote_opts *o)
{
    if (!o->model_id || !o->config_fingerprint || !o->tokenizer_hash)
        return kvt_fail(-EINVAL, "remote: model_id, config_fingerprint and tokenizer_hash "
                                 "are required");
    if (o->timeout_ms <= 0 || o->poll_ms <= 0 || o->queue_max_bytes < 0 || o->chunk_bytes < 4096 ||
        o->chunk_bytes > ((uint64_t)512 << 20))
        return kvt_fail(-EINVAL, "remote: timeout_ms and poll_ms must be > 0, chunk_bytes in "
                                 "[4 KiB, 512 MiB], queue_max_bytes >= 0");
    r->model = strdup(o->model_id);
    r->fp = strdup(o->config_fingerprint);
    r->tok = strdup(o->tokenizer_hash);
    if (!r->model || !r->fp || !r->tok)
        return kvt_fail(-ENOMEM, "remote: out of memory");
    r->poll_ms = o->poll_ms;
    r->max_bytes = o->max_bytes ? o->max_bytes : UINT64_MAX;
    r->max_entry_bytes = o->max_entry_bytes ? o->max_entry_bytes : (uint64_t)64 << 30;
    r->chunk_bytes = o->chunk_bytes;
    r->no_verify = o->no_verify;
    r->share = o->share_prefixes;
    r->log = o->log;
    r->log_ud = o->log_ud;
    return 0;
}

static int setup_cfg(struct kvt_remote *r, const struct kvt_remote_opts *o)
{
    char *prefix = NULL;
    int rc = kvt_remote_parse_url(o->url, &r->cfg, &prefix);
    if (rc < 0)
        return rc;
    r->cfg.timeout_ms = o->timeout_ms;
    if (o->user) {
        free(r->cfg.user);
        r->cfg.user = strdup(o->user);
    }
    if (o->password) {
        free(r->cfg.password);
        r->cfg.password = strdup(o->password);
    }
    rc = kvt_rkeys_init(&r->keys, prefix, r->model, r->fp, r->tok);
    free(prefix);
    if (rc == 0)
        rc = kvt_rclient_init(&r->poll_rc, &r->cfg);
    if (rc == 0)
        rc = kvt_rclient_init(&r->put_rc, &r->cfg);
    return rc;
}

/* First contact: a wrong password fails the open; an absent server does not. */
static int first_sync(struct kvt_remote *r)
{
    int rc = sync_once(r);
    if (rc == -EACCES)
        return rc;
    if (rc < 0)
        kvt_remote_logf(r, KVT_LOG_WARN, "[remote] %s unreachable, retrying in the background: %s",
                        r->cfg.host ? r->cfg.host : r->cfg.unix_path, kvt_last_error());
    kvt_clear_error();
    return 0;
}

static int start(struct kvt_remote *r, const struct kvt_remote_opts *o)
{
    struct kvt_write_queue_ops ops = {q_bytes, q_store, q_dispose, NULL, r};
    int rc = kvt_write_queue_new(&ops, o->queue_max_bytes, NULL, &r->q);
    if (rc < 0)
        return rc;
    rc = pthread_create(&r->poller, NULL, poll_main, r);
    if (rc != 0)
        return kvt_fail(-rc, "remote: cannot start the poll thread");
    r->poller_started = true;
    return 0;
}

int kvt_remote_open(const struct kvt_remote_opts *o, kvt_remote **out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_remote_open: NULL out");
    *out = NULL;
    if (!o)
        return kvt_fail(-EINVAL, "kvt_remote_open: NULL options");
    struct kvt_remote *r = calloc(1, sizeof(*r));
    if (!r)
        return kvt_fail(-ENOMEM, "remote: out of memory");
    r->serial = kvt_serial_next();
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->poll_mu, NULL);
    pthread_mutex_init(&r->put_mu, NULL);
    pthread_mutex_init(&r->get_mu, NULL);
    pthread_mutex_init(&r->stop_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* the poll deadline is monotonic */
    pthread_cond_init(&r->stop_cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = copy_opts(r, o);
    if (rc == 0)
        rc = setup_cfg(r, o);
    if (rc == 0)
        rc = kvt_rview_init(&r->view);
    if (rc == 0)
        rc = first_sync(r);
    if (rc == 0)
        rc = start(r, o);
    if (rc < 0) {
        kvt_remote_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

void kvt_remote_close(kvt_remote *r)
{
    if (!r)
        return;
    if (r->poller_started) {
        pthread_mutex_lock(&r->stop_mu);
        r->stop = true;
        pthread_cond_broadcast(&r->stop_cv);
        pthread_mutex_unlock(&r->stop_mu);
        pthread_join(r->poller, NULL);
    }
    kvt_write_queue_free(r->q);
    kvt_rclient_free(&r->poll_rc);
    kvt_rclient_free(&r->put_rc);
    for (size_t i = 0; i < r->n_get_idle; i++) {
        kvt_rclient_free(r->get_idle[i]);
        free(r->get_idle[i]);
    }
    kvt_rview_free(&r->view);
    kvt_rkeys_free(&r->keys);
    kvt_remote_cfg_free(&r->cfg);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->poll_mu);
    pthread_mutex_destroy(&r->put_mu);
    pthread_mutex_destroy(&r->get_mu);
    pthread_mutex_destroy(&r->stop_mu);
    pthread_cond_destroy(&r->stop_cv);
    free(r->model);
    free(r->fp);
    free(r->tok);
    free(r);
}

/* ---- find, stats ----------------------------------------------------------------------- */

int kvt_remote_find(kvt_remote *r, const int32_t *tok, size_t n, const char *ns,
                    struct kvt_hit *hit)
{
    if (!hit)
        return kvt_fail(-EINVAL, "kvt_remote_find: NULL hit");
    memset(hit, 0, sizeof(*hit));
    if (!r || (!tok && n))
        return kvt_fail(-EINVAL, "kvt_remote_find: NULL argument");
    pthread_mutex_lock(&r->mu);
    size_t plen = 0;
    struct kvt_rec *rec = kvt_index_find(r->view.ix, ns, tok, n, &plen);
    if (rec) {
        hit->prefix_len = plen;
        hit->n_tokens = rec->n_tokens;
        hit->id = rec->seq;
        hit->trimmable = rec->trimmable;
        hit->store = r->serial;
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

void kvt_remote_get_stats(kvt_remote *r, struct kvt_remote_stats *st)
{
    memset(st, 0, sizeof(*st));
    if (!r)
        return;
    struct kvt_write_queue_stats qs;
    kvt_write_queue_get_stats(r->q, &qs);
    pthread_mutex_lock(&r->mu);
    *st = r->st;
    st->entries = kvt_index_count(r->view.ix);
    kvt_rview_objs(&r->view, &st->shared_objects, &st->shared_bytes);
    st->bytes = kvt_index_total_bytes(r->view.ix) + st->shared_bytes;
    st->version = r->view.ver;
    pthread_mutex_unlock(&r->mu);
    st->dropped = qs.dropped;
    st->pending = qs.pending_count;
}

int kvt_remote_put_async(kvt_remote *r, const struct kvt_entry *e)
{
    if (!r || !e)
        return kvt_fail(-EINVAL, "kvt_remote_put_async: NULL argument");
    struct kvt_entry *clone;
    int rc = kvt_entry_clone(e, &clone);
    if (rc < 0)
        return rc;
    return kvt_write_queue_enqueue(r->q, clone, NULL, NULL);
}

int kvt_remote_drain(kvt_remote *r, int64_t timeout_ms)
{
    if (!r)
        return kvt_fail(-EINVAL, "kvt_remote_drain: NULL remote");
    return kvt_write_queue_drain(r->q, timeout_ms < 0 ? -1 : kvt_mono_ms() + timeout_ms);
}
