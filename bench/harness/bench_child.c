/*
 * Peak-RSS measurement for `kvtier bench`: the measured call runs in a forked child whose
 * high-water mark is reset first (writing "5" to /proc/self/clear_refs sets VmHWM to the
 * current RSS), so VmHWM at the end minus VmRSS at the start is exactly the memory the call
 * added at its peak. The child starts with an empty buffer cache and reports through a pipe and
 * exits without running atexit code.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

/* A "VmRSS:" / "VmHWM:" line of /proc/self/status in bytes, or 0 when unreadable. */
static uint64_t status_kb(const char *key)
{
    char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *p = strstr(buf, key);
    return p ? strtoull(p + strlen(key), NULL, 10) * 1024 : 0;
}

static int reset_peak(void)
{
    int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = write(fd, "5", 1) == 1 ? 0 : -errno;
    close(fd);
    return rc;
}

static int write_full(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

int bench_in_child(bench_child_fn fn, void *arg, struct bench_child_result *r)
{
    int p[2];
    memset(r, 0, sizeof(*r));
    r->rc = -ECHILD;
    if (pipe2(p, O_CLOEXEC) != 0)
        return -errno;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        int e = -errno;
        close(p[0]);
        close(p[1]);
        return e;
    }
    if (pid == 0) {
        struct bench_child_result res = {0};
        close(p[0]);
        /* start like a new process: the buffers the parent keeps for reuse are not the child's
         * to take (reusing them would hide the restore's memory from its peak) */
        kvt_buf_cache_limit(kvt_buf_cache_limit(0));
        res.rc = reset_peak();
        uint64_t base = status_kb("VmRSS:");
        if (res.rc == 0) {
            res.rc = fn(arg, &res.secs, &res.value);
            if (res.rc < 0)
                snprintf(res.msg, sizeof(res.msg), "%s", kvt_last_error());
        }
        uint64_t peak = status_kb("VmHWM:");
        res.peak_extra = peak > base ? peak - base : 0;
        _exit(write_full(p[1], &res, sizeof(res)) == 0 ? 0 : 1);
    }
    close(p[1]);
    size_t got = 0;
    while (got < sizeof(*r)) {
        ssize_t n = read(p[0], (char *)r + got, sizeof(*r) - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(p[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (got != sizeof(*r)) {
        memset(r, 0, sizeof(*r));
        r->rc = -ECHILD;
        snprintf(r->msg, sizeof(r->msg), "the measuring child process died");
    }
    return 0;
}
