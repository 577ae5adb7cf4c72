/*
 * --redis URL (serve.h): kvtier's remote tier under the prompt cache, shared with servers on
 * other hosts. The library treats a server it cannot reach as a miss and retries in the
 * background; serve checks the server once at start instead, so that a wrong URL or a server
 * that is down is told at once, not found later as a cache that never hits. The password
 * (in the URL, or KVT_REDIS_PASSWORD) is never printed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

/* The secret of "scheme://userinfo@host...": the password after the user's ':', or the whole
 * userinfo when it has no ':' (the library refuses that URL, but its text is still secret). */
static bool url_secret(const char *url, size_t *at, size_t *len)
{
    const char *from = strstr(url, "://");
    if (!from)
        return false;
    from += 3;
    const char *end = strchr(from, '@'), *slash = strchr(from, '/');
    if (!end || (slash && slash < end))
        return false;
    const char *colon = memchr(from, ':', (size_t)(end - from));
    const char *secret = colon ? colon + 1 : from;
    *at = (size_t)(secret - url);
    *len = (size_t)(end - secret);
    return true;
}

/* @p text into @p out with every occurrence of @p secret[0..len) as "***". */
static void scrub(const char *text, const char *secret, size_t len, char *out, size_t cap)
{
    size_t o = 0;
    while (*text && o + 1 < cap) {
        if (len && strncmp(text, secret, len) == 0) {
            o += (size_t)snprintf(out + o, cap - o, "***");
            o = o < cap ? o : cap - 1;
            text += len;
        } else
            out[o++] = *text++;
    }
    out[o] = '\0';
}

/* Print "kvtier-llama serve: --redis URL: MESSAGE" with the password out of both. */
static int fail(const struct server *s, const char *message)
{
    size_t at = 0, len = 0;
    bool in_url = url_secret(s->o.redis, &at, &len);
    const char *env = getenv("KVT_REDIS_PASSWORD");
    char once[1024], twice[1024];
    scrub(message, s->o.redis + at, in_url ? len : 0, once, sizeof(once));
    scrub(once, env ? env : "", env ? strlen(env) : 0, twice, sizeof(twice));
    fprintf(stderr, "kvtier-llama serve: --redis %s: %s\n", s->redis_shown, twice);
    return -1;
}

int remote_open_cache(struct server *s, struct kvt_llama_opts *ko)
{
    struct kvt_remote_opts ro;
    if (s->o.redis) {
        size_t at, len;
        snprintf(s->redis_shown, sizeof(s->redis_shown), "%s", s->o.redis);
        if (url_secret(s->o.redis, &at, &len) && at < sizeof(s->redis_shown))
            snprintf(s->redis_shown + at, sizeof(s->redis_shown) - at, "***%s",
                     s->o.redis + at + len);
        kvt_remote_opts_init(&ro);
        ro.url = s->o.redis;
        ro.password = getenv("KVT_REDIS_PASSWORD"); /* else the URL's */
        ko->remote = &ro;
    }
    if (kvt_llama_open(s->ctx, ko, &s->kl) != 0) {
        if (s->o.redis)
            return fail(s, kvt_last_error());
        fprintf(stderr, "kvtier-llama serve: cache: %s\n", kvt_last_error());
        return -1;
    }
    if (!s->o.redis)
        return 0;
    s->remote = kvt_pcache_remote(kvt_llama_pcache(s->kl));
    if (kvt_remote_refresh(s->remote) != 0) { /* the server's own error, or no connection */
        int rc = fail(s, kvt_last_error());
        kvt_llama_close(s->kl, 0);
        s->kl = NULL;
        s->remote = NULL;
        return rc;
    }
    return 0;
}

void remote_drain(struct server *s)
{
    if (s->remote && kvt_remote_drain(s->remote, 30000) != 0)
        fprintf(stderr, "kvtier-llama serve: --redis %s: uploads not finished in 30 s\n",
                s->redis_shown);
}
