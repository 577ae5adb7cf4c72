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
    int fd;
    struct kvt_header *h;
    int rc = kvt_file_open_header(path, x, &fd, &h);
    if (rc)
        return rc;
    if (!(x && x->no_verify)) {
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
    kvt_io()->close(fd);
    return rc;
}
