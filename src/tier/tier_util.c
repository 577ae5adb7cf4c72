/*
 * Small helpers the tier files share: clocks (monotonic for timers, wall for idle ages),
 * longest common token prefix, namespace normalization, log formatting and the
 * run-inside-the-engine-exclusion wrapper.
 */
#include "tier/tier.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static int64_t clock_ms(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t kvt_tier_mono_ms(void)
{
    return clock_ms(CLOCK_MONOTONIC);
}

int64_t kvt_tier_wall_ms(void)
{
    return clock_ms(CLOCK_REALTIME);
}

size_t kvt_tier_lcp(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    size_t n = na < nb ? na : nb;
    size_t i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

const char *kvt_tier_ns(const char *ns)
{
    return ns ? ns : "";
}

int kvt_tier_run_exclusive(kvt_run_exclusive_fn rx, void *engine, kvt_step_fn step, void *arg)
{
    if (!rx)
        return step(arg);
    return rx(engine, step, arg);
}
