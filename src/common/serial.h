/*
 * Which index a hit came from: every store and remote tier opened in the process draws a
 * number here, and stamps it into the hits it finds (kvt_hit.store), so that a restore can
 * refuse a hit whose id names a record of another index.
 */
#ifndef KVT_SERIAL_H
#define KVT_SERIAL_H

#include <stdint.h>

/** A number per call in the process, never 0 (kvt_hit.store of no index). Thread-safe. */
uint32_t kvt_serial_next(void);

#endif
