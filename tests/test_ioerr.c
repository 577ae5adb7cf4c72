/*
 * I/O-error loops in the manner of SQLite's: for N = 1, 2, ... fail the Nth I/O call of one
 * kind (open, pwrite as EIO, ENOSPC, a disk that stays full, a short write or EINTR, fsync,
 * directory fsync, rename, unlink, pread as EIO, short or EINTR, ftruncate, fstat, mkdir,
 * flock, fadvise, stat, utimes, listdir, or the Nth call of any kind), through the
 * fault-injecting io backend — once over the plain path and once over the fast one (O_DIRECT
 * descriptors, the io_uring or thread queue, whose requests fail like preads and pwrites) —
 * while one operation runs: kvt_file_save, kvt_store_put, kvt_store_restore or kvt_store_open (with
 * recovery work to do). The loop ends at the first N that no call reaches.
 *
 * After every attempt: the store reopens cleanly; every entry committed before restores
 * byte-identically; the new entry exists exactly when the operation reported success (or, for
 * a save, when only the directory fsync after the rename failed, as kvt_file_save documents);
 * no .tmp remains unless the cleanup unlink was itself failed, and then the next open reaps it
 * (tmp_grace_ms 0); no descriptor is leaked. Memory leaks are left to LeakSanitizer (the
 * address,undefined build runs this suite). A loop in which no fault was injected, or none made
 * the operation fail, fails: it would have checked nothing.
 */
#include "support/support.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/io_fault.h"
#include "progs/crash_entry.h"

#define MAX_N 4000

/* ---- the fault kinds ------------------------------------------------------------------ */

struct fault {
    const char *name;
    enum kvt_fault_op op;
    int err;                  /* injected errno (0: short transfer instead) */
    size_t short_max;         /* short transfer: at most this many bytes */
    bool sticky;              /* every later matching call fails too */
    bool fail_cleanup_unlink; /* also fail the first unlink after the fault */
    bool must_succeed;        /* the operation absorbs this fault (retry) */
};

static const struct fault FAULTS[] = {
    {"open", KVT_FAULT_OPEN, EIO, 0, false, false, false},
    {"open-emfile", KVT_FAULT_OPEN, EMFILE, 0, false, false, false},
    {"pwrite-eio", KVT_FAULT_PWRITE, EIO, 0, false, false, false},
    {"pwrite-enospc", KVT_FAULT_PWRITE, ENOSPC, 0, false, false, false},
    {"pwrite-enospc-sticky", KVT_FAULT_PWRITE, ENOSPC, 0, true, false, false},
    {"pwrite-short", KVT_FAULT_PWRITE, 0, 7, false, false, true},
    {"pwrite-eintr", KVT_FAULT_PWRITE, EINTR, 0, false, false, true},
    {"fsync", KVT_FAULT_FSYNC, EIO, 0, false, false, false},
    {"dir-fsync", KVT_FAULT_DIR_FSYNC, EIO, 0, false, false, false},
    {"rename", KVT_FAULT_RENAME, EIO, 0, false, false, false},
    {"unlink", KVT_FAULT_UNLINK, EIO, 0, false, false, false},
    {"pread-eio", KVT_FAULT_PREAD, EIO, 0, false, false, false},
    {"pread-short", KVT_FAULT_PREAD, 0, 5, false, false, true},
    {"pread-eintr", KVT_FAULT_PREAD, EINTR, 0, false, false, true},
    {"ftruncate", KVT_FAULT_FTRUNCATE, EIO, 0, false, false, false},
    {"fallocate", KVT_FAULT_FALLOCATE, ENOSPC, 0, false, false, false},
    {"fstat", KVT_FAULT_FSTAT, EIO, 0, false, false, false},
    {"mkdir", KVT_FAULT_MKDIR, EIO, 0, false, false, false},
    {"flock", KVT_FAULT_FLOCK, EWOULDBLOCK, 0, false, false, false},
    {"fadvise", KVT_FAULT_FADVISE, EIO, 0, false, false, false},
    {"stat", KVT_FAULT_STAT, EIO, 0, false, false, false},
    {"utimes", KVT_FAULT_UTIMES, EIO, 0, false, false, false},
    {"listdir", KVT_FAULT_LISTDIR, EIO, 0, false, false, false},
    {"any-eio", KVT_FAULT_ANY, EIO, 0, false, false, false},
    {"pwrite+cleanup-unlink", KVT_FAULT_PWRITE, EIO, 0, false, true, false},
    {"fsync+cleanup-unlink", KVT_FAULT_FSYNC, EIO, 0, false, true, false},
};
#define N_FAULTS (sizeof(FAULTS) / sizeof(FAULTS[0]))

