/*
 * The fault-injecting io backend (see io_fault.h). Each call is counted, offered to the hook,
 * then matched against the armed rules; a matching rule either fails the call or turns a
 * read or write into a short one. Descriptors opened with O_DIRECTORY are remembered so that
 * a directory fsync can be told from a file fsync.
 */
#include "io/io_fault.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>

#define MAX_RULES 16
#define MAX_TRACKED_FD 65536

struct armed_rule {
    struct kvt_fault_rule rule;
    uint64_t seen; /* matching calls since arming */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct armed_rule rules[MAX_RULES];
static int n_rules;
static uint64_t calls[KVT_FAULT_OP_COUNT];
static uint64_t injected, injected_async;
static kvt_fault_hook_fn hook_fn;
static void *hook_ud;
static uint8_t dir_fds[MAX_TRACKED_FD / 8];

static const char *const op_names[KVT_FAULT_OP_COUNT] = {
    [KVT_FAULT_OPEN] = "open",           [KVT_FAULT_CLOSE] = "close",
    [KVT_FAULT_PREAD] = "pread",         [KVT_FAULT_PWRITE] = "pwrite",
    [KVT_FAULT_FSYNC] = "fsync",         [KVT_FAULT_DIR_FSYNC] = "dir-fsync",
    [KVT_FAULT_FTRUNCATE] = "ftruncate", [KVT_FAULT_FSTAT] = "fstat",
    [KVT_FAULT_RENAME] = "rename",       [KVT_FAULT_UNLINK] = "unlink",
    [KVT_FAULT_MKDIR] = "mkdir",         [KVT_FAULT_FLOCK] = "flock",
    [KVT_FAULT_FADVISE] = "fadvise",     [KVT_FAULT_FALLOCATE] = "fallocate",
    [KVT_FAULT_STAT] = "stat",           [KVT_FAULT_UTIMES] = "utimes",
    [KVT_FAULT_LISTDIR] = "listdir",     [KVT_FAULT_ANY] = "any",
};

const char *kvt_fault_op_name(enum kvt_fault_op op)
{
    return (unsigned)op < KVT_FAULT_OP_COUNT ? op_names[op] : "unknown";
}

int kvt_fault_op_from_name(const char *name)
{
    for (int i = 0; i < KVT_FAULT_OP_COUNT; i++)
        if (!strcmp(name, op_names[i]))
            return i;
    return -1;
}

static bool fd_is_dir(int fd)
{
    return fd >= 0 && fd < MAX_TRACKED_FD && (dir_fds[fd / 8] & (1u << (fd % 8)));
}

static void fd_mark(int fd, bool dir)
{
    if (fd < 0 || fd >= MAX_TRACKED_FD)
        return;
    if (dir)
        dir_fds[fd / 8] |= (uint8_t)(1u << (fd % 8));
    else
        dir_fds[fd / 8] &= (uint8_t) ~(1u << (fd % 8));
}

/*
 * Count a call and decide its fate: 0 = proceed, a positive errno = fail with it. For reads and
 * writes *limit may be lowered to make the transfer short.
 */
static int decide(enum kvt_fault_op op, const char *path, size_t *limit)
{
    return kvt_fault_decide(op, path, limit, false);
}

int kvt_fault_decide(enum kvt_fault_op op, const char *path, size_t *limit, bool async)
{
    pthread_mutex_lock(&lock);
    uint64_t count = ++calls[op];
    bool any = op < KVT_FAULT_STAT && op != KVT_FAULT_CLOSE;
    if (any)
        calls[KVT_FAULT_ANY]++;
    kvt_fault_hook_fn fn = hook_fn;
    void *ud = hook_ud;
    int err = 0;
    for (int i = 0; i < n_rules && op != KVT_FAULT_CLOSE; i++) {
        struct armed_rule *a = &rules[i];
        if (a->rule.op != op && !(a->rule.op == KVT_FAULT_ANY && any))
            continue;
        a->seen++;
        bool hit = a->seen == a->rule.nth || (a->rule.sticky && a->seen > a->rule.nth);
        if (!hit || err)
            continue;
        if (a->rule.short_max && limit && (op == KVT_FAULT_PREAD || op == KVT_FAULT_PWRITE)) {
            if (*limit > a->rule.short_max) {
                *limit = a->rule.short_max;
                injected++;
                injected_async += async;
            }
        } else if (a->rule.err > 0) {
            err = a->rule.err;
            injected++;
            injected_async += async;
        }
    }
    pthread_mutex_unlock(&lock);
    /* the hook runs unlocked: it may do I/O of its own, or end the process */
    if (!err && fn) {
        int h = fn(ud, op, count, path);
        if (h > 0) {
            err = h;
            pthread_mutex_lock(&lock);
            injected++;
            injected_async += async;
            pthread_mutex_unlock(&lock);
        }
    }
    return err;
}

static int fault_openat(int dirfd, const char *path, int flags, mode_t mode)
{
    int err = decide(KVT_FAULT_OPEN, path, NULL);
    if (err)
        return -err;
    int fd = kvt_io_posix()->openat(dirfd, path, flags, mode);
    if (fd >= 0) {
        pthread_mutex_lock(&lock);
        fd_mark(fd, (flags & O_DIRECTORY) != 0);
        pthread_mutex_unlock(&lock);
    }
    return fd;
}

static int fault_close(int fd)
{
    decide(KVT_FAULT_CLOSE, NULL, NULL);
    pthread_mutex_lock(&lock);
    fd_mark(fd, false);
    pthread_mutex_unlock(&lock);
    return kvt_io_posix()->close(fd);
}

static ssize_t fault_pread(int fd, void *buf, size_t n, uint64_t off)
{
    size_t limit = n;
    int err = decide(KVT_FAULT_PREAD, NULL, &limit);
    if (err)
        return -err;
    return kvt_io_posix()->pread(fd, buf, limit, off);
}

static ssize_t fault_pwrite(int fd, const void *buf, size_t n, uint64_t off)
{
    size_t limit = n;
    int err = decide(KVT_FAULT_PWRITE, NULL, &limit);
    if (err)
        return -err;
    return kvt_io_posix()->pwrite(fd, buf, limit, off);
}

static int fault_fsync(int fd)
{
    pthread_mutex_lock(&lock);
    bool dir = fd_is_dir(fd);
    pthread_mutex_unlock(&lock);
    int err = decide(dir ? KVT_FAULT_DIR_FSYNC : KVT_FAULT_FSYNC, NULL, NULL);
    if (err)
        return -err;
    return kvt_io_posix()->fsync(fd);
}

static int fault_ftruncate(int fd, uint64_t size)
{
    int err = decide(KVT_FAULT_FTRUNCATE, NULL, NULL);
    return err ? -err : kvt_io_posix()->ftruncate(fd, size);
}

static int fault_fallocate(int fd, uint64_t size)
{
    int err = decide(KVT_FAULT_FALLOCATE, NULL, NULL);
    return err ? -err : kvt_io_posix()->fallocate(fd, size);
}

/* The rules decide what room there is, so none is known: a save always reserves its file. */
static int fault_free_bytes(int fd, uint64_t *out)
{
    (void)fd;
    (void)out;
    return -ENOSYS;
}

static int fault_fstat(int fd, struct stat *st)
{
    int err = decide(KVT_FAULT_FSTAT, NULL, NULL);
    return err ? -err : kvt_io_posix()->fstat(fd, st);
}

static int fault_renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath)
{
    int err = decide(KVT_FAULT_RENAME, newpath, NULL);
    return err ? -err : kvt_io_posix()->renameat(olddirfd, oldpath, newdirfd, newpath);
}

