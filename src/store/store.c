/*
 * The store's public calls (STORE.md): open with recovery, find, restore with the LRU bump,
 * synchronous put with dedup, supersession and eviction, has_durable_prefix, refresh, stats
 * and listing. Every call is thread-safe; the lock covers index work only, never file I/O, so
 * find never waits for a write.
 *
 * Failure handling (STORE.md §12.1): a restore failure is a miss, never an error. By the
 * error category of the load: -ENOENT (deleted by another process) is a silent miss; CORRUPT
 * drops the record and deletes the file, or renames it to <name>.mlxkv.corrupt when the
 * store quarantines (opts.quarantine; deletion is the default, like the reference, since a
 * corrupt entry can never be served); FORMAT, UNSUPPORTED and MISMATCH drop the record and
 * keep the file, remembered as skipped; other OS errors drop the record and keep the file,
 * which the next refresh re-admits. A put failure is soft: partial files are unlinked, the
 * first failure of the store is logged with the reference's message, counters move on.
 */
#include "store/store_parts.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/error.h"
#include "common/serial.h"
#include "format/format.h"
#include "io/io.h"
#include "settings/settings.h"
#include "store/layout.h"
#include "store/share.h"

#define DEFAULT_MAX_BYTES ((uint64_t)32 << 30)
#define DEFAULT_TMP_GRACE_MS 60000

static void free_dir(void *val, void *ud)
{
    (void)ud;
    kvt_sdir_free(val);
}

static void free_pending(void *val, void *ud)
{
    (void)ud;
    free(val);
}

void kvt_store_close(kvt_store *s)
{
    if (!s)
        return;
    kvt_index_free(s->ix);
    kvt_hmap_each(&s->dirs, free_dir, NULL);
    kvt_hmap_free(&s->dirs);
    kvt_hmap_each(&s->pending, free_pending, NULL);
    kvt_hmap_free(&s->pending);
    kvt_chunks_free(s);
    pthread_mutex_destroy(&s->lock);
    pthread_mutex_destroy(&s->scan_lock);
    pthread_mutex_destroy(&s->log_lock);
    free(s->root);
    free(s->model_id);
    free(s->fingerprint);
    free(s->tokenizer_hash);
    free(s);
}

/** Evict to the cap and unlink the victims (outside the lock). */
static void evict(struct kvt_store *s)
{
    struct kvt_pathlist pl = {0};
    pthread_mutex_lock(&s->lock);
    kvt_store_evict_locked(s, &pl);
    pthread_mutex_unlock(&s->lock);
    kvt_store_remove_paths(s, &pl);
}

void kvt_store_opts_init(struct kvt_store_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->max_bytes = DEFAULT_MAX_BYTES;
    o->max_header_bytes = KVT_DEFAULT_MAX_HEADER;
    o->tmp_grace_ms = DEFAULT_TMP_GRACE_MS;
}

/* kvt_store_open()'s arguments, the memory settings among them (checked, not applied). */
static int check_open_args(const char *dir, const struct kvt_store_opts *o)
{
    if (!dir || !dir[0] || !o)
        return kvt_fail(-EINVAL, "kvt_store_open: no directory or options");
    if (!o->model_id || !o->config_fingerprint || !o->tokenizer_hash)
        return kvt_fail(-EINVAL, "kvt_store_open: model_id, config_fingerprint and "
                                 "tokenizer_hash are required");
    if (!kvt_layout_valid_name(o->config_fingerprint))
        return kvt_fail(-EINVAL,
                        "kvt_store_open: config_fingerprint \"%s\" is not a directory "
                        "name",
                        o->config_fingerprint);
    if (o->max_bytes == 0 || o->max_header_bytes == 0 || o->tmp_grace_ms < 0)
        return kvt_fail(-EINVAL,
                        "kvt_store_open: max_bytes and max_header_bytes must be positive and "
                        "tmp_grace_ms not negative (start from kvt_store_opts_init())");
    return kvt_mem_check(o->mem);
}

