/*
 * The library's clocks (common/clock.h).
 */
#include "common/clock.h"

#include <time.h>

static int64_t clock_ms(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t kvt_mono_ms(void)
{
    return clock_ms(CLOCK_MONOTONIC);
}

int64_t kvt_wall_ms(void)
{
    return clock_ms(CLOCK_REALTIME);
}
