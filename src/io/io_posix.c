/*
 * The POSIX io backend (the default) and the helpers every layer uses on top of whichever
 * backend is installed: exact reads and writes that absorb EINTR and short transfers, and
 * the directory fsync that makes a rename durable. Every call returns -errno, never errno.
 */
#include "io/io.h"

#include "io/aq.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* Linux transfers at most 0x7ffff000 bytes per call; asking for less keeps ssize_t exact. */
#define IO_MAX_XFER ((size_t)0x7ffff000)

static int posix_openat(int dirfd, const char *path, int flags, mode_t mode)
{
    int fd;
    do {
        fd = openat(dirfd, path, flags, mode);
    } while (fd < 0 && errno == EINTR);
    return fd < 0 ? -errno : fd;
}

static int posix_close(int fd)
{
    /* Linux releases the descriptor even when close fails; never retry. */
    return close(fd) == 0 ? 0 : -errno;
}

static ssize_t posix_pread(int fd, void *buf, size_t n, uint64_t off)
{
    if (off > (uint64_t)INT64_MAX)
        return -EINVAL;
    ssize_t r = pread(fd, buf, n > IO_MAX_XFER ? IO_MAX_XFER : n, (off_t)off);
    return r < 0 ? -errno : r;
}

static ssize_t posix_pwrite(int fd, const void *buf, size_t n, uint64_t off)
{
    if (off > (uint64_t)INT64_MAX)
        return -EINVAL;
    ssize_t r = pwrite(fd, buf, n > IO_MAX_XFER ? IO_MAX_XFER : n, (off_t)off);
    return r < 0 ? -errno : r;
}

static int posix_fsync(int fd)
{
    int rc;
    do {
        rc = fsync(fd);
    } while (rc != 0 && errno == EINTR);
    return rc == 0 ? 0 : -errno;
}

static int posix_ftruncate(int fd, uint64_t size)
{
    if (size > (uint64_t)INT64_MAX)
        return -EINVAL;
    int rc;
    do {
        rc = ftruncate(fd, (off_t)size);
    } while (rc != 0 && errno == EINTR);
    return rc == 0 ? 0 : -errno;
}

static int posix_fallocate_to(int fd, uint64_t size)
{
    if (size > (uint64_t)INT64_MAX)
        return -EINVAL;
    if (size == 0)
        return 0;
    int rc;
    do {
        rc = fallocate(fd, 0, 0, (off_t)size);
    } while (rc != 0 && errno == EINTR);
    return rc == 0 ? 0 : -errno;
}

static int posix_free_bytes(int fd, uint64_t *out)
{
    struct statvfs sv;
    if (fstatvfs(fd, &sv) != 0)
        return -errno;
    *out = (uint64_t)sv.f_bavail * sv.f_frsize;
    return 0;
}

static int posix_fstat(int fd, struct stat *st)
{
    return fstat(fd, st) == 0 ? 0 : -errno;
}

static int posix_renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath)
{
    return renameat(olddirfd, oldpath, newdirfd, newpath) == 0 ? 0 : -errno;
}

static int posix_unlinkat(int dirfd, const char *path, int flags)
{
    return unlinkat(dirfd, path, flags) == 0 ? 0 : -errno;
}

static int posix_mkdirat(int dirfd, const char *path, mode_t mode)
{
    return mkdirat(dirfd, path, mode) == 0 ? 0 : -errno;
}

static int posix_flock(int fd, int op)
{
    int rc;
    do {
        rc = flock(fd, op);
    } while (rc != 0 && errno == EINTR && !(op & LOCK_NB));
    return rc == 0 ? 0 : -errno;
}

