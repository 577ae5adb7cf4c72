/*
 * The io vtable: everything the library asks of the OS about files — data, names,
 * directories, stat, times, locks, the second O_DIRECT descriptor and the asynchronous queue
 * of the fast streams. The default backend is plain POSIX; tests swap in a fault-injecting
 * backend (fail the Nth call, short writes, ENOSPC, EIO) through kvt_io_set(), over the plain
 * path or the fast one. Every function returns >= 0 or -errno (never sets errno for the
 * caller to read).
 */
#ifndef KVT_IO_H
#define KVT_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include <stdbool.h>

struct kvt_aq;

/* One directory entry for list_dir's callback: its name and d_type (DT_UNKNOWN allowed). */
typedef int (*kvt_dirent_fn)(void *ud, const char *name, unsigned char type);

struct kvt_io {
    const char *name;
    int (*openat)(int dirfd, const char *path, int flags, mode_t mode); /* fd or -errno */
    int (*close)(int fd);
    ssize_t (*pread)(int fd, void *buf, size_t n, uint64_t off);        /* may be short */
    ssize_t (*pwrite)(int fd, const void *buf, size_t n, uint64_t off); /* may be short */
    int (*fsync)(int fd);
    int (*ftruncate)(int fd, uint64_t size);
    /* allocate the blocks of [0, size) and extend the file to it (fallocate mode 0); -EOPNOTSUPP
     * where the file system cannot */
    int (*fallocate)(int fd, uint64_t size);
    /* bytes an unprivileged writer may still use on @p fd's file system, or -errno */
    int (*free_bytes)(int fd, uint64_t *out);
    int (*fstat)(int fd, struct stat *st);
    int (*renameat)(int olddirfd, const char *oldpath, int newdirfd, const char *newpath);
    int (*unlinkat)(int dirfd, const char *path, int flags);
    int (*mkdirat)(int dirfd, const char *path, mode_t mode);
    int (*flock)(int fd, int op);
    int (*fadvise_dontneed)(int fd, uint64_t off, uint64_t len);
    /* stat by name; @p flags 0 or AT_SYMLINK_NOFOLLOW (lstat) */
    int (*stat)(const char *path, struct stat *st, int flags);
    /* set @p path's times (NULL: both to now) */
    int (*utimens)(const char *path, const struct timespec times[2]);
    /* @p fn for every entry of directory @p path but "." and ".."; stops at a nonzero return
     * and returns it; 0 or -errno */
    int (*list_dir)(const char *path, kvt_dirent_fn fn, void *ud);
    /* a new descriptor of @p fd's file opened with @p flags (O_DIRECT): fd or -errno */
    int (*reopen)(int fd, int flags);
    /* open an asynchronous queue (aq.h) whose requests this backend sees */
    int (*aq_open)(struct kvt_aq *q, unsigned depth, const char *engine);
    /* whether the streams take the fast path (reopen, aq_open) or plain pread/pwrite */
    bool fast;
};

/** The backend in use (process-wide). */
const struct kvt_io *kvt_io(void);
/** Install @p io (NULL = the POSIX backend). Tests only; not thread-safe against I/O in flight. */
void kvt_io_set(const struct kvt_io *io);
/** The plain POSIX backend. */
const struct kvt_io *kvt_io_posix(void);

/** Read exactly @p n bytes at @p off: 0, -EIO on a short file (unexpected EOF), or -errno. */
int kvt_io_read_full(int fd, void *buf, size_t n, uint64_t off);
/** Write exactly @p n bytes at @p off, retrying short writes: 0 or -errno. */
int kvt_io_write_full(int fd, const void *buf, size_t n, uint64_t off);
/** fsync the directory holding @p path (or @p path itself when it is a directory). */
int kvt_io_fsync_dir(const char *dirpath);

#endif
