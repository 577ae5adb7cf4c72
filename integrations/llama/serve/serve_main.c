/*
 * kvtier-llama serve (serve.h): options, the model and its context, kvtier's prompt cache,
 * the engine and HTTP threads; SIGTERM or SIGINT stops accepting, lets the running requests
 * end, makes every saved prompt durable and exits 0.
 */
#include <ggml-backend.h>
#include <microhttpd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve.h"

static int usage(void)
{
    fprintf(stderr,
            "usage: kvtier-llama serve -m MODEL.gguf --cache-dir DIR [--redis URL] "
            "[--host 127.0.0.1] [--port 8080]\n"
            "                          [--slots 4] [--ctx 4096] [--ram-bytes 1073741824] "
            "[--threads CPUS] [--alias NAME]\n"
            "                          [--no-share-prefixes]\n"
            "       kvtier-llama serve -m MODEL.gguf --no-cache ...   (the prompt cache off)\n");
    return 2;
}

static bool num(const char *v, long long lo, long long hi, long long *out)
{
    char *end;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || x < lo || x > hi)
        return false;
    *out = x;
    return true;
}

static int parse(int argc, char **argv, struct serve_opts *o)
{
    *o = (struct serve_opts){.host = "127.0.0.1",
                             .port = 8080,
                             .slots = 4,
                             .ctx = 4096,
                             .ram_bytes = 1ull << 30,
                             .share_prefixes = true};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x = 0;
        bool ok = v != NULL;
        if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0)
            o->model = v;
        else if (strcmp(a, "--cache-dir") == 0)
            o->cache_dir = v;
        else if (strcmp(a, "--host") == 0)
            o->host = v;
        else if (strcmp(a, "--alias") == 0)
            o->alias = v;
        else if (strcmp(a, "--redis") == 0)
            o->redis = v;
        else if (strcmp(a, "--no-cache") == 0) {
            o->no_cache = true;
            continue;
        } else if (strcmp(a, "--no-share-prefixes") == 0) {
            o->share_prefixes = false;
            continue;
        } else if (strcmp(a, "--port") == 0)
            ok = ok && num(v, 0, 65535, &x), o->port = (int)x;
        else if (strcmp(a, "--slots") == 0)
            ok = ok && num(v, 1, 64, &x), o->slots = (int)x;
        else if (strcmp(a, "--ctx") == 0)
            ok = ok && num(v, 64, 1 << 20, &x), o->ctx = (int)x;
        else if (strcmp(a, "--threads") == 0)
            ok = ok && num(v, 1, 1024, &x), o->threads = (int)x;
        else if (strcmp(a, "--ram-bytes") == 0)
            ok = ok && num(v, 1, (long long)1 << 50, &x), o->ram_bytes = (uint64_t)x;
        else {
            fprintf(stderr, "kvtier-llama serve: unknown option %s\n", a);
            return usage();
        }
        if (!ok) {
            fprintf(stderr, "kvtier-llama serve: %s needs a %svalue\n", a, v ? "valid " : "");
            return usage();
        }
        i++;
    }
    if (!o->model || (!o->cache_dir && !o->no_cache)) {
        fprintf(stderr, "kvtier-llama serve: -m MODEL and --cache-dir DIR are required\n");
        return usage();
    }
    if (o->redis && o->no_cache) {
        fprintf(stderr, "kvtier-llama serve: --redis needs the cache (not --no-cache)\n");
        return usage();
    }
    return 0;
}

