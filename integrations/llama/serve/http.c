/*
 * HTTP (serve.h) on libmicrohttpd, one thread per connection: a request's thread parses it,
 * queues its job and waits for the engine's text, sending a finished response or, for
 * streams, server-sent events as the text arrives. While it waits it watches its socket: a
 * client that hung up cancels its job, which frees the slot at the engine's next step.
 */
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "serve.h"

#define MAX_BODY (16u << 20)

struct request {
    char *body;
    size_t len;
    bool too_big;
};

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type,
                             char *body)
{
    if (!body)
        return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result reply_error(struct server *s, struct MHD_Connection *c,
                                   const struct api_error *e)
{
    pthread_mutex_lock(&s->mu);
    s->m.errors++;
    pthread_mutex_unlock(&s->mu);
    return reply(c, (unsigned)e->status, "application/json", api_error_json(e));
}

static enum MHD_Result fail(struct server *s, struct MHD_Connection *c, int status,
                            const char *code, const char *msg)
{
    struct api_error e = {status, status >= 500 ? "server_error" : "invalid_request_error", code,
                          ""};
    snprintf(e.message, sizeof(e.message), "%s", msg);
    return reply_error(s, c, &e);
}

static bool client_gone(int fd)
{
    struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
    if (fd < 0 || poll(&p, 1, 0) <= 0)
        return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR))
        return true;
    char b;
    return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* Under s->mu: wait until the job has text past @p sent or is done. false (and the job
 * cancelled) when the client hung up meanwhile. */
static bool wait_job(struct server *s, struct job *j, size_t sent, int fd)
{
    while (!j->done && j->released <= sent) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->progress, &s->mu, &ts);
        if (!j->done && client_gone(fd)) {
            j->cancelled = true;
            return false;
        }
    }
    return true;
}

static int conn_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

struct stream {
    struct server *s;
    struct job *j;
    int fd;
    size_t sent, mark; /* text sent; job.marks sent */
    bool started, ended;
    char *pend;
    size_t pend_len, pend_off;
};

/* Under s->mu: the events for what the job did since the last call. */
static void events(struct stream *st, FILE *f)
{
    struct server *s = st->s;
    struct job *j = st->j;
    char *ev;
    while (st->sent < j->released) {
        size_t end = st->mark < j->n_marks ? j->marks[st->mark++] : j->released;
        if (end <= st->sent)
            continue;
        ev = api_chunk(s, j, j->text + st->sent, end - st->sent, false, NULL);
        st->sent = end;
        fputs(ev ? ev : "", f);
        free(ev);
    }
    if (!j->done)
        return;
    if (j->error[0]) {
        struct api_error e = {j->status, "server_error",
                              j->status == 503 ? "shutting_down" : "engine_error", ""};
        snprintf(e.message, sizeof(e.message), "%s", j->error);
        ev = api_error_json(&e);
        fprintf(f, "data: %s\n\n", ev ? ev : "{}");
    } else {
        ev = api_chunk(s, j, NULL, 0, false, j->finish);
        fputs(ev ? ev : "", f);
        if (j->include_usage) {
            free(ev);
            ev = api_usage_chunk(s, j);
            fputs(ev ? ev : "", f);
        }
    }
    free(ev);
    fputs("data: [DONE]\n\n", f);
    st->ended = true;
}

