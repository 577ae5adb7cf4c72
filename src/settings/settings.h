/*
 * The memory module's settings (struct kvt_mem_opts in kvtier.h): one set per process, read
 * by the parts of src/mem/ and by the streams, which act on them. Every getter is cheap and
 * safe from any thread.
 */
#ifndef KVT_MEM_H
#define KVT_MEM_H

#include <pthread.h>
#include <stdbool.h>

#include "kvtier.h"

/** kvt_mem_configure()'s checks of @p o (NULL: the defaults) without applying anything:
 * 0 or -EINVAL, as kvt_mem_configure() would return. */
int kvt_mem_check(const struct kvt_mem_opts *o);
bool kvt_mem_hugepages(void);
bool kvt_mem_helper(void);
bool kvt_mem_parallel(void);
bool kvt_mem_direct(void);
/** The engine reads should use: "io_uring", "threads", or NULL for the best available. */
const char *kvt_mem_io_engine(void);
/** Start a helper thread named @p name on the helper CPUs; returns what pthread_create() does. */
int kvt_mem_thread_start(pthread_t *th, const char *name, void *(*fn)(void *), void *arg);

#endif
