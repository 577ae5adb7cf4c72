/*
 * The .mlxkv writer (STORE.md §5, FORMAT.md §3 and §6). `<path>.tmp` is created exclusively
 * and locked; a plan pass lays out every slot from the caches' state views without touching
 * tensor bytes; each tensor is hashed and streamed from its view (strided views run by run)
 * through the write stream (io/stream.h: staged O_DIRECT writes with several in flight where
 * the file system takes them); once every write is done the header is patched at offset 0,
 * and the file is fsynced, renamed into place and its directory fsynced. The work that reads
 * engine memory is split into N + 1 steps for N tensors so that an engine can run each one
 * inside its own exclusion (kvt_save_opts.run_exclusive); everything that waits on the OS or
 * the device runs outside them. Any failure before the rename removes the .tmp and leaves the
 * final name untouched.
 */
#include "format/format.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>

#include "common/error.h"
#include "io/io.h"
#include "io/stream.h"
#include "tensor/tensor_parts.h"

struct save_job {
    const char *path;
    char *tmp_path;
    char *dir_path; /* the directory whose entry the rename changes */
    const struct kvt_entry *e;
    struct kvt_save_opts opts;
    struct kvt_header h;      /* tokens and metadata borrowed from the entry */
    struct kvt_tensor *views; /* one owned state view per slot, released once written */
    size_t n_views;
    struct kvt_slot **slot_of; /* views[k] belongs to slot_of[k] */
    uint64_t file_size;
    uint64_t file_end; /* bytes written so far reach this file offset */
    int fd;
    size_t step;  /* next step: 0 = plan (unless planned) + first tensor, ... */
    size_t steps; /* n_views + 1 once planned */
    bool planned;
    struct kvt_sbuf json;   /* the header as planned, its hashes patched in once written */
    size_t *hash_at;        /* where views[k]'s slot hash is in json */
    struct kvt_wstream *ws; /* the tensor bytes go through it */
};

