/*
 * kvt_store_check(): the store's own check and repair, what `kvtier gc` runs. It classifies
 * the files of one fingerprint directory by the rules the scan applies (STORE.md §6, §12.1,
 * §12.4: the same .tmp claim, the same header check) and evicts in the store's own order
 * (§10), so the tool never re-implements the store.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "io/io.h"
#include "store/layout.h"
#include "store/share.h"
#include "store/store_parts.h"

struct check {
    const struct kvt_store_opts *so;
    const struct kvt_check_opts *co;
    int64_t grace_ms;
};

static void act(const struct check *c, enum kvt_check_kind k, const char *path, const char *why)
{
    struct stat st;
    uint64_t bytes = kvt_io()->stat(path, &st, 0) == 0 ? (uint64_t)st.st_size : 0;
    int rc = 0;
    if (c->co->repair) {
        rc = kvt_io()->unlinkat(AT_FDCWD, path, 0);
        rc = rc == -ENOENT ? 0 : rc; /* gone meanwhile: as good */
    }
    if (c->co->report)
        c->co->report(c->co->ud, k, path, bytes, why, rc);
}

/* Remove @p path if no one holds its lock and it was last modified at or before @p before_ms
 * (an abandoned .tmp, a chunk no tail needs), reporting it as @p k. */
static void check_claimed(const struct check *c, const char *path, enum kvt_check_kind k,
                          int64_t before_ms)
{
    struct stat st;
    bool again;
    int fd = kvt_claim_older(path, before_ms, &st, &again);
    if (fd < 0)
        return;
    int rc = c->co->repair ? kvt_tmp_unlink_claimed(path, &st) : 0;
    if (c->co->report)
        c->co->report(c->co->ud, k, path, (uint64_t)st.st_size, NULL, rc == -ENOENT ? 0 : rc);
    kvt_io()->close(fd);
}

static bool str_same(const void *val, const void *key)
{
    return !strcmp(val, key);
}

static void free_path(void *val, void *ud)
{
    (void)ud;
    free(val);
}

static bool same(const char *a, const char *b)
{
    return a && b && !strcmp(a, b);
}

/* Why no identity here can use the entry at @p path (NULL: one can), its header read as @p rc. */
static const char *unusable(const struct check *c, const char *path, int rc,
                            const struct kvt_header *h)
{
    if (rc == KVT_E_FORMAT || rc == KVT_E_UNSUPPORTED)
        return kvt_last_error();
    if (rc != 0)
        return NULL;
    if (!same(h->config_fingerprint, c->so->config_fingerprint))
        return "another config fingerprint";
    bool own = same(h->model_id, c->so->model_id) && same(h->tokenizer_hash, c->so->tokenizer_hash);
    if (!own && !(c->co->keep && h->model_id && h->tokenizer_hash && c->co->keep(c->co->ud, h)))
        return "another model or tokenizer";
    if (!kvt_header_is_indexable(h) && !kvt_is_tail(path))
        return "V21: not indexable";
    return NULL;
}

/* The chunks the tails among @p names in @p dir need, into @p set (names by hash). */
struct needed {
    const char *dir;
    struct kvt_hmap *set;
};

static int note_needed(void *ud, size_t k, const char *id)
{
    (void)k;
    struct needed *n = ud;
    char *path = kvt_share_chunk_path(n->dir, id);
    if (!path)
        return -ENOMEM;
    if (kvt_hmap_get(n->set, kvt_str_hash(path), str_same, path)) {
        free(path);
        return 0;
    }
    if (kvt_hmap_put(n->set, kvt_str_hash(path), path) < 0) {
        free(path); /* a needed chunk not noted: the set is incomplete */
        return -ENOMEM;
    }
    return 0;
}

/* @return false when a tail could not be read: no chunk can then be called unneeded. */
static bool collect_needed(const char *dir, char **names, size_t n, struct kvt_hmap *set)
{
    bool complete = true;
    for (size_t i = 0; i < n; i++) {
        if (!kvt_layout_has_suffix(names[i], KVT_SHARE_EXT))
            continue;
        char *p = kvt_path_join(dir, names[i]);
        struct kvt_header *h = NULL;
        struct needed nd = {dir, set};
        if (!p || kvt_file_read_header(p, NULL, &h) != 0 ||
            kvt_share_each_chunk(h->tokens, h->n_tokens, note_needed, &nd) < 0)
            complete = false;
        kvt_header_free(h);
        free(p);
    }
    return complete;
}

/* Check file @p name of a directory listed at @p listed_ms whose tails need @p needed. */
static void check_file(const struct check *c, const char *name, const char *path,
                       const struct kvt_hmap *needed, int64_t listed_ms)
{
    if (kvt_layout_has_suffix(name, KVT_TMP_EXT)) {
        check_claimed(c, path, KVT_CHECK_TMP, kvt_now_ms() - c->grace_ms);
    } else if (kvt_layout_has_suffix(name, KVT_CHUNK_EXT)) {
        /* no tail of its directory needs it, nor one published since (docs/SHARING.md §6) */
        if (needed && !kvt_hmap_get(needed, kvt_str_hash(path), str_same, path))
            check_claimed(c, path, KVT_CHECK_ORPHAN, listed_ms - c->grace_ms);
    } else if (kvt_layout_has_suffix(name, ".mlxkv.corrupt")) {
        if (c->co->remove_skipped)
            act(c, KVT_CHECK_QUARANTINED, path, NULL);
    } else if (kvt_layout_has_suffix(name, KVT_ENTRY_EXT) ||
               kvt_layout_has_suffix(name, KVT_SHARE_EXT)) {
        struct kvt_header *h = NULL;
        int rc = kvt_file_read_header(path, NULL, &h);
        const char *why = NULL;
        if (rc == KVT_E_CORRUPT)
            act(c, KVT_CHECK_CORRUPT, path, kvt_last_error());
        else if (c->co->remove_skipped && (why = unusable(c, path, rc, h)))
            act(c, KVT_CHECK_SKIPPED, path, why);
        kvt_header_free(h);
    }
}

