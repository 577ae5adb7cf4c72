/*
 * Header reading: V1-V5 on the fixed prefix (before anything the prefix sizes is allocated),
 * then the JSON checks of header_parse.c. Entry points for an open file, a path, and bytes
 * already in memory (the store's scan and the fuzz targets).
 */
#include "format/format.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "io/io.h"

static const char *nm(const char *name)
{
    return name ? name : "header";
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static size_t max_header(const struct kvt_read_opts *o)
{
    return o && o->max_header_bytes ? o->max_header_bytes : KVT_DEFAULT_MAX_HEADER;
}

int kvt_prefix_check(const uint8_t *buf, size_t n, uint64_t file_size, size_t max_header_bytes,
                     const char *name, struct kvt_prefix *out)
{
    if (file_size < KVT_PREFIX_LEN)
        return kvt_fail(KVT_E_CORRUPT,
                        "%s: V1: the file is %" PRIu64 " bytes, shorter than the %u-byte prefix",
                        nm(name), file_size, KVT_PREFIX_LEN);
    if (n < KVT_PREFIX_LEN)
        return kvt_fail(-EINVAL, "%s: the prefix was not supplied", nm(name));
    if (memcmp(buf, KVT_MAGIC, KVT_MAGIC_LEN) != 0) {
        if (memcmp(buf, KVT_MAGIC_V1, KVT_MAGIC_LEN) == 0)
            return kvt_fail(KVT_E_UNSUPPORTED,
                            "%s: V2: format v1 file (magic MLXBUNKV1) is not supported", nm(name));
        return kvt_fail(KVT_E_FORMAT, "%s: V2: not an .mlxkv file (bad magic)", nm(name));
    }
    uint32_t hl = le32(buf + 10);
    uint32_t ds = le32(buf + 14);
    if (hl < 1 || KVT_PREFIX_LEN + (uint64_t)hl > file_size)
        return kvt_fail(KVT_E_CORRUPT,
                        "%s: V3: headerLen %" PRIu32 " does not fit in the file (%" PRIu64
                        " bytes)",
                        nm(name), hl, file_size);
    if (hl > max_header_bytes)
        return kvt_fail(KVT_E_UNSUPPORTED,
                        "%s: V4: headerLen %" PRIu32 " exceeds the limit of %zu bytes", nm(name),
                        hl, max_header_bytes);
    uint64_t want = kvt_align_up(KVT_PREFIX_LEN + (uint64_t)hl);
    if (ds != want)
        return kvt_fail(KVT_E_CORRUPT,
                        "%s: V5: dataStart %" PRIu32 " != alignUp(26 + headerLen) = %" PRIu64,
                        nm(name), ds, want);
    if (ds > file_size)
        return kvt_fail(KVT_E_CORRUPT,
                        "%s: V5: dataStart %" PRIu32 " is beyond the file size %" PRIu64, nm(name),
                        ds, file_size);
    out->header_len = hl;
    out->data_start = ds;
    out->header_hash = le64(buf + 18);
    return 0;
}

int kvt_header_parse(const uint8_t *buf, size_t n, uint64_t file_size,
                     const struct kvt_read_opts *o, const char *name, struct kvt_header **out)
{
    *out = NULL;
    if (!buf && n)
        return kvt_fail(-EINVAL, "%s: no bytes", nm(name));
    if (n > file_size)
        return kvt_fail(-EINVAL, "%s: %zu bytes given for a file of %" PRIu64, nm(name), n,
                        file_size);
    struct kvt_prefix p;
    int rc = kvt_prefix_check(buf, n, file_size, max_header(o), name, &p);
    if (rc)
        return rc;
    if (n < KVT_PREFIX_LEN + (size_t)p.header_len)
        return kvt_fail(-EINVAL, "%s: the header bytes were not supplied", nm(name));
    return kvt_header_parse_json(buf + KVT_PREFIX_LEN, &p, file_size, name, out);
}

int kvt_header_read_fd(int fd, const struct kvt_read_opts *o, const char *name,
                       struct kvt_header **out)
{
    const struct kvt_io *io = kvt_io();
    *out = NULL;
    struct stat st;
    int rc = io->fstat(fd, &st);
    if (rc < 0)
        return kvt_fail(rc, "%s: fstat: %s", nm(name), kvt_strerror(rc));
    if (S_ISDIR(st.st_mode))
        return kvt_fail(-EISDIR, "%s: is a directory", nm(name));
    uint64_t file_size = st.st_size > 0 ? (uint64_t)st.st_size : 0;

    uint8_t prefix[KVT_PREFIX_LEN];
    size_t n = file_size < KVT_PREFIX_LEN ? (size_t)file_size : KVT_PREFIX_LEN;
    rc = kvt_io_read_full(fd, prefix, n, 0);
    if (rc < 0)
        return kvt_fail(rc, "%s: reading the prefix: %s", nm(name), kvt_strerror(rc));
    struct kvt_prefix p;
    rc = kvt_prefix_check(prefix, n, file_size, max_header(o), name, &p);
    if (rc)
        return rc;

    uint8_t *json = malloc(p.header_len);
    if (!json)
        return kvt_fail(-ENOMEM, "%s: no memory for a %" PRIu32 "-byte header", nm(name),
                        p.header_len);
    rc = kvt_io_read_full(fd, json, p.header_len, KVT_PREFIX_LEN);
    if (rc < 0)
        rc = kvt_fail(rc, "%s: reading the header: %s", nm(name), kvt_strerror(rc));
    else
        rc = kvt_header_parse_json(json, &p, file_size, name, out);
    free(json);
    return rc;
}

int kvt_file_read_header(const char *path, const struct kvt_read_opts *o, struct kvt_header **out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_file_read_header: no output");
    *out = NULL;
    if (!path)
        return kvt_fail(-EINVAL, "kvt_file_read_header: no path");
    const struct kvt_io *io = kvt_io();
    int fd = io->openat(AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return kvt_fail(fd, "%s: open: %s", path, kvt_strerror(fd));
    int rc = kvt_header_read_fd(fd, o, path, out);
    io->close(fd);
    return rc;
}

int kvt_file_open_header(const char *path, const struct kvt_expect *x, int *fd,
                         struct kvt_header **h)
{
    const struct kvt_io *io = kvt_io();
    *h = NULL;
    *fd = io->openat(AT_FDCWD, path, O_RDONLY | O_CLOEXEC, 0);
    if (*fd < 0)
        return kvt_fail(*fd, "%s: open: %s", path, kvt_strerror(*fd));
    struct kvt_read_opts ro = {.max_header_bytes = x ? x->max_header_bytes : 0};
    int rc = kvt_header_read_fd(*fd, &ro, path, h);
    if (rc == 0)
        rc = kvt_header_check_expect(*h, x, path);
    if (rc) {
        kvt_header_free(*h);
        *h = NULL;
        io->close(*fd);
        *fd = -1;
    }
    return rc;
}
