/*
 * CPU lists for the background threads (common/cpus.h).
 */
#include "common/cpus.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/error.h"

/* One decimal CPU number at *p, advanced past it; -1 when there is none or it is too big. */
static long cpu_number(const char **p)
{
    if (!isdigit((unsigned char)**p))
        return -1;
    char *end;
    errno = 0;
    long v = strtol(*p, &end, 10);
    if (errno || v >= CPU_SETSIZE)
        return -1;
    *p = end;
    return v;
}

int kvt_cpus_parse(const char *list, cpu_set_t *set)
{
    CPU_ZERO(set);
    const char *p = list ? list : "";
    for (;;) {
        long lo = cpu_number(&p), hi = lo;
        if (lo >= 0 && *p == '-') {
            p++;
            hi = cpu_number(&p);
        }
        if (lo < 0 || hi < lo)
            return kvt_fail(-EINVAL,
                            "background_cpus \"%s\": expected a list such as \"2-5,7\" "
                            "of CPUs below %d",
                            list ? list : "", CPU_SETSIZE);
        for (long c = lo; c <= hi; c++)
            CPU_SET((int)c, set);
        if (*p == '\0')
            break;
        if (*p++ != ',')
            return kvt_fail(-EINVAL, "background_cpus \"%s\": unexpected '%c'", list, p[-1]);
    }
    /* The caller's own mask may be narrower than the process's (a pinned engine thread):
     * check only that the CPUs exist; a cpuset that excludes them fails the thread start. */
    long n_cpus = sysconf(_SC_NPROCESSORS_CONF);
    for (long c = 0; c < n_cpus && c < CPU_SETSIZE; c++)
        if (CPU_ISSET((int)c, set))
            return 0;
    return kvt_fail(-EINVAL, "background_cpus \"%s\": this machine has CPUs 0-%ld only", list,
                    n_cpus - 1);
}

int kvt_thread_start(pthread_t *th, const char *name, const cpu_set_t *cpus, void *(*fn)(void *),
                     void *arg)
{
    pthread_attr_t attr;
    int rc = pthread_attr_init(&attr);
    if (rc)
        return rc;
    if (cpus)
        rc = pthread_attr_setaffinity_np(&attr, sizeof(*cpus), cpus);
    if (rc == 0)
        rc = pthread_create(th, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    if (rc == 0)
        pthread_setname_np(*th, name); /* cosmetic: a failure changes nothing */
    return rc;
}
