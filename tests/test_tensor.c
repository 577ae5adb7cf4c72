/*
 * Tensor layer: the dtype table, buffer refcounts and release callbacks (including failure
 * paths), view validation, slicing, and every strided copy checked against a naive
 * element-by-element reference on random shapes and layouts.
 */
#include "support/support.h"

#include "tensor/alloc.h"
#include "tensor/tensor_parts.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_dtype_table(void **state)
{
    (void)state;
    static const struct {
        int code;
        const char *name;
        size_t size;
        bool act;
    } want[] = {
        {0, "bool", 1, false},     {1, "uint8", 1, false},      {2, "uint16", 2, false},
        {3, "uint32", 4, false},   {4, "uint64", 8, false},     {5, "int8", 1, false},
        {6, "int16", 2, false},    {7, "int32", 4, false},      {8, "int64", 8, false},
        {9, "float16", 2, true},   {10, "float32", 4, true},    {11, "float64", 8, false},
        {12, "bfloat16", 2, true}, {13, "complex64", 8, false},
    };
    assert_int_equal(sizeof(want) / sizeof(want[0]), KVT_DTYPE_COUNT);
    for (size_t i = 0; i < KVT_DTYPE_COUNT; i++) {
        assert_int_equal(kvt_dtype_size(want[i].code), want[i].size);
        assert_string_equal(kvt_dtype_name(want[i].code), want[i].name);
        assert_int_equal(kvt_dtype_is_activation(want[i].code), want[i].act);
    }
    int bad[] = {-1, 14, 100, -1000};
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(kvt_dtype_size(bad[i]), 0);
        assert_string_equal(kvt_dtype_name(bad[i]), "unknown");
        assert_false(kvt_dtype_is_activation(bad[i]));
    }
    assert_int_equal(KVT_BFLOAT16, 12);
    assert_int_equal(KVT_UINT32, 3);
}

static void test_buf_new_zeroed_aligned(void **state)
{
    (void)state;
    size_t sizes[] = {0, 1, 63, 64, 65, 4096, 1 << 20, (3 << 20) + 7};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        kvt_buf *b = NULL;
        assert_int_equal(kvt_buf_new(sizes[i], &b), 0);
        assert_non_null(b);
        assert_non_null(kvt_buf_data(b));
        assert_int_equal((uintptr_t)kvt_buf_data(b) % 64, 0);
        assert_int_equal(kvt_buf_size(b), sizes[i]);
        assert_int_equal(kvt_buf_refcount(b), 1);
        const uint8_t *p = kvt_buf_data(b);
        for (size_t j = 0; j < sizes[i]; j++)
            if (p[j])
                fail_msg("byte %zu of a %zu-byte buffer is %u", j, sizes[i], p[j]);
        memset(kvt_buf_data(b), 0xab, sizes[i]);
        assert_ptr_equal(kvt_buf_ref(b), b);
        assert_int_equal(kvt_buf_refcount(b), 2);
        kvt_buf_unref(b);
        assert_int_equal(kvt_buf_refcount(b), 1);
        kvt_buf_unref(b);

        assert_int_equal(kvt_buf_new_uninit(sizes[i], &b), 0);
        assert_int_equal((uintptr_t)kvt_buf_data(b) % 64, 0);
        memset(kvt_buf_data(b), 0x11, sizes[i]);
        kvt_buf_unref(b);
    }
    kvt_buf_unref(NULL);
    assert_null(kvt_buf_ref(NULL));
    assert_int_equal(kvt_buf_size(NULL), 0);
    assert_null(kvt_buf_data(NULL));
    assert_int_equal(kvt_buf_new(16, NULL), -EINVAL);
}

/*
 * Large buffers start on a 2 MiB boundary and their mapping asks for transparent huge pages
 * (VmFlags "hg"); with huge pages off it does not. 40 MiB is above the C library's largest
 * mmap threshold, so each buffer is a mapping of its own.
 */
static void test_buf_large_huge_pages(void **state)
{
    (void)state;
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", R_OK) != 0)
        skip(); /* a kernel without transparent huge pages */
    char flags[512];
    size_t n = (size_t)40 << 20;
    size_t limit = kvt_buf_cache_limit(0); /* no kept mapping from before the switch */
    for (int zero = 0; zero < 2; zero++)
        for (int off = 0; off < 2; off++) {
            kvt_buf *b = NULL;
            if (off)
                set_mem(true, false);
            assert_int_equal(zero ? kvt_buf_new(n, &b) : kvt_buf_new_uninit(n, &b), 0);
            set_mem(false, false);
            uint8_t *d = kvt_buf_data(b);
            if (!off)
                assert_int_equal((uintptr_t)d % ((uintptr_t)2 << 20), 0);
            vma_flags(d, flags, sizeof(flags));
            assert_true(flags[0] != '\0');
            if (off ? strstr(flags, " hg") != NULL : strstr(flags, " hg") == NULL)
                fail_msg("%s, huge pages %s: %s", zero ? "kvt_buf_new" : "kvt_buf_new_uninit",
                         off ? "0" : "unset", flags);
            memset(d, 0x5a, n); /* every byte is the caller's */
            assert_int_equal(d[n - 1], 0x5a);
            kvt_buf_unref(b);
        }
    kvt_buf_cache_limit(limit);
}

