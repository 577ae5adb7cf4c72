/*
 * The write-behind queue (TIER.md §3, the "spill queue"): a bounded FIFO of owned entries written
 * by one writer thread. Every item is disposed exactly once on every path (stored, failed, dropped,
 * shut down) and settles once. The byte cap is soft: the victim of an over-cap enqueue is
 * the oldest item that is still queued (not in flight, not the item being added, and
 * droppable); with none, the queue simply runs over the cap.
 *
 * Records stay on the list, in enqueue order, until their settle callback has returned,
 * so drain() can wait for "everything enqueued before me" by looking at the list head.
 */
#include "threads/write_queue.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "common/clock.h"
#include "common/cpus.h"
#include "common/error.h"

enum { REC_QUEUED, REC_IN_FLIGHT, REC_SETTLING };

struct rec {
    struct rec *prev, *next;
    struct rec *victim_next; /* victims of one enqueue, settled after the lock is dropped */
    struct kvt_entry *e;
    size_t bytes;
    uint64_t seq;
    int state;
    kvt_write_settle_fn settle;
    void *settle_ud;
};

struct kvt_write_queue {
    struct kvt_write_queue_ops ops;
    int64_t cap_bytes;
    pthread_mutex_t mu;
    pthread_cond_t work; /* writer: a record is queued, or stop */
    pthread_cond_t done; /* drain: a record left the list */
    struct rec *head, *tail;
    uint64_t next_seq;
    struct kvt_write_queue_stats st;
    bool stop;
    pthread_t writer;
};

static void list_remove(struct kvt_write_queue *q, struct rec *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        q->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        q->tail = r->prev;
}

/* Dispose, settle, then take the record off the list (called without the lock). */
static void settle_rec(struct kvt_write_queue *q, struct rec *r, bool stored)
{
    q->ops.dispose(q->ops.ud, r->e);
    if (r->settle)
        r->settle(r->settle_ud, stored);
    pthread_mutex_lock(&q->mu);
    list_remove(q, r);
    pthread_cond_broadcast(&q->done);
    pthread_mutex_unlock(&q->mu);
    free(r);
}

static struct rec *first_queued(struct kvt_write_queue *q)
{
    for (struct rec *r = q->head; r; r = r->next)
        if (r->state == REC_QUEUED)
            return r;
    return NULL;
}

