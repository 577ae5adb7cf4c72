/*
 * The remote tier keeps the host and the shared entries safe from this host's own trouble,
 * against real redis-server processes started here: no library socket raises SIGPIPE (a child
 * without SIG_IGN restores and uploads across a server restart, reconnecting once), a reader
 * out of memory leaves the entry for the next reader, one deadline bounds a whole restore
 * through a slow link, and the CLI reports the server's own errors without the password.
 */
#include "support/redis_srv.h"
#include "support/slow_relay.h"
#include "support/support.h"

#include <errno.h>
#include <stdint.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "kvtier.h"
#include "remote/remote_parts.h"

#define N_TOK 300

static char *base;

static int group_setup(void **state)
{
    (void)state;
    if (!redis_available())
        return -1;
    base = scratch_dir("remote-faults");
    return base ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    if (base)
        rm_rf(base);
    free(base);
    return 0;
}

static kvt_remote *open_remote(const char *url, uint64_t chunk, int timeout_ms)
{
    struct kvt_remote_opts o;
    remote_opts(&o, url, chunk, timeout_ms, 100);
    kvt_remote *r = NULL;
    return kvt_remote_open(&o, &r) == 0 ? r : NULL;
}

static struct kvt_remote_stats stats(kvt_remote *r)
{
    struct kvt_remote_stats st;
    kvt_remote_get_stats(r, &st);
    return st;
}

/* ---- SIGPIPE and the reconnect after a server restart -------------------------------------- */

/* The child: a reader and writer whose connections are all in use when the server restarts
 * (the parent restarts it between the two bytes on @p sync). Exit 0: restored and uploaded;
 * 2: the restore missed; 3: the upload failed; a signal: the library raised it. */
static int restart_child(const char *url, int sync[2][2])
{
    signal(SIGPIPE, SIG_DFL); /* what a host that never heard of SIGPIPE has */
    kvt_remote *r = open_remote(url, 64 << 10, 2000);
    if (!r || kvt_remote_refresh(r) < 0 || remote_put(r, 302, N_TOK) < 0 ||
        remote_restore(r, 301, N_TOK) != 1)
        return 10;
    char c = 'r';
    if (write(sync[0][1], &c, 1) != 1 || read(sync[1][0], &c, 1) != 1)
        return 11;
    int got = remote_restore(r, 301, N_TOK);
    int rc = got == 1 ? 0 : 2;
    if (rc == 0 && remote_put(r, 303, N_TOK) < 0)
        rc = 3;
    fprintf(stderr, "child: restore %d, upload %s (%s)\n", got, rc == 3 ? "failed" : "done",
            kvt_last_error());
    kvt_remote_close(r);
    return rc;
}

/* SIGKILL and restart of the server (its data back from a snapshot) under a process that
 * does not ignore SIGPIPE: it lives, and its first restore and upload reconnect once. */
static void test_restart_no_sigpipe(void **state)
{
    (void)state;
    struct redis_srv k = {0};
    assert_int_equal(redis_start(&k, base, 0, "--dbfilename sigpipe.rdb"), 0);
    char url[128];
    snprintf(url, sizeof(url), "%s", redis_url(&k, "pipe"));
    kvt_remote *w = open_remote(url, 64 << 10, 2000);
    assert_non_null(w);
    assert_int_equal(remote_put(w, 301, N_TOK), 0);
    kvt_remote_close(w);
    int sync[2][2];
    assert_int_equal(pipe(sync[0]), 0);
    assert_int_equal(pipe(sync[1]), 0);
    pid_t pid = fork();
    if (pid == 0)
        _exit(restart_child(url, sync));
    char c;
    assert_int_equal(read(sync[0][0], &c, 1), 1);
    assert_int_equal(redis_cli(&k, "SAVE", NULL), 0);
    assert_int_equal(redis_restart(&k), 0); /* SIGKILL, then up again from the snapshot */
    assert_int_equal(write(sync[1][1], &c, 1), 1);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    print_message("child: %s %d\n", WIFSIGNALED(st) ? "killed by signal" : "exit",
                  WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    assert_false(WIFSIGNALED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    for (int i = 0; i < 2; i++) {
        close(sync[i][0]);
        close(sync[i][1]);
    }
    redis_kill(&k);
}

/* ---- a reader out of memory ------------------------------------------------------------- */

#define BIG_TOK 8192 /* about 27 MB */

/* The child: its address space capped a few MiB above what it uses, it restores the big
 * entry. Exit 0: a miss, as it must be; 2: restored anyway (the cap did not bite). */
static int capped_child(const char *url)
{
    kvt_buf_cache_limit(0); /* the writer's freed buffers, inherited, would serve the restore */
    kvt_remote *r = open_remote(url, 1 << 20, 2000);
    if (!r || kvt_remote_refresh(r) < 0)
        return 10;
    long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld", &pages) != 1)
        return 11;
    fclose(f);
    rlim_t cap = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)8 << 20);
    if (setrlimit(RLIMIT_AS, &(struct rlimit){cap, cap}) != 0)
        return 12;
    int got = remote_restore(r, 311, BIG_TOK);
    fprintf(stderr, "capped reader: restore %d (%s)\n", got, kvt_last_error());
    kvt_remote_close(r);
    return got == 0 ? 0 : 2;
}

