/*
 * Milliseconds on the two clocks the library reads: monotonic for deadlines and timers, wall
 * for ages and times other processes and hosts compare.
 */
#ifndef KVT_CLOCK_H
#define KVT_CLOCK_H

#include <stdint.h>

/** CLOCK_MONOTONIC in milliseconds: deadlines, timeouts, timer due times. */
int64_t kvt_mono_ms(void);
/** CLOCK_REALTIME in milliseconds since the epoch: idle ages, creation times. */
int64_t kvt_wall_ms(void);

#endif
