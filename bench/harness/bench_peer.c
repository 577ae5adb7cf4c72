/*
 * The numpy peer of `kvtier bench --peers`: finds bench/peers/numpy_peer.py, runs it under a
 * Python that has numpy (Debian's /usr/bin/python3 by default) on the tensors of the entry
 * kvtier just saved, and reads back its per-repetition seconds (one JSON object on stdout).
 */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

static char *exists_or_null(char *path)
{
    if (path && access(path, R_OK) == 0)
        return path;
    free(path);
    return NULL;
}

static char *join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s/%s", a, b);
    return s;
}

char *bench_peer_script(const char *hint)
{
    const char *name = "numpy_peer.py";
    if (hint)
        return exists_or_null(strdup(hint));
    const char *env = getenv("KVTIER_PEERS");
    char *p = env ? exists_or_null(join(env, name)) : NULL;
    if (p)
        return p;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        /* <root>/build/<cfg>/kvtier and an installed <prefix>/bin/kvtier */
        static const char *const rel[] = {"../../bench/peers", "../share/kvtier/peers"};
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]) && !p; i++) {
                char *dir = join(exe, rel[i]);
                p = dir ? exists_or_null(join(dir, name)) : NULL;
                free(dir);
            }
        }
    }
    return p ? p : exists_or_null(strdup("bench/peers/numpy_peer.py"));
}

/* Run @p argv and collect its stdout (NUL-terminated) into *out; returns its exit status. */
static int capture(char *const argv[], char **out)
{
    int pfd[2];
    *out = NULL;
    if (pipe(pfd) != 0)
        return -errno;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        int e = -errno;
        close(pfd[0]);
        close(pfd[1]);
        return e;
    }
    if (pid == 0) {
        dup2(pfd[1], STDOUT_FILENO);
        close(pfd[0]);
        close(pfd[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(pfd[1]);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (buf && len + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            } else {
                buf = nb;
            }
        }
        char sink[4096];
        char *dst = buf ? buf + len : sink;
        size_t room = buf ? cap - len - 1 : sizeof(sink);
        ssize_t r = read(pfd[0], dst, room);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        if (buf)
            len += (size_t)r;
    }
    close(pfd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (buf)
        buf[len] = '\0';
    *out = buf;
    if (!buf)
        return -ENOMEM;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The single number in the one-element array @p key of the peer's output. */
static int take_one(json_t *root, const char *key, double *dst)
{
    json_t *a = json_object_get(root, key);
    if (!json_is_array(a) || json_array_size(a) != 1 || !json_is_number(json_array_get(a, 0)))
        return -EINVAL;
    *dst = json_number_value(json_array_get(a, 0));
    return 0;
}

int bench_peer_step(const char *python, const char *script, const char *src, const char *dir, int i,
                    struct bench_peer *p)
{
    char *argv[] = {(char *)python, (char *)script, "--src", (char *)src, "--dir",
                    (char *)dir,    "--repeat",     "1",     NULL};
    char *text;
    if (i < 0 || i >= BENCH_MAX_REPEAT)
        return -EINVAL;
    int st = capture(argv, &text);
    if (st != 0) {
        free(text);
        return st < 0 ? st : -ECHILD;
    }
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    free(text);
    if (!root)
        return -EINVAL;
    int rc = take_one(root, "save_s", &p->save_s[i]);
    if (rc == 0)
        rc = take_one(root, "load_cold_s", &p->cold_s[i]);
    if (rc == 0)
        rc = take_one(root, "load_warm_s", &p->warm_s[i]);
    json_t *v = json_object_get(root, "file_bytes");
    p->file_bytes = json_is_integer(v) ? (uint64_t)json_integer_value(v) : 0;
    v = json_object_get(root, "numpy");
    snprintf(p->version, sizeof(p->version), "%s", json_is_string(v) ? json_string_value(v) : "");
    json_decref(root);
    if (rc == 0)
        p->n = i + 1;
    return rc;
}