/* A reader that runs out of memory (RLIMIT_AS in a child) misses; the entry stays for the next
 * reader, which restores it byte for byte. */
static void test_reader_out_of_memory(void **state)
{
    (void)state;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    skip(); /* the sanitizers reserve address space far beyond any cap */
#endif
    struct redis_srv k = {0};
    assert_int_equal(redis_start(&k, base, 0, ""), 0);
    char url[128];
    snprintf(url, sizeof(url), "%s", redis_url(&k, "oom"));
    kvt_remote *w = open_remote(url, 1 << 20, 2000);
    assert_non_null(w);
    assert_int_equal(remote_put(w, 311, BIG_TOK), 0);
    kvt_remote_close(w);
    pid_t pid = fork();
    if (pid == 0)
        _exit(capped_child(url));
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    kvt_remote *r = open_remote(url, 1 << 20, 2000);
    assert_non_null(r);
    assert_int_equal(stats(r).entries, 1);
    assert_int_equal(remote_restore(r, 311, BIG_TOK), 1);
    kvt_remote_close(r);
    redis_kill(&k);
}

/* ---- one deadline per call ---------------------------------------------------------------- */

/* Through a link that passes 1 KiB every 0.3 s, a restore and an upload each end within their
 * one deadline (1 s, plus 1 s per 64 MiB moved), not after every byte trickled through; the
 * entry stays. */
static void test_deadline_through_slow_link(void **state)
{
    (void)state;
    struct redis_srv k = {0};
    assert_int_equal(redis_start(&k, base, 0, ""), 0);
    char url[128], slow[128];
    snprintf(url, sizeof(url), "%s", redis_url(&k, "dl"));
    kvt_remote *w = open_remote(url, 64 << 10, 2000);
    assert_non_null(w);
    assert_int_equal(remote_put(w, 321, N_TOK), 0);
    struct slow_relay P;
    assert_int_equal(slow_relay_start(&P, k.port, 0), 0);
    snprintf(slow, sizeof(slow), "redis://127.0.0.1:%d/dl", P.port);
    kvt_remote *r = open_remote(slow, 64 << 10, 1000);
    assert_non_null(r);
    assert_int_equal(kvt_remote_refresh(r), 0);
    P.slow = 1;
    int64_t t0 = now_ms();
    int got = remote_restore(r, 321, N_TOK);
    int64_t restore_ms = now_ms() - t0;
    t0 = now_ms();
    int rc = remote_put(r, 322, BIG_TOK);
    int64_t put_ms = now_ms() - t0;
    print_message("slow link: restore %d after %lld ms, upload of 27 MB %d after %lld ms\n", got,
                  (long long)restore_ms, rc, (long long)put_ms);
    assert_int_equal(got, 0);
    assert_true(restore_ms < 1000 + 600 * SLACK);
    assert_true(rc < 0);
    assert_true(put_ms < 1000 + 400 + 600 * SLACK);
    assert_int_equal(kvt_remote_refresh(w), 0);
    assert_int_equal(remote_restore(w, 321, N_TOK), 1); /* kept */
    kvt_remote_close(r);
    kvt_remote_close(w);
    slow_relay_stop(&P);
    redis_kill(&k);
}

/* ---- the CLI's errors and a failed upload's message ----------------------------------------- */

/* `kvtier ls` against @p url: its exit status, its output in *@p out (caller frees). */
static int cli_ls(const char *url, char **out)
{
    char *args = strf("ls --redis '%s' --model-id %s --config-fingerprint %s --tokenizer-hash %s",
                      url, REMOTE_MODEL, REMOTE_FP, REMOTE_TOK);
    int rc = run_cli(args, true, out);
    print_message("ls: exit %d: %s", rc, *out);
    free(args);
    return rc;
}

/* An ACL user without key permissions and an index key of the wrong type are errors with
 * the server's own words and no password; a failed upload says why it failed. */
