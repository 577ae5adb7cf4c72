/*
 * The chunks of shared entries in the store's bookkeeping (docs/SHARING.md §5-§6): each
 * indexed tail holds a reference on each chunk it needs; a chunk's bytes count towards the
 * cap once, however many tails need it; a chunk no indexed tail needs goes to the caller's
 * path list, whose removal (share_reap.c) first makes sure that no tail on disk needs it.
 */
#include "store/store_parts.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "io/io.h"
#include "store/layout.h"
#include "store/share.h"

bool kvt_is_tail(const char *path)
{
    return path && kvt_layout_has_suffix(path, KVT_SHARE_EXT);
}

struct sizes_job {
    const char *dir;
    uint64_t *sizes;
};

static int size_one(void *ud, size_t k, const char *id)
{
    struct sizes_job *j = ud;
    char *path = kvt_share_chunk_path(j->dir, id);
    if (!path)
        return -ENOMEM;
    struct stat st;
    int rc = kvt_io()->stat(path, &st, 0);
    if (rc == -ENOENT)
        rc = kvt_fail(KVT_E_CORRUPT, "%s: a chunk the entry needs is missing", path);
    else if (rc < 0)
        kvt_fail(rc, "%s: %s", path, kvt_strerror(rc));
    else
        j->sizes[k] = (uint64_t)st.st_size;
    free(path);
    return rc;
}

int kvt_chunks_size(const char *dir, const int32_t *tok, size_t n, uint64_t **sizes)
{
    size_t m = kvt_share_chunks(n);
    struct sizes_job j = {dir, calloc(m ? m : 1, sizeof(uint64_t))};
    if (!j.sizes)
        return -ENOMEM;
    int rc = kvt_share_each_chunk(tok, n, size_one, &j);
    if (rc < 0) {
        free(j.sizes);
        return rc;
    }
    *sizes = j.sizes;
    return 0;
}

static bool chunk_eq(const void *val, const void *key)
{
    return !strcmp(((const struct kvt_chunk *)val)->path, key);
}

static struct kvt_chunk *chunk_get(struct kvt_store *s, const char *path)
{
    return kvt_hmap_get(&s->chunks, kvt_str_hash(path), chunk_eq, path);
}

bool kvt_chunk_needed_locked(struct kvt_store *s, const char *path)
{
    return chunk_get(s, path) != NULL;
}

/* A walk over the chunks of one tail that adds or drops its references. */
struct ref_job {
    struct kvt_store *s;
    const char *dir;
    const uint64_t *sizes; /* adding: the chunks' sizes */
    struct kvt_pathlist *pl;
    size_t limit; /* dropping: only the first limit chunks */
};

static int ref_one(void *ud, size_t k, const char *id)
{
    struct ref_job *j = ud;
    char *path = kvt_share_chunk_path(j->dir, id);
    if (!path)
        return -ENOMEM;
    struct kvt_chunk *c = chunk_get(j->s, path);
    if (c) {
        free(path);
    } else {
        c = calloc(1, sizeof(*c));
        if (!c || kvt_hmap_put(&j->s->chunks, kvt_str_hash(path), c) < 0) {
            free(c);
            free(path);
            j->limit = k;
            return -ENOMEM;
        }
        c->path = path;
        c->bytes = j->sizes[k];
        j->s->chunk_bytes += c->bytes;
    }
    c->refs++;
    return 0;
}

static int unref_one(void *ud, size_t k, const char *id)
{
    struct ref_job *j = ud;
    if (k >= j->limit)
        return 1;
    char *path = kvt_share_chunk_path(j->dir, id);
    struct kvt_chunk *c = path ? chunk_get(j->s, path) : NULL;
    free(path);
    if (!c || --c->refs)
        return 0;
    kvt_hmap_del(&j->s->chunks, kvt_str_hash(c->path), c);
    j->s->chunk_bytes -= c->bytes;
    if (j->pl)
        kvt_pathlist_push(j->pl, c->path); /* failing, a later scan removes it */
    free(c->path);
    free(c);
    return 0;
}

/* Walk the chunks of tail @p r with @p fn. */
static int walk(const struct kvt_rec *r, kvt_chunk_fn fn, struct ref_job *j)
{
    int32_t *tok = malloc((r->n_tokens ? r->n_tokens : 1) * sizeof(*tok));
    if (!tok)
        return -ENOMEM;
    kvt_rec_tokens(r, tok);
    j->dir = ((const struct kvt_sdir *)r->owner)->path;
    int rc = kvt_share_each_chunk(tok, r->n_tokens, fn, j);
    free(tok);
    return rc;
}

int kvt_chunks_ref_locked(struct kvt_store *s, const struct kvt_rec *r, const uint64_t *sizes)
{
    struct ref_job j = {.s = s, .sizes = sizes};
    int rc = walk(r, ref_one, &j);
    if (rc < 0 && j.limit) { /* take back the references counted before the failure */
        struct ref_job back = {.s = s, .limit = j.limit};
        walk(r, unref_one, &back);
    }
    return rc < 0 ? rc : 0;
}

void kvt_chunks_unref_locked(struct kvt_store *s, const struct kvt_rec *r, struct kvt_pathlist *pl)
{
    /* Out of memory here leaves the references counted: the chunks stay until a reopen. */
    struct ref_job j = {.s = s, .pl = pl, .limit = SIZE_MAX};
    walk(r, unref_one, &j);
}

static void free_chunk(void *val, void *ud)
{
    (void)ud;
    struct kvt_chunk *c = val;
    free(c->path);
    free(c);
}

void kvt_chunks_free(struct kvt_store *s)
{
    kvt_hmap_each(&s->chunks, free_chunk, NULL);
    kvt_hmap_free(&s->chunks);
}
