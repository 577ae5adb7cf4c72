/*
 * The process's memory and I/O settings (struct kvt_mem_opts in kvtier.h): one set per
 * process, read by the memory, the library's threads and the streams, which act on them.
 * Every getter is cheap and safe from any thread.
 */
#ifndef KVT_SETTINGS_H
#define KVT_SETTINGS_H

#include <pthread.h>
#include <stdbool.h>

#include "kvtier.h"

/** kvt_mem_configure()'s checks of @p o (NULL: the defaults) without applying anything:
 * 0 or -EINVAL, as kvt_mem_configure() would return. */
int kvt_mem_check(const struct kvt_mem_opts *o);
/** kvt_mem_configure() less the buffer cache limit, which src/mem/ applies above this: check
 * @p o (NULL: the defaults) and publish it; 0, or -EINVAL with nothing changed. */
int kvt_mem_apply(const struct kvt_mem_opts *o);
bool kvt_mem_hugepages(void);
bool kvt_mem_helper(void);
bool kvt_mem_parallel(void);
bool kvt_mem_direct(void);
/** The engine reads should use: "io_uring", "threads", or NULL for the best available. */
const char *kvt_mem_io_engine(void);
/** Start a helper thread named @p name on the helper CPUs; returns what pthread_create() does. */
int kvt_mem_thread_start(pthread_t *th, const char *name, void *(*fn)(void *), void *arg);

#endif
