/*
 * Store commands: ls, find, gc, stats (STORE.md). DIR is a store root (<dir>, holding one
 * directory per config fingerprint) or one fingerprint directory. The identity a store is
 * opened with comes from --model-id / --config-fingerprint / --tokenizer-hash, or else from
 * the entries' headers: every distinct identity found is reported on its own. ls, find and
 * stats open stores read-only and change nothing; gc changes files only without --dry-run.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

struct args {
    const char *dir, *model_id, *fingerprint, *tokenizer_hash, *ns, *tokens;
    bool json, dry_run, remove_skipped, have_max;
    uint64_t max_bytes;
    int64_t tmp_grace_ms;
};

struct identity {
    char *model_id, *tokenizer_hash;
};

/** One fingerprint directory: <parent>/<fp>, and the identities to open it with. */
struct target {
    char *parent, *fp, *path;
    struct identity *ids;
    size_t n_ids;
};

static char *join(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    char *p = malloc(na + nb + 2);
    if (p) {
        memcpy(p, a, na);
        p[na] = '/';
        memcpy(p + na + 1, b, nb + 1);
    }
    return p;
}

static bool has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/** Sorted names of the entries of @p path (subdirectories only when @p dirs). */
static char **list(const char *path, bool dirs, size_t *n)
{
    *n = 0;
    DIR *dp = opendir(path);
    if (!dp)
        return NULL;
    size_t cap = 16;
    char **v = malloc(cap * sizeof(*v));
    struct dirent *de;
    while (v && (de = readdir(dp))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (dirs) {
            char *p = join(path, de->d_name);
            bool d = p && is_dir(p);
            free(p);
            if (!d)
                continue;
        }
        if (*n == cap) {
            char **nv = realloc(v, (cap *= 2) * sizeof(*v));
            if (!nv)
                break;
            v = nv;
        }
        if (!(v[*n] = strdup(de->d_name)))
            break;
        (*n)++;
    }
    closedir(dp);
    for (size_t i = 1; v && i < *n; i++)
        for (size_t j = i; j > 0 && strcmp(v[j - 1], v[j]) > 0; j--) {
            char *t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v;
}

static void free_list(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

static bool is_store_file(const char *name)
{
    return has_suffix(name, ".mlxkv") || has_suffix(name, ".mlxkv.tmp") ||
           has_suffix(name, ".mlxkv.corrupt") || has_suffix(name, ".kvshare") ||
           has_suffix(name, ".kvchunk"); /* shared entries: docs/SHARING.md */
}

/** Whether @p dir looks like a fingerprint directory: entry files one level down. */
static bool looks_like_fingerprint_dir(const char *dir)
{
    size_t n;
    char **subs = list(dir, true, &n);
    bool yes = false;
    for (size_t i = 0; i < n && !yes; i++) {
        char *p = join(dir, subs[i]);
        size_t m;
        char **files = p ? list(p, false, &m) : NULL;
        for (size_t j = 0; files && j < m && !yes; j++)
            yes = is_store_file(files[j]);
        free_list(files, files ? m : 0);
        free(p);
    }
    free_list(subs, n);
    return yes;
}

static void free_targets(struct target *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < t[i].n_ids; j++) {
            free(t[i].ids[j].model_id);
            free(t[i].ids[j].tokenizer_hash);
        }
        free(t[i].ids);
        free(t[i].parent);
        free(t[i].fp);
        free(t[i].path);
    }
    free(t);
}

static bool add_target(struct target **t, size_t *n, const char *parent, const char *fp)
{
    struct target *nt = realloc(*t, (*n + 1) * sizeof(**t));
    if (!nt)
        return false;
    *t = nt;
    struct target *x = &nt[(*n)++];
    memset(x, 0, sizeof(*x));
    x->parent = strdup(parent);
    x->fp = strdup(fp);
    x->path = join(parent, fp);
    return x->parent && x->fp && x->path;
}

static bool add_identity(struct target *t, const char *model, const char *tok)
{
    for (size_t i = 0; i < t->n_ids; i++)
        if (!strcmp(t->ids[i].model_id, model) && !strcmp(t->ids[i].tokenizer_hash, tok))
            return true;
    struct identity *v = realloc(t->ids, (t->n_ids + 1) * sizeof(*v));
    if (!v)
        return false;
    t->ids = v;
    v[t->n_ids].model_id = strdup(model);
    v[t->n_ids].tokenizer_hash = strdup(tok);
    return v[t->n_ids++].model_id && v[t->n_ids - 1].tokenizer_hash;
}