/* What the hook injected during one attempt. */
struct shot {
    const struct fault *f;
    uint64_t nth, seen;
    int fired;           /* failures injected by the hook */
    bool renamed;        /* a rename went through */
    bool after_rename;   /* the first failure came after a rename went through */
    bool cleanup_failed; /* the cleanup unlink was failed */
};

static int hook(void *ud, enum kvt_fault_op op, uint64_t count, const char *path)
{
    struct shot *s = ud;
    (void)count;
    (void)path;
    int err = 0;
    if (op == KVT_FAULT_CLOSE)
        return 0;
    if (s->f->fail_cleanup_unlink && s->fired && !s->cleanup_failed && op == KVT_FAULT_UNLINK) {
        s->cleanup_failed = true;
        return EIO;
    }
    if (s->f->err != 0 && (s->f->op == KVT_FAULT_ANY || s->f->op == op)) {
        s->seen++;
        if (s->seen == s->nth || (s->f->sticky && s->seen > s->nth)) {
            if (!s->fired)
                s->after_rename = s->renamed;
            s->fired++;
            err = s->f->err;
        }
    }
    /* the real call runs after the hook; an uninjected rename succeeds in these tests */
    if (!err && op == KVT_FAULT_RENAME)
        s->renamed = true;
    return err;
}

/* The path the streams take under the fault backend: kvt_io_fault() (plain) or
 * kvt_io_fault_fast() (O_DIRECT and the asynchronous queue); every loop runs over both. */
static const struct kvt_io *backend;
static uint64_t injected_sync, injected_async; /* of the loop running now */

/* Install the fault backend with the Nth call of @p f armed. */
static void arm(struct shot *s, const struct fault *f, uint64_t nth)
{
    memset(s, 0, sizeof(*s));
    s->f = f;
    s->nth = nth;
    kvt_fault_reset();
    if (f->err == 0) {
        struct kvt_fault_rule r = {.op = f->op, .nth = nth, .short_max = f->short_max};
        assert_int_equal(kvt_fault_arm(&r), 0);
    }
    kvt_fault_set_hook(hook, s);
    kvt_io_set(backend);
}

/* Back to the POSIX backend; @return whether anything was injected. */
static bool disarm(struct shot *s)
{
    (void)s;
    uint64_t async = kvt_fault_injected_async();
    bool hit = kvt_fault_injected() > 0;
    injected_sync += kvt_fault_injected() - async;
    injected_async += async;
    kvt_io_set(NULL);
    kvt_fault_reset();
    return hit;
}

/* ---- directories ---------------------------------------------------------------------- */

static char *tmpl; /* a store with the committed entries, copied for every attempt */
static const uint32_t COMMITTED[] = {1, 2, 3}; /* six kinds, trimmable, another namespace */
#define N_COMMITTED (sizeof(COMMITTED) / sizeof(COMMITTED[0]))
#define NEW_ID 101         /* the entry a put writes (six kinds), in a namespace of its own */
#define NEW_NS "ioerr-new" /* not in the template: the put creates its directory */
#define SAVE_ID 100        /* the entry kvt_file_save writes (plus a zero-byte last layer) */
#define AFTER_ID 104       /* a put after a failed one: the store stays usable */

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