static int posix_fadvise_dontneed(int fd, uint64_t off, uint64_t len)
{
    if (off > (uint64_t)INT64_MAX || len > (uint64_t)INT64_MAX)
        return -EINVAL;
    /* posix_fadvise returns the error number instead of setting errno */
    int rc = posix_fadvise(fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
    return -rc;
}

static int posix_stat(const char *path, struct stat *st, int flags)
{
    return fstatat(AT_FDCWD, path, st, flags) == 0 ? 0 : -errno;
}

static int posix_utimens(const char *path, const struct timespec times[2])
{
    return utimensat(AT_FDCWD, path, times, 0) == 0 ? 0 : -errno;
}

static int posix_list_dir(const char *path, kvt_dirent_fn fn, void *ud)
{
    DIR *dp = opendir(path);
    if (!dp)
        return -errno;
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (errno = 0, de = readdir(dp)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            rc = fn(ud, de->d_name, de->d_type);
    if (rc == 0 && errno)
        rc = -errno;
    closedir(dp);
    return rc;
}

/* Through /proc: the descriptor may have been opened by name relative to any directory. */
static int posix_reopen(int fd, int flags)
{
    char proc[64];
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
    return posix_openat(AT_FDCWD, proc, flags | O_CLOEXEC, 0);
}

static const struct kvt_io posix_io = {
    .name = "posix",
    .openat = posix_openat,
    .close = posix_close,
    .pread = posix_pread,
    .pwrite = posix_pwrite,
    .fsync = posix_fsync,
    .ftruncate = posix_ftruncate,
    .fallocate = posix_fallocate_to,
    .free_bytes = posix_free_bytes,
    .fstat = posix_fstat,
    .renameat = posix_renameat,
    .unlinkat = posix_unlinkat,
    .mkdirat = posix_mkdirat,
    .flock = posix_flock,
    .fadvise_dontneed = posix_fadvise_dontneed,
    .stat = posix_stat,
    .utimens = posix_utimens,
    .list_dir = posix_list_dir,
    .reopen = posix_reopen,
    .aq_open = kvt_aq_open_os,
    .fast = true,
};

static _Atomic(const struct kvt_io *) current_io = &posix_io;

const struct kvt_io *kvt_io_posix(void)
{
    return &posix_io;
}

const struct kvt_io *kvt_io(void)
{
    return atomic_load_explicit(&current_io, memory_order_acquire);
}

void kvt_io_set(const struct kvt_io *io)
{
    atomic_store_explicit(&current_io, io ? io : &posix_io, memory_order_release);
}

int kvt_io_read_full(int fd, void *buf, size_t n, uint64_t off)
{
    const struct kvt_io *io = kvt_io();
    uint8_t *p = buf;
    if (n > UINT64_MAX - off)
        return -EINVAL;
    while (n > 0) {
        ssize_t r = io->pread(fd, p, n, off);
        if (r == -EINTR)
            continue;
        if (r < 0)
            return (int)r;
        if (r == 0)
            return -EIO; /* the file ended before the range did */
        if ((size_t)r > n)
            return -EIO; /* a backend that claims more than asked is broken */
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

int kvt_io_write_full(int fd, const void *buf, size_t n, uint64_t off)
{
    const struct kvt_io *io = kvt_io();
    const uint8_t *p = buf;
    if (n > UINT64_MAX - off)
        return -EINVAL;
    while (n > 0) {
        ssize_t w = io->pwrite(fd, p, n, off);
        if (w == -EINTR)
            continue;
        if (w < 0)
            return (int)w;
        if (w == 0 || (size_t)w > n)
            return -EIO; /* no progress: never spin */
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

/* The directory part of @p path ("." when it has none); caller frees. */
static char *parent_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    while (slash > path && slash[-1] == '/')
        slash--;
    if (slash == path)
        return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

int kvt_io_fsync_dir(const char *dirpath)
{
    const struct kvt_io *io = kvt_io();
    int fd = io->openat(AT_FDCWD, dirpath, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd == -ENOTDIR) {
        char *parent = parent_of(dirpath);
        if (!parent)
            return -ENOMEM;
        fd = io->openat(AT_FDCWD, parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
        free(parent);
    }
    if (fd < 0)
        return fd;
    int rc = io->fsync(fd);
    io->close(fd);
    /* some filesystems cannot fsync a directory; that is not a durability failure there */
    return rc == -EINVAL || rc == -EROFS ? 0 : rc;
}