/** The identities of a fingerprint directory: the flags, or every one its headers name. */
static bool find_identities(struct target *t, const struct args *a)
{
    if (a->model_id && a->tokenizer_hash)
        return add_identity(t, a->model_id, a->tokenizer_hash);
    size_t nd;
    char **subs = list(t->path, true, &nd);
    bool ok = true;
    for (size_t i = 0; ok && i < nd; i++) {
        char *p = join(t->path, subs[i]);
        size_t nf;
        char **files = p ? list(p, false, &nf) : NULL;
        for (size_t j = 0; ok && files && j < nf; j++) {
            if (!has_suffix(files[j], ".mlxkv") && !has_suffix(files[j], ".kvshare"))
                continue;
            char *f = join(p, files[j]);
            struct kvt_header *h = NULL;
            if (f && kvt_file_read_header(f, NULL, &h) == 0 && h->model_id && h->tokenizer_hash &&
                h->config_fingerprint && !strcmp(h->config_fingerprint, t->fp) &&
                (!a->model_id || !strcmp(a->model_id, h->model_id)) &&
                (!a->tokenizer_hash || !strcmp(a->tokenizer_hash, h->tokenizer_hash)))
                ok = add_identity(t, h->model_id, h->tokenizer_hash);
            kvt_header_free(h);
            free(f);
        }
        free_list(files, files ? nf : 0);
        free(p);
    }
    free_list(subs, nd);
    return ok;
}

/* Why @p path cannot be a store directory, or NULL when it is a directory. */
static const char *not_a_dir(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return errno == ENOENT ? "does not exist" : strerror(errno);
    return S_ISDIR(st.st_mode) ? NULL : "not a directory";
}

static int resolve(const struct args *a, struct target **out, size_t *n_out)
{
    struct target *t = NULL;
    size_t n = 0;
    bool ok = true;
    char *dir = strdup(a->dir);
    if (!dir)
        return EXIT_USAGE;
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/')
        dir[--len] = '\0';
    const char *why = not_a_dir(dir);
    if (why) {
        fprintf(stderr, "kvtier: %s: %s\n", dir, why);
        free(dir);
        return EXIT_USAGE;
    }
    char *slash = strrchr(dir, '/');
    const char *base = slash ? slash + 1 : dir;
    char *parent =
        slash ? (slash == dir ? strdup("/") : strndup(dir, (size_t)(slash - dir))) : strdup(".");
    if (a->fingerprint) {
        char *sub = join(dir, a->fingerprint);
        if (sub && is_dir(sub))
            ok = add_target(&t, &n, dir, a->fingerprint);
        else if (!strcmp(base, a->fingerprint))
            ok = add_target(&t, &n, parent, base);
        else
            fprintf(stderr, "kvtier: %s holds no fingerprint directory %s\n", dir, a->fingerprint);
        free(sub);
    } else if (looks_like_fingerprint_dir(dir)) {
        ok = add_target(&t, &n, parent, base);
    } else {
        size_t m;
        char **subs = list(dir, true, &m);
        for (size_t i = 0; ok && i < m; i++)
            ok = add_target(&t, &n, dir, subs[i]);
        free_list(subs, m);
    }
    for (size_t i = 0; ok && i < n; i++)
        ok = find_identities(&t[i], a);
    free(parent);
    free(dir);
    if (!ok) {
        fprintf(stderr, "kvtier: out of memory\n");
        free_targets(t, n);
        return EXIT_USAGE;
    }
    *out = t;
    *n_out = n;
    return 0;
}

static int open_store(const struct target *t, const struct identity *id, const struct args *a,
                      bool read_only, kvt_store **s)
{
    struct kvt_store_opts o;
    kvt_store_opts_init(&o);
    o.model_id = id->model_id;
    o.config_fingerprint = t->fp;
    o.tokenizer_hash = id->tokenizer_hash;
    o.max_bytes = a->have_max ? a->max_bytes : UINT64_MAX;
    if (a->tmp_grace_ms >= 0) /* given */
        o.tmp_grace_ms = a->tmp_grace_ms;
    o.read_only = read_only;
    int rc = kvt_store_open(t->parent, &o, s);
    if (rc < 0)
        cli_error(t->path, rc);
    return rc;
}