static struct kvt_store_opts store_opts(void)
{
    struct kvt_store_opts o;
    store_opts_for(&o, SYNTH_MODEL, SYNTH_FP, SYNTH_TOK);
    o.tmp_grace_ms = 0;
    return o;
}

static kvt_store *open_clean(const char *dir)
{
    struct kvt_store_opts o = store_opts();
    kvt_store *s;
    if (kvt_store_open(dir, &o, &s) != 0)
        fail_msg("clean reopen of %s: %s", dir, kvt_last_error());
    return s;
}

/* Copy every file of the two-level tree @p from/<ns>/<file> to @p to. */
static void copy_tree(const char *from, const char *to)
{
    assert_int_equal(mkdir(to, 0755), 0);
    DIR *d = opendir(from);
    assert_non_null(d);
    struct dirent *ns;
    while ((ns = readdir(d))) {
        if (ns->d_name[0] == '.')
            continue;
        char *src = strf("%s/%s", from, ns->d_name), *dst = strf("%s/%s", to, ns->d_name);
        assert_int_equal(mkdir(dst, 0755), 0);
        DIR *e = opendir(src);
        assert_non_null(e);
        struct dirent *f;
        while ((f = readdir(e))) {
            if (f->d_name[0] == '.')
                continue;
            char *a = strf("%s/%s", src, f->d_name), *b = strf("%s/%s", dst, f->d_name);
            size_t n;
            uint8_t *data = read_file(a, &n);
            assert_non_null(data);
            assert_int_equal(write_file(b, data, n), 0);
            free(data);
            free(a);
            free(b);
        }
        closedir(e);
        free(src);
        free(dst);
    }
    closedir(d);
}

