/*
 * Saving an entry as shared chunks plus its own tail (docs/SHARING.md §2-§3): chunks first,
 * each crash-safe on its own and skipped (only touched) when another entry wrote it already,
 * the tail last, so that a tail on disk always finds its chunks.
 */
#include "store/share.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "io/io.h"
#include "store/layout.h"
#include "store/store_parts.h"

bool kvt_share_splits(int kind)
{
    return kind == KVT_KIND_KV || kind == KVT_KIND_QKV;
}

size_t kvt_share_chunks(size_t n)
{
    return n ? (n - 1) / KVT_SHARE_CHUNK : 0;
}

bool kvt_share_applies(const struct kvt_entry *e)
{
    if (!kvt_share_chunks(e->n_tokens))
        return false;
    for (size_t i = 0; i < e->n_caches; i++) {
        struct kvt_cache_info info;
        kvt_cache_get_info(e->caches[i], &info);
        if (kvt_share_splits(info.kind))
            return true;
    }
    return false;
}

#define ID_SEED_A 0x6b767469657231ull
#define ID_SEED_B 0x63686e6b32ull

int kvt_share_each_chunk(const int32_t *tok, size_t n, kvt_chunk_fn fn, void *ud)
{
    /* two independent 64-bit hashes, streamed: an id names a chunk for as long as the store
     * lives, and the ids of all chunks cost one pass over the tokens */
    struct kvt_wyhash_state a, b;
    kvt_wyhash_init(&a, ID_SEED_A);
    kvt_wyhash_init(&b, ID_SEED_B);
    size_t m = kvt_share_chunks(n);
    for (size_t k = 0; k < m; k++) {
        const int32_t *rows = tok + k * KVT_SHARE_CHUNK;
        kvt_wyhash_update(&a, rows, KVT_SHARE_CHUNK * sizeof(*tok));
        kvt_wyhash_update(&b, rows, KVT_SHARE_CHUNK * sizeof(*tok));
        char id[KVT_CHUNK_ID_LEN + 1];
        snprintf(id, sizeof(id), "%016llx%016llx", (unsigned long long)kvt_wyhash_final(&a),
                 (unsigned long long)kvt_wyhash_final(&b));
        int rc = fn(ud, k, id);
        if (rc)
            return rc;
    }
    return 0;
}

char *kvt_share_chunk_path(const char *dir, const char *id)
{
    char name[KVT_CHUNK_ID_LEN + sizeof(KVT_CHUNK_EXT)];
    memcpy(name, id, KVT_CHUNK_ID_LEN);
    memcpy(name + KVT_CHUNK_ID_LEN, KVT_CHUNK_EXT, sizeof(KVT_CHUNK_EXT));
    return kvt_path_join(dir, name);
}

struct path_of {
    const char *dir;
    size_t k;
    char *path;
};

static int path_of_k(void *ud, size_t k, const char *id)
{
    struct path_of *p = ud;
    if (k < p->k)
        return 0;
    p->path = kvt_share_chunk_path(p->dir, id);
    return 1;
}

char *kvt_share_chunk_path_of(const char *dir, const int32_t *tok, size_t k)
{
    struct path_of p = {dir, k, NULL};
    kvt_share_each_chunk(tok, (k + 1) * KVT_SHARE_CHUNK + 1, path_of_k, &p);
    return p.path;
}

/* A cache of @p c's kind over rows [a, b) of its state (new references on the same bytes). */
static int cut(const kvt_cache *c, int64_t a, int64_t b, kvt_cache **out)
{
    struct kvt_tensor st[KVT_MAX_CACHE_TENSORS];
    int nt = kvt_cache_state(c, st);
    if (nt < 0)
        return nt;
    struct kvt_cache_info info;
    kvt_cache_get_info(c, &info);
    info.offset = b - a;
    int rc = 0;
    for (int i = 0; i < nt && rc == 0; i++)
        rc = kvt_tensor_slice(&st[i], &st[i], 2, a, b);
    if (rc == 0)
        rc = kvt_cache_from_state(&info, st, nt, out);
    for (int i = 0; i < nt; i++)
        kvt_tensor_release(&st[i]);
    return rc;
}

