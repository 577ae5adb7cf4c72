/*
 * CPU placement of the library's own threads: an embedding server pins its decode threads
 * and hands kvtier the other cores, so background writes never take a decode core.
 */
#ifndef KVT_CPUS_H
#define KVT_CPUS_H

#include <pthread.h>
#include <sched.h>

/**
 * Parse a CPU list in the kernel's format ("3", "2-5", "0,4-7") into @p set. The set must
 * name at least one CPU of this machine.
 * @return 0, or -EINVAL with the reason in kvt_last_error().
 */
int kvt_cpus_parse(const char *list, cpu_set_t *set);

/**
 * pthread_create() on @p cpus (NULL = the creator's CPUs), named @p name (at most 15
 * characters, what top -H and /proc show); returns what pthread_create() returns.
 */
int kvt_thread_start(pthread_t *th, const char *name, const cpu_set_t *cpus, void *(*fn)(void *),
                     void *arg);

#endif
