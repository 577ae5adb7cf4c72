/*
 * The process's memory and I/O settings: kvt_mem_apply() checks a struct kvt_mem_opts whole,
 * then publishes it; the flags are atomics so the hot paths read them without a lock, the CPU
 * set is copied under one.
 */
#include "settings/settings.h"

#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "common/cpus.h"
#include "common/error.h"

static atomic_bool no_hugepages, no_helper, no_parallel, no_direct;
static _Atomic(const char *) engine; /* a string literal or NULL */
static pthread_mutex_t cpus_mu = PTHREAD_MUTEX_INITIALIZER;
static bool pin;
static cpu_set_t cpus;

void kvt_mem_opts_init(struct kvt_mem_opts *o)
{
    memset(o, 0, sizeof(*o));
}

/* @p o's engine as a string literal and its CPU set, or -EINVAL; changes nothing. */
static int parse(const struct kvt_mem_opts *o, const char **e, cpu_set_t *set)
{
    *e = NULL;
    if (o->io_engine && !strcmp(o->io_engine, "io_uring"))
        *e = "io_uring";
    else if (o->io_engine && !strcmp(o->io_engine, "threads"))
        *e = "threads";
    else if (o->io_engine)
        return kvt_fail(-EINVAL, "io_engine \"%s\": not io_uring or threads", o->io_engine);
    CPU_ZERO(set);
    return o->helper_cpus ? kvt_cpus_parse(o->helper_cpus, set) : 0;
}

int kvt_mem_check(const struct kvt_mem_opts *o)
{
    const char *e;
    cpu_set_t set;
    return o ? parse(o, &e, &set) : 0;
}

int kvt_mem_apply(const struct kvt_mem_opts *o)
{
    struct kvt_mem_opts def = {0};
    if (!o)
        o = &def;
    const char *e;
    cpu_set_t set;
    int rc = parse(o, &e, &set);
    if (rc < 0)
        return rc;
    atomic_store(&no_hugepages, o->no_hugepages);
    atomic_store(&no_helper, o->no_helper);
    atomic_store(&no_parallel, o->no_parallel);
    atomic_store(&no_direct, o->no_direct);
    atomic_store(&engine, e);
    pthread_mutex_lock(&cpus_mu);
    pin = o->helper_cpus != NULL;
    cpus = set;
    pthread_mutex_unlock(&cpus_mu);
    return 0;
}

bool kvt_mem_hugepages(void)
{
    return !atomic_load_explicit(&no_hugepages, memory_order_relaxed);
}

bool kvt_mem_helper(void)
{
    return !atomic_load_explicit(&no_helper, memory_order_relaxed);
}

bool kvt_mem_parallel(void)
{
    return !atomic_load_explicit(&no_parallel, memory_order_relaxed);
}

bool kvt_mem_direct(void)
{
    return !atomic_load_explicit(&no_direct, memory_order_relaxed);
}

const char *kvt_mem_io_engine(void)
{
    return atomic_load_explicit(&engine, memory_order_relaxed);
}

int kvt_mem_thread_start(pthread_t *th, const char *name, void *(*fn)(void *), void *arg)
{
    pthread_mutex_lock(&cpus_mu);
    bool pinned = pin;
    cpu_set_t set = cpus;
    pthread_mutex_unlock(&cpus_mu);
    return kvt_thread_start(th, name, pinned ? &set : NULL, fn, arg);
}