static void quiet(enum ggml_log_level level, const char *text, void *ud)
{
    (void)ud;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

/* One thread pool for every decode, as llama-server has: without one, llama.cpp starts and
 * joins its threads in each llama_decode(), which on a busy machine costs more than a small
 * decode itself. The CPU back-end is loaded at run time, so its calls are looked up. */
static void attach_pool(struct server *s)
{
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_reg_t reg = cpu ? ggml_backend_dev_backend_reg(cpu) : NULL;
    if (!reg)
        return;
    typedef struct ggml_threadpool *(*pool_new_fn)(struct ggml_threadpool_params *);
    pool_new_fn pool_new =
        (pool_new_fn)ggml_backend_reg_get_proc_address(reg, "ggml_threadpool_new");
    s->pool_free = (void (*)(struct ggml_threadpool *))ggml_backend_reg_get_proc_address(
        reg, "ggml_threadpool_free");
    if (!pool_new || !s->pool_free)
        return;
    struct ggml_threadpool_params p = ggml_threadpool_params_default(llama_n_threads(s->ctx));
    s->pool = pool_new(&p);
    if (s->pool)
        llama_attach_threadpool(s->ctx, s->pool, NULL);
}

/* The model, a context of one sequence per slot, kvtier's cache on it. */
static int open_engine(struct server *s)
{
    llama_log_set(quiet, NULL);
    ggml_backend_load_all_from_path(KVT_LLAMA_LIB_DIR);
    s->model = llama_model_load_from_file(s->o.model, llama_model_default_params());
    if (!s->model) {
        fprintf(stderr, "kvtier-llama serve: cannot load %s\n", s->o.model);
        return -1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)s->o.ctx * (uint32_t)s->o.slots;
    cp.n_seq_max = (uint32_t)s->o.slots;
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch =
        s->o.threads ? s->o.threads : (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    s->ctx = llama_init_from_model(s->model, cp);
    if (!s->ctx) {
        fprintf(stderr, "kvtier-llama serve: cannot create a context of %d slots of %d tokens\n",
                s->o.slots, s->o.ctx);
        return -1;
    }
    attach_pool(s);
    s->vocab = llama_model_get_vocab(s->model);
    s->n_ctx_seq = llama_n_ctx_seq(s->ctx);
    s->tmpl = llama_model_chat_template(s->model, NULL);
    if (!s->tmpl)
        s->tmpl = "chatml";
    const char *base = strrchr(s->o.model, '/') ? strrchr(s->o.model, '/') + 1 : s->o.model;
    snprintf(s->model_id, sizeof(s->model_id), "%s", s->o.alias ? s->o.alias : base);
    size_t l = strlen(s->model_id);
    if (!s->o.alias && l > 5 && strcmp(s->model_id + l - 5, ".gguf") == 0)
        s->model_id[l - 5] = '\0';
    s->fingerprint = "no-cache";
    if (s->o.no_cache)
        return 0;
    struct kvt_llama_opts ko;
    kvt_llama_opts_init(&ko);
    ko.cache_dir = s->o.cache_dir;
    ko.model_path = s->o.model;
    ko.cparams = &cp;
    ko.ram_max_bytes = s->o.ram_bytes;
    ko.share_prefixes = s->o.share_prefixes;
    if (remote_open_cache(s, &ko) != 0)
        return -1;
    s->fingerprint = kvt_llama_identity(s->kl)->config_fingerprint;
    return 0;
}

static void close_engine(struct server *s)
{
    llama_free(s->ctx);
    if (s->pool)
        s->pool_free(s->pool);
    llama_model_free(s->model);
}

int cmd_serve(int argc, char **argv)
{
    static struct server s;
    int rc = parse(argc, argv, &s.o);
    if (rc)
        return rc;
    sigset_t sigs; /* taken by sigwait() below, blocked in every thread started from here */
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.wake, NULL);
    pthread_cond_init(&s.progress, NULL);
    if (open_engine(&s) != 0) {
        if (s.ctx)
            close_engine(&s);
        return 1;
    }
    int port = s.o.port;
    bool started = sched_start(&s) == 0;
    struct MHD_Daemon *d = started ? http_start(&s, &port) : NULL;
    if (!d) {
        if (started)
            sched_stop(&s);
        kvt_llama_close(s.kl, -1);
        close_engine(&s);
        return 1;
    }
    fprintf(stderr,
            "kvtier-llama serve: listening on http://%s:%d (model %s, %d slots of %zu tokens, "
            "cache %s%s%s)\n",
            s.o.host, port, s.model_id, s.o.slots, s.n_ctx_seq,
            s.o.no_cache ? "off" : s.o.cache_dir, s.remote ? ", remote " : "",
            s.remote ? s.redis_shown : "");
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "kvtier-llama serve: %s: finishing the running requests\n", strsignal(sig));
    MHD_socket lfd = MHD_quiesce_daemon(d);
    if (lfd != MHD_INVALID_SOCKET)
        close(lfd);
    sched_stop(&s);
    http_drain(&s, 30); /* the streams send their last events */
    MHD_stop_daemon(d);
    rc = s.kl ? kvt_llama_flush(s.kl, -1) : 0;
    if (rc)
        fprintf(stderr, "kvtier-llama serve: flush failed: %s\n", kvt_last_error());
    remote_drain(&s); /* the uploads queued behind the disk writes */
    kvt_llama_close(s.kl, 0);
    close_engine(&s);
    fprintf(stderr, "kvtier-llama serve: stopped, the cache is on disk\n");
    return rc ? 1 : 0;
}