static bool refill(struct stream *st)
{
    struct server *s = st->s;
    FILE *f = open_memstream(&st->pend, &st->pend_len);
    if (!f)
        return false;
    bool ok = true;
    pthread_mutex_lock(&s->mu);
    if (!st->started && st->j->kind == JOB_CHAT) {
        char *ev = api_chunk(s, st->j, NULL, 0, true, NULL);
        fputs(ev ? ev : "", f);
        free(ev);
    } else if (!wait_job(s, st->j, st->sent, st->fd))
        ok = false;
    else
        events(st, f);
    st->started = true;
    pthread_mutex_unlock(&s->mu);
    fclose(f);
    return ok;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct stream *st = cls;
    while (st->pend_off == st->pend_len) {
        free(st->pend);
        st->pend = NULL;
        st->pend_len = st->pend_off = 0;
        if (st->ended)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (!refill(st))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = st->pend_len - st->pend_off < max ? st->pend_len - st->pend_off : max;
    memcpy(buf, st->pend + st->pend_off, n);
    st->pend_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    struct stream *st = cls;
    pthread_mutex_lock(&st->s->mu);
    if (!st->j->done)
        st->j->cancelled = true;
    job_release(st->j);
    pthread_mutex_unlock(&st->s->mu);
    free(st->pend);
    free(st);
}

static enum MHD_Result start_stream(struct server *s, struct MHD_Connection *c, struct job *j)
{
    struct stream *st = calloc(1, sizeof(*st));
    struct MHD_Response *r =
        st ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free)
           : NULL;
    if (!r) {
        free(st);
        pthread_mutex_lock(&s->mu);
        j->cancelled = true;
        job_release(j);
        pthread_mutex_unlock(&s->mu);
        return MHD_NO;
    }
    *st = (struct stream){.s = s, .j = j, .fd = conn_fd(c)};
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result complete(struct server *s, struct MHD_Connection *c, enum job_kind kind,
                                const struct request *rq)
{
    struct api_error e;
    if (rq->too_big)
        return fail(s, c, 413, "body_too_large", "the request body exceeds 16 MiB");
    struct job *j = api_parse(s, kind, rq->body ? rq->body : "", rq->len, &e);
    if (!j)
        return reply_error(s, c, &e);
    if (!sched_submit(s, j)) {
        pthread_mutex_lock(&s->mu);
        job_release(j);
        pthread_mutex_unlock(&s->mu);
        return fail(s, c, 503, "shutting_down", "the server is shutting down");
    }
    if (j->stream)
        return start_stream(s, c, j);
    pthread_mutex_lock(&s->mu);
    bool stayed = wait_job(s, j, (size_t)-1, conn_fd(c));
    char *body = stayed && !j->error[0] ? api_response(s, j) : NULL;
    char err[sizeof(j->error)];
    snprintf(err, sizeof(err), "%s", j->error[0] ? j->error : "out of memory");
    int status = j->error[0] ? j->status : 500;
    job_release(j);
    pthread_mutex_unlock(&s->mu);
    if (!stayed)
        return MHD_NO; /* nobody to answer */
    if (!body)
        return fail(s, c, status, status == 503 ? "shutting_down" : "engine_error", err);
    return reply(c, MHD_HTTP_OK, "application/json", body);
}

static enum MHD_Result route(struct server *s, struct MHD_Connection *c, const char *url,
                             const char *method, const struct request *rq)
{
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (strcmp(url, "/v1/chat/completions") == 0 || strcmp(url, "/v1/completions") == 0) {
        if (strcmp(method, "POST") != 0)
            return fail(s, c, 405, "method_not_allowed", "use POST");
        return complete(s, c, strcmp(url, "/v1/completions") ? JOB_CHAT : JOB_COMPLETION, rq);
    }
    bool known = strcmp(url, "/health") == 0 || strcmp(url, "/metrics") == 0 ||
                 strcmp(url, "/v1/models") == 0;
    if (!known)
        return fail(s, c, 404, "not_found", "no such route");
    if (!get)
        return fail(s, c, 405, "method_not_allowed", "use GET");
    if (strcmp(url, "/v1/models") == 0)
        return reply(c, MHD_HTTP_OK, "application/json", api_models(s));
    if (strcmp(url, "/metrics") == 0)
        return reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4", metrics_text(s));
    return reply(c, MHD_HTTP_OK, "application/json", strdup("{\"status\":\"ok\"}"));
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *data,
                              size_t *size, void **con_cls)
{
    (void)version;
    struct request *rq = *con_cls;
    struct server *s = cls;
    if (!rq) {
        *con_cls = rq = calloc(1, sizeof(*rq));
        if (!rq)
            return MHD_NO;
        pthread_mutex_lock(&s->mu);
        s->open_requests++;
        pthread_mutex_unlock(&s->mu);
        return MHD_YES;
    }
    if (*size) {
        if (!rq->too_big && rq->len + *size <= MAX_BODY) {
            char *b = realloc(rq->body, rq->len + *size + 1);
            if (!b)
                return MHD_NO;
            memcpy(b + rq->len, data, *size);
            rq->body = b;
            rq->len += *size;
            rq->body[rq->len] = '\0';
        } else
            rq->too_big = true;
        *size = 0;
        return MHD_YES;
    }
    return route(s, c, url, method, rq);
}

static void request_done(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode why)
{
    (void)c, (void)why;
    struct server *s = cls;
    struct request *rq = *con_cls;
    if (!rq)
        return;
    free(rq->body);
    free(rq);
    *con_cls = NULL;
    pthread_mutex_lock(&s->mu);
    s->open_requests--;
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->mu);
}

void http_drain(struct server *s, double secs)
{
    double end = now_s() + secs;
    pthread_mutex_lock(&s->mu);
    while (s->open_requests && now_s() < end) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&s->progress, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
}

struct MHD_Daemon *http_start(struct server *s, int *port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", *port);
    int rc = getaddrinfo(s->o.host, ps, &hints, &ai);
    if (rc) {
        fprintf(stderr, "kvtier-llama serve: --host %s: %s\n", s->o.host, gai_strerror(rc));
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    struct MHD_Daemon *d =
        MHD_start_daemon(flags, (uint16_t)*port, NULL, NULL, handle, s, MHD_OPTION_SOCK_ADDR,
                         ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, request_done, s,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        fprintf(stderr, "kvtier-llama serve: cannot listen on %s:%d\n", s->o.host, *port);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    if (di)
        *port = di->port;
    return d;
}