static int fault_unlinkat(int dirfd, const char *path, int flags)
{
    int err = decide(KVT_FAULT_UNLINK, path, NULL);
    return err ? -err : kvt_io_posix()->unlinkat(dirfd, path, flags);
}

static int fault_mkdirat(int dirfd, const char *path, mode_t mode)
{
    int err = decide(KVT_FAULT_MKDIR, path, NULL);
    return err ? -err : kvt_io_posix()->mkdirat(dirfd, path, mode);
}

static int fault_flock(int fd, int op)
{
    int err = decide(KVT_FAULT_FLOCK, NULL, NULL);
    return err ? -err : kvt_io_posix()->flock(fd, op);
}

static int fault_fadvise(int fd, uint64_t off, uint64_t len)
{
    int err = decide(KVT_FAULT_FADVISE, NULL, NULL);
    return err ? -err : kvt_io_posix()->fadvise_dontneed(fd, off, len);
}

static int fault_stat(const char *path, struct stat *st, int flags)
{
    int err = decide(KVT_FAULT_STAT, path, NULL);
    return err ? -err : kvt_io_posix()->stat(path, st, flags);
}

static int fault_utimens(const char *path, const struct timespec times[2])
{
    int err = decide(KVT_FAULT_UTIMES, path, NULL);
    return err ? -err : kvt_io_posix()->utimens(path, times);
}

