/*
 * Removing a file that a writer may hold (STORE.md §12.4): an abandoned .tmp, or a chunk no
 * indexed entry needs (docs/SHARING.md §6), goes only once an exclusive non-blocking flock on
 * it succeeds and it is older than the grace, and only if its name still leads to the locked
 * file. A directory's chunks are removed under an exclusive lock on its chunks.lock, which
 * every shared put holds shared from its first chunk to its tail's publication. The store's
 * clocks, which ages are judged by, live here too.
 */
#include "store/store_parts.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>

#include "io/io.h"
#include "store/layout.h"
#include "store/share.h"

int64_t kvt_timespec_ms(const struct timespec *t)
{
    return (int64_t)t->tv_sec * 1000 + t->tv_nsec / 1000000;
}

int64_t kvt_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return kvt_timespec_ms(&t);
}

int kvt_claim_older(const char *path, int64_t before_ms, struct stat *st, bool *again)
{
    const struct kvt_io *io = kvt_io();
    *again = false;
    int fd = io->openat(AT_FDCWD, path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    if (io->flock(fd, LOCK_EX | LOCK_NB) < 0)
        *again = true; /* a live writer holds it; look again in case the writer dies */
    else if (io->fstat(fd, st) < 0 || !S_ISREG(st->st_mode))
        ;
    else if (kvt_timespec_ms(&st->st_mtim) > before_ms)
        *again = true; /* may be between its writer's create and lock, or its use and commit */
    else
        return fd;
    io->close(fd);
    return -1;
}

int kvt_tmp_claim(const char *path, int64_t grace_ms, struct stat *st, bool *again)
{
    return kvt_claim_older(path, kvt_now_ms() - grace_ms, st, again);
}

int kvt_tmp_unlink_claimed(const char *path, const struct stat *st)
{
    /* Unlink only the very file we locked: the name may have moved on since the open. */
    const struct kvt_io *io = kvt_io();
    struct stat now_st;
    int rc = io->stat(path, &now_st, AT_SYMLINK_NOFOLLOW);
    if (rc == 0 && (now_st.st_ino != st->st_ino || now_st.st_dev != st->st_dev))
        rc = -ENOENT;
    return rc == 0 ? io->unlinkat(AT_FDCWD, path, 0) : rc;
}

void kvt_chunk_remove(const char *path, int64_t before_ms)
{
    struct stat st;
    bool again;
    int fd = kvt_claim_older(path, before_ms, &st, &again);
    if (fd < 0)
        return; /* in use or young: a later scan takes it if no tail needs it then */
    kvt_tmp_unlink_claimed(path, &st);
    kvt_io()->close(fd);
}

#define LOCK_TRIES 20 /* with LOCK_WAIT_NS: 100 ms for the puts under way to finish */
#define LOCK_WAIT_NS 5000000

int kvt_chunks_lock(const char *dir, bool remove)
{
    char *path = kvt_path_join(dir, KVT_CHUNKS_LOCK);
    if (!path)
        return -ENOMEM;
    const struct kvt_io *io = kvt_io();
    int fd = io->openat(AT_FDCWD, path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    free(path);
    if (fd < 0)
        return fd;
    int rc = io->flock(fd, remove ? LOCK_EX | LOCK_NB : LOCK_SH);
    for (int tries = 1; remove && rc == -EWOULDBLOCK && tries < LOCK_TRIES; tries++) {
        nanosleep(&(struct timespec){0, LOCK_WAIT_NS}, NULL);
        rc = io->flock(fd, LOCK_EX | LOCK_NB);
    }
    if (rc < 0) {
        io->close(fd);
        return rc;
    }
    return fd;
}