/* Whether [@p p, @p p + 4096) is mapped in this process. */
static bool mapped(const void *p)
{
    return msync((void *)((uintptr_t)p & ~(uintptr_t)4095), 4096, MS_ASYNC) == 0;
}

/*
 * The buffer cache: a freed large buffer is kept and handed to the next uninitialized one that
 * fits (the very memory, old bytes and all), or cleared to a zero-filled one; a larger kept one
 * is cut on a 2 MiB boundary and its tail kept; the limit unmaps the longest-kept ones, and a
 * limit of 0 releases everything.
 */
static void test_buf_cache(void **state)
{
    (void)state;
    const size_t mib = (size_t)1 << 20;
    size_t old = kvt_buf_cache_limit(0);
    assert_int_equal(kvt_buf_cache_limit(64 * mib), 0);
    assert_int_equal(kvt_buf_cache_bytes(), 0);

    kvt_buf *b, *c;
    assert_int_equal(kvt_buf_new_uninit(8 * mib, &b), 0);
    uint8_t *p = kvt_buf_data(b);
    memset(p, 0x3c, 8 * mib);
    kvt_buf_unref(b);
    assert_int_equal(kvt_buf_cache_bytes(), 8 * mib);
    assert_true(mapped(p));
    assert_int_equal(kvt_buf_new_uninit(SIZE_MAX - 8, &b), -ENOMEM); /* not the kept one */
    assert_null(b);
    assert_int_equal(kvt_buf_cache_bytes(), 8 * mib);
    assert_int_equal(kvt_buf_new_uninit(8 * mib - 100, &c), 0);
    assert_ptr_equal(kvt_buf_data(c), p);
    assert_int_equal(p[0], 0x3c); /* kept, not refaulted */
    assert_int_equal(kvt_buf_size(c), 8 * mib - 100);
    assert_int_equal(kvt_buf_cache_bytes(), 0);
    assert_int_equal(kvt_buf_new(8 * mib, &b), 0); /* nothing kept: a fresh mapping */
    assert_ptr_not_equal(kvt_buf_data(b), p);
    kvt_buf_unref(c);
    memset(kvt_buf_data(b), 0x5a, 8 * mib);
    kvt_buf_unref(b);
    assert_int_equal(kvt_buf_cache_bytes(), 16 * mib);
    /* a zero-filled buffer takes a kept one too, cleared: both kept ones were written */
    assert_int_equal(kvt_buf_new(8 * mib - 4096, &b), 0);
    const uint8_t *z = kvt_buf_data(b);
    assert_true(z == p || mapped(z));
    for (size_t i = 0; i < 8 * mib - 4096; i++)
        if (z[i])
            fail_msg("byte %zu of a zero-filled buffer from the cache is %u", i, z[i]);
    assert_int_equal(kvt_buf_cache_bytes(), 8 * mib);
    kvt_buf_unref(b);
    assert_int_equal(kvt_buf_cache_bytes(), 16 * mib);

    /* 5 MiB out of a kept 8 MiB: the first 6 MiB go, the 2 MiB tail stays kept */
    kvt_buf_cache_limit(0);
    assert_false(mapped(p));
    kvt_buf_cache_limit(64 * mib);
    assert_int_equal(kvt_buf_new_uninit(8 * mib, &b), 0);
    p = kvt_buf_data(b);
    kvt_buf_unref(b);
    assert_int_equal(kvt_buf_new_uninit(5 * mib, &b), 0);
    assert_ptr_equal(kvt_buf_data(b), p);
    assert_int_equal(kvt_buf_cache_bytes(), 2 * mib);
    assert_int_equal(kvt_buf_new_uninit(4 * mib, &c), 0); /* the tail is too small: it goes */
    assert_int_equal(kvt_buf_cache_bytes(), 0);
    kvt_buf_unref(c);
    kvt_buf_unref(b);
    assert_int_equal(kvt_buf_cache_bytes(), 10 * mib);

    /* over the limit the longest-kept go; a buffer larger than the limit is not kept */
    kvt_buf_cache_limit(0);
    kvt_buf_cache_limit(20 * mib);
    kvt_buf *v[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(kvt_buf_new_uninit(8 * mib, &v[i]), 0);
    uint8_t *first = kvt_buf_data(v[0]), *last = kvt_buf_data(v[2]);
    for (int i = 0; i < 3; i++)
        kvt_buf_unref(v[i]);
    assert_int_equal(kvt_buf_cache_bytes(), 16 * mib);
    assert_false(mapped(first));
    assert_true(mapped(last));
    assert_int_equal(kvt_buf_new_uninit(32 * mib, &b), 0);
    p = kvt_buf_data(b);
    kvt_buf_unref(b);
    assert_false(mapped(p));
    assert_int_equal(kvt_buf_cache_bytes(), 0);

    /* a request no kept buffer fits first gives back as much of the longest-kept memory */
    for (int i = 0; i < 2; i++)
        assert_int_equal(kvt_buf_new_uninit(8 * mib, &v[i]), 0);
    assert_int_equal(kvt_buf_new_uninit(4 * mib, &v[2]), 0);
    last = kvt_buf_data(v[2]);
    for (int i = 0; i < 3; i++)
        kvt_buf_unref(v[i]); /* kept in this order: 8, 8, 4 MiB */
    assert_int_equal(kvt_buf_cache_bytes(), 20 * mib);
    assert_int_equal(kvt_buf_new_uninit(10 * mib, &b), 0);
    assert_int_equal(kvt_buf_cache_bytes(), 4 * mib); /* both 8 MiB ones went */
    assert_true(mapped(last));
    kvt_buf_unref(b);

    /* from 1 MiB on buffers are kept; smaller ones come from malloc and are not */
    kvt_buf_cache_limit(0);
    kvt_buf_cache_limit(20 * mib);
    assert_int_equal(kvt_buf_new_uninit(mib + mib / 2, &b), 0);
    p = kvt_buf_data(b);
    kvt_buf_unref(b);
    assert_int_equal(kvt_buf_cache_bytes(), mib + mib / 2);
    assert_int_equal(kvt_buf_new_uninit(mib, &b), 0);
    assert_ptr_equal(kvt_buf_data(b), p);
    kvt_buf_unref(b);
    assert_int_equal(kvt_buf_new_uninit(mib - 4096, &b), 0);
    assert_ptr_not_equal(kvt_buf_data(b), p);
    kvt_buf_unref(b);
    assert_int_equal(kvt_buf_cache_bytes(), mib + mib / 2); /* only the first one is kept */
    assert_int_equal(kvt_buf_cache_limit(old), 20 * mib);
}

/* Whether all @p n bytes at @p p are zero. */
static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

/*
 * A buffer for filling says whether it came zero-filled: small ones always do, a mapping when
 * it is fresh, not when it was taken back from the buffer cache (old bytes and all); a
 * zero-filled buffer is zeroed whatever its origin, an uninitialized small one is not.
 */
static void test_buf_for_fill(void **state)
{
    (void)state;
    const size_t mib = (size_t)1 << 20;
    size_t old = kvt_buf_cache_limit(0);
    kvt_buf_cache_limit(64 * mib);
    kvt_buf *b;
    assert_int_equal(kvt_buf_new_for_fill(100 << 10, &b), 0);
    assert_true(kvt_buf_zeroed(b));
    assert_true(all_zero(kvt_buf_data(b), 100 << 10));
    memset(kvt_buf_data(b), 7, 100 << 10);
    kvt_buf_unref(b);
    assert_int_equal(kvt_buf_new_for_fill(100 << 10, &b), 0); /* perhaps the same block */
    assert_true(kvt_buf_zeroed(b));
    assert_true(all_zero(kvt_buf_data(b), 100 << 10));
    kvt_buf_unref(b);
    assert_int_equal(kvt_buf_new_uninit(100 << 10, &b), 0);
    assert_false(kvt_buf_zeroed(b));
    kvt_buf_unref(b);

    assert_int_equal(kvt_buf_new_for_fill(4 * mib, &b), 0); /* nothing kept: fresh */
    assert_true(kvt_buf_zeroed(b));
    uint8_t *p = kvt_buf_data(b);
    memset(p, 9, 4 * mib);
    kvt_buf_unref(b);
    assert_int_equal(kvt_buf_new_for_fill(4 * mib, &b), 0);
    assert_ptr_equal(kvt_buf_data(b), p);
    assert_false(kvt_buf_zeroed(b)); /* kept: the caller clears what must be zero */
    assert_int_equal(p[0], 9);
    kvt_buf_unref(b);
    assert_int_equal(kvt_buf_new(4 * mib, &b), 0);
    assert_ptr_equal(kvt_buf_data(b), p);
    assert_true(kvt_buf_zeroed(b));
    assert_true(all_zero(p, 4 * mib));
    kvt_buf_unref(b);
    kvt_buf_cache_limit(0);
    kvt_buf_cache_limit(old);
}

/*
 * Where a buffer's small-page tail begins: a mapping taken back from the buffer cache is on
 * huge pages up to its last whole one (none under 2 MiB); fresh memory, buffers that are no
 * mapping of their own and exact multiples of 2 MiB have no tail.
 */
static void test_buf_small_tail(void **state)
{
    (void)state;
    const size_t mib = (size_t)1 << 20;
    const struct {
        size_t bytes, tail;
    } cases[] = {{mib / 2, SIZE_MAX},       {mib + mib / 2, 0},           {2 * mib, SIZE_MAX},
                 {2 * mib + 4096, 2 * mib}, {4 * mib + mib / 2, 4 * mib}, {8 * mib, SIZE_MAX}};
    size_t old = kvt_buf_cache_limit(0);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvt_buf_cache_limit(0); /* nothing kept: the second take gets the first one's mapping */
        kvt_buf_cache_limit(64 * mib);
        kvt_buf *b;
        assert_int_equal(kvt_buf_new_uninit(cases[i].bytes, &b), 0);
        assert_int_equal(kvt_buf_small_tail(b), SIZE_MAX); /* fresh */
        kvt_buf_unref(b);
        assert_int_equal(kvt_buf_new_uninit(cases[i].bytes, &b), 0);
        if (kvt_buf_small_tail(b) != cases[i].tail)
            fail_msg("%zu bytes: small-page tail at %zu, want %zu", cases[i].bytes,
                     kvt_buf_small_tail(b), cases[i].tail);
        kvt_buf_unref(b);
    }
    set_mem(true, false);
    kvt_buf *b;
    assert_int_equal(kvt_buf_new_uninit(mib + mib / 2, &b), 0);
    kvt_buf_unref(b);
    assert_int_equal(kvt_buf_new_uninit(mib + mib / 2, &b), 0);
    assert_int_equal(kvt_buf_small_tail(b), SIZE_MAX); /* no huge pages anywhere */
    kvt_buf_unref(b);
    set_mem(false, false);
    kvt_buf_cache_limit(0);
    kvt_buf_cache_limit(old);
}

