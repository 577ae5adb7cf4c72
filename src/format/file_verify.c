/*
 * kvt_file_verify(): the loader's checks without building anything. The header goes through
 * V1-V20 and the caller's expectations, then every tensor range is streamed through one
 * bounded buffer and hashed (L3), so verifying a file of any size costs one chunk of memory.
 */
#include "format/format.h"

#include <errno.h>
#include <fcntl.h>

#include "common/error.h"
#include "io/io.h"

int kvt_file_verify(const char *path, const struct kvt_expect *x)
{
    if (!path)
        return kvt_fail(-EINVAL, "kvt_file_verify: no path");
    const struct kvt_io *io = kvt_io();
    int fd = io->openat(AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return kvt_fail(fd, "%s: open: %s", path, kvt_strerror(fd));
    struct kvt_read_opts ro = {.max_header_bytes = x ? x->max_header_bytes : 0};
    struct kvt_header *h = NULL;
    int rc = kvt_header_read_fd(fd, &ro, path, &h);
    if (!rc)
        rc = kvt_header_check_expect(h, x, path);
    if (!rc && !(x && x->no_verify)) {
        struct kvt_tensor_reader r = {
            .fd = fd,
            .name = path,
            .h = h,
            .verify = true,
            .keep_cache = x && x->keep_cache,
        };
        rc = kvt_tensor_read_all(&r);
        kvt_tensor_reader_free(&r);
    }
    kvt_header_free(h);
    io->close(fd);
    return rc;
}
