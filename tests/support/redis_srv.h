/*
 * Real redis-server processes for the remote-tier suites and the benchmark: started on
 * 127.0.0.1 with free ports in a scratch directory, killed by pid at the end (also when the
 * test process dies: the servers get SIGKILL with their parent). Nothing here downloads.
 */
#ifndef KVT_TEST_REDIS_SRV_H
#define KVT_TEST_REDIS_SRV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvtier.h"

struct redis_srv {
    pid_t pid;
    int port;
    char dir[512];
    char sock[600];
    char extra[512]; /* extra server arguments, kept for restarts */
};

/** Sleep @p ms milliseconds; the monotonic clock in ms. */
void msleep(int ms);
int64_t now_ms(void);

/** Whether redis-server and redis-cli are installed. */
bool redis_available(void);
/** A free TCP port whose cluster bus port (+10000) is free too. */
int redis_free_port(void);
/** Start a server in @p dir on @p port (0 = a free one) with @p extra arguments ("" = none);
 * waits until it answers PING. 0 or -1. */
int redis_start(struct redis_srv *s, const char *dir, int port, const char *extra);
/** A suite's server: a scratch directory tagged @p tag in *@p base and a server in it, no
 * extra arguments. 0, or -1 (also when Redis is not installed). */
int redis_suite_start(struct redis_srv *s, const char *tag, char **base);
/** Kill the suite's server and remove its directory *@p base (freed). 0. */
int redis_suite_stop(struct redis_srv *s, char **base);
/** SIGKILL and reap (no-op when not running). */
void redis_kill(struct redis_srv *s);
/** Kill and start again on the same port, empty. */
int redis_restart(struct redis_srv *s);
/** Run redis-cli against @p s with @p args; its output in *out (may be NULL; caller frees). */
int redis_cli(const struct redis_srv *s, const char *args, char **out);
/** "redis://127.0.0.1:<port>/<prefix>" (a buffer of the calling thread). */
const char *redis_url(const struct redis_srv *s, const char *prefix);

/** A cluster of @p masters masters with @p replicas replicas each. */
struct redis_cluster {
    struct redis_srv node[12];
    int n;
};
int redis_cluster_start(struct redis_cluster *c, const char *dir, int masters, int replicas);
void redis_cluster_stop(struct redis_cluster *c);
/** Wait until every live node reports cluster_state:ok and every live replica is in sync with
 * its master (up to @p ms). 0 or -1. */
int redis_cluster_wait_ok(struct redis_cluster *c, int ms);
/** The node (index) that is master for @p slot now, or -1. */
int redis_cluster_master_of(struct redis_cluster *c, unsigned slot);

/* The identity and entries the remote suites and their peer program share. */
#define REMOTE_MODEL "model-remote"
#define REMOTE_FP "fp-remote"
#define REMOTE_TOK "tok-remote"
/** Tokens of entry @p seed: n of them, distinct per seed from the first token on. */
void remote_tokens(uint64_t seed, size_t n, int32_t *out);
/** Options of that identity on @p url (@p chunk 0: the default chunk size). */
void remote_opts(struct kvt_remote_opts *o, const char *url, uint64_t chunk, int timeout_ms,
                 int poll_ms);
/** Entry @p seed of @p n tokens (synth_random_entry() of remote_tokens()). */
struct kvt_entry *remote_entry(uint64_t seed, size_t n);
/** kvt_remote_put() of entry @p seed. */
int remote_put(kvt_remote *r, uint64_t seed, size_t n);
/** Find and restore entry @p seed: 1 identical, 0 miss, -1 not found, -2 wrong bytes (no
 * cmocka asserts: forked children use it too). */
int remote_restore(kvt_remote *r, uint64_t seed, size_t n);
/* Branches: REMOTE_SHARED tokens of prompt p, then REMOTE_OWN of branch b; a kv layer (cut
 * into shared objects) and an ssm layer (kept whole), bytes derived from the tokens. */
#define REMOTE_SHARED 600 /* two whole 256-token chunks */
#define REMOTE_OWN 100
#define REMOTE_BRANCH_TOK (REMOTE_SHARED + REMOTE_OWN)
void remote_branch_tokens(int p, int b, int32_t *t);
struct kvt_entry *remote_branch(int p, int b);
/** kvt_remote_put() of branch @p b of prompt @p p. */
int remote_put_branch(kvt_remote *r, int p, int b);
/** Find and restore it: 1 identical, 0 miss, -1 not found, -2 wrong bytes (no asserts). */
int remote_restore_branch(kvt_remote *r, int p, int b);
/* Time bounds stretch under the sanitizers, which slow every step several times. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define SLACK 4
#else
#define SLACK 1
#endif

#endif