/*
 * The entry that rows [a, b) of @p e make: its token-axis layers cut, and with @p whole the
 * other layers as they are (borrowed), else left out. v[] receives the caches; owned[i] says
 * which ones the caller frees.
 */
static int part_entry(const struct kvt_entry *e, int64_t a, int64_t b, bool whole,
                      struct kvt_entry *pe, kvt_cache **v, bool *owned)
{
    size_t nv = 0;
    int rc = 0;
    for (size_t i = 0; i < e->n_caches && rc == 0; i++) {
        struct kvt_cache_info info;
        kvt_cache_get_info(e->caches[i], &info);
        owned[nv] = kvt_share_splits(info.kind);
        if (owned[nv])
            rc = cut(e->caches[i], a, b, &v[nv++]);
        else if (whole)
            v[nv++] = e->caches[i];
    }
    *pe = *e;
    pe->caches = v;
    pe->n_caches = nv; /* a failed cut left NULL, which part_free() passes over */
    return rc;
}

static void part_free(struct kvt_entry *pe, const bool *owned)
{
    for (size_t i = 0; i < pe->n_caches; i++)
        if (owned[i])
            kvt_cache_free(pe->caches[i]);
}

int kvt_share_part_new(const struct kvt_entry *e, int64_t a, int64_t b, bool whole,
                       struct kvt_share_part *p)
{
    memset(p, 0, sizeof(*p));
    p->v = calloc(e->n_caches ? e->n_caches : 1, sizeof(*p->v));
    p->owned = calloc(e->n_caches ? e->n_caches : 1, sizeof(*p->owned));
    if (!p->v || !p->owned) {
        kvt_share_part_free(p);
        return -ENOMEM;
    }
    int rc = part_entry(e, a, b, whole, &p->e, p->v, p->owned);
    if (rc == 0 && !whole) { /* a chunk: its own 256 tokens */
        p->e.tokens = e->tokens + a;
        p->e.n_tokens = (size_t)(b - a);
    }
    if (rc < 0)
        kvt_share_part_free(p);
    return rc;
}

void kvt_share_part_free(struct kvt_share_part *p)
{
    if (p->v && p->owned)
        part_free(&p->e, p->owned);
    free(p->v);
    free(p->owned);
    memset(p, 0, sizeof(*p));
}

/* Write rows [a, b) of @p e to @p path (@p whole: with the other layers). */
static int save_part(const char *path, const struct kvt_entry *e, int64_t a, int64_t b, bool whole,
                     const struct kvt_save_opts *o, uint64_t *bytes)
{
    struct kvt_share_part p;
    int rc = kvt_share_part_new(e, a, b, whole, &p);
    if (rc == 0)
        rc = kvt_file_save(path, &p.e, o, bytes);
    kvt_share_part_free(&p);
    return rc;
}

/*
 * Reuse the chunk at @p path: under a shared lock (a remover holds an exclusive one from its
 * age check to its unlink), make sure the name still leads to the open file and set its mtime
 * to now, its last use. @return 0, or -ENOENT when it must be written.
 */
static int touch_chunk(const char *path)
{
    const struct kvt_io *io = kvt_io();
    int fd = io->openat(AT_FDCWD, path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW, 0);
    if (fd < 0)
        return fd;
    struct stat a, b;
    int rc = io->flock(fd, LOCK_SH);
    if (rc == 0)
        rc = io->fstat(fd, &a);
    if (rc == 0)
        rc = io->stat(path, &b, 0);
    if (rc == 0 && (a.st_ino != b.st_ino || a.st_dev != b.st_dev || a.st_nlink == 0))
        rc = -ENOENT; /* removed while this waited for the lock */
    if (rc == 0)
        rc = futimens(fd, NULL) < 0 ? -errno : 0;
    io->close(fd);
    return rc;
}

