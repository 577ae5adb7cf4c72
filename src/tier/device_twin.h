/*
 * The real binding of struct kvt_tier_device_ops (device_twin.c): a device and the
 * page-locked pool that holds the RAM tier's copies of its entries.
 */
#ifndef KVT_DEVICE_TWIN_H
#define KVT_DEVICE_TWIN_H

#include "tier/tier.h"

struct kvt_tier_dev;

/** The binding for device @p d, with a pool of @p pool_bytes (allocated at its first use). */
int kvt_tier_dev_new(kvt_device *d, size_t pool_bytes, struct kvt_tier_dev **out);
/** Its ops; close releases the binding (the pool's region goes with its last buffer). */
extern const struct kvt_tier_device_ops kvt_tier_dev_ops;

#endif
