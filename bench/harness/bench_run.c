/*
 * The `kvtier bench` run: save and restore throughput of model-shaped entries against the
 * device limits measured in the same run on the same directory (raw writes and reads of the
 * same bytes into buffers allocated the same way, memcpy), the cost of the hash check, peak
 * RSS against the entry size, and optionally the numpy peer. Figures are taken in this
 * process, as a long-running server would see them; peak RSS is taken in a fresh forked child
 * per repetition (which also gives the first-restore-after-a-restart figure). The command
 * (tools/cmd_bench.c) only parses the options.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "bench.h"

/* Paths and state shared by the measurements of one size. */
struct bench_ctx {
    const struct bench_opts *o;
    char work[4096];
    char kvt_path[4200], raw_path[4200];
    struct kvt_entry *e;
    struct bench_layout lay;
    void *hot; /* a prefaulted buffer of the file's size, for the prefaulted limits */
    bool tty;
};

static void progress(const struct bench_ctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void progress(const struct bench_ctx *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (c->tty)
        fputs("\r\033[K", stderr);
    fputs("bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(c->tty ? "" : "\n", stderr);
    fflush(stderr);
    va_end(ap);
}

static int child(bench_child_fn fn, const struct bench_kvt_job *j, double *secs, double *rss,
                 uint64_t *value, const char *what)
{
    struct bench_child_result r;
    int rc = bench_in_child(fn, (void *)j, &r);
    if (rc == 0 && r.rc < 0) {
        fprintf(stderr, "\nkvtier bench: %s: %s\n", what, r.msg[0] ? r.msg : kvt_strerror(r.rc));
        return r.rc;
    }
    if (rc < 0) {
        fprintf(stderr, "\nkvtier bench: %s: %s\n", what, strerror(-rc));
        return rc;
    }
    *secs = r.secs;
    if (rss)
        *rss = (double)r.peak_extra;
    if (value)
        *value = r.value;
    return 0;
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "\nkvtier bench: %s: %s\n", what,
            rc <= -1000 || kvt_last_error()[0] ? kvt_last_error() : strerror(-rc));
    return rc;
}

/*
 * One measured step. Within a repetition the steps of a phase run in an order rotated by the
 * repetition number, so that no figure always runs first (right after a page-cache drop) or
 * last (on memory the previous step just freed).
 */
typedef int (*step_fn)(struct bench_ctx *c, struct bench_row *row, int i);

/* Bring the file and the memory to the state a step starts from. */
static int prepare_step(struct bench_ctx *c, const struct bench_row *row, bool level, bool warm)
{
    /* the host may page idle page cache out within seconds: warm again, before leveling
     * (warming a file that is not cached takes memory, which would then be missing) */
    int rc = warm ? bench_make_warm(c->kvt_path) : 0;
    if (rc < 0)
        return fail("warming the page cache", rc);
    if (level)
        bench_level_memory(row->restored_bytes);
    return 0;
}

static int run_rotated(struct bench_ctx *c, struct bench_row *row, int i, const step_fn *steps,
                       int n, bool level, bool warm)
{
    for (int k = 0; k < n; k++) {
        int rc = prepare_step(c, row, level, warm);
        if (rc == 0)
            rc = steps[(k + i) % n](c, row, i);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int kvt_save_step(struct bench_ctx *c, struct bench_row *row, int i)
{
    struct bench_kvt_job job = {.path = c->kvt_path, .e = c->e};
    uint64_t bytes;
    unlink(c->kvt_path);
    int rc = bench_settle_disk(c->work);
    if (rc == 0)
        rc = bench_kvt_save(&job, &row->secs[BF_SAVE][i], &bytes);
    return rc < 0 ? fail("save", rc) : 0;
}

static int raw_write_step(struct bench_ctx *c, struct bench_row *row, int i, bool direct)
{
    double *secs = &row->secs[direct ? BF_RAW_WRITE_DIRECT : BF_RAW_WRITE][i];
    unlink(c->raw_path);
    int rc = bench_settle_disk(c->work);
    if (rc == 0)
        rc = bench_raw_write(c->raw_path, c->lay.spans, c->lay.n_spans, c->lay.file_bytes, direct,
                             secs);
    /* the file stays until the next write step deletes it, as the entry's does: every write
     * then starts right after the deletion of a file of the same size (what was freed just
     * before a write changes its speed; docs/PERFORMANCE.md, What is measured) */
    if (rc == 0)
        rc = bench_make_cold(c->raw_path);
    if (rc == -EINVAL && direct) { /* no O_DIRECT here: the buffered figure stands */
        *secs = 0;
        return 0;
    }
    return rc < 0 ? fail("raw write", rc) : 0;
}

static int raw_write_buffered_step(struct bench_ctx *c, struct bench_row *row, int i)
{
    return raw_write_step(c, row, i, false);
}

static int raw_write_direct_step(struct bench_ctx *c, struct bench_row *row, int i)
{
    return raw_write_step(c, row, i, true);
}

static int kvt_load_step(struct bench_ctx *c, double *secs, bool verify, bool warm)
{
    struct bench_kvt_job job = {.path = c->kvt_path, .verify = verify, .keep_cache = warm};
    uint64_t bytes;
    int rc = warm ? 0 : bench_make_cold(c->kvt_path);
    if (rc == 0)
        rc = bench_kvt_load(&job, secs, &bytes);
    return rc < 0 ? fail(warm ? "warm restore" : "cold restore", rc) : 0;
}

/*
 * A restore with the hash check and one without, back to back (the cost of the check is
 * their ratio, so nothing else runs between them), in alternating order from one repetition
 * to the next so that a drift in the machine's speed cancels over two repetitions.
 */
static int kvt_load_pair(struct bench_ctx *c, struct bench_row *row, int i, bool warm)
{
    enum bench_fig with = warm ? BF_WARM : BF_COLD;
    enum bench_fig without = warm ? BF_WARM_NOVERIFY : BF_COLD_NOVERIFY;
    for (int k = 0; k < 2; k++) {
        bool verify = (k + i) % 2 == 0;
        int rc = k == 0 ? 0 : prepare_step(c, row, true, warm);
        if (rc == 0)
            rc = kvt_load_step(c, &row->secs[verify ? with : without][i], verify, warm);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int cold_pair_step(struct bench_ctx *c, struct bench_row *row, int i)
{
    return kvt_load_pair(c, row, i, false);
}

static int warm_pair_step(struct bench_ctx *c, struct bench_row *row, int i)
{
    return kvt_load_pair(c, row, i, true);
}

/*
 * Fresh buffers, one per tensor (and one for the header block), mapped the way a restore's
 * tensors are on a first restore (page aligned, huge pages from 2 MiB on), each with room for
 * its length rounded up to the direct-I/O granule. Mapped here, not taken from the library,
 * whose buffer cache would hand out memory the process holds.
 */
static void **fresh_buffers(const struct bench_layout *l)
{
    void **b = calloc(l->n_spans, sizeof(*b));
    for (size_t k = 0; b && k < l->n_spans; k++) {
        if (!(b[k] = bench_map(bench_round_up(l->spans[k].len), false))) {
            while (k-- > 0)
                bench_unmap(b[k], bench_round_up(l->spans[k].len));
            free(b);
            return NULL;
        }
    }
    return b;
}

static void free_buffers(const struct bench_layout *l, void **b)
{
    for (size_t k = 0; b && k < l->n_spans; k++)
        bench_unmap(b[k], bench_round_up(l->spans[k].len));
    free(b);
}

static int raw_read_step(struct bench_ctx *c, struct bench_row *row, int i, bool prefaulted)
{
    size_t n = c->lay.n_spans;
    struct bench_span *s = calloc(n, sizeof(*s));
    void **fresh = NULL;
    int rc = bench_make_cold(c->kvt_path);
    if (rc < 0) {
        free(s);
        return fail("dropping the page cache", rc);
    }
    double t0 = bench_now();
    if (!prefaulted)
        fresh = fresh_buffers(&c->lay);
    if (!s || (!prefaulted && !fresh)) {
        free(s);
        free_buffers(&c->lay, fresh);
        return fail("raw read", -ENOMEM);
    }
    for (size_t k = 0; k < n; k++)
        s[k] = (struct bench_span){prefaulted ? (char *)c->hot + c->lay.spans[k].off : fresh[k],
                                   c->lay.spans[k].off, c->lay.spans[k].len};
    double io;
    rc = bench_raw_read(c->kvt_path, s, n, &io, &row->direct_read);
    row->secs[prefaulted ? BF_RAW_READ_HOT : BF_RAW_READ][i] = bench_now() - t0;
    free(s);
    free_buffers(&c->lay, fresh);
    return rc < 0 ? fail("raw read", rc) : 0;
}

static int raw_read_fresh_step(struct bench_ctx *c, struct bench_row *row, int i)
{
    return raw_read_step(c, row, i, false);
}

static int raw_read_hot_step(struct bench_ctx *c, struct bench_row *row, int i)
{
    return raw_read_step(c, row, i, true);
}

static int memcpy_step(struct bench_ctx *c, struct bench_row *row, int i, bool prefaulted)
{
    const struct bench_layout *l = &c->lay;
    double t0 = bench_now();
    if (prefaulted) {
        for (size_t k = 0; k < l->n_spans; k++)
            memcpy((char *)c->hot + l->spans[k].off, l->spans[k].data, l->spans[k].len);
        row->secs[BF_MEMCPY_HOT][i] = bench_now() - t0;
        return 0;
    }
    void **dst = fresh_buffers(l);
    for (size_t k = 0; dst && k < l->n_spans; k++)
        memcpy(dst[k], l->spans[k].data, l->spans[k].len);
    row->secs[BF_MEMCPY][i] = bench_now() - t0;
    free_buffers(l, dst);
    return dst ? 0 : fail("memcpy", -ENOMEM);
}

static int memcpy_fresh_step(struct bench_ctx *c, struct bench_row *row, int i)
{
    return memcpy_step(c, row, i, false);
}

static int memcpy_hot_step(struct bench_ctx *c, struct bench_row *row, int i)
{
    return memcpy_step(c, row, i, true);
}

/* Peak RSS of a save and of a cold restore, each in a fresh child. */
static int measure_rss(struct bench_ctx *c, struct bench_row *row, int i)
{
    struct bench_kvt_job save = {.path = c->kvt_path, .e = c->e};
    struct bench_kvt_job load = {.path = c->kvt_path, .verify = true};
    double secs;
    unlink(c->kvt_path);
    int rc = child(bench_kvt_save, &save, &secs, &row->rss_save[i], NULL, "save");
    if (rc == 0)
        rc = bench_make_cold(c->kvt_path);
    bench_level_memory(row->restored_bytes);
    if (rc == 0)
        rc = child(bench_kvt_load, &load, &row->secs[BF_COLD_CHILD][i], &row->rss_restore[i], NULL,
                   "cold restore");
    return rc;
}

static const step_fn save_steps[] = {kvt_save_step, raw_write_buffered_step, raw_write_direct_step};
static const step_fn cold_steps[] = {cold_pair_step, raw_read_fresh_step, raw_read_hot_step};
static const step_fn warm_steps[] = {warm_pair_step, memcpy_fresh_step, memcpy_hot_step};

/* Build the entry, save it once, check that a restore gives back the same bytes. */
static int prepare(struct bench_ctx *c, struct bench_row *row, const struct bench_model *m)
{
    struct kvt_entry *back = NULL;
    uint64_t h0, h1;
    progress(c, "%llu MiB: building a %zu-token entry",
             (unsigned long long)(row->target_bytes >> 20), row->tokens);
    int rc = bench_entry_build(m, NULL, row->tokens, 0, row->target_bytes, &c->e);
    if (rc < 0)
        return fail("building the entry", rc);
    row->entry_bytes = kvt_entry_bytes(c->e);
    struct kvt_save_opts so = {.created_at = 1767225600000};
    rc = kvt_file_save(c->kvt_path, c->e, &so, &row->file_bytes);
    if (rc < 0)
        return fail("save", rc);
    rc = bench_layout_build(c->e, c->kvt_path, &c->lay);
    if (rc < 0)
        return fail("reading the saved layout", rc);
    rc = kvt_file_load(c->kvt_path, NULL, &back, NULL);
    if (rc < 0)
        return fail("restore", rc);
    row->restored_bytes = kvt_entry_bytes(back);
    rc = bench_entry_state_hash(c->e, &h0);
    if (rc == 0)
        rc = bench_entry_state_hash(back, &h1);
    kvt_entry_free(back);
    if (rc < 0)
        return fail("hashing state", rc);
    if (h0 != h1) {
        fprintf(stderr, "\nkvtier bench: the restored entry differs from the saved one\n");
        return KVT_E_CORRUPT;
    }
    c->hot = bench_map(row->file_bytes, true);
    return c->hot ? 0 : fail("mapping the prefaulted buffer", -ENOMEM);
}

static void release(struct bench_ctx *c, uint64_t file_bytes)
{
    kvt_entry_free(c->e);
    c->e = NULL;
    bench_layout_free(&c->lay);
    bench_unmap(c->hot, file_bytes);
    c->hot = NULL;
    unlink(c->kvt_path);
    unlink(c->raw_path);
}

/* The numpy peer's repetition @p i; a failure drops the peer for this size, not the run. */
static void peer_step(struct bench_ctx *c, struct bench_row *row, const char *script, int i)
{
    int rc = bench_peer_step(c->o->python, script, c->kvt_path, c->work, i, &row->peer);
    if (rc != 0) {
        row->peer.failed = true;
        fprintf(stderr, "\nkvtier bench: the numpy peer failed (%s %s): %s\n", c->o->python, script,
                rc == -ECHILD ? "exit status" : strerror(-rc));
    }
}

static int run_size(struct bench_ctx *c, struct bench_row *row, const struct bench_model *m,
                    char *peer_script)
{
    int rc = prepare(c, row, m);
    for (int i = 0; rc == 0 && i < c->o->repeat; i++) {
        unsigned long long mib = (unsigned long long)(row->target_bytes >> 20);
        progress(c, "%llu MiB: repetition %d/%d: save", mib, i + 1, c->o->repeat);
        rc = run_rotated(c, row, i, save_steps, 3, false, false);
        if (rc == 0) {
            progress(c, "%llu MiB: repetition %d/%d: cold restore", mib, i + 1, c->o->repeat);
            rc = run_rotated(c, row, i, cold_steps, 3, true, false);
        }
        if (rc == 0) {
            progress(c, "%llu MiB: repetition %d/%d: warm restore", mib, i + 1, c->o->repeat);
            rc = run_rotated(c, row, i, warm_steps, 3, true, true);
        }
        if (rc == 0) {
            progress(c, "%llu MiB: repetition %d/%d: peak RSS", mib, i + 1, c->o->repeat);
            rc = measure_rss(c, row, i);
        }
        if (rc == 0 && c->o->peers && !row->peer.failed) {
            progress(c, "%llu MiB: repetition %d/%d: numpy peer", mib, i + 1, c->o->repeat);
            peer_step(c, row, peer_script, i);
        }
        if (rc == 0)
            row->n = i + 1;
    }
    release(c, row->file_bytes);
    return rc;
}

static int check_space(const char *dir, const struct bench_opts *o)
{
    struct statvfs sv;
    uint64_t biggest = 0;
    for (size_t i = 0; i < o->n_sizes; i++)
        biggest = o->sizes[i] > biggest ? o->sizes[i] : biggest;
    if (statvfs(dir, &sv) != 0)
        return -errno;
    /* the entry file, the raw file, the numpy file (and the .tmp while a save runs) */
    uint64_t need = biggest * (o->peers ? 3 : 2) + (64ull << 20);
    if ((uint64_t)sv.f_bavail * sv.f_frsize < need) {
        fprintf(stderr, "kvtier bench: %s: needs %llu MiB free\n", dir,
                (unsigned long long)(need >> 20));
        return -ENOSPC;
    }
    return 0;
}

/* The table (stdout, or stderr when the JSON goes to stdout), the JSON and the plot. */
static int report(const struct bench_opts *o, const struct bench_run_info *ri,
                  const struct bench_row *rows, size_t n)
{
    int rc = 0;
    bool json_stdout = o->json_path && !strcmp(o->json_path, "-");
    bench_print_table(json_stdout ? stderr : stdout, ri, rows, n);
    if (o->json_path) {
        FILE *jf = json_stdout ? stdout : fopen(o->json_path, "w");
        if (!jf) {
            fprintf(stderr, "kvtier bench: %s: %s\n", o->json_path, strerror(errno));
            rc = -1;
        } else {
            bench_print_json(jf, ri, rows, n);
            if (!json_stdout && fclose(jf) != 0)
                rc = -1;
        }
    }
    if (o->plot_path) {
        int prc = bench_plot(o->plot_path, rows, n);
        if (prc == -ENOENT)
            fprintf(stderr, "kvtier bench: gnuplot not found (install gnuplot-nox, e.g. "
                            "KVT_DEPS_EXTRA=gnuplot-nox scripts/deps.sh as root)\n");
        else if (prc < 0)
            fprintf(stderr, "kvtier bench: plotting %s failed\n", o->plot_path);
        if (prc < 0)
            rc = -1;
    }
    return rc;
}

int bench_run(const struct bench_opts *o)
{
    struct bench_ctx c = {.o = o, .tty = isatty(STDERR_FILENO) == 1};
    const struct bench_model *m = &bench_llama3_8b;
    struct bench_row *rows = NULL;
    char *peer_script = NULL;
    int rc;
    if (o->peers && !(peer_script = bench_peer_script(o->peer_script))) {
        fprintf(stderr, "kvtier bench: numpy_peer.py not found (use --peer-script)\n");
        return -1;
    }
    snprintf(c.work, sizeof(c.work), "%s/kvtier-bench.%ld", o->dir, (long)getpid());
    snprintf(c.kvt_path, sizeof(c.kvt_path), "%s/entry.mlxkv", c.work);
    snprintf(c.raw_path, sizeof(c.raw_path), "%s/raw.bin", c.work);
    if (mkdir(o->dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "kvtier bench: %s: %s\n", o->dir, strerror(errno));
        free(peer_script);
        return -1;
    }
    if (check_space(o->dir, o) < 0 || mkdir(c.work, 0755) != 0) {
        if (errno == EEXIST || errno == EACCES)
            fprintf(stderr, "kvtier bench: %s: %s\n", c.work, strerror(errno));
        free(peer_script);
        return -1;
    }
    rows = calloc(o->n_sizes, sizeof(*rows));
    double t0 = bench_now();
    size_t done = 0;
    for (; rows && done < o->n_sizes; done++) {
        struct bench_row *row = &rows[done];
        row->target_bytes = o->sizes[done];
        row->tokens = (size_t)(o->sizes[done] / bench_token_bytes(m));
        if (row->tokens == 0)
            row->tokens = 1;
        if (run_size(&c, row, m, peer_script) < 0)
            break;
    }
    if (c.tty)
        fputs("\r\033[K", stderr);
    rmdir(c.work);
    rc = rows && done == o->n_sizes ? 0 : -1;
    struct bench_run_info ri = {
        .dir = o->dir, .model = m, .repeat = o->repeat, .wall_s = bench_now() - t0};
    if (rc == 0)
        rc = report(o, &ri, rows, done);
    free(rows);
    free(peer_script);
    return rc;
}