static bool has_chunk(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (kvt_layout_has_suffix(names[i], KVT_CHUNK_EXT))
            return true;
    return false;
}

/*
 * List directory @p d at *@p listed_ms into @p files; a repair of a directory with chunks
 * lists it again under its chunks lock (docs/SHARING.md §6), held in *@p lock (else -1), so
 * that every tail a put published before the lock is seen. @return 0, or < 0 to pass the
 * directory over, as the scan does when it cannot read one.
 */
static int list_dir(const struct check *c, const char *d, char ***files, size_t *nf,
                    int64_t *listed_ms, int *lock)
{
    *lock = -1;
    *listed_ms = kvt_now_ms();
    int rc = kvt_store_names(d, false, files, nf);
    if (rc < 0 || !c->co->repair || !has_chunk(*files, *nf))
        return rc;
    *lock = kvt_chunks_lock(d, true);
    if (*lock < 0)
        return 0; /* puts kept it: no chunk is called unneeded this time */
    kvt_store_free_names(*files, *nf);
    *listed_ms = kvt_now_ms();
    rc = kvt_store_names(d, false, files, nf);
    if (rc < 0) {
        kvt_io()->close(*lock);
        *lock = -1;
    }
    return rc;
}

static int check_files(const struct check *c, const char *root)
{
    char **dirs, **files;
    size_t nd, nf;
    int rc = kvt_store_names(root, true, &dirs, &nd);
    if (rc < 0)
        return rc == -ENOENT ? 0 : kvt_fail(rc, "%s: cannot list: %s", root, kvt_strerror(rc));
    for (size_t i = 0; i < nd; i++) {
        char *d = kvt_path_join(root, dirs[i]);
        int64_t listed_ms;
        int lock;
        if (!d || list_dir(c, d, &files, &nf, &listed_ms, &lock) < 0) {
            free(d);
            continue;
        }
        struct kvt_hmap needed = {0};
        bool complete = (lock >= 0 || !c->co->repair || !has_chunk(files, nf)) &&
                        collect_needed(d, files, nf, &needed);
        for (size_t j = 0; j < nf; j++) {
            char *p = kvt_path_join(d, files[j]);
            if (p)
                check_file(c, files[j], p, complete ? &needed : NULL, listed_ms);
            free(p);
        }
        if (lock >= 0)
            kvt_io()->close(lock);
        kvt_hmap_each(&needed, free_path, NULL);
        kvt_hmap_free(&needed);
        kvt_store_free_names(files, nf);
        free(d);
    }
    kvt_store_free_names(dirs, nd);
    return 0;
}

static int lru_cmp(const void *x, const void *y)
{
    const struct kvt_store_record *a = x, *b = y;
    if (a->mtime_ms != b->mtime_ms)
        return a->mtime_ms < b->mtime_ms ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* Report the victims of a cap of co->max_bytes, oldest first; a repair then opens the store
 * with that cap, which evicts exactly them (STORE.md §12.6). */
static int check_cap(const struct check *c, const char *dir)
{
    struct kvt_store_opts o = *c->so;
    o.read_only = true;
    kvt_store *s;
    int rc = kvt_store_open(dir, &o, &s);
    if (rc < 0)
        return rc;
    struct kvt_store_record *v;
    size_t n;
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    rc = kvt_store_list(s, &v, &n);
    kvt_store_close(s);
    if (rc < 0)
        return rc;
    qsort(v, n, sizeof(*v), lru_cmp);
    uint64_t total = st.total_bytes;
    for (size_t k = 0; k < n && total > c->co->max_bytes; k++) {
        char why[48];
        snprintf(why, sizeof(why), "%zu tokens", v[k].n_tokens);
        if (c->co->report)
            c->co->report(c->co->ud, KVT_CHECK_EVICT, v[k].path, v[k].bytes, why, 0);
        total -= v[k].bytes;
    }
    kvt_store_list_free(v);
    if (!c->co->repair)
        return 0;
    o = *c->so;
    o.max_bytes = c->co->max_bytes;
    rc = kvt_store_open(dir, &o, &s);
    kvt_store_close(s);
    return rc;
}

int kvt_store_check(const char *dir, const struct kvt_store_opts *so,
                    const struct kvt_check_opts *co)
{
    if (!dir || !so || !co || !so->config_fingerprint ||
        !kvt_layout_valid_name(so->config_fingerprint))
        return kvt_fail(-EINVAL, "kvt_store_check: no directory, options or fingerprint");
    if (so->tmp_grace_ms < 0)
        return kvt_fail(-EINVAL, "kvt_store_check: tmp_grace_ms %lld is negative",
                        (long long)so->tmp_grace_ms);
    struct check c = {so, co, so->tmp_grace_ms};
    int rc = 0;
    if (co->files) {
        char *root = kvt_path_join(dir, so->config_fingerprint);
        rc = root ? check_files(&c, root) : -ENOMEM;
        free(root);
    }
    if (rc == 0 && co->max_bytes)
        rc = check_cap(&c, dir);
    return rc;
}
