/*
 * What every restore takes: a client of its own (kept idle for the next restore, so that
 * restores on one handle run at once, each on its own connection), and a sink that feeds a
 * bulk reply's bytes to a fed load as they come off the socket.
 */
#include <stdlib.h>

#include "format/format.h"
#include "remote/remote_obj.h"

static int sink_next(void *ud, uint8_t **at, size_t *len)
{
    return kvt_feed_next(ud, at, len);
}

static int sink_wrote(void *ud, size_t n)
{
    return kvt_feed_wrote(ud, n);
}

static void sink_restart(void *ud)
{
    kvt_feed_reset(ud);
}

struct kvt_rsink kvt_remote_feed_sink(struct kvt_feed *f)
{
    return (struct kvt_rsink){sink_next, sink_wrote, sink_restart, f};
}

struct kvt_rclient *kvt_remote_client_take(struct kvt_remote *r)
{
    pthread_mutex_lock(&r->get_mu);
    struct kvt_rclient *c = r->n_get_idle ? r->get_idle[--r->n_get_idle] : NULL;
    pthread_mutex_unlock(&r->get_mu);
    if (c || !(c = malloc(sizeof(*c))))
        return c;
    if (kvt_rclient_init(c, &r->cfg) < 0) {
        free(c);
        return NULL;
    }
    return c;
}

void kvt_remote_client_give(struct kvt_remote *r, struct kvt_rclient *c)
{
    pthread_mutex_lock(&r->get_mu);
    bool keep = r->n_get_idle < KVT_GET_IDLE;
    if (keep)
        r->get_idle[r->n_get_idle++] = c;
    pthread_mutex_unlock(&r->get_mu);
    if (!keep) {
        kvt_rclient_free(c);
        free(c);
    }
}