/* A save job planned ahead of its path (kvt_save_plan_new()). */
struct kvt_save_plan {
    struct save_job j;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void job_release_views(struct save_job *j)
{
    for (size_t k = 0; k < j->n_views; k++)
        kvt_tensor_release(&j->views[k]);
}

static void job_free(struct save_job *j)
{
    job_release_views(j);
    free(j->views);
    free(j->slot_of);
    free(j->hash_at);
    kvt_sbuf_free(&j->json);
    free(j->h.caches);
    free(j->tmp_path);
    free(j->dir_path);
    kvt_wstream_free(j->ws);
}

/* Serialize the planned header once, noting where each slot's hash goes (patched in once the
 * tensors are written: nothing else in it changes, and a hash is always 16 hex digits). */
static int render_header(struct save_job *j)
{
    j->hash_at = calloc(j->n_views ? j->n_views : 1, sizeof(*j->hash_at));
    if (!j->hash_at || kvt_header_to_json_at(&j->h, &j->json, j->hash_at) < 0)
        return kvt_fail(-ENOMEM, "%s: out of memory serializing the header", j->path);
    return 0;
}

/*
 * The plan pass (no tensor bytes are touched): state views of every cache, slot placement
 * (FORMAT.md §6), header size, data start and file size.
 */
/* Plan cache @p i: its info and its slots at 16 KiB-aligned offsets from *@p cursor, whose
 * tensor views the job owns from here on. */
static int plan_cache(struct save_job *j, size_t i, uint64_t *cursor)
{
    const struct kvt_entry *e = j->e;
    struct kvt_cache_header *c = &j->h.caches[i];
    if (!e->caches[i])
        return kvt_fail(-EINVAL, "%s: caches[%zu] is NULL", j->path, i);
    kvt_cache_get_info(e->caches[i], &c->info);
    size_t base = j->n_views;
    struct kvt_tensor *v = &j->views[base];
    kvt_clear_error();
    int n = kvt_cache_state(e->caches[i], v);
    if (n < 0)
        return kvt_fail_prefix(n, j->path);
    j->n_views += (size_t)n; /* owned from here on, whatever happens next */
    if (n > KVT_MAX_CACHE_TENSORS)
        return kvt_fail(-EINVAL, "%s: caches[%zu] has %d tensors", j->path, i, n);
    c->n_slots = n;
    for (int k = 0; k < n; k++) {
        struct kvt_slot *s = &c->slots[k];
        s->dtype = v[k].dtype;
        s->rank = v[k].rank;
        memcpy(s->shape, v[k].shape, sizeof(s->shape));
        s->bytes = kvt_tensor_nbytes(&v[k]);
        if (*cursor >= KVT_SAFE_INT_LIMIT || s->bytes >= KVT_SAFE_INT_LIMIT)
            return kvt_fail(KVT_E_TOO_LARGE, "%s: the entry exceeds 2^53 bytes", j->path);
        s->off = kvt_align_up(*cursor);
        s->hash = KVT_PLACEHOLDER_HASH;
        *cursor = s->off + s->bytes;
        j->slot_of[base + (size_t)k] = s;
    }
    return 0;
}

static int plan(struct save_job *j)
{
    const struct kvt_entry *e = j->e;
    if (!e->caches || e->n_caches == 0)
        return kvt_fail(-EINVAL, "%s: an entry needs at least one cache", j->path);
    if (e->n_tokens && !e->tokens)
        return kvt_fail(-EINVAL, "%s: entry has %zu tokens but no token array", j->path,
                        e->n_tokens);
    if (e->n_caches > SIZE_MAX / (KVT_MAX_CACHE_TENSORS * sizeof(struct kvt_tensor)))
        return kvt_fail(-EINVAL, "%s: too many caches", j->path);

    struct kvt_header *h = &j->h;
    h->format_version = KVT_FORMAT_VERSION;
    h->created_at = j->opts.created_at > 0 ? j->opts.created_at : now_ms();
    h->model_id = (char *)e->meta.model_id;
    h->config_fingerprint = (char *)e->meta.config_fingerprint;
    h->tokenizer_hash = (char *)e->meta.tokenizer_hash;
    h->ns = (char *)e->meta.ns;
    h->tokens = e->tokens;
    h->n_tokens = e->n_tokens;
    h->caches = calloc(e->n_caches, sizeof(*h->caches));
    j->views = calloc(e->n_caches * KVT_MAX_CACHE_TENSORS, sizeof(*j->views));
    j->slot_of = calloc(e->n_caches * KVT_MAX_CACHE_TENSORS, sizeof(*j->slot_of));
    if (!h->caches || !j->views || !j->slot_of)
        return kvt_fail(-ENOMEM, "%s: out of memory planning the write", j->path);
    h->n_caches = e->n_caches;

    uint64_t cursor = 0;
    for (size_t i = 0; i < e->n_caches; i++) {
        int rc = plan_cache(j, i, &cursor);
        if (rc)
            return rc;
    }

    int rc = render_header(j);
    size_t len = j->json.len;
    if (rc)
        return rc;
    if (len > KVT_DEFAULT_MAX_HEADER)
        return kvt_fail(KVT_E_TOO_LARGE,
                        "%s: the header would be %zu bytes, over the %zu-byte reader limit",
                        j->path, len, KVT_DEFAULT_MAX_HEADER);
    h->header_len = (uint32_t)len;
    h->data_start = (uint32_t)kvt_align_up(KVT_PREFIX_LEN + (uint64_t)len);
    const struct kvt_slot *last = j->n_views ? j->slot_of[j->n_views - 1] : NULL;
    j->file_size = (uint64_t)h->data_start + (last ? last->off + last->bytes : 0);
    h->file_size = j->file_size;
    rc = kvt_header_check_writable(h);
    if (rc)
        return kvt_fail_prefix(rc, j->path);
    if (j->opts.max_file_bytes && j->file_size > j->opts.max_file_bytes)
        return kvt_fail(KVT_E_TOO_LARGE,
                        "%s: entry not stored: %" PRIu64 " bytes exceeds the %" PRIu64 "-byte cap",
                        j->path, j->file_size, j->opts.max_file_bytes);
    j->steps = j->n_views + 1;
    j->planned = true;
    return 0;
}

static int open_tmp(struct save_job *j)
{
    const struct kvt_io *io = kvt_io();
    int fd = io->openat(AT_FDCWD, j->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return kvt_fail(fd, "%s: create: %s", j->tmp_path, kvt_strerror(fd));
    j->fd = fd;
    int rc = io->flock(fd, LOCK_EX);
    if (rc < 0)
        return kvt_fail(rc, "%s: lock: %s", j->tmp_path, kvt_strerror(rc));
    const struct kvt_stream_opts through_cache = {.no_direct = true};
    rc = kvt_wstream_open(fd, j->opts.keep_cache ? &through_cache : NULL, &j->ws);
    if (rc < 0)
        return kvt_fail(rc, "%s: out of memory for the write stream", j->tmp_path);
    return 0;
}

/*
 * Allocate the whole file once the plan has sized it, before the tensor writes go out, when
 * the file system is short of room: a disk without room for the file then fails here, before
 * anything is written. With room to spare the blocks are left to the writes themselves: on
 * ext4 each direct write into preallocated (unwritten) blocks converts them at completion,
 * which measurably slowed saves against a plain write of the same bytes; a disk that fills
 * while the writes run still fails the save cleanly. Runs outside the engine's exclusion;
 * skipped where the file system cannot preallocate.
 */
static int reserve(struct save_job *j)
{
    uint64_t avail;
    if (kvt_io()->free_bytes(j->fd, &avail) == 0 && avail / 2 > j->file_size)
        return 0;
    int rc = kvt_io()->fallocate(j->fd, j->file_size);
    if (rc == -EOPNOTSUPP || rc == -ENOSYS || rc == -EINVAL)
        return 0;
    if (rc < 0)
        return kvt_fail(rc, "%s: allocating %" PRIu64 " bytes: %s", j->tmp_path, j->file_size,
                        kvt_strerror(rc));
    return 0;
}

static int write_at(struct save_job *j, const void *p, size_t n, uint64_t off)
{
    int rc = kvt_io_write_full(j->fd, p, n, off);
    if (rc < 0)
        return kvt_fail(rc, "%s: write of %zu bytes at offset %" PRIu64 ": %s", j->tmp_path, n, off,
                        kvt_strerror(rc));
    if (off + n > j->file_end)
        j->file_end = off + n;
    return 0;
}

/* Hash and write @p n bytes of tensor memory at @p off through the write stream. */
static int stream_write(struct save_job *j, const void *p, size_t n, uint64_t off,
                        struct kvt_wyhash_state *st)
{
    uint64_t at = off;
    int rc = kvt_wstream_write(j->ws, off, p, n, st, &at);
    if (rc < 0)
        return kvt_fail(rc, "%s: write at offset %" PRIu64 ": %s", j->tmp_path, at,
                        kvt_strerror(rc));
    return 0;
}

/* Contiguous view: one run straight from the tensor's memory. */
static int write_contiguous(struct save_job *j, const uint8_t *p, uint64_t n, uint64_t off,
                            uint64_t *hash)
{
    struct kvt_wyhash_state st;
    kvt_wyhash_init(&st, 0);
    int rc = stream_write(j, p, (size_t)n, off, &st);
    if (!rc)
        *hash = kvt_wyhash_final(&st);
    return rc;
}

/* Writing the runs of a strided view one after another. */
struct gather {
    struct save_job *j;
    struct kvt_wyhash_state st;
    uint64_t pos; /* file offset of the next run */
};

static int gather_run(void *ud, const void *p, size_t n)
{
    struct gather *g = ud;
    int rc = stream_write(g->j, p, n, g->pos, &g->st);
    g->pos += n;
    return rc;
}

/*
 * Strided view (e.g. rows [0, offset) of a capacity buffer): its contiguous runs, in row-major
 * order, are adjacent in the file, and the stream gathers them into whole chunks. A tensor in
 * device memory comes the same way, as host copies of its pieces (the device's staging).
 */
static int write_strided(struct save_job *j, const struct kvt_tensor *t, uint64_t off,
                         uint64_t *hash)
{
    struct gather g = {.j = j, .pos = off};
    kvt_wyhash_init(&g.st, 0);
    int rc = kvt_tensor_for_each_run(t, gather_run, &g);
    if (!rc)
        *hash = kvt_wyhash_final(&g.st);
    return rc;
}

static int write_tensor(struct save_job *j, size_t k)
{
    struct kvt_tensor *t = &j->views[k];
    struct kvt_slot *s = j->slot_of[k];
    uint64_t abs = kvt_slot_abs(&j->h, s);
    uint64_t n = kvt_tensor_nbytes(t);
    int rc = 0;
    if (n != s->bytes)
        return kvt_fail(KVT_E_STATE,
                        "%s: tensor byte-length drift: planned %" PRIu64 ", got %" PRIu64, j->path,
                        s->bytes, n);
    if (n == 0)
        s->hash = kvt_wyhash(0, NULL, 0);
    else if (kvt_tensor_is_contiguous(t) && !kvt_tensor_on_device(t))
        rc = write_contiguous(j, (const uint8_t *)kvt_buf_data(t->buf) + t->offset, n, abs,
                              &s->hash);
    else
        rc = write_strided(j, t, abs, &s->hash);
    kvt_tensor_release(t);
    return rc;
}

/* The last gated step: send the staged tail; nothing after it reads engine memory. */
static int seal(struct save_job *j)
{
    uint64_t at = 0;
    int rc = kvt_wstream_flush(j->ws, &at);
    if (rc < 0)
        rc = kvt_fail(rc, "%s: write at offset %" PRIu64 ": %s", j->tmp_path, at, kvt_strerror(rc));
    return rc;
}

/* The file's first data_start bytes: prefix, the JSON with the slots' hashes patched in, zero
 * padding (malloc'd; NULL when out of memory). *@p hash: the header hash (may be NULL). */
static uint8_t *render_head(struct save_job *j, uint64_t *hash)
{
    struct kvt_sbuf *json = &j->json;
    for (size_t k = 0; k < j->n_views; k++)
        kvt_json_hex64(json->data + j->hash_at[k], j->slot_of[k]->hash);
    uint8_t *head = calloc(1, j->h.data_start);
    if (!head)
        return NULL;
    uint64_t hh = kvt_wyhash(0, json->data, json->len);
    memcpy(head, KVT_MAGIC, KVT_MAGIC_LEN);
    for (int b = 0; b < 4; b++) {
        head[10 + b] = (uint8_t)(j->h.header_len >> (8 * b));
        head[14 + b] = (uint8_t)(j->h.data_start >> (8 * b));
    }
    for (int b = 0; b < 8; b++)
        head[18 + b] = (uint8_t)(hh >> (8 * b));
    memcpy(head + KVT_PREFIX_LEN, json->data, json->len);
    if (hash)
        *hash = hh;
    return head;
}

/*
 * Wait for every tensor write, cut the padded tail, patch the header at offset 0 (after the
 * tensor writes: where the file could not be preallocated, a write on ext4 waits for direct
 * writes that extend it), extend the file to F after an empty last tensor.
 */
static int complete(struct save_job *j)
{
    uint64_t at = 0;
    int rc = kvt_wstream_finish(j->ws, &at);
    if (rc < 0)
        return kvt_fail(rc, "%s: write at offset %" PRIu64 ": %s", j->tmp_path, at,
                        kvt_strerror(rc));
    if (kvt_wstream_end(j->ws) > j->file_end)
        j->file_end = kvt_wstream_end(j->ws);
    uint8_t *head = render_head(j, NULL);
    if (!head)
        return kvt_fail(-ENOMEM, "%s: out of memory for the header", j->path);
    rc = write_at(j, head, j->h.data_start, 0);
    free(head);
    if (rc)
        return rc;
    if (j->file_end < j->file_size) {
        /* the last tensor is empty: extend the file to F (FORMAT.md §6) */
        rc = kvt_io()->ftruncate(j->fd, j->file_size);
        if (rc < 0)
            rc = kvt_fail(rc, "%s: ftruncate: %s", j->tmp_path, kvt_strerror(rc));
    }
    return rc;
}

/*
 * The device waits, the header, fsync, rename, directory fsync. Runs after the last gated
 * step, outside the engine's exclusion: it reads no engine memory, and waiting for tens of
 * megabytes of writes or an fsync takes tens of milliseconds that would stall a decode step.
 */
static int publish(struct save_job *j)
{
    const struct kvt_io *io = kvt_io();
    int rc = complete(j);
    if (rc)
        return rc;
    if (!j->opts.no_sync) {
        rc = io->fsync(j->fd);
        if (rc < 0)
            return kvt_fail(rc, "%s: fsync: %s", j->tmp_path, kvt_strerror(rc));
    }
    if (j->opts.drop_cache && !j->opts.keep_cache)
        io->fadvise_dontneed(j->fd, 0, 0); /* advisory: the result does not matter */
    rc = io->renameat(AT_FDCWD, j->tmp_path, AT_FDCWD, j->path);
    if (rc < 0)
        return kvt_fail(rc, "%s: rename to %s: %s", j->tmp_path, j->path, kvt_strerror(rc));
    /* published: from here on nothing is unlinked */
    io->close(j->fd);
    j->fd = -1;
    if (!j->opts.no_sync) {
        rc = kvt_io_fsync_dir(j->dir_path);
        if (rc < 0)
            rc = kvt_fail(rc, "%s: fsync of the directory after the rename: %s", j->path,
                          kvt_strerror(rc));
    }
    return rc;
}

/* One step of the write; kvt_step_fn so that run_exclusive can run it. */
static int save_step(void *arg)
{
    struct save_job *j = arg;
    int rc;
    if (j->step == 0) {
        rc = j->planned ? 0 : plan(j);
        if (!rc && j->n_views > 0)
            rc = write_tensor(j, 0);
    } else if (j->step < j->steps - 1) {
        rc = write_tensor(j, j->step);
    } else {
        rc = seal(j);
    }
    j->step++;
    return rc;
}

static void abort_job(struct save_job *j)
{
    kvt_wstream_free(j->ws); /* no write may land after the unlink */
    j->ws = NULL;
    if (j->fd >= 0) {
        const struct kvt_io *io = kvt_io();
        io->unlinkat(AT_FDCWD, j->tmp_path, 0); /* never leave a partial file behind */
        io->close(j->fd);
        j->fd = -1;
    }
}

/* The job's path, .tmp path and directory for @p path. */
static int set_paths(struct save_job *j, const char *path)
{
    size_t plen = strlen(path);
    const char *slash = strrchr(path, '/');
    j->path = path;
    j->tmp_path = malloc(plen + 5);
    j->dir_path = !slash          ? strdup(".")
                  : slash == path ? strdup("/")
                                  : strndup(path, (size_t)(slash - path));
    if (!j->tmp_path || !j->dir_path)
        return kvt_fail(-ENOMEM, "%s: out of memory", path);
    memcpy(j->tmp_path, path, plen);
    memcpy(j->tmp_path + plen, ".tmp", 5);
    return 0;
}

/* Run step @p step of @p j inside the engine's exclusion; a refusal becomes KVT_E_REFUSED. */
static int gated_step(struct save_job *j, size_t step)
{
    kvt_clear_error();
    int rc = j->opts.run_exclusive(j->opts.engine, save_step, j);
    if (rc != 0 && j->step == step) {
        /* refused without running the step */
        int code = rc < 0 ? rc : KVT_E_REFUSED;
        if (!kvt_last_error()[0])
            kvt_fail(code, "%s: the engine refused write step %zu", j->path, step + 1);
        return code;
    }
    if (rc > 0)
        return kvt_fail(KVT_E_REFUSED, "%s: write step %zu failed (%d)", j->path, step + 1, rc);
    return rc;
}

/* Write, publish (or remove) the file of job @p j, its paths set. */
static int run_job(struct save_job *j, uint64_t *out_bytes)
{
    /* Creating the .tmp and the stream (its staging memory) needs no engine memory: it runs
     * before the gated steps, outside the engine's exclusion. */
    int rc = open_tmp(j);
    while (rc == 0 && (j->step == 0 || j->step < j->steps)) {
        size_t step = j->step;
        if (step == 1 && (rc = reserve(j)) != 0)
            break;
        if (step > 0 && step < j->steps - 1)
            kvt_wstream_room(j->ws, (size_t)kvt_tensor_nbytes(&j->views[step])); /* errors: below */
        rc = j->opts.run_exclusive ? gated_step(j, step) : save_step(j);
    }
    if (rc == 0)
        rc = publish(j);
    if (rc == 0 && out_bytes)
        *out_bytes = j->file_size;
    if (rc != 0)
        abort_job(j);
    return rc;
}

int kvt_file_save(const char *path, const struct kvt_entry *e, const struct kvt_save_opts *o,
                  uint64_t *out_bytes)
{
    if (out_bytes)
        *out_bytes = 0;
    if (!path || !e)
        return kvt_fail(-EINVAL, "kvt_file_save: no %s", path ? "entry" : "path");
    struct save_job j = {.path = path, .e = e, .fd = -1};
    if (o)
        j.opts = *o;
    int rc = set_paths(&j, path);
    if (rc == 0)
        rc = run_job(&j, out_bytes);
    job_free(&j);
    return rc;
}

int kvt_save_plan_new(const struct kvt_entry *e, const struct kvt_save_opts *o,
                      struct kvt_save_plan **out)
{
    *out = NULL;
    struct kvt_save_plan *p = calloc(1, sizeof(*p));
    if (!p)
        return kvt_fail(-ENOMEM, "entry: out of memory planning the write");
    p->j = (struct save_job){.path = "entry", .e = e, .fd = -1};
    if (o)
        p->j.opts = *o;
    int rc = plan(&p->j);
    if (rc) {
        kvt_save_plan_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

uint64_t kvt_save_plan_bytes(const struct kvt_save_plan *p)
{
    return p->j.file_size;
}

int kvt_file_save_planned(const char *path, struct kvt_save_plan *p, uint64_t *out_bytes)
{
    if (out_bytes)
        *out_bytes = 0;
    int rc = set_paths(&p->j, path);
    return rc ? rc : run_job(&p->j, out_bytes);
}

size_t kvt_save_plan_views(struct kvt_save_plan *p, const struct kvt_tensor **views,
                           struct kvt_slot *const **slots, const struct kvt_header **h)
{
    *views = p->j.views;
    *slots = p->j.slot_of;
    *h = &p->j.h;
    return p->j.n_views;
}

uint8_t *kvt_save_plan_head(struct kvt_save_plan *p, uint64_t *hash)
{
    return render_head(&p->j, hash);
}

void kvt_save_plan_free(struct kvt_save_plan *p)
{
    if (!p)
        return;
    job_free(&p->j);
    free(p);
}

int kvt_file_plan_size(const struct kvt_entry *e, uint64_t *out_bytes)
{
    if (!out_bytes)
        return kvt_fail(-EINVAL, "kvt_file_plan_size: no output");
    *out_bytes = 0;
    if (!e)
        return kvt_fail(-EINVAL, "kvt_file_plan_size: no entry");
    struct kvt_save_plan *p;
    int rc = kvt_save_plan_new(e, NULL, &p);
    if (rc == 0)
        *out_bytes = kvt_save_plan_bytes(p);
    kvt_save_plan_free(p);
    return rc;
}