static void test_cli_errors(void **state)
{
    (void)state;
    struct redis_srv k = {0};
    assert_int_equal(redis_start(&k, base, 0, "--requirepass sekrit"), 0);
    char *out = NULL;
    assert_int_equal(redis_cli(&k,
                               "-a sekrit --no-auth-warning ACL SETUSER keyless on "
                               "'>pw3' '~other:*' '+@all'",
                               &out),
                     0);
    free(out);
    char url[160], *keyless = strf("redis://keyless:pw3@127.0.0.1:%d/cli", k.port);
    snprintf(url, sizeof(url), "redis://:sekrit@127.0.0.1:%d/cli", k.port);
    kvt_remote *r = open_remote(url, 64 << 10, 2000);
    assert_non_null(r);
    assert_int_equal(remote_put(r, 331, N_TOK), 0);

    assert_int_not_equal(cli_ls(keyless, &out), 0);
    assert_non_null(strstr(out, "NOPERM"));
    assert_null(strstr(out, "pw3"));
    assert_non_null(strstr(out, "keyless:***@"));
    free(out);

    struct kvt_rkeys keys;
    assert_int_equal(kvt_rkeys_init(&keys, "cli", REMOTE_MODEL, REMOTE_FP, REMOTE_TOK), 0);
    char *junk = strf("-a sekrit --no-auth-warning EVAL \"redis.call('DEL', KEYS[1]) return "
                      "redis.call('SET', KEYS[1], 'x')\" 1 '%s'",
                      keys.idx);
    assert_int_equal(redis_cli(&k, junk, NULL), 0);
    assert_int_not_equal(cli_ls(url, &out), 0);
    assert_non_null(strstr(out, "WRONGTYPE"));
    assert_null(strstr(out, "sekrit"));
    free(out);

    redis_kill(&k);
    assert_true(remote_put(r, 332, N_TOK) < 0);
    print_message("failed upload: %s\n", kvt_last_error());
    assert_non_null(strstr(kvt_last_error(), "connect"));
    assert_null(strstr(kvt_last_error(), "backing off"));
    assert_null(strstr(kvt_last_error(), "not retried"));
    kvt_remote_close(r);
    kvt_rkeys_free(&keys);
    free(junk);
    free(keyless);
}

/* A server that answers every request with an error full of control bytes and far too long
 * (no real Redis sends one: this stands in for a hostile or broken peer); a thread a
 * connection, as the remote tier holds several. */
static void *hostile_conn(void *ud)
{
    int c = (int)(intptr_t)ud;
    char evil[1000], req[4096];
    int n = snprintf(evil, sizeof(evil), "-ERR evil\x1b[2J\x07\x7f\xc3\xa9");
    memset(evil + n, 'A', sizeof(evil) - n - 2);
    memcpy(evil + sizeof(evil) - 2, "\r\n", 2);
    while (read(c, req, sizeof(req)) > 0)
        if (write(c, evil, sizeof(evil)) != (ssize_t)sizeof(evil))
            break;
    close(c);
    return NULL;
}

static void *hostile_server(void *ud)
{
    for (int c; (c = accept(*(int *)ud, NULL, NULL)) >= 0;) {
        pthread_t t;
        if (pthread_create(&t, NULL, hostile_conn, (void *)(intptr_t)c) == 0)
            pthread_detach(t);
    }
    return NULL;
}

/* Error text from the server reaches messages as printable ASCII, bounded in length. */
static void test_server_error_text_cleaned(void **state)
{
    (void)state;
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    assert_int_equal(bind(ls, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(ls, 8), 0);
    assert_int_equal(getsockname(ls, (struct sockaddr *)&a, &al), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, hostile_server, &ls), 0);
    char url[96];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/evil", ntohs(a.sin_port));
    kvt_remote *r = open_remote(url, 64 << 10, 2000); /* opens: the server may come back */
    assert_non_null(r);
    assert_true(remote_put(r, 333, N_TOK) < 0);
    const char *msg = kvt_last_error();
    print_message("put: %.120s...\n", msg);
    assert_non_null(strstr(msg, "evil"));
    for (const char *p = msg; *p; p++)
        assert_true(*p >= 0x20 && *p <= 0x7e);
    assert_true(strlen(msg) < 600);
    kvt_remote_close(r);
    shutdown(ls, SHUT_RDWR);
    close(ls);
    pthread_join(t, NULL);
}

static int zero_next(void *ud, uint8_t **at, size_t *len)
{
    *at = ud;
    *len = 0;
    return 0;
}

static int zero_wrote(void *ud, size_t n)
{
    (void)ud;
    (void)n;
    return 0;
}

/* A sink that offers no room ends the read with its own error instead of looping forever. */
static void test_sink_without_room(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    const char reply[] = "$8\r\n12345678\r\n";
    assert_int_equal(write(sv[1], reply, sizeof(reply) - 1), (ssize_t)sizeof(reply) - 1);
    static struct kvt_rio r;
    memset(&r, 0, sizeof(r));
    r.fd = sv[0];
    r.deadline_ms = kvt_mono_ms() + 2000;
    uint8_t room[8];
    struct kvt_rsink sink = {.next = zero_next, .wrote = zero_wrote, .ud = room};
    assert_int_equal(kvt_rio_reply_sink(&r, 8, &sink), KVT_R_SINK);
    assert_int_equal(r.sink_rc, -EINVAL);
    close(sv[0]);
    close(sv[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_restart_no_sigpipe),
        cmocka_unit_test(test_reader_out_of_memory),
        cmocka_unit_test(test_deadline_through_slow_link),
        cmocka_unit_test(test_cli_errors),
        cmocka_unit_test(test_server_error_text_cleaned),
        cmocka_unit_test(test_sink_without_room),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
