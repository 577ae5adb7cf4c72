/*
 * Small helpers the tier files share: longest common token prefix, namespace normalization
 * and the run-inside-the-engine-exclusion wrapper.
 */
#include "tier/tier.h"

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