struct churn_arg {
    int id;
    bool ok;
};

/* Take and free buffers of varied sizes, each filled with this thread's mark and checked: a
 * buffer handed to two holders at once would show the other's mark. */
static void *cache_churn(void *p)
{
    struct churn_arg *a = p;
    a->ok = true;
    for (int i = 0; i < 40 && a->ok; i++) {
        size_t n = ((size_t)4 << 20) + (size_t)((i * 7 + a->id * 3) % 9) * ((size_t)1 << 20);
        kvt_buf *b;
        if (kvt_buf_new_uninit(n, &b)) {
            a->ok = false;
            break;
        }
        uint8_t *d = kvt_buf_data(b);
        memset(d, a->id, n);
        sched_yield();
        for (size_t k = 0; k < n; k += 4096)
            a->ok &= d[k] == a->id && d[n - 1] == a->id;
        kvt_buf_unref(b);
    }
    return NULL;
}

static void test_buf_cache_threads(void **state)
{
    (void)state;
    size_t old = kvt_buf_cache_limit((size_t)48 << 20);
    enum { N = 4 };
    pthread_t th[N];
    struct churn_arg arg[N];
    for (int i = 0; i < N; i++) {
        arg[i].id = i + 1;
        assert_int_equal(pthread_create(&th[i], NULL, cache_churn, &arg[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_true(arg[i].ok);
    }
    assert_true(kvt_buf_cache_bytes() <= (size_t)48 << 20);
    kvt_buf_cache_limit(old);
}

static atomic_bool churn_stop;

static void *churn_until_stopped(void *p)
{
    (void)p;
    while (!atomic_load(&churn_stop)) {
        kvt_buf *b;
        if (kvt_buf_new_uninit((size_t)4 << 20, &b) == 0)
            kvt_buf_unref(b);
    }
    return NULL;
}

/*
 * A process that forks while another thread takes and frees large buffers: the child can
 * use the buffer cache (its lock is never inherited held). A child that hangs is killed by
 * its alarm and fails the test.
 */
static void test_buf_cache_fork(void **state)
{
    (void)state;
    size_t old = kvt_buf_cache_limit((size_t)64 << 20);
    atomic_store(&churn_stop, false);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, churn_until_stopped, NULL), 0);
    int bad = 0;
    for (int i = 0; i < 200 && !bad; i++) {
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            alarm(5);
            kvt_buf *b;
            int rc = kvt_buf_new_uninit((size_t)4 << 20, &b);
            if (rc == 0)
                kvt_buf_unref(b);
            kvt_buf_cache_limit(0);
            _exit(rc == 0 && kvt_buf_cache_bytes() == 0 ? 0 : 1);
        }
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        bad = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    atomic_store(&churn_stop, true);
    pthread_join(th, NULL);
    kvt_buf_cache_limit(old);
    assert_false(bad);
}

struct release_log {
    int calls;
    void *last_data;
};

static void count_release(void *ud, void *data)
{
    struct release_log *l = ud;
    l->calls++;
    l->last_data = data;
}

static void test_buf_wrap_release_once(void **state)
{
    (void)state;
    char mem[100];
    struct release_log log = {0};
    kvt_buf *b = NULL;
    assert_int_equal(kvt_buf_wrap(mem, sizeof(mem), count_release, &log, &b), 0);
    assert_ptr_equal(kvt_buf_data(b), mem);
    assert_int_equal(kvt_buf_size(b), sizeof(mem));
    assert_true(kvt_buf_is_wrapped(b));
    kvt_buf_ref(b);
    struct kvt_tensor t, u;
    int64_t shape[2] = {10, 10};
    assert_int_equal(kvt_tensor_init(&t, b, 0, KVT_UINT8, 2, shape), 0);
    kvt_tensor_share(&u, &t);
    assert_int_equal(kvt_buf_refcount(b), 4);
    kvt_buf_unref(b);
    kvt_buf_unref(b);
    kvt_tensor_release(&t);
    assert_int_equal(log.calls, 0);
    kvt_tensor_release(&u);
    assert_int_equal(log.calls, 1);
    assert_ptr_equal(log.last_data, mem);

    /* a NULL callback is allowed */
    assert_int_equal(kvt_buf_wrap(mem, sizeof(mem), NULL, NULL, &b), 0);
    kvt_buf_unref(b);

    /* failing calls still release exactly once */
    log.calls = 0;
    b = (kvt_buf *)&log;
    assert_int_equal(kvt_buf_wrap(NULL, 10, count_release, &log, &b), -EINVAL);
    assert_null(b);
    assert_int_equal(log.calls, 1);
    assert_int_equal(kvt_buf_wrap(mem, 10, count_release, &log, NULL), -EINVAL);
    assert_int_equal(log.calls, 2);
    kvt_alloc_fail_after(0);
    int rc = kvt_buf_wrap(mem, 10, count_release, &log, &b);
    kvt_alloc_fail_after(-1);
    assert_int_equal(rc, -ENOMEM);
    assert_null(b);
    assert_int_equal(log.calls, 3);
    assert_ptr_equal(log.last_data, mem);
}

static void test_buf_new_enomem(void **state)
{
    (void)state;
    kvt_buf *b = (kvt_buf *)1;
    kvt_alloc_fail_after(0);
    int rc = kvt_buf_new(128, &b);
    kvt_alloc_fail_after(-1);
    assert_int_equal(rc, -ENOMEM);
    assert_null(b);
    assert_int_equal(kvt_buf_new(SIZE_MAX - 8, &b), -ENOMEM);
    assert_null(b);
    struct kvt_tensor t;
    int64_t shape[1] = {4};
    kvt_alloc_fail_after(0);
    rc = kvt_tensor_zeros(&t, KVT_FLOAT32, 1, shape);
    kvt_alloc_fail_after(-1);
    assert_int_equal(rc, -ENOMEM);
    assert_null(t.buf);
}

struct thread_arg {
    kvt_buf *b;
    int rounds;
};

static void *ref_churn(void *p)
{
    struct thread_arg *a = p;
    for (int i = 0; i < a->rounds; i++) {
        kvt_buf_ref(a->b);
        kvt_buf_unref(a->b);
    }
    kvt_buf_unref(a->b); /* each thread drops the reference it was given */
    return NULL;
}

static void test_buf_refcount_threads(void **state)
{
    (void)state;
    char mem[8];
    struct release_log log = {0};
    kvt_buf *b;
    assert_int_equal(kvt_buf_wrap(mem, sizeof(mem), count_release, &log, &b), 0);
    enum { N = 4 };
    pthread_t th[N];
    struct thread_arg arg = {b, 20000};
    for (int i = 0; i < N; i++)
        kvt_buf_ref(b);
    for (int i = 0; i < N; i++)
        assert_int_equal(pthread_create(&th[i], NULL, ref_churn, &arg), 0);
    kvt_buf_unref(b);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(log.calls, 1);
}

static void test_tensor_init_bounds(void **state)
{
    (void)state;
    kvt_buf *b;
    assert_int_equal(kvt_buf_new(96, &b), 0);
    struct kvt_tensor t;
    int64_t s1[2] = {4, 6}; /* 24 floats = 96 bytes */
    assert_int_equal(kvt_tensor_init(&t, b, 0, KVT_FLOAT32, 2, s1), 0);
    assert_int_equal(t.strides[0], 6);
    assert_int_equal(t.strides[1], 1);
    assert_int_equal(kvt_tensor_numel(&t), 24);
    assert_int_equal(kvt_tensor_nbytes(&t), 96);
    assert_true(kvt_tensor_is_contiguous(&t));
    assert_int_equal(kvt_tensor_check(&t), 0);
    assert_int_equal(kvt_buf_refcount(b), 2);
    kvt_tensor_release(&t);
    assert_null(t.buf);
    assert_int_equal(kvt_buf_refcount(b), 1);

    assert_int_equal(kvt_tensor_init(&t, b, 4, KVT_FLOAT32, 2, s1), -EINVAL);
    assert_null(t.buf);
    int64_t s2[2] = {4, 5};
    assert_int_equal(kvt_tensor_init(&t, b, 16, KVT_FLOAT32, 2, s2), 0);
    kvt_tensor_release(&t);
    assert_int_equal(kvt_tensor_init(&t, b, 0, 99, 2, s2), -EINVAL);
    assert_int_equal(kvt_tensor_init(&t, b, 0, KVT_FLOAT32, 9, s2), -EINVAL);
    int64_t neg[2] = {-1, 4};
    assert_int_equal(kvt_tensor_init(&t, b, 0, KVT_FLOAT32, 2, neg), -EINVAL);
    int64_t huge[3] = {INT64_MAX / 2, 4, 4};
    assert_int_equal(kvt_tensor_init(&t, b, 0, KVT_FLOAT32, 3, huge), -EINVAL);
    int64_t huge2[1] = {INT64_MAX / 2};
    assert_int_equal(kvt_tensor_init(&t, b, 0, KVT_FLOAT64, 1, huge2), -EINVAL);
    assert_int_equal(kvt_tensor_init(&t, b, SIZE_MAX - 2, KVT_UINT8, 1, s1), -EINVAL);
    /* rank 0: one element */
    assert_int_equal(kvt_tensor_init(&t, b, 92, KVT_INT32, 0, NULL), 0);
    assert_int_equal(kvt_tensor_numel(&t), 1);
    kvt_tensor_release(&t);
    /* zero elements fit anywhere up to the end */
    int64_t z[2] = {0, 1000};
    assert_int_equal(kvt_tensor_init(&t, b, 96, KVT_FLOAT32, 2, z), 0);
    assert_int_equal(kvt_tensor_nbytes(&t), 0);
    kvt_tensor_release(&t);

    /* hand-built strided views: in bounds, out of bounds, negative strides */
    struct kvt_tensor v = {.buf = b, .offset = 0, .dtype = KVT_FLOAT32, .rank = 2};
    v.shape[0] = 6;
    v.shape[1] = 4;
    v.strides[0] = 1;
    v.strides[1] = 6;
    assert_int_equal(kvt_tensor_check(&v), 0);
    assert_false(kvt_tensor_is_contiguous(&v));
    v.strides[1] = 7;
    assert_int_equal(kvt_tensor_check(&v), -EINVAL);
    v.strides[1] = -6;
    assert_int_equal(kvt_tensor_check(&v), -EINVAL);
    v.offset = 18 * 4;
    assert_int_equal(kvt_tensor_check(&v), 0);
    v.strides[0] = INT64_MAX / 3;
    assert_int_equal(kvt_tensor_check(&v), -EINVAL);
    /* a broadcast view (stride 0) addresses few bytes but may not overflow its byte size */
    v.offset = 0;
    v.rank = 1;
    v.shape[0] = 1000;
    v.strides[0] = 0;
    assert_int_equal(kvt_tensor_check(&v), 0);
    v.shape[0] = INT64_MAX / 2;
    assert_int_equal(kvt_tensor_check(&v), -EINVAL);
    v.buf = NULL;
    assert_int_equal(kvt_tensor_check(&v), -EINVAL);
    kvt_buf_unref(b);
    kvt_tensor_release(NULL);
}

/* Naive reference: element at multi-index @p idx of @p t. */
static const uint8_t *elem_at(const struct kvt_tensor *t, const int64_t *idx)
{
    int64_t off = 0;
    for (int i = 0; i < t->rank; i++)
        off += idx[i] * t->strides[i];
    return (const uint8_t *)kvt_buf_data(t->buf) + t->offset +
           off * (int64_t)kvt_dtype_size(t->dtype);
}

static uint8_t *naive_copy_out(const struct kvt_tensor *t)
{
    size_t item = kvt_dtype_size(t->dtype), n = kvt_tensor_numel(t);
    uint8_t *out = malloc(n * item + 1), *o = out;
    int64_t idx[KVT_MAX_RANK] = {0};
    for (size_t e = 0; e < n; e++) {
        memcpy(o, elem_at(t, idx), item);
        o += item;
        for (int j = t->rank - 1; j >= 0; j--) {
            if (++idx[j] < t->shape[j])
                break;
            idx[j] = 0;
        }
    }
    return out;
}

struct gather {
    uint8_t *p;
    size_t n, runs, max_run;
};

static int gather_run(void *ud, const void *p, size_t n)
{
    struct gather *g = ud;
    assert_true(n > 0);
    memcpy(g->p + g->n, p, n);
    g->n += n;
    g->runs++;
    if (n > g->max_run)
        g->max_run = n;
    return 0;
}

struct scatter {
    const uint8_t *p;
    size_t n;
};

static int scatter_run(void *ud, void *p, size_t n)
{
    struct scatter *s = ud;
    memcpy(p, s->p + s->n, n);
    s->n += n;
    return 0;
}

static int stop_at_second(void *ud, const void *p, size_t n)
{
    (void)p;
    (void)n;
    return ++*(int *)ud == 2 ? 42 : 0;
}

/* A random view: a contiguous base of random rank/shape, axes permuted, random slices. */
static void random_view(uint64_t *rng, struct kvt_tensor *t)
{
    static const int dtypes[] = {KVT_UINT8, KVT_BFLOAT16, KVT_FLOAT32, KVT_FLOAT64};
    int rank = 1 + (int)(xs64(rng) % 5);
    int dtype = dtypes[xs64(rng) % 4];
    int64_t shape[KVT_MAX_RANK];
    for (int i = 0; i < rank; i++)
        shape[i] = 1 + (int64_t)(xs64(rng) % 6);
    struct kvt_tensor base;
    assert_int_equal(kvt_tensor_zeros(&base, dtype, rank, shape), 0);
    fill_random(kvt_buf_data(base.buf), kvt_buf_size(base.buf), rng);
    /* permute axes */
    if (xs64(rng) % 2) {
        for (int i = rank - 1; i > 0; i--) {
            int j = (int)(xs64(rng) % (uint64_t)(i + 1));
            int64_t s = base.shape[i], st = base.strides[i];
            base.shape[i] = base.shape[j];
            base.strides[i] = base.strides[j];
            base.shape[j] = s;
            base.strides[j] = st;
        }
    }
    /* slice a few axes */
    for (int k = 0; k < 2; k++) {
        int axis = (int)(xs64(rng) % (uint64_t)rank);
        int64_t n = base.shape[axis];
        int64_t a = (int64_t)(xs64(rng) % (uint64_t)(n + 1));
        int64_t b = a + (int64_t)(xs64(rng) % (uint64_t)(n - a + 1));
        if (b == a && xs64(rng) % 4)
            b = n, a = 0; /* mostly keep views non-empty */
        assert_int_equal(kvt_tensor_slice(&base, &base, axis, a, b), 0);
    }
    *t = base;
}

static void test_strided_copies_vs_naive(void **state)
{
    (void)state;
    uint64_t rng = 0x1234567;
    for (int iter = 0; iter < 400; iter++) {
        struct kvt_tensor t;
        random_view(&rng, &t);
        assert_int_equal(kvt_tensor_check(&t), 0);
        size_t nb = kvt_tensor_nbytes(&t);
        uint8_t *want = naive_copy_out(&t);
        uint8_t *got = malloc(nb + 1);
        kvt_tensor_copy_out(&t, got);
        assert_memory_equal(got, want, nb);

        struct gather g = {malloc(nb + 1), 0, 0, 0};
        assert_int_equal(kvt_tensor_for_each_run(&t, gather_run, &g), 0);
        assert_int_equal(g.n, nb);
        assert_memory_equal(g.p, want, nb);
        assert_int_equal(g.max_run, kvt_tensor_run_bytes(&t));
        if (kvt_tensor_is_contiguous(&t) && nb)
            assert_int_equal(g.runs, 1);
        assert_int_equal(kvt_tensor_hash(&t), kvt_wyhash(0, want, nb));

        struct kvt_tensor c;
        assert_int_equal(kvt_tensor_contiguous(&c, &t), 0);
        assert_true(kvt_tensor_is_contiguous(&c));
        assert_int_equal(kvt_tensor_nbytes(&c), nb);
        assert_memory_equal(kvt_buf_data(c.buf), want, nb);

        /* scatter fresh bytes into the view, read them back through the naive walk */
        uint8_t *fresh = malloc(nb + 1);
        fill_random(fresh, nb, &rng);
        struct scatter s = {fresh, 0};
        assert_int_equal(kvt_tensor_for_each_run_mut(&t, scatter_run, &s), 0);
        free(want);
        want = naive_copy_out(&t);
        assert_memory_equal(want, fresh, nb);
        kvt_tensor_copy_in(&t, kvt_buf_data(c.buf)); /* and restore the old bytes */
        free(want);
        want = naive_copy_out(&t);
        assert_memory_equal(want, kvt_buf_data(c.buf), nb);

        /* view-to-view: copy the strided view into a permuted view of a new buffer */
        struct kvt_tensor d;
        int64_t tshape[KVT_MAX_RANK];
        for (int i = 0; i < t.rank; i++)
            tshape[i] = t.shape[t.rank - 1 - i];
        assert_int_equal(kvt_tensor_zeros(&d, t.dtype, t.rank, tshape), 0);
        for (int i = 0; i < t.rank / 2; i++) { /* d becomes a transposed view */
            int j = t.rank - 1 - i;
            int64_t sh = d.shape[i], st = d.strides[i];
            d.shape[i] = d.shape[j];
            d.strides[i] = d.strides[j];
            d.shape[j] = sh;
            d.strides[j] = st;
        }
        assert_int_equal(kvt_tensor_copy(&d, &t), 0);
        uint8_t *dd = naive_copy_out(&d);
        assert_memory_equal(dd, want, nb);
        free(dd);

        if (g.runs >= 2) {
            int calls = 0;
            assert_int_equal(kvt_tensor_for_each_run(&t, stop_at_second, &calls), 42);
            assert_int_equal(calls, 2);
        }
        kvt_tensor_release(&d);
        kvt_tensor_release(&c);
        kvt_tensor_release(&t);
        free(fresh);
        free(g.p);
        free(got);
        free(want);
    }
}

static void test_slice_rows_runs(void **state)
{
    (void)state;
    /* [B,H,cap,D] sliced to [0, off) on axis 2 gives B·H runs of off·D·item bytes */
    int64_t shape[4] = {2, 3, 256, 8};
    struct kvt_tensor full, s;
    assert_int_equal(kvt_tensor_zeros(&full, KVT_BFLOAT16, 4, shape), 0);
    uint64_t rng = 99;
    fill_random(kvt_buf_data(full.buf), kvt_buf_size(full.buf), &rng);
    assert_int_equal(kvt_tensor_slice(&s, &full, 2, 0, 100), 0);
    assert_int_equal(kvt_buf_refcount(full.buf), 2);
    assert_false(kvt_tensor_is_contiguous(&s));
    assert_int_equal(s.shape[2], 100);
    assert_int_equal(kvt_tensor_nbytes(&s), 2 * 3 * 100 * 8 * 2);
    struct gather g = {malloc(kvt_tensor_nbytes(&s)), 0, 0, 0};
    assert_int_equal(kvt_tensor_for_each_run(&s, gather_run, &g), 0);
    assert_int_equal(g.runs, 6);
    assert_int_equal(g.max_run, 100 * 8 * 2);
    /* each run is one (b, h) block of rows [0, 100) */
    const uint8_t *base = kvt_buf_data(full.buf);
    for (int bh = 0; bh < 6; bh++)
        assert_memory_equal(g.p + (size_t)bh * 1600, base + (size_t)bh * 256 * 16, 1600);
    free(g.p);

    /* slicing the middle of a contiguous 1-axis split keeps it contiguous */
    struct kvt_tensor m;
    assert_int_equal(kvt_tensor_slice(&m, &full, 0, 1, 2), 0);
    assert_true(kvt_tensor_is_contiguous(&m));
    assert_int_equal(m.offset, 3 * 256 * 8 * 2);
    kvt_tensor_release(&m);
    /* empty slice at the end */
    assert_int_equal(kvt_tensor_slice(&m, &full, 2, 256, 256), 0);
    assert_int_equal(kvt_tensor_nbytes(&m), 0);
    assert_int_equal(kvt_tensor_check(&m), 0);
    assert_int_equal(kvt_tensor_run_bytes(&m), 0);
    kvt_tensor_release(&m);
    /* bad arguments */
    assert_int_equal(kvt_tensor_slice(&m, &full, 4, 0, 1), -EINVAL);
    assert_null(m.buf);
    assert_int_equal(kvt_tensor_slice(&m, &full, 2, 10, 5), -EINVAL);
    assert_int_equal(kvt_tensor_slice(&m, &full, 2, 0, 257), -EINVAL);
    assert_int_equal(kvt_tensor_slice(&m, &full, 2, -1, 5), -EINVAL);
    assert_int_equal(kvt_buf_refcount(full.buf), 2);
    /* copy with mismatched shapes */
    assert_int_equal(kvt_tensor_copy(&s, &full), -EINVAL);
    kvt_tensor_release(&s);
    kvt_tensor_release(&full);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_buf_new_zeroed_aligned),
        cmocka_unit_test(test_buf_large_huge_pages),
        cmocka_unit_test(test_buf_cache),
        cmocka_unit_test(test_buf_small_tail),
        cmocka_unit_test(test_buf_for_fill),
        cmocka_unit_test(test_buf_cache_threads),
        cmocka_unit_test(test_buf_cache_fork),
        cmocka_unit_test(test_buf_wrap_release_once),
        cmocka_unit_test(test_buf_new_enomem),
        cmocka_unit_test(test_buf_refcount_threads),
        cmocka_unit_test(test_tensor_init_bounds),
        cmocka_unit_test(test_strided_copies_vs_naive),
        cmocka_unit_test(test_slice_rows_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