#define EXIST_TRIES 2000 /* with EXIST_WAIT_NS: 10 s for another writer to publish */
#define EXIST_WAIT_NS 5000000

/*
 * Remove the .tmp of chunk @p path when its writer is gone: its lock is free now and still
 * free a moment later (a live writer takes it right after creating the file; should one be
 * that slow, its put fails, nothing is lost). @return whether it was removed.
 */
static bool reap_dead_tmp(const char *path)
{
    size_t n = strlen(path);
    char *tmp = malloc(n + sizeof(KVT_TMP_EXT));
    if (!tmp)
        return false;
    memcpy(tmp, path, n);
    memcpy(tmp + n, KVT_TMP_EXT, sizeof(KVT_TMP_EXT));
    bool removed = false, again;
    struct stat st;
    int fd = kvt_tmp_claim(tmp, 0, &st, &again);
    if (fd >= 0) {
        kvt_io()->close(fd);
        nanosleep(&(struct timespec){0, EXIST_WAIT_NS}, NULL);
        fd = kvt_tmp_claim(tmp, 0, &st, &again);
    }
    if (fd >= 0) {
        removed = kvt_tmp_unlink_claimed(tmp, &st) == 0;
        kvt_io()->close(fd);
    }
    free(tmp);
    return removed;
}

struct save_job {
    const char *dir;
    const struct kvt_entry *e;
    const struct kvt_save_opts *o;
    struct kvt_share_saved *out;
};

/* Chunk @p k: touched when present, else written. */
static int save_chunk(void *ud, size_t k, const char *id)
{
    struct save_job *j = ud;
    char *path = kvt_share_chunk_path(j->dir, id);
    if (!path)
        return -ENOMEM;
    int rc = -EEXIST;
    /* -EEXIST: another writer is writing this very chunk; reuse it once it is published */
    for (int tries = 0; rc == -EEXIST && tries < EXIST_TRIES; tries++) {
        if (tries && !reap_dead_tmp(path))
            nanosleep(&(struct timespec){0, EXIST_WAIT_NS}, NULL);
        rc = touch_chunk(path);
        if (rc == 0)
            j->out->chunks_reused++;
        if (rc == -ENOENT) {
            uint64_t bytes = 0;
            int64_t a = (int64_t)(k * KVT_SHARE_CHUNK);
            rc = save_part(path, j->e, a, a + KVT_SHARE_CHUNK, false, j->o, &bytes);
            j->out->chunk_bytes += bytes;
            j->out->chunks_written += rc == 0;
        }
    }
    if (rc < 0)
        kvt_fail(rc, "%s: cannot write the shared chunk: %s", path, kvt_strerror(rc));
    free(path);
    return rc;
}

int kvt_share_save(const char *dir, const char *tail_path, const struct kvt_entry *e,
                   const struct kvt_save_opts *o, struct kvt_share_saved *out)
{
    memset(out, 0, sizeof(*out));
    if (!kvt_share_applies(e))
        return kvt_fail(-EINVAL, "%s: nothing of this entry can be shared", tail_path);
    /* no chunk of the directory is removed from the first chunk's use to the tail's
     * publication, however slow the put (docs/SHARING.md §6) */
    int lock = kvt_chunks_lock(dir, false);
    if (lock < 0)
        return kvt_fail(lock, "%s: cannot lock the directory's chunks: %s", dir,
                        kvt_strerror(lock));
    struct save_job j = {dir, e, o, out};
    int rc = kvt_share_each_chunk(e->tokens, e->n_tokens, save_chunk, &j);
    size_t m = kvt_share_chunks(e->n_tokens);
    if (rc == 0)
        rc = save_part(tail_path, e, (int64_t)(m * KVT_SHARE_CHUNK), (int64_t)e->n_tokens, true, o,
                       &out->tail_bytes);
    kvt_io()->close(lock);
    return rc;
}
