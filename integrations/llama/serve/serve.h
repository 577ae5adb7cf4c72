/*
 * kvtier-llama serve: an OpenAI-compatible HTTP server on llama.cpp whose prompt cache is
 * kvtier. Three kinds of threads: libmicrohttpd's connection threads parse requests, queue
 * jobs and wait for their text; one engine thread owns the llama.cpp context and the
 * kvt_llama handle and decodes every busy slot in one batch per step; kvtier's own writer
 * thread writes finished conversations to disk behind the requests (with --redis, the remote
 * tier's threads upload them behind that and merge what other servers published).
 */
#ifndef KVT_SERVE_H
#define KVT_SERVE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier-llama.h"

struct serve_opts {
    const char *model, *cache_dir, *host, *alias;
    const char *redis; /* the remote tier's URL, or NULL */
    int port, slots, ctx, threads;
    uint64_t ram_bytes;
    bool no_cache;       /* every prompt prefilled whole, nothing saved: the benchmark's baseline */
    bool share_prefixes; /* a prompt several conversations begin with stored once (default) */
};

enum job_kind { JOB_CHAT, JOB_COMPLETION };

#define MAX_STOP 4

struct sample_params {
    float temperature, top_p;
    int top_k;
    uint32_t seed;
    long max_tokens;
    char *stop[MAX_STOP];
    int n_stop;
};

/* Where a request's cached prompt tokens came from. */
enum cache_source { SRC_NONE, SRC_SLOT, SRC_RAM, SRC_DISK, SRC_REMOTE, SRC_COUNT };

/* One request. The HTTP side fills the first block before queueing it; the rest is written
 * by the engine under server.mu and read by the HTTP side under it. */
struct job {
    enum job_kind kind;
    bool stream, include_usage;
    llama_token *prompt;
    size_t n_prompt;
    struct sample_params sp;
    char id[48];
    long long created;
    double t_arrival;

    struct job *next; /* the queue */
    char *text;       /* generated text, valid UTF-8; text[0..released) may be sent */
    size_t len, cap, released;
    size_t *marks; /* released as it grew, token by token: a stream sends one chunk each */
    size_t n_marks, cap_marks;
    size_t n_cached, n_gen;
    enum cache_source source;
    bool done, cancelled;
    const char *finish; /* "stop" or "length" */
    char error[160];    /* set when the engine failed it, with its HTTP status */
    int status;
    int refs;

    /* engine only: a UTF-8 sequence split across tokens */
    unsigned char utf8[4];
    int n_utf8;
};

/* Counters for /metrics, under server.mu. */
#define TTFT_BUCKETS 12
struct metrics {
    uint64_t requests[2], errors, prompt_tokens, prefilled, generated;
    uint64_t decode_steps, decode_seqs; /* batches, and the sequences in them summed */
    uint64_t cached[SRC_COUNT];
    uint64_t ttft_count, ttft_le[TTFT_BUCKETS];
    double ttft_sum;
};
extern const double ttft_bounds[TTFT_BUCKETS];

struct slot;

struct server {
    struct serve_opts o;
    char model_id[256];
    struct llama_model *model;
    struct llama_context *ctx;
    struct ggml_threadpool *pool; /* kept across decodes (else each one starts threads) */
    void (*pool_free)(struct ggml_threadpool *);
    const struct llama_vocab *vocab;
    const char *tmpl;
    kvt_llama *kl;         /* NULL with no_cache */
    kvt_remote *remote;    /* the --redis tier (kl's), or NULL */
    char redis_shown[512]; /* its URL with the password as "***" */
    const char *fingerprint;
    size_t n_ctx_seq;

    pthread_mutex_t mu;
    pthread_cond_t wake;     /* the engine: a job queued, or stopping */
    pthread_cond_t progress; /* the HTTP side: some job got text or ended */
    struct job *head, *tail;
    size_t queued, busy;
    size_t open_requests; /* HTTP requests not yet answered to the end */
    bool stopping;
    struct metrics m;

    struct slot *slots;
    pthread_t engine;
};

/* sched.c: the engine thread */
int sched_start(struct server *s);
/** Stop taking queued jobs (they fail with 503), finish the running ones, join. */
void sched_stop(struct server *s);
/** Queue @p j (the queue holds a reference). false when the server is stopping. */
bool sched_submit(struct server *s, struct job *j);

/* job.c */
struct job *job_new(void);
/** Drop one reference; under server.mu. */
void job_release(struct job *j);
/** Append a token's bytes, keeping the text valid UTF-8 (a bad byte becomes U+FFFD). */
void job_append(struct job *j, const char *piece, size_t n);
/** Move the text that can no longer become part of a stop string to released; true when a
 * stop string was found (the text is cut before it). At @p final, release everything. */
bool job_release_text(struct job *j, bool final);
double now_s(void);

/* api.c: the OpenAI request and response bodies */
struct api_error {
    int status;
    const char *type, *code;
    char message[256];
};
/** Parse a request body into a new job. NULL with @p e filled on a bad request. */
struct job *api_parse(struct server *s, enum job_kind kind, const char *body, size_t n,
                      struct api_error *e);
/** The whole response of a finished job (malloc'd JSON). */
char *api_response(const struct server *s, const struct job *j);
/** One SSE event "data: ...\n\n" for a stream (malloc'd): the first (role) chunk when
 * @p first, else a delta of @p text / the final chunk with @p finish set. */
char *api_chunk(const struct server *s, const struct job *j, const char *text, size_t n, bool first,
                const char *finish);
/** The usage-only chunk of stream_options.include_usage (malloc'd "data: ...\n\n"). */
char *api_usage_chunk(const struct server *s, const struct job *j);
char *api_error_json(const struct api_error *e);
char *api_models(const struct server *s);

/* metrics.c */
char *metrics_text(struct server *s);
/** Count a first token @p secs after arrival (under server.mu). */
void metrics_ttft(struct metrics *m, double secs);

/* serve_remote.c: the --redis tier */
/** Open kvtier's prompt cache with @p ko, the remote tier of --redis attached, and check that
 * the server answers: a bad URL, a refused password or an unreachable server fails (-1) with
 * its message on stderr, the password never shown. */
int remote_open_cache(struct server *s, struct kvt_llama_opts *ko);
/** Wait for the uploads queued so far (at SIGTERM, after the disk flush); a timeout is logged,
 * not failed: the cache is durable on disk, Redis only shares it. */
void remote_drain(struct server *s);

/* http.c */
struct MHD_Daemon;
struct MHD_Daemon *http_start(struct server *s, int *port);
/** Wait up to @p secs until every request has been answered to its end. */
void http_drain(struct server *s, double secs);

int cmd_serve(int argc, char **argv);

#endif
