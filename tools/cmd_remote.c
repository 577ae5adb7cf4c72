/*
 * ls, stats and gc of a remote tier: `kvtier ls|stats|gc --redis URL --model-id M
 * --config-fingerprint F --tokenizer-hash T [...]`. The password may come from
 * KVT_REDIS_PASSWORD instead of the URL, and is never printed. ls and stats change nothing; gc
 * removes records whose chunks are gone and the oldest entries beyond --max-bytes (unless
 * --dry-run). A server that refuses (an error reply, no connection) is an error, with its
 * own message.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

struct rargs {
    const char *url, *model, *fp, *tok, *ns;
    char shown_url[512]; /* the URL as printed: its password replaced by "***" */
    bool json, dry_run;
    uint64_t max_bytes;
};

bool cli_has_redis(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--redis"))
            return true;
    return false;
}

static bool parse(int argc, char **argv, struct rargs *a)
{
    memset(a, 0, sizeof(*a));
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const char **dst = !strcmp(k, "--redis")                ? &a->url
                           : !strcmp(k, "--model-id")           ? &a->model
                           : !strcmp(k, "--config-fingerprint") ? &a->fp
                           : !strcmp(k, "--tokenizer-hash")     ? &a->tok
                           : !strcmp(k, "--ns")                 ? &a->ns
                                                                : NULL;
        if (dst && v) {
            *dst = v;
            i++;
        } else if (!strcmp(k, "--json")) {
            a->json = true;
        } else if (!strcmp(k, "--dry-run")) {
            a->dry_run = true;
        } else if (!strcmp(k, "--max-bytes") && v && cli_parse_size(v, &a->max_bytes)) {
            i++;
        } else {
            fprintf(stderr, "kvtier %s: unknown or incomplete option %s\n", argv[0], k);
            return false;
        }
    }
    if (!a->url || !a->model || !a->fp || !a->tok) {
        fprintf(stderr,
                "kvtier %s: --redis needs --model-id, --config-fingerprint and "
                "--tokenizer-hash\n",
                argv[0]);
        return false;
    }
    return true;
}

/* @p url with the password of its user part (scheme://[user]:password@...) as "***". */
static void redact(const char *url, char *out, size_t cap)
{
    snprintf(out, cap, "%s", url);
    char *from = strstr(out, "://");
    if (!from)
        return;
    from += 3;
    char *at = strchr(from, '@'), *slash = strchr(from, '/');
    char *colon = at && (!slash || at < slash) ? memchr(from, ':', (size_t)(at - from)) : NULL;
    if (colon)
        snprintf(colon + 1, cap - (size_t)(colon + 1 - out), "***%s", url + (at - out));
}

/* Open the remote and sync its index once: the server's own error (NOPERM, WRONGTYPE, a
 * refused connection) is reported, never an empty cache. */
static int open_remote(const struct rargs *a, kvt_remote **r)
{
    struct kvt_remote_opts o;
    kvt_remote_opts_init(&o);
    o.url = a->url;
    o.model_id = a->model;
    o.config_fingerprint = a->fp;
    o.tokenizer_hash = a->tok;
    o.password = getenv("KVT_REDIS_PASSWORD");
    int rc = kvt_remote_open(&o, r);
    if (rc < 0)
        return cli_error(a->shown_url, rc);
    rc = kvt_remote_refresh(*r);
    if (rc < 0) {
        rc = cli_error(a->shown_url, rc);
        kvt_remote_close(*r);
    }
    return rc;
}

static void ls_print(const struct rargs *a, const struct kvt_store_record *v, size_t n)
{
    size_t shown = 0;
    for (size_t i = 0; i < n; i++) {
        if (a->ns && strcmp(a->ns, v[i].ns))
            continue;
        shown++;
        if (a->json) {
            printf("{\"uuid\": \"%s\", \"ns\": ", v[i].path);
            cli_json_string(stdout, v[i].ns);
            printf(", \"tokens\": %zu, \"bytes\": %" PRIu64 ", \"created_ms\": %" PRId64
                   ", \"trimmable\": %s}\n",
                   v[i].n_tokens, v[i].bytes, v[i].mtime_ms, v[i].trimmable ? "true" : "false");
        } else {
            printf("%s  ns=%-10s %8zu tokens %12" PRIu64 " bytes%s\n", v[i].path,
                   v[i].ns[0] ? v[i].ns : "\"\"", v[i].n_tokens, v[i].bytes,
                   v[i].trimmable ? "" : "  untrimmable");
        }
    }
    if (!a->json)
        printf("%zu entries\n", shown);
}

static void stats_print(const struct rargs *a, const struct kvt_remote_stats *s)
{
    if (a->json) {
        printf("{\"url\": ");
        cli_json_string(stdout, a->shown_url);
        printf(", \"entries\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"shared_objects\": %" PRIu64
               ", \"shared_bytes\": %" PRIu64 ", \"version\": %" PRId64 "}\n",
               s->entries, s->bytes, s->shared_objects, s->shared_bytes, s->version);
    } else {
        printf("%s: %" PRIu64 " entries, %.2f MiB, index version %" PRId64 "\n", a->shown_url,
               s->entries, (double)s->bytes / (1 << 20), s->version);
        if (s->shared_objects)
            printf("shared prefix objects: %" PRIu64 ", %.2f MiB (counted once)\n",
                   s->shared_objects, (double)s->shared_bytes / (1 << 20));
    }
}

int cmd_remote(int argc, char **argv, const char *usage)
{
    struct rargs a;
    if (!parse(argc, argv, &a))
        return cli_usage(stderr, usage, EXIT_USAGE);
    redact(a.url, a.shown_url, sizeof(a.shown_url));
    kvt_remote *r;
    int rc = open_remote(&a, &r);
    if (rc)
        return rc;
    if (!strcmp(argv[0], "ls")) {
        struct kvt_store_record *v;
        size_t n;
        rc = kvt_remote_list(r, &v, &n);
        if (rc == 0)
            ls_print(&a, v, n);
        struct kvt_remote_stats st;
        kvt_remote_get_stats(r, &st);
        if (rc == 0 && !a.json && st.shared_objects) /* entries list their own bytes */
            printf("shared prefix objects: %" PRIu64 ", %.2f MiB\n", st.shared_objects,
                   (double)st.shared_bytes / (1 << 20));
        kvt_store_list_free(v);
    } else if (!strcmp(argv[0], "stats")) {
        struct kvt_remote_stats st;
        kvt_remote_get_stats(r, &st);
        stats_print(&a, &st);
    } else {
        size_t dropped = 0;
        rc = kvt_remote_gc(r, a.max_bytes, a.dry_run, &dropped);
        if (rc == 0)
            printf("%s %zu record%s\n", a.dry_run ? "would drop" : "dropped", dropped,
                   dropped == 1 ? "" : "s");
    }
    kvt_remote_close(r);
    return rc < 0 ? cli_error(a.shown_url, rc) : 0;
}