int kvt_store_open(const char *dir, const struct kvt_store_opts *o, kvt_store **out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_store_open: no output");
    *out = NULL;
    int rc = check_open_args(dir, o);
    if (rc < 0)
        return rc;
    struct kvt_store *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    rc = -ENOMEM;
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->scan_lock, NULL);
    pthread_mutex_init(&s->log_lock, NULL);
    s->root = kvt_path_join(dir, o->config_fingerprint);
    s->model_id = strdup(o->model_id);
    s->fingerprint = strdup(o->config_fingerprint);
    s->tokenizer_hash = strdup(o->tokenizer_hash);
    if (!s->root || !s->model_id || !s->fingerprint || !s->tokenizer_hash ||
        kvt_index_new(&s->ix) < 0)
        goto out_free;
    s->max_bytes = o->max_bytes;
    s->n_layers = o->n_layers;
    s->max_header_bytes = o->max_header_bytes;
    s->no_verify = o->no_verify;
    s->quarantine = o->quarantine;
    s->keep_saved_cached = o->keep_saved_cached;
    s->read_only = o->read_only;
    s->share = o->share_prefixes;
    s->tmp_grace_ms = o->tmp_grace_ms;
    s->log = o->log;
    s->log_ud = o->log_ud;
    s->serial = kvt_serial_next();

    if (!s->read_only) {
        rc = kvt_mkdir_durable(s->root);
        if (rc < 0) {
            kvt_fail(rc, "%s: cannot create the store directory: %s", s->root, kvt_strerror(rc));
            goto out_free;
        }
    }
    rc = kvt_store_scan(s, true);
    if (rc < 0)
        goto out_free;
    evict(s); /* STORE.md §12.6: a lowered cap applies at open */
    /* the process changes only once the store exists (the settings were checked above) */
    if (o->mem)
        kvt_mem_configure(o->mem);
    *out = s;
    return 0;

out_free:
    kvt_store_close(s);
    return rc;
}

int kvt_store_refresh(kvt_store *s)
{
    if (!s)
        return kvt_fail(-EINVAL, "kvt_store_refresh: no store");
    int rc = kvt_store_scan(s, true);
    evict(s);
    return rc;
}