static bool parse_args(int argc, char **argv, struct args *a, bool want_tokens)
{
    memset(a, 0, sizeof(*a));
    a->tmp_grace_ms = -1;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = true;
        if (!strcmp(o, "--json"))
            a->json = true, takes = false;
        else if (!strcmp(o, "--dry-run"))
            a->dry_run = true, takes = false;
        else if (!strcmp(o, "--remove-skipped"))
            a->remove_skipped = true, takes = false;
        else if (!v && o[0] == '-')
            return false;
        else if (!strcmp(o, "--model-id"))
            a->model_id = v;
        else if (!strcmp(o, "--config-fingerprint"))
            a->fingerprint = v;
        else if (!strcmp(o, "--tokenizer-hash"))
            a->tokenizer_hash = v;
        else if (!strcmp(o, "--ns"))
            a->ns = v;
        else if (!strcmp(o, "--tokens") && want_tokens)
            a->tokens = v;
        else if (!strcmp(o, "--max-bytes")) {
            if (!cli_parse_size(v, &a->max_bytes))
                return false;
            a->have_max = true;
        } else if (!strcmp(o, "--tmp-grace-ms")) {
            char *end;
            long long g = strtoll(v, &end, 10);
            if (*end || g < 0)
                return false;
            a->tmp_grace_ms = g;
        } else if (o[0] != '-' && !a->dir) {
            a->dir = o;
            takes = false;
        } else {
            return false;
        }
        if (takes)
            i++;
    }
    return a->dir && (!want_tokens || a->tokens);
}

static void print_id_json(const struct target *t, const struct identity *id)
{
    printf("\"root\":");
    cli_json_string(stdout, t->path);
    printf(",\"model_id\":");
    cli_json_string(stdout, id->model_id);
    printf(",\"config_fingerprint\":");
    cli_json_string(stdout, t->fp);
    printf(",\"tokenizer_hash\":");
    cli_json_string(stdout, id->tokenizer_hash);
}

static void print_record_json(const struct kvt_store_record *r)
{
    printf("{\"id\":%" PRIu64 ",\"path\":", r->id);
    cli_json_string(stdout, r->path);
    printf(",\"ns\":");
    cli_json_string(stdout, r->ns);
    printf(",\"n_tokens\":%zu,\"bytes\":%" PRIu64 ",\"mtime_ms\":%" PRId64 ",\"trimmable\":%s}",
           r->n_tokens, r->bytes, r->mtime_ms, r->trimmable ? "true" : "false");
}

static void print_time(int64_t ms)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    char buf[32];
    if (gmtime_r(&t, &tm) && strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm))
        printf("%s", buf);
    else
        printf("%" PRId64, ms);
}

/*
 * What ls, find and stats do with one store: with --json, print its fields after the
 * identity (each_store opens and closes the object); @p first is the first store printed.
 */
typedef void (*store_fn)(void *ud, const struct target *t, const struct identity *id, kvt_store *s,
                         bool first);

/*
 * Open every store the arguments name, read-only, and hand each to @p fn; with --json, as
 * one array of objects that start with the identity. Prints "<dir>: no entries" when there
 * is none. @return false when some store could not be opened (the error is printed).
 */
static bool each_store(const struct args *a, const struct target *t, size_t nt, store_fn fn,
                       void *ud)
{
    bool first = true, opened_all = true;
    if (a->json)
        printf("[");
    for (size_t i = 0; i < nt; i++)
        for (size_t j = 0; j < t[i].n_ids; j++) {
            kvt_store *s;
            if (open_store(&t[i], &t[i].ids[j], a, true, &s) < 0) {
                opened_all = false;
                continue;
            }
            if (a->json) {
                printf("%s{", first ? "" : ",");
                print_id_json(&t[i], &t[i].ids[j]);
            }
            fn(ud, &t[i], &t[i].ids[j], s, first);
            if (a->json)
                printf("}");
            first = false;
            kvt_store_close(s);
        }
    if (a->json)
        printf("]\n");
    else if (first)
        printf("%s: no entries\n", a->dir);
    return opened_all;
}

/* Parse the arguments and find the stores; @return 0, or the exit status (usage printed). */
static int store_command(int argc, char **argv, bool want_tokens, const char *usage, struct args *a,
                         struct target **t, size_t *nt)
{
    if (!parse_args(argc, argv, a, want_tokens))
        return cli_usage(stderr, usage, EXIT_USAGE);
    return resolve(a, t, nt);
}

