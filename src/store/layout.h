/*
 * Store directory layout (STORE.md §2, §12.3): <dir>/<config_fingerprint>/<nsHash(ns)>/
 * <uuid>.mlxkv, random v4 UUIDs, and directory creation that fsyncs the parent of every
 * directory it creates.
 */
#ifndef KVT_STORE_LAYOUT_H
#define KVT_STORE_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>

#define KVT_ENTRY_EXT ".mlxkv"
#define KVT_TMP_EXT ".tmp"
#define KVT_CORRUPT_EXT ".corrupt"
#define KVT_UUID_LEN 36

/** A lowercase canonical v4 UUID from getrandom() into @p out. 0 or -errno. */
int kvt_uuid_v4(char out[KVT_UUID_LEN + 1]);
/** Whether @p name is usable as one directory name: non-empty, no '/', not "." or "..". */
bool kvt_layout_valid_name(const char *name);
/** Whether @p name ends with @p suffix. */
bool kvt_layout_has_suffix(const char *name, const char *suffix);
/**
 * Create @p path and any missing parents (mode 0755); after creating each directory fsync its
 * parent. Existing directories are fine. 0 or -errno.
 */
int kvt_mkdir_durable(const char *path);
/** "<a>/<b>" (malloc'd), or NULL. */
char *kvt_path_join(const char *a, const char *b);

/** The sorted entry names of @p path (subdirectories only when @p dirs_only); 0 or -errno. */
int kvt_store_names(const char *path, bool dirs_only, char ***out, size_t *n_out);
void kvt_store_free_names(char **v, size_t n);

#endif