/* Files under <dir>/<fp>/<ns>/ whose names end in @p suffix. */
static int count_files(const char *dir, const char *suffix)
{
    char *root = strf("%s/%s", dir, SYNTH_FP);
    int count = 0;
    DIR *d = opendir(root);
    struct dirent *ns;
    while (d && (ns = readdir(d))) {
        if (ns->d_name[0] == '.')
            continue;
        char *sub = strf("%s/%s", root, ns->d_name);
        DIR *e = opendir(sub);
        struct dirent *f;
        while (e && (f = readdir(e))) {
            size_t len = strlen(f->d_name), sl = strlen(suffix);
            count += len > sl && strcmp(f->d_name + len - sl, suffix) == 0;
        }
        if (e)
            closedir(e);
        free(sub);
    }
    if (d)
        closedir(d);
    free(root);
    return count;
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Find entry @p id in @p s; 0 on a miss, else its restore compared with the synthetic one. */
static bool has_entry(kvt_store *s, const struct kvt_entry *want, const char *ns)
{
    int32_t prompt[70];
    memcpy(prompt, want->tokens, want->n_tokens * sizeof(*prompt));
    prompt[want->n_tokens] = 7;
    struct kvt_hit hit;
    assert_int_equal(kvt_store_find(s, prompt, want->n_tokens + 1, ns, &hit), 0);
    if (hit.prefix_len != want->n_tokens)
        return false;
    struct kvt_entry *got = NULL;
    assert_int_equal(kvt_store_restore(s, &hit, &got), 0);
    if (!got)
        fail_msg("an indexed entry does not restore: %s", kvt_last_error());
    if (!synth_same_caches(got, want))
        fail_msg("an entry restores with different bytes");
    kvt_entry_free(got);
    return true;
}

/* The entry kvt_file_save writes: SAVE_ID's layers, then a kv layer of zero heads (0 bytes). */
static struct kvt_entry *save_entry(void)
{
    int32_t tok[64];
    size_t n = synth_tokens(SAVE_ID, tok, 64);
    kvt_cache *c[4] = {0};
    for (int i = 0; i < 3; i++)
        assert_int_equal(synth_cache(SYNTH_TRIMMABLE_KINDS[i], tok, n, i, &c[i]), 0);
    assert_int_equal(synth_cache_heads(KVT_KIND_KV, tok, n, 3, 0, &c[3]), 0);
    struct kvt_entry *e;
    assert_int_equal(kvt_entry_new(tok, n, c, 4, synth_id_ns(SAVE_ID), &e), 0);
    assert_int_equal(synth_set_meta(e), 0);
    return e;
}

/* Entry @p id as this suite stores it. */
static struct kvt_entry *entry_of(uint32_t id)
{
    if (id == SAVE_ID)
        return save_entry();
    struct kvt_entry *e;
    if (id != NEW_ID) {
        assert_int_equal(synth_id_entry(id, &e), 0);
        return e;
    }
    int32_t tok[64];
    size_t n = synth_tokens(id, tok, 64);
    assert_int_equal(synth_entry(tok, n, SYNTH_ALL_KINDS, 6, NEW_NS, &e), 0);
    return e;
}

static bool has_id(kvt_store *s, uint32_t id)
{
    struct kvt_entry *want = entry_of(id);
    bool found = has_entry(s, want, want->meta.ns);
    kvt_entry_free(want);
    return found;
}

/*
 * The state every attempt must leave: a clean open, every committed entry intact, @p new_id
 * present exactly when @p want_new, @p also (if non-zero) present, no .tmp after the open, and
 * no partial file (the scan finds nothing corrupt; recovery work planted on purpose aside).
 */
static void check_dir(const char *dir, uint32_t new_id, bool want_new, uint32_t also, bool planted)
{
    kvt_store *s = open_clean(dir);
    assert_int_equal(count_files(dir, ".tmp"), 0);
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    if (!planted && st.corrupt_files != 0)
        fail_msg("%llu corrupt file(s) left behind", (unsigned long long)st.corrupt_files);
    if (!planted && st.entries + st.skipped_files != (uint64_t)count_files(dir, ".mlxkv"))
        fail_msg("files on disk the store neither indexed nor skipped");
    for (size_t i = 0; i < N_COMMITTED; i++)
        if (!has_id(s, COMMITTED[i]))
            fail_msg("committed entry %u is gone", COMMITTED[i]);
    if (new_id && has_id(s, new_id) != want_new)
        fail_msg("entry %u is %s", new_id, want_new ? "missing" : "present after a failure");
    if (also && !has_id(s, also))
        fail_msg("entry %u (stored after the failure) is missing", also);
    kvt_store_close(s);
}

/* ---- the operations ------------------------------------------------------------------- */

struct tally {
    int attempts, failures;
};

typedef void (*attempt_fn)(const char *dir, const struct fault *f, uint64_t nth, bool *hit,
                           struct tally *t);

static void attempt_save(const char *dir, const struct fault *f, uint64_t nth, bool *hit,
                         struct tally *t)
{
    char ns[17];
    kvt_ns_hash(synth_id_ns(SAVE_ID), ns);
    char *nsdir = strf("%s/%s/%s", dir, SYNTH_FP, ns);
    mkdir(nsdir, 0755);
    char *path = strf("%s/saved.mlxkv", nsdir), *tmp = strf("%s.tmp", path);
    struct kvt_entry *e = save_entry();
    struct kvt_save_opts o = {0};
    struct shot s;
    arm(&s, f, nth);
    uint64_t bytes = 1;
    int rc = kvt_file_save(path, e, &o, &bytes);
    *hit = disarm(&s);
    kvt_entry_free(e);
    t->failures += rc != 0;
    if (f->must_succeed && rc != 0)
        fail_msg("save under %s #%llu: %s", f->name, (unsigned long long)nth, kvt_last_error());
    bool published = rc == 0 || s.after_rename;
    if (rc != 0)
        assert_int_equal(bytes, 0);
    if (exists(path) != published)
        fail_msg("save under %s #%llu (rc %d): %s %s", f->name, (unsigned long long)nth, rc, path,
                 published ? "missing" : "left behind");
    if (exists(tmp) && !s.cleanup_failed)
        fail_msg("save under %s #%llu left %s", f->name, (unsigned long long)nth, tmp);
    if (published) {
        struct kvt_expect x = {.model_id = SYNTH_MODEL};
        assert_int_equal(kvt_file_verify(path, &x), 0);
    }
    check_dir(dir, SAVE_ID, published, 0, false);
    free(path);
    free(tmp);
    free(nsdir);
}

static void attempt_put(const char *dir, const struct fault *f, uint64_t nth, bool *hit,
                        struct tally *t)
{
    kvt_store *st = open_clean(dir);
    struct kvt_entry *e = entry_of(NEW_ID);
    struct shot s;
    arm(&s, f, nth);
    int rc = kvt_store_put(st, e, NULL, NULL);
    *hit = disarm(&s);
    t->failures += rc != 0;
    if (f->must_succeed && rc != 0)
        fail_msg("put under %s #%llu: %s", f->name, (unsigned long long)nth, kvt_last_error());
    if (count_files(dir, ".tmp") != 0 && !s.cleanup_failed)
        fail_msg("put under %s #%llu left a .tmp", f->name, (unsigned long long)nth);
    /* the live store agrees with the outcome, and takes the next put */
    if (has_entry(st, e, NEW_NS) != (rc == 0))
        fail_msg("put under %s #%llu returned %d but the store says otherwise", f->name,
                 (unsigned long long)nth, rc);
    kvt_entry_free(e);
    assert_int_equal(synth_id_entry(AFTER_ID, &e), 0);
    if (kvt_store_put(st, e, NULL, NULL) != 0)
        fail_msg("put after a failed put: %s", kvt_last_error());
    kvt_entry_free(e);
    kvt_store_close(st);
    check_dir(dir, NEW_ID, rc == 0, AFTER_ID, false);
}

static void attempt_restore(const char *dir, const struct fault *f, uint64_t nth, bool *hit,
                            struct tally *t)
{
    kvt_store *st = open_clean(dir);
    struct kvt_entry *want;
    assert_int_equal(synth_id_entry(COMMITTED[0], &want), 0);
    int32_t prompt[70];
    memcpy(prompt, want->tokens, want->n_tokens * sizeof(*prompt));
    prompt[want->n_tokens] = 7;
    struct kvt_hit h;
    assert_int_equal(kvt_store_find(st, prompt, want->n_tokens + 1, "", &h), 0);
    assert_int_equal(h.prefix_len, want->n_tokens);
    struct kvt_entry *got = NULL;
    struct shot s;
    arm(&s, f, nth);
    int rc = kvt_store_restore(st, &h, &got);
    *hit = disarm(&s);
    assert_int_equal(rc, 0); /* a failed restore is a miss, never an error */
    t->failures += got == NULL;
    if (f->must_succeed && !got)
        fail_msg("restore under %s #%llu missed: %s", f->name, (unsigned long long)nth,
                 kvt_last_error());
    if (got && !synth_same_caches(got, want))
        fail_msg("restore under %s #%llu gave different bytes", f->name, (unsigned long long)nth);
    kvt_entry_free(got);
    kvt_entry_free(want);
    kvt_store_close(st);
    check_dir(dir, 0, false, 0, false); /* an I/O error never costs the file */
}

/* Recovery work for an open: an abandoned .tmp, a corrupt file, another model's file. */
static void plant(const char *dir, char **corrupt, char **foreign)
{
    char *base = strf("%s/%s/base", dir, SYNTH_FP);
    DIR *d = opendir(base);
    assert_non_null(d);
    struct dirent *f;
    char *any = NULL;
    while ((f = readdir(d)) && !any)
        if (strstr(f->d_name, ".mlxkv"))
            any = strf("%s/%s", base, f->d_name);
    closedir(d);
    assert_non_null(any);
    size_t n;
    uint8_t *data = read_file(any, &n);
    assert_non_null(data);
    char *tmp = strf("%s/abandoned.mlxkv.tmp", base);
    assert_int_equal(write_file(tmp, data, n / 2), 0);
    data[40] ^= 0x20; /* a header JSON byte: V6 at scan */
    *corrupt = strf("%s/corrupt.mlxkv", base);
    assert_int_equal(write_file(*corrupt, data, n), 0);
    free(data);
    struct kvt_entry *e;
    assert_int_equal(synth_id_entry(7, &e), 0);
    free((char *)e->meta.model_id);
    e->meta.model_id = strdup("another/model");
    *foreign = strf("%s/foreign.mlxkv", base);
    struct kvt_save_opts o = {.no_sync = true};
    assert_int_equal(kvt_file_save(*foreign, e, &o, NULL), 0);
    kvt_entry_free(e);
    free(tmp);
    free(any);
    free(base);
}

static void attempt_open(const char *dir, const struct fault *f, uint64_t nth, bool *hit,
                         struct tally *t)
{
    char *corrupt, *foreign;
    plant(dir, &corrupt, &foreign);
    struct kvt_store_opts o = store_opts();
    kvt_store *st = NULL;
    struct shot s;
    arm(&s, f, nth);
    int rc = kvt_store_open(dir, &o, &st);
    *hit = disarm(&s);
    t->failures += rc != 0;
    if (rc != 0)
        assert_null(st);
    if (f->must_succeed && rc != 0)
        fail_msg("open under %s #%llu: %s", f->name, (unsigned long long)nth, kvt_last_error());
    kvt_store_close(st);
    check_dir(dir, 0, false, 0, true);
    if (exists(corrupt))
        fail_msg("a clean open after %s #%llu kept the corrupt file", f->name,
                 (unsigned long long)nth);
    if (!exists(foreign))
        fail_msg("open under %s #%llu deleted another model's file", f->name,
                 (unsigned long long)nth);
    free(corrupt);
    free(foreign);
}

/* ---- the loop ------------------------------------------------------------------------- */

static void run_faults(const char *what, const char *path, attempt_fn fn, bool reads_only)
{
    int total = 0, failed = 0;
    injected_sync = injected_async = 0;
    for (size_t k = 0; k < N_FAULTS; k++) {
        const struct fault *f = &FAULTS[k];
        if (reads_only && f->op != KVT_FAULT_PREAD && f->op != KVT_FAULT_OPEN)
            continue;
        struct tally t = {0};
        bool hit = true;
        uint64_t nth;
        for (nth = 1; hit; nth++) {
            if (nth > MAX_N)
                fail_msg("%s under %s: still failing after %d calls", what, f->name, MAX_N);
            char *dir = scratch_dir("ioerr");
            char *root = strf("%s/%s", dir, SYNTH_FP);
            copy_tree(tmpl, root);
            free(root);
            int fds = count_fds();
            fn(dir, f, nth, &hit, &t);
            t.attempts++;
            if (count_fds() != fds)
                fail_msg("%s under %s #%llu leaked %d descriptors", what, f->name,
                         (unsigned long long)nth, count_fds() - fds);
            rm_rf(dir);
            free(dir);
        }
        print_message("ioerr %-8s %-5s %-22s %4d attempts, %4d failed\n", what, path, f->name,
                      t.attempts, t.failures);
        total += t.attempts;
        failed += t.failures;
    }
    print_message("ioerr %-8s %-5s all: %d attempts, %d reported failures, faults injected: "
                  "%llu into plain calls, %llu into asynchronous requests\n",
                  what, path, total, failed, (unsigned long long)injected_sync,
                  (unsigned long long)injected_async);
    /* a loop that injected nothing, or whose faults never made the operation fail, ran the
     * operation without faults and checked nothing */
    if (injected_sync + injected_async == 0 || failed == 0)
        fail_msg("ioerr %s %s: %llu faults injected, %d reported failures: nothing was exercised",
                 what, path, (unsigned long long)(injected_sync + injected_async), failed);
}

static void run_loop(const char *what, attempt_fn fn, bool reads_only)
{
    backend = kvt_io_fault();
    run_faults(what, "plain", fn, reads_only);
    backend = kvt_io_fault_fast();
    run_faults(what, "fast", fn, reads_only);
}

/* ---- a large load: the read ring ------------------------------------------------------- */

static void drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(fdatasync(fd), 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
}

/* An entry of about 2 MiB, big enough for the restore's read ring (small ones read plainly). */
static struct kvt_entry *large_entry(void)
{
    enum { N = 2048, HEADS = 22 }; /* 48 bytes a row and head: 2.1 MB in 44 runs */
    static int32_t tok[N];
    size_t n = N;
    for (size_t i = 0; i < n; i++)
        tok[i] = (int32_t)i + 1;
    kvt_cache *c;
    assert_int_equal(synth_cache_heads(KVT_KIND_KV, tok, n, 0, HEADS, &c), 0);
    struct kvt_entry *e;
    assert_int_equal(kvt_entry_new(tok, n, &c, 1, "", &e), 0);
    assert_int_equal(synth_set_meta(e), 0);
    return e;
}

/* Load the large file with the Nth open or read failed: the load succeeds with the same
 * bytes, or fails cleanly; the file itself is untouched either way. */
static void attempt_load(const char *dir, const struct fault *f, uint64_t nth, bool *hit,
                         struct tally *t)
{
    char *path = strf("%s/large.mlxkv", dir);
    struct kvt_entry *want = large_entry();
    assert_int_equal(kvt_file_save(path, want, NULL, NULL), 0);
    drop_cache(path); /* pages in the page cache would be copied, not read through the ring */
    struct kvt_entry *got = NULL;
    struct shot s;
    arm(&s, f, nth);
    int rc = kvt_file_load(path, NULL, &got, NULL);
    *hit = disarm(&s);
    t->failures += rc != 0;
    if (rc != 0 && (f->must_succeed || !*hit))
        fail_msg("load under %s #%llu failed: %s", f->name, (unsigned long long)nth,
                 kvt_last_error());
    if (rc == 0 && !synth_same_caches(got, want))
        fail_msg("load under %s #%llu gave different bytes", f->name, (unsigned long long)nth);
    assert_int_equal(kvt_file_verify(path, NULL), 0);
    kvt_entry_free(got);
    kvt_entry_free(want);
    free(path);
}

static void test_load_large(void **state)
{
    (void)state;
    run_loop("load", attempt_load, true);
}

static void test_save(void **state)
{
    (void)state;
    run_loop("save", attempt_save, false);
}

static void test_put(void **state)
{
    (void)state;
    run_loop("put", attempt_put, false);
}

static void test_restore(void **state)
{
    (void)state;
    run_loop("restore", attempt_restore, false);
}

static void test_open(void **state)
{
    (void)state;
    run_loop("open", attempt_open, false);
}

static int setup(void **state)
{
    (void)state;
    char *dir = scratch_dir("ioerr-template");
    if (!dir)
        return -1;
    struct kvt_store_opts o = store_opts();
    kvt_store *s;
    if (kvt_store_open(dir, &o, &s) != 0)
        return -1;
    for (size_t i = 0; i < N_COMMITTED; i++) {
        struct kvt_entry *e;
        if (synth_id_entry(COMMITTED[i], &e) != 0 || kvt_store_put(s, e, NULL, NULL) != 0)
            return -1;
        kvt_entry_free(e);
    }
    kvt_store_close(s);
    tmpl = strf("%s/%s", dir, SYNTH_FP);
    free(dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (tmpl) {
        char *dir = strdup(tmpl);
        char *slash = strrchr(dir, '/');
        *slash = '\0';
        rm_rf(dir);
        free(dir);
    }
    free(tmpl);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_save),       cmocka_unit_test(test_put),
        cmocka_unit_test(test_restore),    cmocka_unit_test(test_open),
        cmocka_unit_test(test_load_large),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