/* Each command's usage; ls, stats and gc also work on a remote tier (cmd_remote.c). */
#define IDENTITY_FLAGS "[--model-id M] [--config-fingerprint F] [--tokenizer-hash T]"
#define REMOTE(cmd)                                                                                \
    "\n       kvtier " cmd " --redis URL --model-id M --config-fingerprint F "                     \
    "--tokenizer-hash T"
static const char LS_USAGE[] =
    "ls DIR [--json] [--ns NS] " IDENTITY_FLAGS REMOTE("ls") " [--json] [--ns NS]";
static const char FIND_USAGE[] = "find DIR --tokens 1,2,3 [--ns NS] [--json] " IDENTITY_FLAGS;
static const char STATS_USAGE[] = "stats DIR [--json] " IDENTITY_FLAGS REMOTE("stats") " [--json]";
static const char GC_USAGE[] =
    "gc DIR [--max-bytes N] [--dry-run] [--remove-skipped] "
    "[--tmp-grace-ms MS] " IDENTITY_FLAGS REMOTE("gc") " [--max-bytes N] [--dry-run]";

struct ls_run {
    const struct args *a;
    int status;
};

static void ls_one(void *ud, const struct target *t, const struct identity *id, kvt_store *s,
                   bool first)
{
    struct ls_run *r = ud;
    const struct args *a = r->a;
    struct kvt_store_record *v;
    size_t n;
    if (kvt_store_list(s, &v, &n) < 0) {
        r->status = cli_error("ls", -ENOMEM);
        return;
    }
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    if (a->json) {
        printf(",\"entries\":[");
        bool f2 = true;
        for (size_t k = 0; k < n; k++) {
            if (a->ns && strcmp(a->ns, v[k].ns))
                continue;
            printf("%s", f2 ? "" : ",");
            print_record_json(&v[k]);
            f2 = false;
        }
        printf("],\"skipped_files\":%" PRIu64, st.skipped_files);
    } else {
        printf("%s%s  model %s  tokenizer %s: %" PRIu64 " entries, %" PRIu64 " bytes, %" PRIu64
               " skipped files\n",
               first ? "" : "\n", t->path, id->model_id, id->tokenizer_hash, st.entries,
               st.total_bytes, st.skipped_files);
        for (size_t k = 0; k < n; k++) {
            if (a->ns && strcmp(a->ns, v[k].ns))
                continue;
            printf("%6" PRIu64 "  %8zu tok  %12" PRIu64 " B  %s  ns ", v[k].id, v[k].n_tokens,
                   v[k].bytes, v[k].trimmable ? "trim  " : "notrim");
            cli_json_string(stdout, v[k].ns);
            printf("  ");
            print_time(v[k].mtime_ms);
            printf("  %s\n", v[k].path);
        }
    }
    kvt_store_list_free(v);
}

int cmd_store_ls(int argc, char **argv)
{
    if (cli_wants_help(argc, argv))
        return cli_usage(stdout, LS_USAGE, 0);
    if (cli_has_redis(argc, argv))
        return cmd_remote(argc, argv, LS_USAGE);
    struct args a;
    struct target *t;
    size_t nt;
    int rc = store_command(argc, argv, false, LS_USAGE, &a, &t, &nt);
    if (rc)
        return rc;
    struct ls_run r = {&a, 0};
    int status = each_store(&a, t, nt, ls_one, &r) ? 0 : EXIT_USAGE;
    free_targets(t, nt);
    return r.status ? r.status : status;
}

struct find_run {
    const struct args *a;
    const int32_t *tok;
    size_t n_tok;
    bool hit;
};

