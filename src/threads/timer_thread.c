/*
 * The timer thread: a loop that ticks every task, then sleeps on a monotonic condition
 * variable until the earliest time a task asked for or until woken. A wake that arrives
 * while tasks run is remembered (a sequence number), so no deadline is ever missed.
 */
#include "threads/timer_thread.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "common/clock.h"
#include "common/cpus.h"
#include "common/error.h"

struct kvt_timer_thread {
    struct kvt_timer_task tasks[KVT_TIMER_MAX_TASKS];
    int n;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    uint64_t wake_seq;
    bool stop;
    pthread_t thread;
};

static void *timer_main(void *arg)
{
    struct kvt_timer_thread *t = arg;

    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        uint64_t seq = t->wake_seq;
        pthread_mutex_unlock(&t->mu);

        int64_t next = INT64_MAX;
        for (int i = 0; i < t->n; i++) {
            int64_t due = t->tasks[i].tick(t->tasks[i].ud, kvt_mono_ms());
            if (due < next)
                next = due;
        }

        pthread_mutex_lock(&t->mu);
        if (t->stop || t->wake_seq != seq)
            continue;
        if (next == INT64_MAX) {
            pthread_cond_wait(&t->cond, &t->mu);
        } else if (next > kvt_mono_ms()) {
            struct timespec ts = {next / 1000, (long)(next % 1000) * 1000000};
            pthread_cond_timedwait(&t->cond, &t->mu, &ts);
        }
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int kvt_timer_thread_start(const struct kvt_timer_task *tasks, int n, const cpu_set_t *cpus,
                           struct kvt_timer_thread **out)
{
    *out = NULL;
    if (n < 0 || n > KVT_TIMER_MAX_TASKS)
        return kvt_fail(-EINVAL, "timer thread: %d tasks", n);
    struct kvt_timer_thread *t = calloc(1, sizeof(*t));
    if (!t)
        return kvt_fail(-ENOMEM, "timer thread: out of memory");
    for (int i = 0; i < n; i++)
        t->tasks[i] = tasks[i];
    t->n = n;

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cond, &ca);
    pthread_condattr_destroy(&ca);

    int rc = kvt_thread_start(&t->thread, "kvt-timer", cpus, timer_main, t);
    if (rc != 0) {
        pthread_cond_destroy(&t->cond);
        pthread_mutex_destroy(&t->mu);
        free(t);
        return kvt_fail(-rc, "timer thread: cannot start: %s", kvt_strerror(-rc));
    }
    *out = t;
    return 0;
}

void kvt_timer_thread_wake(struct kvt_timer_thread *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->wake_seq++;
    pthread_cond_signal(&t->cond);
    pthread_mutex_unlock(&t->mu);
}

void kvt_timer_thread_stop(struct kvt_timer_thread *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_signal(&t->cond);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL);
    pthread_cond_destroy(&t->cond);
    pthread_mutex_destroy(&t->mu);
    free(t);
}
