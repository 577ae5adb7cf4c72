/* Real redis-server processes for tests and benchmarks (see redis_srv.h). */
#include "support/redis_srv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support/support.h"
#include "support/synth.h"

bool redis_available(void)
{
    return access("/usr/bin/redis-server", X_OK) == 0 && access("/usr/bin/redis-cli", X_OK) == 0;
}

int redis_suite_start(struct redis_srv *s, const char *tag, char **base)
{
    if (!redis_available())
        return -1;
    *base = scratch_dir(tag);
    return *base && redis_start(s, *base, 0, "") == 0 ? 0 : -1;
}

int redis_suite_stop(struct redis_srv *s, char **base)
{
    redis_kill(s);
    if (*base)
        rm_rf(*base);
    free(*base);
    *base = NULL;
    return 0;
}

static bool port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

int redis_free_port(void)
{
    static unsigned seed;
    if (!seed)
        seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
    for (int i = 0; i < 1000; i++) {
        int p = 20000 + (int)(rand_r(&seed) % 25000);
        if (port_free(p) && port_free(p + 10000))
            return p;
    }
    return -1;
}

void msleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int redis_cli(const struct redis_srv *s, const char *args, char **out)
{
    char *cmd = strf("redis-cli -h 127.0.0.1 -p %d %s 2>&1", s->port, args);
    int rc = run_capture(cmd, out);
    free(cmd);
    return rc;
}

static int wait_ping(struct redis_srv *s)
{
    for (int i = 0; i < 250; i++) {
        char *out = NULL;
        int rc = redis_cli(s, "PING", &out);
        bool up = rc == 0 && out &&
                  (strstr(out, "PONG") || strstr(out, "NOAUTH") || strstr(out, "WRONGPASS"));
        free(out);
        if (up)
            return 0;
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            s->pid = 0;
            return -1;
        }
        msleep(20);
    }
    return -1;
}

/* The command line is built before fork: the child of a threaded process only execs. */
static char *server_cmd(const struct redis_srv *s)
{
    return strf("exec redis-server --bind 127.0.0.1 --port %d --save '' --appendonly no "
                "--dir '%s' --logfile '%s/redis-%d.log' --unixsocket '%s' "
                "--unixsocketperm 700 --protected-mode no %s",
                s->port, s->dir, s->dir, s->port, s->sock, s->extra);
}

int redis_start(struct redis_srv *s, const char *dir, int port, const char *extra)
{
    if (port <= 0)
        port = redis_free_port();
    if (port <= 0)
        return -1;
    s->port = port;
    if (dir != s->dir)
        snprintf(s->dir, sizeof(s->dir), "%s", dir);
    snprintf(s->sock, sizeof(s->sock), "%s/redis-%d.sock", s->dir, port);
    if (extra != s->extra)
        snprintf(s->extra, sizeof(s->extra), "%s", extra ? extra : "");
    char *cmd = server_cmd(s);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    free(cmd);
    if (pid < 0)
        return -1;
    s->pid = pid;
    return wait_ping(s);
}

void redis_kill(struct redis_srv *s)
{
    if (s->pid <= 0)
        return;
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
}

int redis_restart(struct redis_srv *s)
{
    redis_kill(s);
    for (int i = 0; i < 100 && !port_free(s->port); i++)
        msleep(20);
    return redis_start(s, s->dir, s->port, s->extra);
}

const char *redis_url(const struct redis_srv *s, const char *prefix)
{
    static _Thread_local char buf[256]; /* suites call it from several threads */
    snprintf(buf, sizeof(buf), "redis://127.0.0.1:%d/%s", s->port, prefix);
    return buf;
}

/* ---- cluster ---------------------------------------------------------------------------- */

int redis_cluster_start(struct redis_cluster *c, const char *dir, int masters, int replicas)
{
    memset(c, 0, sizeof(*c));
    c->n = masters * (1 + replicas);
    char addrs[1024] = "";
    for (int i = 0; i < c->n; i++) {
        char *extra = strf("--cluster-enabled yes --cluster-config-file nodes-%d.conf "
                           "--cluster-node-timeout 1000 --cluster-require-full-coverage no "
                           "--cluster-replica-validity-factor 0 --repl-diskless-sync-delay 0",
                           i);
        int rc = redis_start(&c->node[i], dir, 0, extra);
        free(extra);
        if (rc < 0)
            return -1;
        size_t len = strlen(addrs);
        snprintf(addrs + len, sizeof(addrs) - len, " 127.0.0.1:%d", c->node[i].port);
    }
    char *cmd = strf("redis-cli --cluster create%s --cluster-replicas %d --cluster-yes "
                     ">'%s/cluster-create.log' 2>&1",
                     addrs, replicas, dir);
    int rc = run_capture(cmd, NULL);
    free(cmd);
    return rc == 0 ? redis_cluster_wait_ok(c, 20000) : -1;
}

void redis_cluster_stop(struct redis_cluster *c)
{
    for (int i = 0; i < c->n; i++)
        redis_kill(&c->node[i]);
}

int redis_cluster_wait_ok(struct redis_cluster *c, int ms)
{
    for (int t = 0; t < ms; t += 50) {
        bool ok = true;
        for (int i = 0; ok && i < c->n; i++) {
            if (c->node[i].pid <= 0)
                continue;
            char *out = NULL, *repl = NULL;
            redis_cli(&c->node[i], "CLUSTER INFO", &out);
            redis_cli(&c->node[i], "INFO replication", &repl); /* replicas: synced */
            ok = out && strstr(out, "cluster_state:ok") && repl &&
                 (!strstr(repl, "role:slave") || strstr(repl, "master_link_status:up"));
            free(out);
            free(repl);
        }
        if (ok)
            return 0;
        msleep(50);
    }
    return -1;
}

