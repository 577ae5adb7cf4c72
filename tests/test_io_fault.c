/*
 * The io layer: the POSIX backend's exact read/write helpers and directory fsync, and the
 * fault-injecting backend (Nth-call failures, sticky failures, short transfers, EINTR,
 * directory-fsync classification, counters, the hook).
 */
#include "support/support.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/io.h"
#include "io/io_fault.h"

static char *dir;

static int setup(void **state)
{
    (void)state;
    dir = scratch_dir("io");
    kvt_fault_reset();
    return dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvt_io_set(NULL);
    kvt_fault_reset();
    rm_rf(dir);
    free(dir);
    return 0;
}

static int open_new(const char *name, char **path_out)
{
    char *p = strf("%s/%s", dir, name);
    int fd = kvt_io()->openat(AT_FDCWD, p, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (path_out)
        *path_out = p;
    else
        free(p);
    return fd;
}

static void test_posix_read_write(void **state)
{
    (void)state;
    assert_ptr_equal(kvt_io(), kvt_io_posix());
    int fd = open_new("rw", NULL);
    assert_true(fd >= 0);
    uint8_t buf[100000], back[100000];
    uint64_t rng = 3;
    fill_random(buf, sizeof(buf), &rng);
    assert_int_equal(kvt_io_write_full(fd, buf, sizeof(buf), 5), 0);
    assert_int_equal(kvt_io_read_full(fd, back, sizeof(back), 5), 0);
    assert_memory_equal(buf, back, sizeof(buf));
    /* a range past EOF is a short file: -EIO, never a partial success */
    assert_int_equal(kvt_io_read_full(fd, back, 10, sizeof(buf)), -EIO);
    assert_int_equal(kvt_io_read_full(fd, back, 0, 1u << 30), 0);
    struct stat st;
    assert_int_equal(kvt_io()->fstat(fd, &st), 0);
    assert_int_equal(st.st_size, sizeof(buf) + 5);
    assert_int_equal(kvt_io()->ftruncate(fd, 7), 0);
    assert_int_equal(kvt_io()->fstat(fd, &st), 0);
    assert_int_equal(st.st_size, 7);
    assert_int_equal(kvt_io()->fadvise_dontneed(fd, 0, 0), 0);
    assert_int_equal(kvt_io()->close(fd), 0);
    /* errors come back as -errno */
    assert_int_equal(kvt_io()->close(fd), -EBADF);
    assert_int_equal(kvt_io()->openat(AT_FDCWD, "/nonexistent/x", O_RDONLY, 0), -ENOENT);
}

static void test_fsync_dir(void **state)
{
    (void)state;
    char *p;
    int fd = open_new("f", &p);
    assert_true(fd >= 0);
    kvt_io()->close(fd);
    assert_int_equal(kvt_io_fsync_dir(dir), 0);
    assert_int_equal(kvt_io_fsync_dir(p), 0); /* the directory holding the file */
    char *missing = strf("%s/none/x", dir);
    assert_int_equal(kvt_io_fsync_dir(missing), -ENOENT);
    free(missing);

    /* through the fault backend a directory fsync is its own operation */
    kvt_io_set(kvt_io_fault());
    assert_int_equal(kvt_io_fsync_dir(dir), 0);
    assert_int_equal(kvt_fault_calls(KVT_FAULT_DIR_FSYNC), 1);
    assert_int_equal(kvt_fault_calls(KVT_FAULT_FSYNC), 0);
    struct kvt_fault_rule r = {.op = KVT_FAULT_DIR_FSYNC, .nth = 1, .err = EIO};
    assert_int_equal(kvt_fault_arm(&r), 0);
    assert_int_equal(kvt_io_fsync_dir(p), -EIO);
    /* a file fsync is not a directory fsync */
    fd = kvt_io()->openat(AT_FDCWD, p, O_RDWR, 0);
    assert_true(fd >= 0);
    assert_int_equal(kvt_io()->fsync(fd), 0);
    assert_int_equal(kvt_fault_calls(KVT_FAULT_FSYNC), 1);
    kvt_io()->close(fd);
    free(p);
}

static void test_nth_call_fails(void **state)
{
    (void)state;
    kvt_io_set(kvt_io_fault());
    int fd = open_new("nth", NULL);
    assert_true(fd >= 0);
    struct kvt_fault_rule r = {.op = KVT_FAULT_PWRITE, .nth = 3, .err = ENOSPC};
    assert_int_equal(kvt_fault_arm(&r), 0);
    uint8_t b[16] = {1};
    assert_int_equal(kvt_io_write_full(fd, b, 16, 0), 0);
    assert_int_equal(kvt_io_write_full(fd, b, 16, 16), 0);
    assert_int_equal(kvt_io_write_full(fd, b, 16, 32), -ENOSPC);
    assert_int_equal(kvt_io_write_full(fd, b, 16, 32), 0); /* one-shot */
    assert_int_equal(kvt_fault_calls(KVT_FAULT_PWRITE), 4);
    assert_int_equal(kvt_fault_injected(), 1);

    kvt_fault_disarm();
    r = (struct kvt_fault_rule){.op = KVT_FAULT_PREAD, .nth = 1, .err = EIO, .sticky = true};
    assert_int_equal(kvt_fault_arm(&r), 0);
    assert_int_equal(kvt_io_read_full(fd, b, 16, 0), -EIO);
    assert_int_equal(kvt_io_read_full(fd, b, 16, 0), -EIO);
    kvt_fault_disarm();
    assert_int_equal(kvt_io_read_full(fd, b, 16, 0), 0);
    assert_int_equal(b[0], 1);

    /* "any" counts every operation */
    kvt_fault_reset();
    r = (struct kvt_fault_rule){.op = KVT_FAULT_ANY, .nth = 2, .err = EIO};
    assert_int_equal(kvt_fault_arm(&r), 0);
    struct stat st;
    assert_int_equal(kvt_io()->fstat(fd, &st), 0);
    assert_int_equal(kvt_io()->ftruncate(fd, 0), -EIO);
    assert_int_equal(kvt_io()->ftruncate(fd, 0), 0);
    assert_int_equal(kvt_fault_calls(KVT_FAULT_ANY), 3);
    kvt_io()->close(fd);
    assert_int_equal(kvt_fault_calls(KVT_FAULT_ANY), 3); /* close is not counted in "any" */
    assert_int_equal(kvt_fault_calls(KVT_FAULT_CLOSE), 1);
}

static void test_short_and_eintr(void **state)
{
    (void)state;
    kvt_io_set(kvt_io_fault());
    int fd = open_new("short", NULL);
    assert_true(fd >= 0);
    uint8_t buf[10000], back[10000];
    uint64_t rng = 9;
    fill_random(buf, sizeof(buf), &rng);
    struct kvt_fault_rule r = {.op = KVT_FAULT_PWRITE, .nth = 1, .short_max = 7, .sticky = true};
    assert_int_equal(kvt_fault_arm(&r), 0);
    assert_int_equal(kvt_io_write_full(fd, buf, sizeof(buf), 0), 0);
    assert_true(kvt_fault_calls(KVT_FAULT_PWRITE) >= sizeof(buf) / 7);
    kvt_fault_disarm();
    r = (struct kvt_fault_rule){.op = KVT_FAULT_PREAD, .nth = 1, .short_max = 1000, .sticky = true};
    assert_int_equal(kvt_fault_arm(&r), 0);
    assert_int_equal(kvt_io_read_full(fd, back, sizeof(back), 0), 0);
    assert_memory_equal(buf, back, sizeof(buf));
    kvt_fault_disarm();
    /* EINTR is retried by the helpers */
    uint64_t before = kvt_fault_injected();
    r = (struct kvt_fault_rule){.op = KVT_FAULT_PWRITE, .nth = 1, .err = EINTR};
    assert_int_equal(kvt_fault_arm(&r), 0);
    r.op = KVT_FAULT_PREAD;
    assert_int_equal(kvt_fault_arm(&r), 0);
    assert_int_equal(kvt_io_write_full(fd, buf, 100, 0), 0);
    assert_int_equal(kvt_io_read_full(fd, back, 100, 0), 0);
    assert_int_equal(kvt_fault_injected() - before, 2);
    kvt_io()->close(fd);
}

struct hook_log {
    int calls;
    int renames;
    char last_path[256];
};

static int hook(void *ud, enum kvt_fault_op op, uint64_t count, const char *path)
{
    struct hook_log *log = ud;
    log->calls++;
    (void)count;
    if (path)
        snprintf(log->last_path, sizeof(log->last_path), "%s", path);
    if (op == KVT_FAULT_RENAME && ++log->renames == 2)
        return EXDEV;
    return 0;
}

static void test_hook(void **state)
{
    (void)state;
    struct hook_log log = {0};
    kvt_io_set(kvt_io_fault());
    kvt_fault_set_hook(hook, &log);
    char *a = strf("%s/a", dir), *b = strf("%s/b", dir);
    int fd = kvt_io()->openat(AT_FDCWD, a, O_WRONLY | O_CREAT, 0644);
    assert_true(fd >= 0);
    kvt_io()->close(fd);
    assert_int_equal(kvt_io()->renameat(AT_FDCWD, a, AT_FDCWD, b), 0);
    assert_string_equal(log.last_path, b);
    assert_int_equal(kvt_io()->renameat(AT_FDCWD, b, AT_FDCWD, a), -EXDEV);
    assert_int_equal(access(b, F_OK), 0); /* the failed rename did nothing */
    assert_int_equal(kvt_io()->unlinkat(AT_FDCWD, b, 0), 0);
    assert_int_equal(log.calls, 5);
    assert_int_equal(kvt_fault_injected(), 1);
    free(a);
    free(b);
}

static void test_names_and_arming(void **state)
{
    (void)state;
    for (int op = 0; op < KVT_FAULT_OP_COUNT; op++)
        assert_int_equal(kvt_fault_op_from_name(kvt_fault_op_name(op)), op);
    assert_int_equal(kvt_fault_op_from_name("dir-fsync"), KVT_FAULT_DIR_FSYNC);
    assert_int_equal(kvt_fault_op_from_name("nope"), -1);
    struct kvt_fault_rule r = {.op = KVT_FAULT_CLOSE, .nth = 1, .err = EIO};
    assert_int_equal(kvt_fault_arm(&r), -EINVAL);
    r.op = KVT_FAULT_OPEN;
    r.err = 0;
    assert_int_equal(kvt_fault_arm(&r), -EINVAL);
    r.err = EACCES;
    for (int i = 0; i < 16; i++)
        assert_int_equal(kvt_fault_arm(&r), 0);
    assert_int_equal(kvt_fault_arm(&r), -ENOSPC);
    kvt_io_set(kvt_io_fault());
    assert_int_equal(open_new("denied", NULL), -EACCES);
    kvt_fault_reset();
    int fd = open_new("allowed", NULL);
    assert_true(fd >= 0);
    kvt_io()->close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_posix_read_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fsync_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nth_call_fails, setup, teardown),
        cmocka_unit_test_setup_teardown(test_short_and_eintr, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hook, setup, teardown),
        cmocka_unit_test_setup_teardown(test_names_and_arming, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
