/*
 * Paths collected under the store's lock and removed after it: entries' files at once;
 * chunks stay listed for kvt_store_remove_paths() (share_reap.c).
 */
#include "store/store_parts.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "io/io.h"
#include "store/layout.h"
#include "store/share.h"

int kvt_pathlist_push(struct kvt_pathlist *pl, const char *path)
{
    if (pl->n == pl->cap) {
        size_t cap = pl->cap ? pl->cap * 2 : 8;
        char **v = realloc(pl->v, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        pl->v = v;
        pl->cap = cap;
    }
    char *p = strdup(path);
    if (!p)
        return -ENOMEM;
    pl->v[pl->n++] = p;
    return 0;
}

void kvt_pathlist_unlink_files(struct kvt_pathlist *pl)
{
    size_t kept = 0;
    for (size_t i = 0; i < pl->n; i++) {
        if (kvt_layout_has_suffix(pl->v[i], KVT_CHUNK_EXT)) {
            pl->v[kept++] = pl->v[i];
            continue;
        }
        kvt_io()->unlinkat(AT_FDCWD, pl->v[i], 0);
        free(pl->v[i]);
    }
    pl->n = kept;
}

void kvt_pathlist_free(struct kvt_pathlist *pl)
{
    for (size_t i = 0; i < pl->n; i++)
        free(pl->v[i]);
    free(pl->v);
    *pl = (struct kvt_pathlist){0};
}
