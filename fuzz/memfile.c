/*
 * The in-memory file behind fuzz_memfile(): one memfd per process, truncated and rewritten
 * for every input, so the loaders see a real file (pread, fstat, size) with no disk I/O and
 * nothing left behind. Also fuzz_fail(), the one way a target reports a broken property.
 */
#include "fuzz.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

const char *fuzz_memfile(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("kvtier-fuzz-input", MFD_CLOEXEC);
        if (fd < 0)
            return NULL;
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0)
        return NULL;
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(fd, data + done, size - done, (off_t)done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return NULL;
        done += (size_t)w;
    }
    return path;
}

void fuzz_fail(const char *what)
{
    fprintf(stderr, "fuzz: property violated: %s\n", what);
    fflush(stderr);
    abort();
}