int kvt_store_find(kvt_store *s, const int32_t *tok, size_t n, const char *ns, struct kvt_hit *hit)
{
    if (!hit)
        return kvt_fail(-EINVAL, "kvt_store_find: no hit");
    memset(hit, 0, sizeof(*hit));
    if (!s || (!tok && n))
        return kvt_fail(-EINVAL, "kvt_store_find: no store or tokens");
    pthread_mutex_lock(&s->lock);
    size_t plen;
    struct kvt_rec *r = kvt_index_find(s->ix, ns, tok, n, &plen);
    if (r) {
        hit->prefix_len = plen;
        hit->n_tokens = r->n_tokens;
        hit->id = r->seq;
        hit->trimmable = r->trimmable;
    }
    hit->store = s->serial;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

bool kvt_store_has_durable_prefix(kvt_store *s, const int32_t *tok, size_t n, const char *ns)
{
    if (!s || (!tok && n))
        return false;
    pthread_mutex_lock(&s->lock);
    bool yes = kvt_index_has_durable_prefix(s->ix, ns, tok, n);
    pthread_mutex_unlock(&s->lock);
    return yes;
}

static double mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/** What restore needs from a record, copied under the lock. */
struct restore_job {
    uint64_t id;
    char *path, *ns;
    int32_t *tokens;
    size_t n_tokens;
};

static int restore_job_get(struct kvt_store *s, uint64_t id, struct restore_job *j)
{
    memset(j, 0, sizeof(*j));
    pthread_mutex_lock(&s->lock);
    struct kvt_rec *r = kvt_index_by_seq(s->ix, id);
    int rc = -ENOENT;
    if (r) {
        rc = -ENOMEM;
        j->id = id;
        j->n_tokens = r->n_tokens;
        j->path = strdup(r->path);
        j->ns = strdup(kvt_rec_ns(r));
        j->tokens = malloc((r->n_tokens ? r->n_tokens : 1) * sizeof(*j->tokens));
        if (j->path && j->ns && j->tokens) {
            kvt_rec_tokens(r, j->tokens);
            rc = 0;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static void restore_job_free(struct restore_job *j)
{
    free(j->path);
    free(j->ns);
    free(j->tokens);
}

/*
 * A chunk of a shared entry failed for good (docs/SHARING.md §7): drop every entry that needs
 * it, remove their tails (useless without it) and the chunk (corrupt, or gone already).
 */
static void chunk_lost(struct kvt_store *s, const struct restore_job *j, int rc, const char *bad)
{
    char *why = strdup(kvt_last_error()[0] ? kvt_last_error() : kvt_strerror(rc));
    const char *msg = why ? why : kvt_strerror(rc);
    kvt_store_logf(s, KVT_LOG_WARN,
                   "[ssd-cache] restore failed, dropping %s and every entry that needs %s: %s",
                   j->path, bad, msg);
    struct kvt_pathlist pl = {0};
    pthread_mutex_lock(&s->lock);
    s->restore_misses++;
    struct kvt_rec *r = kvt_index_by_seq(s->ix, j->id);
    if (r)
        kvt_store_drop_locked(s, r, s->read_only ? NULL : &pl);
    kvt_share_drop_dependents_locked(s, bad, s->read_only ? NULL : &pl);
    pthread_mutex_unlock(&s->lock);
    if (rc != -ENOENT && !s->read_only) /* first: the list below may hold it too */
        kvt_store_dispose_corrupt(s, bad, msg);
    kvt_store_remove_paths(s, &pl);
    free(why);
}

/** STORE.md §12.1, restore column: drop the record, act on the file by category. */
static void restore_failed(struct kvt_store *s, const struct restore_job *j, int rc,
                           const char *bad_chunk)
{
    if (bad_chunk && (rc == -ENOENT || rc == KVT_E_CORRUPT || rc == KVT_E_FORMAT ||
                      rc == KVT_E_UNSUPPORTED || rc == KVT_E_MISMATCH)) {
        chunk_lost(s, j, rc, bad_chunk);
        return;
    }
    char *why = strdup(kvt_last_error()[0] ? kvt_last_error() : kvt_strerror(rc));
    const char *msg = why ? why : kvt_strerror(rc);
    struct stat st;
    bool have_st = rc != -ENOENT && kvt_io()->stat(j->path, &st, 0) == 0;
    bool skip = rc == KVT_E_FORMAT || rc == KVT_E_UNSUPPORTED || rc == KVT_E_MISMATCH;

    if (rc == KVT_E_CORRUPT && !s->read_only)
        kvt_store_logf(s, KVT_LOG_WARN, "[ssd-cache] restore failed, dropping %s: %s", j->path,
                       msg);
    else if (rc != -ENOENT)
        kvt_store_logf(s, KVT_LOG_WARN,
                       "[ssd-cache] restore failed, dropping %s from the index (file kept): %s",
                       j->path, msg);

    pthread_mutex_lock(&s->lock);
    s->restore_misses++;
    struct kvt_rec *r = kvt_index_by_seq(s->ix, j->id);
    struct kvt_sdir *d = r ? r->owner : NULL;
    if (r)
        kvt_store_drop_locked(s, r, NULL);
    if (d && have_st) {
        if (skip || (rc == KVT_E_CORRUPT && s->read_only))
            kvt_skip_set_locked(d, j->path, (uint64_t)st.st_size, &st.st_mtim, false);
        else if (rc != KVT_E_CORRUPT) /* an OS error: let the next refresh retry it */
            d->recheck = true;
    }
    pthread_mutex_unlock(&s->lock);

    if (rc == KVT_E_CORRUPT && !s->read_only)
        kvt_store_dispose_corrupt(s, j->path, msg);
    free(why);
}

/*
 * How a restore loads its file: into new caches (kvt_file_load), or into memory the caller
 * owns through a loader (kvt_store_restore_with), whose failure may be the caller's refusal
 * rather than the file's fault.
 */
struct restore_load {
    kvt_restore_load_fn load; /* NULL: new caches into e */
    void *ud;
    bool refused;
    struct kvt_entry *e;
    struct kvt_header *h;
    char *bad_chunk; /* a shared entry's chunk that failed */
};

static int load_file(struct restore_load *l, const char *path, const struct kvt_expect *x,
                     const struct restore_job *j)
{
    const int32_t *tok;
    size_t n;
    int rc;
    if (kvt_is_tail(path) && !l->load) {
        rc = kvt_share_load(path, x, &l->e, &l->bad_chunk);
        tok = rc ? NULL : l->e->tokens;
        n = rc ? 0 : l->e->n_tokens;
    } else if (l->load) {
        rc = l->load(l->ud, path, x, &l->h, &l->refused, &l->bad_chunk);
        tok = rc ? NULL : l->h->tokens;
        n = rc ? 0 : l->h->n_tokens;
    } else {
        rc = kvt_file_load(path, x, &l->e, NULL);
        tok = rc ? NULL : l->e->tokens;
        n = rc ? 0 : l->e->n_tokens;
    }
    if (rc == 0 && (n != j->n_tokens || (n && memcmp(tok, j->tokens, n * sizeof(int32_t)))))
        rc = kvt_fail(KVT_E_MISMATCH, "%s: tokens differ from the indexed ones", path);
    if (rc) {
        kvt_entry_free(l->e);
        kvt_header_free(l->h);
        l->e = NULL;
        l->h = NULL;
    }
    return rc;
}

/* kvt_store_restore() and kvt_store_restore_into(): 0 with l->e or l->h set, 0 with neither
 * on a miss, or the placement's refusal. */
static int restore(kvt_store *s, const struct kvt_hit *hit, struct restore_load *l)
{
    if (hit->prefix_len == 0)
        return 0;
    if (hit->store != s->serial) /* its id names a record of another index */
        return kvt_fail(-EINVAL,
                        "restore: the hit is of another store (found in store %u, "
                        "restored in store %u)",
                        hit->store, s->serial);
    struct restore_job j;
    int rc = restore_job_get(s, hit->id, &j);
    if (rc < 0) {
        pthread_mutex_lock(&s->lock);
        s->restore_misses++; /* evicted or superseded since the find */
        pthread_mutex_unlock(&s->lock);
        restore_job_free(&j);
        return 0;
    }

    double t0 = mono_ms();
    struct kvt_expect x = {
        .model_id = s->model_id,
        .config_fingerprint = s->fingerprint,
        .tokenizer_hash = s->tokenizer_hash,
        .ns = j.ns,
        .n_layers = s->n_layers,
        .no_verify = s->no_verify,
        .max_header_bytes = s->max_header_bytes,
    };
    kvt_clear_error();
    rc = load_file(l, j.path, &x, &j);
    if (rc < 0) {
        if (!l->refused)
            restore_failed(s, &j, rc, l->bad_chunk);
        free(l->bad_chunk);
        restore_job_free(&j);
        return l->refused ? rc : 0;
    }
    if (!s->read_only)
        kvt_io()->utimens(j.path, NULL); /* the LRU bump on disk; errors ignored */
    double ms = mono_ms() - t0;
    int64_t now = kvt_now_ms();
    pthread_mutex_lock(&s->lock);
    struct kvt_rec *r = kvt_index_by_seq(s->ix, j.id);
    if (r)
        kvt_index_touch(s->ix, r, now);
    s->restores++;
    s->restore_ms_last = ms;
    pthread_mutex_unlock(&s->lock);
    restore_job_free(&j);
    return 0;
}

int kvt_store_restore(kvt_store *s, const struct kvt_hit *hit, struct kvt_entry **out)
{
    if (!out)
        return kvt_fail(-EINVAL, "kvt_store_restore: no output");
    *out = NULL;
    if (!s || !hit)
        return kvt_fail(-EINVAL, "kvt_store_restore: no store or hit");
    struct restore_load l = {0};
    int rc = restore(s, hit, &l);
    *out = l.e;
    return rc;
}

int kvt_store_restore_with(kvt_store *s, const struct kvt_hit *hit, kvt_restore_load_fn load,
                           void *ud, struct kvt_header **out_header)
{
    struct restore_load l = {.load = load, .ud = ud};
    int rc = restore(s, hit, &l);
    *out_header = l.h;
    return rc;
}

/* kvt_store_restore_into()'s loader: the caller's placement @p ud, its refusal told apart. */
static int load_placed(void *ud, const char *path, const struct kvt_expect *x,
                       struct kvt_header **h, bool *refused, char **bad_chunk)
{
    struct kvt_placement *p = ud;
    p->refused = refused;
    if (kvt_is_tail(path))
        return kvt_share_load_into(path, x, p, h, bad_chunk);
    return kvt_file_load_placed(path, x, p, h);
}

int kvt_store_restore_into(kvt_store *s, const struct kvt_hit *hit, kvt_place_fn place, void *ud,
                           struct kvt_header **out_header)
{
    if (!out_header)
        return kvt_fail(-EINVAL, "kvt_store_restore_into: no output");
    *out_header = NULL;
    if (!s || !hit || !place)
        return kvt_fail(-EINVAL, "kvt_store_restore_into: no store, hit or placement");
    struct kvt_placement p = {.host = place, .ud = ud};
    return kvt_store_restore_with(s, hit, load_placed, &p, out_header);
}

/** FORMAT.md V21 for a live entry: what the store writes it must be able to index. */
static int check_indexable(const struct kvt_entry *e)
{
    for (size_t i = 0; i < e->n_caches; i++) {
        struct kvt_cache_info info;
        if (!e->caches[i])
            return kvt_fail(-EINVAL, "kvt_store_put: cache %zu is NULL", i);
        kvt_cache_get_info(e->caches[i], &info);
        if (info.kind != KVT_KIND_SSM && (info.offset < 0 || (uint64_t)info.offset != e->n_tokens))
            return kvt_fail(-EINVAL,
                            "kvt_store_put: cache %zu covers %lld tokens, the entry has "
                            "%zu (V21)",
                            i, (long long)info.offset, e->n_tokens);
    }
    return 0;
}

static int put_failed(struct kvt_store *s, int rc, const char *path)
{
    char *why = strdup(kvt_last_error()[0] ? kvt_last_error() : kvt_strerror(rc));
    if (path) {
        size_t n = strlen(path);
        char *tmp = malloc(n + sizeof(KVT_TMP_EXT));
        kvt_io()->unlinkat(AT_FDCWD, path, 0);
        if (tmp) {
            memcpy(tmp, path, n);
            memcpy(tmp + n, KVT_TMP_EXT, sizeof(KVT_TMP_EXT));
            kvt_io()->unlinkat(AT_FDCWD, tmp, 0);
            free(tmp);
        }
    }
    pthread_mutex_lock(&s->lock);
    if (path)
        kvt_pending_del_locked(s, path);
    s->store_failures++;
    bool warn = rc != KVT_E_REFUSED && rc != KVT_E_TOO_LARGE && !s->warned_store_failure;
    if (warn)
        s->warned_store_failure = true;
    pthread_mutex_unlock(&s->lock);
    if (warn)
        kvt_store_logf(s, KVT_LOG_WARN,
                       "[ssd-cache] store failed (disk full or unwritable?) — cold tier disabled "
                       "for this entry: %s",
                       why ? why : kvt_strerror(rc));
    if (why) {
        kvt_fail(rc, "%s", why);
        free(why);
    }
    return rc;
}

static int too_large(struct kvt_store *s, uint64_t bytes)
{
    kvt_store_logf(s, KVT_LOG_WARN,
                   "[ssd-cache] entry not stored: %llu bytes exceeds the %llu-byte cap",
                   (unsigned long long)bytes, (unsigned long long)s->max_bytes);
    pthread_mutex_lock(&s->lock);
    s->store_failures++;
    pthread_mutex_unlock(&s->lock);
    return kvt_fail(KVT_E_TOO_LARGE, "entry of %llu bytes exceeds the %llu-byte cap",
                    (unsigned long long)bytes, (unsigned long long)s->max_bytes);
}

/** <root>/<nsHash>/<uuid>.mlxkv, registered as pending; the directory exists on return. */
static int new_entry_path(struct kvt_store *s, const char *ns, const char *ext,
                          struct kvt_sdir **dir, char **out)
{
    char nsdir[17], uuid[KVT_UUID_LEN + 1], name[KVT_UUID_LEN + sizeof(KVT_SHARE_EXT)];
    kvt_ns_hash(ns, nsdir);
    int rc = kvt_uuid_v4(uuid);
    if (rc < 0)
        return kvt_fail(rc, "cannot draw a random entry name");
    pthread_mutex_lock(&s->lock);
    struct kvt_sdir *d = kvt_sdir_get(s, nsdir, true);
    pthread_mutex_unlock(&s->lock);
    if (!d)
        return -ENOMEM;
    rc = kvt_mkdir_durable(d->path);
    if (rc < 0)
        return kvt_fail(rc, "%s: cannot create the namespace directory: %s", d->path,
                        kvt_strerror(rc));
    memcpy(name, uuid, KVT_UUID_LEN);
    strcpy(name + KVT_UUID_LEN, ext);
    char *path = kvt_path_join(d->path, name);
    if (!path)
        return -ENOMEM;
    pthread_mutex_lock(&s->lock);
    rc = kvt_pending_add_locked(s, path);
    pthread_mutex_unlock(&s->lock);
    if (rc < 0) {
        free(path);
        return rc;
    }
    *dir = d;
    *out = path;
    return 0;
}

/* Index a published entry (STORE.md §9 steps 3-6: supersession, insert, eviction), then take
 * the directory's new mtime as this process's own change. On failure the file goes. */
static int index_new(struct kvt_store *s, const struct kvt_entry *e, const char *ns,
                     struct kvt_sdir *d, const char *path, uint64_t bytes,
                     const uint64_t *chunk_sizes)
{
    bool trimmable = kvt_entry_is_trimmable(e);
    struct kvt_pathlist pl = {0};
    struct kvt_rec **sup = NULL, *r = NULL;
    size_t n_sup = 0;
    pthread_mutex_lock(&s->lock);
    kvt_pending_del_locked(s, path);
    int rc = kvt_index_superseded(s->ix, ns, e->tokens, e->n_tokens, trimmable, &sup, &n_sup);
    if (rc == 0)
        rc = kvt_index_insert(s->ix, ns, e->tokens, e->n_tokens, trimmable, bytes, kvt_now_ms(),
                              path, &r);
    if (rc == 0) {
        r->owner = d;
        if ((rc = kvt_hmap_put(&d->recs, kvt_str_hash(path), r)) == 0 && chunk_sizes &&
            (rc = kvt_chunks_ref_locked(s, r, chunk_sizes)) < 0) /* before a supersession */
            kvt_hmap_del(&d->recs, kvt_str_hash(path), r);
        if (rc < 0)
            kvt_index_remove(s->ix, r);
    }
    if (rc == 0) {
        for (size_t i = 0; i < n_sup; i++)
            kvt_store_drop_locked(s, sup[i], &pl);
        s->spills++;
        kvt_store_evict_locked(s, &pl);
    }
    pthread_mutex_unlock(&s->lock);
    free(sup);
    kvt_store_remove_paths(s, &pl);
    if (rc == 0) {
        kvt_store_note_own_change(s, d);
        return 0;
    }
    kvt_fail(rc, "%s: written but not indexed: out of memory", path);
    return put_failed(s, rc, path);
}

/*
 * Write @p w to @p path: planned whole, or, for a tail, as its shared chunks and the tail, with
 * the sizes of the chunks it needs in *@p sizes (docs/SHARING.md §3).
 */
static int write_entry(const struct kvt_entry *w, struct kvt_save_plan *plan,
                       const struct kvt_save_opts *so, const struct kvt_sdir *d, const char *path,
                       uint64_t *bytes, uint64_t **sizes)
{
    if (!kvt_is_tail(path))
        return kvt_file_save_planned(path, plan, bytes);
    struct kvt_share_saved sv;
    int rc = kvt_share_save(d->path, path, w, so, &sv);
    *bytes = sv.tail_bytes;
    if (rc == 0) /* a chunk removed meanwhile makes the put fail, never a broken entry */
        rc = kvt_chunks_size(d->path, w->tokens, w->n_tokens, sizes);
    return rc;
}

int kvt_store_put(kvt_store *s, const struct kvt_entry *e, kvt_run_exclusive_fn run_exclusive,
                  void *engine)
{
    if (!s || !e || !e->n_caches || !e->caches || (!e->tokens && e->n_tokens))
        return kvt_fail(-EINVAL, "kvt_store_put: no store or entry");
    if (s->read_only)
        return kvt_fail(KVT_E_STATE, "kvt_store_put: the store is read-only");
    int rc = check_indexable(e);
    if (rc < 0)
        return put_failed(s, rc, NULL);

    const char *ns = e->meta.ns ? e->meta.ns : "";
    struct kvt_entry w = *e;
    w.meta.model_id = s->model_id;
    w.meta.config_fingerprint = s->fingerprint;
    w.meta.tokenizer_hash = s->tokenizer_hash;
    w.meta.ns = ns;
    /* planned once: the size checked here is the file the save writes */
    struct kvt_save_opts so = {
        .run_exclusive = run_exclusive, .engine = engine, .keep_cache = s->keep_saved_cached};
    struct kvt_save_plan *plan;
    rc = kvt_save_plan_new(&w, &so, &plan);
    if (rc < 0)
        return put_failed(s, rc, NULL);
    uint64_t planned = kvt_save_plan_bytes(plan);
    if (planned > s->max_bytes) {
        kvt_save_plan_free(plan);
        return too_large(s, planned);
    }

    /* Count other processes' files before this one evicts (STORE.md §12.4): directories whose
     * mtime moved since this process last saw it are listed again, not the unchanged ones. */
    kvt_store_scan(s, false);

    struct kvt_sdir *d = NULL;
    char *path = NULL;
    bool shared = s->share && kvt_share_applies(&w);
    rc = new_entry_path(s, ns, shared ? KVT_SHARE_EXT : KVT_ENTRY_EXT, &d, &path);
    uint64_t bytes = 0, *sizes = NULL;
    if (rc == 0)
        rc = write_entry(&w, plan, &so, d, path, &bytes, &sizes);
    kvt_save_plan_free(plan);
    if (rc < 0) {
        put_failed(s, rc, path);
        free(path);
        return rc;
    }

    rc = index_new(s, e, ns, d, path, bytes, sizes);
    free(sizes);
    free(path);
    return rc;
}

static void count_skip(void *val, void *ud)
{
    struct kvt_store_stats *st = ud;
    st->skipped_files++;
    st->skipped_bytes += ((const struct kvt_skip *)val)->bytes;
}

static void count_dir_skips(void *val, void *ud)
{
    kvt_hmap_each(&((struct kvt_sdir *)val)->skips, count_skip, ud);
}

void kvt_store_get_stats(kvt_store *s, struct kvt_store_stats *st)
{
    memset(st, 0, sizeof(*st));
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    st->entries = kvt_index_count(s->ix);
    st->total_bytes = kvt_index_total_bytes(s->ix);
    st->max_bytes = s->max_bytes;
    st->restores = s->restores;
    st->spills = s->spills;
    st->store_failures = s->store_failures;
    st->evictions = s->evictions;
    st->corrupt_files = s->corrupt_files;
    st->restore_misses = s->restore_misses;
    st->restore_ms_last = s->restore_ms_last;
    st->longest_durable_prefix_tokens = kvt_index_longest(s->ix);
    st->tmp_reaped = s->tmp_reaped;
    st->shared_chunks = s->chunks.n;
    st->shared_bytes = s->chunk_bytes;
    st->total_bytes += s->chunk_bytes;
    kvt_hmap_each(&s->dirs, count_dir_skips, st);
    pthread_mutex_unlock(&s->lock);
}

int kvt_store_list(kvt_store *s, struct kvt_store_record **out, size_t *n)
{
    if (!out || !n)
        return kvt_fail(-EINVAL, "kvt_store_list: no output");
    *out = NULL;
    *n = 0;
    if (!s)
        return kvt_fail(-EINVAL, "kvt_store_list: no store");
    pthread_mutex_lock(&s->lock);
    struct kvt_rec **recs;
    size_t count;
    int rc = kvt_index_records(s->ix, &recs, &count);
    if (rc < 0)
        goto out_unlock;
    size_t bytes = (count + 1) * sizeof(struct kvt_store_record);
    for (size_t i = 0; i < count; i++)
        bytes += strlen(recs[i]->path) + strlen(kvt_rec_ns(recs[i])) + 2;
    struct kvt_store_record *v = malloc(bytes);
    if (!v) {
        rc = -ENOMEM;
        goto out_free;
    }
    char *str = (char *)(v + count + 1);
    for (size_t i = 0; i < count; i++) {
        const struct kvt_rec *r = recs[i];
        size_t lp = strlen(r->path) + 1, ln = strlen(kvt_rec_ns(r)) + 1;
        v[i] = (struct kvt_store_record){r->seq,
                                         memcpy(str, r->path, lp),
                                         memcpy(str + lp, kvt_rec_ns(r), ln),
                                         r->n_tokens,
                                         r->bytes,
                                         r->mtime_ms,
                                         r->trimmable};
        str += lp + ln;
    }
    *out = v;
    *n = count;
out_free:
    free(recs);
out_unlock:
    pthread_mutex_unlock(&s->lock);
    return rc;
}

void kvt_store_list_free(struct kvt_store_record *v)
{
    free(v);
}

const char *kvt_store_root(const kvt_store *s)
{
    return s ? s->root : NULL;
}