static int fault_list_dir(const char *path, kvt_dirent_fn fn, void *ud)
{
    int err = decide(KVT_FAULT_LISTDIR, path, NULL);
    return err ? -err : kvt_io_posix()->list_dir(path, fn, ud);
}

static int fault_reopen(int fd, int flags)
{
    int err = decide(KVT_FAULT_OPEN, NULL, NULL);
    if (err)
        return -err;
    int nfd = kvt_io_posix()->reopen(fd, flags);
    if (nfd >= 0) {
        pthread_mutex_lock(&lock);
        fd_mark(nfd, false);
        pthread_mutex_unlock(&lock);
    }
    return nfd;
}

#define FAULT_IO_OPS                                                                               \
    .openat = fault_openat, .close = fault_close, .pread = fault_pread, .pwrite = fault_pwrite,    \
    .fsync = fault_fsync, .ftruncate = fault_ftruncate, .fallocate = fault_fallocate,              \
    .free_bytes = fault_free_bytes, .fstat = fault_fstat, .renameat = fault_renameat,              \
    .unlinkat = fault_unlinkat, .mkdirat = fault_mkdirat, .flock = fault_flock,                    \
    .fadvise_dontneed = fault_fadvise, .stat = fault_stat, .utimens = fault_utimens,               \
    .list_dir = fault_list_dir, .reopen = fault_reopen, .aq_open = kvt_fault_aq_open

static const struct kvt_io fault_io = {.name = "fault", FAULT_IO_OPS, .fast = false};
static const struct kvt_io fault_fast_io = {.name = "fault-fast", FAULT_IO_OPS, .fast = true};

const struct kvt_io *kvt_io_fault_fast(void)
{
    return &fault_fast_io;
}

const struct kvt_io *kvt_io_fault(void)
{
    return &fault_io;
}

void kvt_fault_reset(void)
{
    pthread_mutex_lock(&lock);
    n_rules = 0;
    memset(calls, 0, sizeof(calls));
    injected = injected_async = 0;
    hook_fn = NULL;
    hook_ud = NULL;
    pthread_mutex_unlock(&lock);
}

int kvt_fault_arm(const struct kvt_fault_rule *rule)
{
    if (!rule || (unsigned)rule->op >= KVT_FAULT_OP_COUNT || rule->op == KVT_FAULT_CLOSE)
        return -EINVAL;
    if (rule->short_max == 0 && rule->err <= 0)
        return -EINVAL;
    pthread_mutex_lock(&lock);
    int rc = 0;
    if (n_rules == MAX_RULES) {
        rc = -ENOSPC;
    } else {
        rules[n_rules].rule = *rule;
        rules[n_rules].seen = 0;
        n_rules++;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

void kvt_fault_disarm(void)
{
    pthread_mutex_lock(&lock);
    n_rules = 0;
    pthread_mutex_unlock(&lock);
}

uint64_t kvt_fault_calls(enum kvt_fault_op op)
{
    if ((unsigned)op >= KVT_FAULT_OP_COUNT)
        return 0;
    pthread_mutex_lock(&lock);
    uint64_t n = calls[op];
    pthread_mutex_unlock(&lock);
    return n;
}

uint64_t kvt_fault_injected_async(void)
{
    pthread_mutex_lock(&lock);
    uint64_t n = injected_async;
    pthread_mutex_unlock(&lock);
    return n;
}

uint64_t kvt_fault_injected(void)
{
    pthread_mutex_lock(&lock);
    uint64_t n = injected;
    pthread_mutex_unlock(&lock);
    return n;
}

void kvt_fault_set_hook(kvt_fault_hook_fn hook, void *ud)
{
    pthread_mutex_lock(&lock);
    hook_fn = hook;
    hook_ud = ud;
    pthread_mutex_unlock(&lock);
}