static void find_one(void *ud, const struct target *t, const struct identity *id, kvt_store *s,
                     bool first)
{
    (void)first;
    struct find_run *r = ud;
    struct kvt_hit hit;
    kvt_store_find(s, r->tok, r->n_tok, r->a->ns ? r->a->ns : "", &hit);
    const char *path = NULL;
    struct kvt_store_record *v = NULL;
    size_t n = 0;
    if (hit.prefix_len && kvt_store_list(s, &v, &n) == 0)
        for (size_t k = 0; k < n; k++)
            if (v[k].id == hit.id)
                path = v[k].path;
    r->hit |= hit.prefix_len > 0;
    if (r->a->json) {
        printf(",\"prefix_len\":%zu", hit.prefix_len);
        if (hit.prefix_len) {
            printf(",\"n_tokens\":%zu,\"trimmable\":%s,\"trim\":%zu,\"path\":", hit.n_tokens,
                   hit.trimmable ? "true" : "false", hit.n_tokens - hit.prefix_len);
            cli_json_string(stdout, path ? path : "");
        }
    } else if (hit.prefix_len) {
        printf("%s  model %s: hit, prefix %zu of %zu prompt tokens from an entry of %zu (%s, "
               "trim %zu): %s\n",
               t->path, id->model_id, hit.prefix_len, r->n_tok, hit.n_tokens,
               hit.trimmable ? "trimmable" : "not trimmable", hit.n_tokens - hit.prefix_len,
               path ? path : "?");
    } else {
        printf("%s  model %s: miss\n", t->path, id->model_id);
    }
    kvt_store_list_free(v);
}

int cmd_store_find(int argc, char **argv)
{
    struct args a;
    struct target *t;
    size_t nt;
    int32_t *tok;
    size_t n_tok;
    if (cli_wants_help(argc, argv))
        return cli_usage(stdout, FIND_USAGE, 0);
    int rc = store_command(argc, argv, true, FIND_USAGE, &a, &t, &nt);
    if (rc)
        return rc;
    if (!cli_parse_tokens(a.tokens, &tok, &n_tok)) {
        fprintf(stderr, "kvtier: find: bad --tokens list\n");
        free_targets(t, nt);
        return EXIT_USAGE;
    }
    struct find_run r = {&a, tok, n_tok, false};
    each_store(&a, t, nt, find_one, &r); /* a store that cannot be opened holds no hit */
    free_targets(t, nt);
    free(tok);
    return r.hit ? 0 : EXIT_BAD;
}

static void print_stats_json(const struct kvt_store_stats *st)
{
    printf("\"entries\":%" PRIu64 ",\"total_bytes\":%" PRIu64 ",\"max_bytes\":", st->entries,
           st->total_bytes);
    if (st->max_bytes == UINT64_MAX) /* inspected without --max-bytes: no cap */
        printf("null");
    else
        printf("%" PRIu64, st->max_bytes);
    printf(",\"skipped_files\":%" PRIu64 ",\"skipped_bytes\":%" PRIu64 ",\"corrupt_files\":%" PRIu64
           ",\"longest_durable_prefix_tokens\":%" PRIu64 ",\"shared_chunks\":%" PRIu64
           ",\"shared_bytes\":%" PRIu64,
           st->skipped_files, st->skipped_bytes, st->corrupt_files,
           st->longest_durable_prefix_tokens, st->shared_chunks, st->shared_bytes);
}

static void stats_one(void *ud, const struct target *t, const struct identity *id, kvt_store *s,
                      bool first)
{
    const struct args *a = ud;
    struct kvt_store_stats st;
    kvt_store_get_stats(s, &st);
    if (a->json) {
        printf(",");
        print_stats_json(&st);
        return;
    }
    printf("%s%s\n  model_id            %s\n  tokenizer_hash      %s\n"
           "  entries             %" PRIu64 "\n  total_bytes         %" PRIu64
           "\n  longest_prefix      %" PRIu64 " tokens\n  skipped_files       %" PRIu64 " (%" PRIu64
           " bytes)\n  corrupt_files       %" PRIu64 "\n  shared_chunks       %" PRIu64 " (%" PRIu64
           " bytes, counted once in total_bytes)\n",
           first ? "" : "\n", t->path, id->model_id, id->tokenizer_hash, st.entries, st.total_bytes,
           st.longest_durable_prefix_tokens, st.skipped_files, st.skipped_bytes, st.corrupt_files,
           st.shared_chunks, st.shared_bytes);
}

int cmd_store_stats(int argc, char **argv)
{
    if (cli_wants_help(argc, argv))
        return cli_usage(stdout, STATS_USAGE, 0);
    if (cli_has_redis(argc, argv))
        return cmd_remote(argc, argv, STATS_USAGE);
    struct args a;
    struct target *t;
    size_t nt;
    int rc = store_command(argc, argv, false, STATS_USAGE, &a, &t, &nt);
    if (rc)
        return rc;
    int status = each_store(&a, t, nt, stats_one, &a) ? 0 : EXIT_USAGE;
    free_targets(t, nt);
    return status;
}