static void *writer_main(void *arg)
{
    struct kvt_write_queue *q = arg;

    pthread_mutex_lock(&q->mu);
    for (;;) {
        struct rec *r = q->stop ? NULL : first_queued(q);
        if (!r) {
            if (q->stop)
                break;
            pthread_cond_wait(&q->work, &q->mu);
            continue;
        }
        r->state = REC_IN_FLIGHT;
        pthread_mutex_unlock(&q->mu);

        int rc = q->ops.store(q->ops.ud, r->e);

        pthread_mutex_lock(&q->mu);
        if (rc < 0)
            q->st.failed++;
        else
            q->st.stored++;
        q->st.pending_count--;
        q->st.pending_bytes -= r->bytes;
        r->state = REC_SETTLING;
        pthread_mutex_unlock(&q->mu);

        settle_rec(q, r, rc >= 0);
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

int kvt_write_queue_new(const struct kvt_write_queue_ops *ops, int64_t cap_bytes,
                        const cpu_set_t *cpus, struct kvt_write_queue **out)
{
    *out = NULL;
    if (!ops || cap_bytes < 0 || !ops->bytes_of || !ops->store || !ops->dispose)
        return kvt_fail(-EINVAL, "spill queue: bad configuration");
    struct kvt_write_queue *q = calloc(1, sizeof(*q));
    if (!q)
        return kvt_fail(-ENOMEM, "spill queue: out of memory");
    q->ops = *ops;
    q->cap_bytes = cap_bytes;
    q->next_seq = 1;

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->work, NULL);
    pthread_cond_init(&q->done, &ca);
    pthread_condattr_destroy(&ca);

    int rc = kvt_thread_start(&q->writer, "kvt-writer", cpus, writer_main, q);
    if (rc != 0) {
        pthread_cond_destroy(&q->done);
        pthread_cond_destroy(&q->work);
        pthread_mutex_destroy(&q->mu);
        free(q);
        return kvt_fail(-rc, "spill queue: cannot start the writer thread: %s", kvt_strerror(-rc));
    }
    *out = q;
    return 0;
}

void kvt_write_queue_free(struct kvt_write_queue *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->writer, NULL);

    /* The writer is gone: whatever is left is queued (settling records are finished by the
     * calls that own them, and none may be running now). */
    for (;;) {
        pthread_mutex_lock(&q->mu);
        struct rec *r = first_queued(q);
        if (r) {
            r->state = REC_SETTLING;
            q->st.pending_count--;
            q->st.pending_bytes -= r->bytes;
        }
        pthread_mutex_unlock(&q->mu);
        if (!r)
            break;
        settle_rec(q, r, false);
    }
    pthread_cond_destroy(&q->done);
    pthread_cond_destroy(&q->work);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

int kvt_write_queue_enqueue(struct kvt_write_queue *q, struct kvt_entry *e,
                            kvt_write_settle_fn settle, void *settle_ud)
{
    size_t bytes = q->ops.bytes_of(q->ops.ud, e);
    struct rec *r = calloc(1, sizeof(*r));
    if (!r) {
        q->ops.dispose(q->ops.ud, e);
        return kvt_fail(-ENOMEM, "spill queue: out of memory");
    }
    r->e = e;
    r->bytes = bytes;
    r->state = REC_QUEUED;
    r->settle = settle;
    r->settle_ud = settle_ud;

    struct rec *victims = NULL, **vtail = &victims;
    pthread_mutex_lock(&q->mu);
    if (q->stop) {
        pthread_mutex_unlock(&q->mu);
        q->ops.dispose(q->ops.ud, e);
        free(r);
        return kvt_fail(KVT_E_STATE, "spill queue: shut down");
    }
    r->seq = q->next_seq++;
    r->prev = q->tail;
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    q->st.pending_count++;
    q->st.pending_bytes += bytes;

    struct rec *v = q->head;
    while (q->st.pending_bytes > (uint64_t)q->cap_bytes) {
        while (v && (v == r || v->state != REC_QUEUED ||
                     (q->ops.can_drop && !q->ops.can_drop(q->ops.ud, v->e))))
            v = v->next;
        if (!v)
            break;               /* soft cap: nothing may go */
        v->state = REC_SETTLING; /* stays listed until settled, so drain() waits for it */
        q->st.dropped++;
        q->st.pending_count--;
        q->st.pending_bytes -= v->bytes;
        *vtail = v;
        vtail = &v->victim_next;
        v = v->next;
    }
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->mu);

    while (victims) {
        struct rec *next = victims->victim_next;
        settle_rec(q, victims, false);
        victims = next;
    }
    return 0;
}

int kvt_write_queue_drain(struct kvt_write_queue *q, int64_t deadline_ms)
{
    struct timespec ts = {deadline_ms / 1000, (long)(deadline_ms % 1000) * 1000000};
    int rc = 0;

    pthread_mutex_lock(&q->mu);
    uint64_t last = q->next_seq - 1;
    while (q->head && q->head->seq <= last) {
        if (deadline_ms < 0) {
            pthread_cond_wait(&q->done, &q->mu);
        } else if (pthread_cond_timedwait(&q->done, &q->mu, &ts) == ETIMEDOUT) {
            if (q->head && q->head->seq <= last)
                rc = kvt_fail(KVT_E_TIMEOUT, "spill queue: drain timed out");
            break;
        }
    }
    pthread_mutex_unlock(&q->mu);
    return rc;
}

void kvt_write_queue_get_stats(struct kvt_write_queue *q, struct kvt_write_queue_stats *st)
{
    pthread_mutex_lock(&q->mu);
    *st = q->st;
    pthread_mutex_unlock(&q->mu);
}
