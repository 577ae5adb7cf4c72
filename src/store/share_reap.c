/*
 * Removing the chunks an eviction or a drop left unneeded by this process's table
 * (docs/SHARING.md §6). Each process counts only the tails it has indexed, and another
 * process may have published a branch of the same prompt since this one last listed the
 * directory. So a chunk goes only after a fresh listing under the directory's chunks lock
 * (kvt_chunks_lock(), which a put holds shared from its first chunk to its tail's
 * publication): every tail there that this process has not indexed is read, and the chunk
 * stays if one of them needs it. A put that starts after the listing finds the chunk gone and
 * writes it again; and a chunk used a grace before the listing is left in any case.
 */
#include "store/store_parts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "io/io.h"
#include "store/layout.h"
#include "store/share.h"

struct marks {
    const char *dir;
    char *const *cands;
    size_t n;
    bool *needed;
};

static int mark_one(void *ud, size_t k, const char *id)
{
    (void)k;
    struct marks *m = ud;
    char *path = kvt_share_chunk_path(m->dir, id);
    if (!path)
        return -ENOMEM;
    for (size_t i = 0; i < m->n; i++)
        m->needed[i] |= !strcmp(path, m->cands[i]);
    free(path);
    return 0;
}

/* Mark the candidates the tail @p path needs; false when it cannot be read (then any may be
 * needed). */
static bool tail_marks(const struct kvt_store *s, const char *path, struct marks *m)
{
    struct kvt_read_opts ro = {.max_header_bytes = s->max_header_bytes};
    struct kvt_header *h = NULL;
    int rc = kvt_file_read_header(path, &ro, &h);
    if (rc == -ENOENT)
        return true; /* removed meanwhile: it needs nothing */
    if (rc == 0)
        rc = kvt_share_each_chunk(h->tokens, h->n_tokens, mark_one, m);
    kvt_header_free(h);
    return rc == 0;
}

/* Whether the tails in @p dir that this process has not indexed leave every candidate of
 * @p m marked as they need; listed at *@p listed_ms. */
static bool mark_unknown_tails(struct kvt_store *s, struct marks *m, int64_t *listed_ms)
{
    char **names;
    size_t n;
    *listed_ms = kvt_now_ms();
    if (kvt_store_names(m->dir, false, &names, &n) < 0)
        return false;
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        if (!kvt_layout_has_suffix(names[i], KVT_SHARE_EXT))
            continue;
        char *path = kvt_path_join(m->dir, names[i]);
        if (!path) {
            ok = false;
            break;
        }
        pthread_mutex_lock(&s->lock);
        bool known = kvt_index_by_path(s->ix, path) != NULL;
        pthread_mutex_unlock(&s->lock);
        ok = known || tail_marks(s, path, m);
        free(path);
    }
    kvt_store_free_names(names, n);
    return ok;
}

void kvt_share_reap_dir(struct kvt_store *s, const char *dir, char *const *cands, size_t n)
{
    struct marks m = {dir, cands, n, calloc(n ? n : 1, sizeof(bool))};
    int64_t listed;
    int lock = m.needed ? kvt_chunks_lock(dir, true) : -ENOMEM;
    if (lock < 0 || !mark_unknown_tails(s, &m, &listed)) {
        if (lock >= 0)
            kvt_io()->close(lock);
        free(m.needed);
        return; /* a later scan of the directory removes what no tail needs */
    }
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(&s->lock);
        bool needed = m.needed[i] || kvt_chunk_needed_locked(s, cands[i]);
        pthread_mutex_unlock(&s->lock);
        if (!needed)
            kvt_chunk_remove(cands[i], listed - s->tmp_grace_ms);
    }
    kvt_io()->close(lock);
    free(m.needed);
}

static int path_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The length of the directory part of @p path (up to its last slash). */
static size_t dir_len(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? (size_t)(slash - path) : 0;
}

void kvt_store_remove_paths(struct kvt_store *s, struct kvt_pathlist *pl)
{
    kvt_pathlist_unlink_files(pl); /* a tail gone needs its chunks no more */
    if (pl->n)                     /* a directory's chunks side by side */
        qsort(pl->v, pl->n, sizeof(*pl->v), path_cmp);
    for (size_t a = 0, b; a < pl->n; a = b) {
        size_t len = dir_len(pl->v[a]);
        for (b = a + 1; b < pl->n && dir_len(pl->v[b]) == len && !strncmp(pl->v[a], pl->v[b], len);
             b++)
            ;
        char *dir = strndup(pl->v[a], len);
        if (dir && len)
            kvt_share_reap_dir(s, dir, pl->v + a, b - a);
        free(dir);
    }
    kvt_pathlist_free(pl);
}
