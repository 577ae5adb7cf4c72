/*
 * Running independent jobs of one call on several cores: the calling thread works too, and
 * helper threads are started for the call and joined before it returns.
 */
#ifndef KVT_PAR_FOR_H
#define KVT_PAR_FOR_H

#include <stdbool.h>
#include <stddef.h>

/**
 * Call @p fn(@p ud, i) once for each i in [0, @p n), on the calling thread and up to
 * @p threads - 1 helpers (fewer when they cannot be started: the work is then done by
 * those that run). Indices are handed out in ascending order; once a call returns false
 * no further index is handed out (calls already running finish). Returns when every call
 * has returned.
 */
void kvt_par_for(size_t n, unsigned threads, bool (*fn)(void *ud, size_t i), void *ud);

/** Helper threads kvt_par_for() has started in this process (what tests observe). */
unsigned long kvt_par_helpers_started(void);

/** The CPUs the calling thread may run on (at least 1). */
unsigned kvt_par_cpus(void);

#endif
