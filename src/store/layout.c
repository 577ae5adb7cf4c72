/*
 * Store directory layout: namespace directory names (FORMAT.md §8), entry names (random v4
 * UUIDs), durable directory creation (STORE.md §12.3) and the sorted listing of a directory.
 */
#include "store/layout.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "io/io.h"
#include "kvtier.h"

void kvt_ns_hash(const char *ns, char out[17])
{
    if (!ns || !ns[0]) {
        memcpy(out, "base", 5);
        return;
    }
    snprintf(out, 17, "%" PRIx64, kvt_wyhash(0, ns, strlen(ns)));
}

int kvt_uuid_v4(char out[KVT_UUID_LEN + 1])
{
    uint8_t b[16];
    size_t got = 0;
    while (got < sizeof(b)) {
        ssize_t r = getrandom(b + got, sizeof(b) - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        got += (size_t)r;
    }
    b[6] = (uint8_t)((b[6] & 0x0f) | 0x40); /* version 4 */
    b[8] = (uint8_t)((b[8] & 0x3f) | 0x80); /* variant 10xx */
    static const char hex[] = "0123456789abcdef";
    char *p = out;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            *p++ = '-';
        *p++ = hex[b[i] >> 4];
        *p++ = hex[b[i] & 15];
    }
    *p = '\0';
    return 0;
}

bool kvt_layout_valid_name(const char *name)
{
    return name && name[0] && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..");
}

bool kvt_layout_has_suffix(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);
    return n >= k && !memcmp(name + n - k, suffix, k);
}

char *kvt_path_join(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    while (na > 1 && a[na - 1] == '/')
        na--;
    char *p = malloc(na + 1 + nb + 1);
    if (!p)
        return NULL;
    memcpy(p, a, na);
    p[na] = '/';
    memcpy(p + na + 1, b, nb + 1);
    return p;
}

static int is_dir(const char *path)
{
    struct stat st;
    int rc = kvt_io()->stat(path, &st, 0);
    if (rc != 0)
        return rc;
    return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

int kvt_mkdir_durable(const char *path)
{
    if (!path || !path[0])
        return -EINVAL;
    if (is_dir(path) == 0)
        return 0;
    char *buf = strdup(path);
    if (!buf)
        return -ENOMEM;
    size_t len = strlen(buf);
    while (len > 1 && buf[len - 1] == '/')
        buf[--len] = '\0';
    int rc = 0;
    /* Each prefix ending at a '/' (then the whole path) is one level to create. */
    for (size_t i = 1; i <= len && rc == 0; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char saved = buf[i];
        buf[i] = '\0';
        rc = kvt_io()->mkdirat(AT_FDCWD, buf, 0755);
        if (rc == 0) {
            char *slash = strrchr(buf, '/');
            if (!slash)
                rc = kvt_io_fsync_dir(".");
            else if (slash == buf)
                rc = kvt_io_fsync_dir("/");
            else {
                *slash = '\0';
                rc = kvt_io_fsync_dir(buf);
                *slash = '/';
            }
        } else if (rc == -EEXIST) {
            rc = is_dir(buf);
        }
        buf[i] = saved;
    }
    free(buf);
    return rc;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void kvt_store_free_names(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

struct name_list {
    const char *path;
    bool dirs_only;
    char **v;
    size_t n, cap;
};

static int add_name(void *ud, const char *name, unsigned char type)
{
    struct name_list *l = ud;
    if (l->dirs_only && type != DT_DIR) {
        if (type != DT_UNKNOWN && type != DT_LNK)
            return 0;
        struct stat st;
        char *p = kvt_path_join(l->path, name);
        int rc = p ? kvt_io()->stat(p, &st, 0) : -ENOMEM;
        free(p);
        if (rc == -ENOENT || (rc == 0 && !S_ISDIR(st.st_mode)))
            return 0;
        if (rc < 0)
            return rc; /* a directory that cannot be told from a file fails the listing */
    }
    if (l->n == l->cap) {
        size_t c = l->cap ? l->cap * 2 : 64;
        char **nv = realloc(l->v, c * sizeof(*nv));
        if (!nv)
            return -ENOMEM;
        l->v = nv;
        l->cap = c;
    }
    if (!(l->v[l->n] = strdup(name)))
        return -ENOMEM;
    l->n++;
    return 0;
}

int kvt_store_names(const char *path, bool dirs_only, char ***out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    struct name_list l = {.path = path, .dirs_only = dirs_only};
    int rc = kvt_io()->list_dir(path, add_name, &l);
    if (rc < 0) {
        kvt_store_free_names(l.v, l.n);
        return rc;
    }
    char **v = l.v;
    size_t n = l.n;
    if (n)
        qsort(v, n, sizeof(*v), name_cmp);
    *out = v;
    *n_out = n;
    return 0;
}