/* ---- gc: the store's own check (kvt_store_check) ------------------------------------- */

static const char *const gc_verb[KVT_CHECK_KINDS] = {
    [KVT_CHECK_TMP] = "reap abandoned",
    [KVT_CHECK_CORRUPT] = "remove corrupt",
    [KVT_CHECK_QUARANTINED] = "remove quarantined",
    [KVT_CHECK_SKIPPED] = "remove skipped",
    [KVT_CHECK_EVICT] = "evict",
    [KVT_CHECK_ORPHAN] = "remove unneeded chunk",
};

struct gc_run {
    const struct args *a;
    const struct target *t;
    uint64_t files[KVT_CHECK_KINDS], bytes[KVT_CHECK_KINDS];
    bool failed;
};

static void gc_report(void *ud, enum kvt_check_kind k, const char *path, uint64_t bytes,
                      const char *why, int rc)
{
    struct gc_run *g = ud;
    if (rc < 0) {
        fprintf(stderr, "kvtier: gc: cannot remove %s: %s\n", path, kvt_strerror(rc));
        return;
    }
    const char *would = g->a->dry_run ? "would " : "";
    if (k == KVT_CHECK_EVICT)
        printf("%s%s %s (%" PRIu64 " bytes, %s)\n", would, gc_verb[k], path, bytes, why);
    else
        printf("%s%s %s%s%s\n", would, gc_verb[k], path, why ? ": " : "", why ? why : "");
    g->files[k]++;
    g->bytes[k] += bytes;
}

/* Any identity found in the fingerprint directory keeps its entries. */
static bool gc_keep(void *ud, const struct kvt_header *h)
{
    const struct target *t = ((struct gc_run *)ud)->t;
    for (size_t i = 0; i < t->n_ids; i++)
        if (!strcmp(t->ids[i].model_id, h->model_id) &&
            !strcmp(t->ids[i].tokenizer_hash, h->tokenizer_hash))
            return true;
    return false;
}

/* The files of one fingerprint directory, then each identity's store to --max-bytes. */
static void gc_target(struct gc_run *g, const struct target *t)
{
    const struct args *a = g->a;
    g->t = t;
    struct kvt_store_opts so;
    kvt_store_opts_init(&so);
    so.config_fingerprint = t->fp;
    so.max_bytes = UINT64_MAX;
    if (a->tmp_grace_ms >= 0) /* given */
        so.tmp_grace_ms = a->tmp_grace_ms;
    struct kvt_check_opts co = {.repair = !a->dry_run,
                                .files = true,
                                .remove_skipped = a->remove_skipped,
                                .keep = gc_keep,
                                .report = gc_report,
                                .ud = g};
    if (t->n_ids) {
        so.model_id = t->ids[0].model_id;
        so.tokenizer_hash = t->ids[0].tokenizer_hash;
    }
    int rc = kvt_store_check(t->parent, &so, &co);
    co.files = false;
    co.max_bytes = a->have_max ? a->max_bytes : 0;
    for (size_t j = 0; rc == 0 && co.max_bytes && j < t->n_ids; j++) {
        so.model_id = t->ids[j].model_id;
        so.tokenizer_hash = t->ids[j].tokenizer_hash;
        rc = kvt_store_check(t->parent, &so, &co);
    }
    if (rc < 0) {
        cli_error(t->path, rc);
        g->failed = true;
    }
}

int cmd_store_gc(int argc, char **argv)
{
    if (cli_wants_help(argc, argv))
        return cli_usage(stdout, GC_USAGE, 0);
    if (cli_has_redis(argc, argv))
        return cmd_remote(argc, argv, GC_USAGE);
    struct args a;
    struct target *t;
    size_t nt;
    int rc = store_command(argc, argv, false, GC_USAGE, &a, &t, &nt);
    if (rc)
        return rc;
    struct gc_run g = {.a = &a};
    for (size_t i = 0; i < nt; i++)
        gc_target(&g, &t[i]);
    printf("%s", a.dry_run ? "dry run: " : "");
    for (int k = 0; k < KVT_CHECK_KINDS; k++)
        printf("%s%s %" PRIu64 " (%" PRIu64 " bytes)", k ? ", " : "", gc_verb[k], g.files[k],
               g.bytes[k]);
    printf("\n");
    int status = g.failed ? EXIT_USAGE : 0;
    free_targets(t, nt);
    return status;
}