/* Whether the slot ranges after the 8th field of a CLUSTER NODES line hold @p slot. */
static bool line_has_slot(const char *line, unsigned slot)
{
    const char *p = line;
    for (int f = 0; f < 8 && p; f++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    while (p && *p && *p != '\n') {
        unsigned a, b;
        int used = 0;
        if (sscanf(p, "%u-%u%n", &a, &b, &used) == 2 && slot >= a && slot <= b)
            return true;
        if (used == 0 && sscanf(p, "%u%n", &a, &used) == 1 && slot == a)
            return true;
        p = strpbrk(p, " \n");
        if (p && *p == ' ')
            p++;
    }
    return false;
}

int redis_cluster_master_of(struct redis_cluster *c, unsigned slot)
{
    for (int i = 0; i < c->n; i++) {
        if (c->node[i].pid <= 0)
            continue;
        char *out = NULL;
        redis_cli(&c->node[i], "CLUSTER NODES", &out);
        int found = -1;
        for (char *line = out; line && *line && found < 0; line = strchr(line, '\n')) {
            if (*line == '\n')
                line++;
            int port;
            char flags[128];
            if (sscanf(line, "%*s %*[^:]:%d@%*d %127s", &port, flags) != 2 ||
                !strstr(flags, "master") || strstr(flags, "fail") || !line_has_slot(line, slot))
                continue;
            for (int j = 0; j < c->n; j++)
                if (c->node[j].port == port)
                    found = j;
        }
        free(out);
        return found;
    }
    return -1;
}

void remote_tokens(uint64_t seed, size_t n, int32_t *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = (int32_t)((seed * 1000003u + i * 7919u + (i == 0 ? seed * 13u : 0)) % 60000u);
}

void remote_opts(struct kvt_remote_opts *o, const char *url, uint64_t chunk, int timeout_ms,
                 int poll_ms)
{
    kvt_remote_opts_init(o);
    o->url = url;
    o->model_id = REMOTE_MODEL;
    o->config_fingerprint = REMOTE_FP;
    o->tokenizer_hash = REMOTE_TOK;
    o->timeout_ms = timeout_ms;
    o->poll_ms = poll_ms;
    if (chunk)
        o->chunk_bytes = chunk;
}

struct kvt_entry *remote_entry(uint64_t seed, size_t n)
{
    int32_t *tok = malloc(n * sizeof(*tok));
    remote_tokens(seed, n, tok);
    struct kvt_entry *e = synth_random_entry(tok, n, seed, "m", "f", "t");
    free(tok);
    return e;
}

int remote_put(kvt_remote *r, uint64_t seed, size_t n)
{
    struct kvt_entry *e = remote_entry(seed, n);
    int rc = kvt_remote_put(r, e);
    kvt_entry_free(e);
    return rc;
}

int remote_restore(kvt_remote *r, uint64_t seed, size_t n)
{
    int32_t *tok = malloc((n + 1) * sizeof(*tok));
    remote_tokens(seed, n, tok);
    tok[n] = 1;
    struct kvt_hit hit;
    int found = kvt_remote_find(r, tok, n + 1, "", &hit) == 0 && hit.prefix_len == n;
    free(tok);
    if (!found)
        return -1;
    struct kvt_entry *got = NULL;
    if (kvt_remote_restore(r, &hit, &got) != 0 || !got)
        return 0;
    struct kvt_entry *want = remote_entry(seed, n);
    int same = synth_same_entry_bytes(got, want) ? 1 : -2;
    kvt_entry_free(want);
    kvt_entry_free(got);
    return same;
}

void remote_branch_tokens(int p, int b, int32_t *t)
{
    for (int i = 0; i < REMOTE_BRANCH_TOK; i++)
        t[i] = i < REMOTE_SHARED ? 7 * i + 1 + 1000000 * p : 100000 * (b + 1) + i + 1000000 * p;
}

struct kvt_entry *remote_branch(int p, int b)
{
    int32_t t[REMOTE_BRANCH_TOK];
    remote_branch_tokens(p, b, t);
    struct kvt_entry *e;
    return synth_entry(t, REMOTE_BRANCH_TOK, "", false, &e) == 0 ? e : NULL;
}

int remote_put_branch(kvt_remote *r, int p, int b)
{
    struct kvt_entry *e = remote_branch(p, b);
    int rc = e ? kvt_remote_put(r, e) : -1;
    kvt_entry_free(e);
    return rc;
}

int remote_restore_branch(kvt_remote *r, int p, int b)
{
    int32_t t[REMOTE_BRANCH_TOK + 1];
    remote_branch_tokens(p, b, t);
    t[REMOTE_BRANCH_TOK] = 5;
    struct kvt_hit hit;
    if (kvt_remote_find(r, t, REMOTE_BRANCH_TOK + 1, "", &hit) != 0 ||
        hit.prefix_len != REMOTE_BRANCH_TOK)
        return -1;
    struct kvt_entry *got = NULL;
    if (kvt_remote_restore(r, &hit, &got) != 0 || !got)
        return 0;
    struct kvt_entry *want = remote_branch(p, b);
    int same = want && got->n_tokens == REMOTE_BRANCH_TOK && got->n_caches == want->n_caches;
    for (size_t i = 0; same && i < want->n_caches; i++)
        same = kvt_cache_offset(got->caches[i]) == kvt_cache_offset(want->caches[i]) &&
               synth_same_state(got->caches[i], want->caches[i]);
    kvt_entry_free(got);
    kvt_entry_free(want);
    return same ? 1 : -2;
}
