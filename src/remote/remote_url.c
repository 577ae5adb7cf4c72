/*
 * The remote's URL: "redis://[[user]:password@]host[:port][,host:port...][/prefix]" or
 * "unix://[[user]:password@]/path/to.sock[?prefix=P]". Explicit user / password options
 * override the URL's, so that a secret need not appear in a command line.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "remote/remote_obj.h"

static char *dup_n(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

/* "[user]:password@" at the start of @p *s, consumed. */
static int parse_auth(const char **s, struct kvt_rcfg *c)
{
    const char *at = strchr(*s, '@');
    const char *slash = strchr(*s, '/');
    if (!at || (slash && slash < at))
        return 0;
    const char *colon = memchr(*s, ':', (size_t)(at - *s));
    if (!colon)
        return kvt_fail(-EINVAL, "remote URL: credentials must be [user]:password@");
    if (colon > *s && !(c->user = dup_n(*s, (size_t)(colon - *s))))
        return -ENOMEM;
    if (!(c->password = dup_n(colon + 1, (size_t)(at - colon - 1))))
        return -ENOMEM;
    *s = at + 1;
    return 0;
}

static int parse_tcp(const char *s, struct kvt_rcfg *c, char **prefix)
{
    const char *slash = strchr(s, '/');
    size_t hl = slash ? (size_t)(slash - s) : strlen(s);
    const char *comma = memchr(s, ',', hl);
    if (comma) { /* more seeds: the cluster is found through any of them */
        if (!(c->seeds = dup_n(comma + 1, (size_t)(s + hl - comma - 1))))
            return -ENOMEM;
        hl = (size_t)(comma - s);
    }
    const char *colon = memchr(s, ':', hl);
    c->port = 6379;
    if (colon) {
        char *end;
        long p = strtol(colon + 1, &end, 10);
        if (end != s + hl || p <= 0 || p > 65535)
            return kvt_fail(-EINVAL, "remote URL: bad port");
        c->port = (int)p;
        hl = (size_t)(colon - s);
    }
    if (hl == 0)
        return kvt_fail(-EINVAL, "remote URL: no host");
    if (!(c->host = dup_n(s, hl)))
        return -ENOMEM;
    if (slash && slash[1] && !(*prefix = strdup(slash + 1)))
        return -ENOMEM;
    return 0;
}

static int parse_unix(const char *s, struct kvt_rcfg *c, char **prefix)
{
    const char *q = strstr(s, "?prefix=");
    size_t pl = q ? (size_t)(q - s) : strlen(s);
    if (pl == 0 || s[0] != '/')
        return kvt_fail(-EINVAL, "remote URL: unix:// needs an absolute socket path");
    if (!(c->unix_path = dup_n(s, pl)))
        return -ENOMEM;
    if (q && q[8] && !(*prefix = strdup(q + 8)))
        return -ENOMEM;
    return 0;
}

int kvt_remote_parse_url(const char *url, struct kvt_rcfg *c, char **prefix)
{
    memset(c, 0, sizeof(*c));
    *prefix = NULL;
    if (!url)
        return kvt_fail(-EINVAL, "remote: no URL");
    bool tcp = !strncmp(url, "redis://", 8);
    /* The rest of a URL may hold a password: another scheme is named alone. */
    if (!tcp && strncmp(url, "unix://", 7)) {
        const char *end = strstr(url, "://");
        return end ? kvt_fail(-EINVAL, "remote URL must start with redis:// or unix://, not %.*s",
                              (int)(end - url + 3), url)
                   : kvt_fail(-EINVAL, "remote URL must start with redis:// or unix://");
    }
    const char *s = url + (tcp ? 8 : 7);
    int rc = parse_auth(&s, c);
    if (rc == 0)
        rc = tcp ? parse_tcp(s, c, prefix) : parse_unix(s, c, prefix);
    if (rc == -ENOMEM)
        kvt_fail(rc, "remote: out of memory");
    if (rc < 0)
        kvt_remote_cfg_free(c);
    if (rc == 0 && !*prefix && !(*prefix = strdup("kvtier")))
        rc = kvt_fail(-ENOMEM, "remote: out of memory");
    return rc;
}

void kvt_remote_cfg_free(struct kvt_rcfg *c)
{
    free(c->host);
    free(c->seeds);
    free(c->unix_path);
    free(c->user);
    free(c->password);
    memset(c, 0, sizeof(*c));
}
