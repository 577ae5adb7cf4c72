/*
 * The OpenAI API's bodies (serve.h): requests of /v1/chat/completions and /v1/completions
 * become jobs (the chat through the model's own template), finished jobs and stream steps
 * become responses and chunks in OpenAI's shapes. Unknown request fields are ignored.
 */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

static void *bad(struct api_error *e, int status, const char *code, const char *fmt, ...)
{
    e->status = status;
    e->type = status == 404 ? "not_found_error" : "invalid_request_error";
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    return NULL;
}

/* A message's content: a string, or an array of {"type":"text","text":...} parts joined. */
static char *content_text(json_t *c)
{
    if (json_is_null(c) || !c)
        return strdup("");
    if (json_is_string(c))
        return strdup(json_string_value(c));
    if (!json_is_array(c))
        return NULL;
    size_t len = 0, i;
    json_t *p;
    json_array_foreach(c, i, p)
    {
        json_t *t = json_object_get(p, "text");
        if (!json_is_string(t))
            return NULL;
        len += json_string_length(t);
    }
    char *s = malloc(len + 1), *at = s;
    if (!s)
        return NULL;
    json_array_foreach(c, i, p)
    {
        json_t *t = json_object_get(p, "text");
        memcpy(at, json_string_value(t), json_string_length(t));
        at += json_string_length(t);
    }
    *at = '\0';
    return s;
}

/* The chat through the template into text; NULL with @p e set. */
static char *chat_prompt(struct server *s, json_t *msgs, struct api_error *e)
{
    size_t n = json_array_size(msgs);
    if (!json_is_array(msgs) || n == 0)
        return bad(e, 400, "invalid_value", "'messages' must be a non-empty array"), NULL;
    struct llama_chat_message *m = calloc(n, sizeof(*m));
    char **content = calloc(n, sizeof(*content));
    char *out = NULL;
    size_t i, total = 0;
    if (!m || !content) {
        bad(e, 500, "out_of_memory", "out of memory");
        goto done;
    }
    for (i = 0; i < n; i++) {
        json_t *msg = json_array_get(msgs, i), *role = json_object_get(msg, "role");
        content[i] = content_text(json_object_get(msg, "content"));
        if (!json_is_string(role) || !content[i]) {
            bad(e, 400, "invalid_value", "messages[%zu] needs a string 'role' and a text 'content'",
                i);
            goto done;
        }
        m[i].role =
            strcmp(json_string_value(role), "developer") == 0 ? "system" : json_string_value(role);
        m[i].content = content[i];
        total += strlen(content[i]) + 64;
    }
    int32_t cap = (int32_t)(total * 2 + 256), got = -1;
    for (int tries = 0; tries < 2; tries++) {
        free(out);
        out = malloc((size_t)cap + 1);
        got = out ? llama_chat_apply_template(s->tmpl, m, n, true, out, cap) : -1;
        if (got < 0 || got <= cap)
            break;
        cap = got;
    }
    if (got < 0) {
        free(out);
        out = NULL;
        bad(e, 500, "template_error", "the model's chat template cannot be applied");
    } else
        out[got] = '\0';
done:
    for (i = 0; content && i < n; i++)
        free(content[i]);
    free(content);
    free(m);
    return out;
}

static llama_token *tokenize(struct server *s, const char *text, bool special, size_t *n)
{
    int32_t len = (int32_t)strlen(text), cap = len + 8;
    llama_token *t = malloc((size_t)cap * sizeof(*t));
    int32_t got = t ? llama_tokenize(s->vocab, text, len, t, cap, true, special) : -1;
    if (got < 0) {
        free(t);
        return NULL;
    }
    *n = (size_t)got;
    return t;
}

/* /v1/completions' prompt: a string, a one-string array, or an array of token ids. */
static llama_token *completion_prompt(struct server *s, json_t *p, size_t *n, struct api_error *e)
{
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (json_is_string(p))
        return tokenize(s, json_string_value(p), false, n);
    size_t k = json_array_size(p), i;
    if (!json_is_array(p) || k == 0)
        return bad(e, 400, "invalid_value", "'prompt' must be a string or an array of tokens");
    llama_token *t = malloc(k * sizeof(*t));
    int nv = llama_vocab_n_tokens(s->vocab);
    json_t *v;
    json_array_foreach(p, i, v)
    {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= nv) {
            free(t);
            return bad(e, 400, "invalid_value",
                       "'prompt' holds one prompt: a string or token ids "
                       "below %d",
                       nv);
        }
        t[i] = (llama_token)id;
    }
    *n = k;
    return t;
}

static bool number(json_t *r, const char *key, double lo, double hi, double *v, struct api_error *e)
{
    json_t *x = json_object_get(r, key);
    if (!x || json_is_null(x))
        return true;
    if (!json_is_number(x) || json_number_value(x) < lo || json_number_value(x) > hi) {
        bad(e, 400, "invalid_value", "'%s' must be a number in [%g, %g]", key, lo, hi);
        return false;
    }
    *v = json_number_value(x);
    return true;
}

static bool stops(json_t *st, struct sample_params *sp, struct api_error *e)
{
    if (!st || json_is_null(st))
        return true;
    json_t *one = json_is_string(st) ? st : NULL;
    size_t k = one ? 1 : json_array_size(st);
    if ((!one && !json_is_array(st)) || k > MAX_STOP) {
        bad(e, 400, "invalid_value", "'stop' must be a string or up to %d strings", MAX_STOP);
        return false;
    }
    for (size_t i = 0; i < k; i++) {
        json_t *x = one ? one : json_array_get(st, i);
        if (!json_is_string(x) || json_string_length(x) == 0) {
            bad(e, 400, "invalid_value", "'stop' strings must be non-empty");
            return false;
        }
        sp->stop[sp->n_stop++] = strdup(json_string_value(x));
    }
    return true;
}

static bool params(json_t *r, enum job_kind kind, struct sample_params *sp, struct api_error *e)
{
    double t = 1.0, p = 1.0, k = 0, seed = -1, max = kind == JOB_COMPLETION ? 16 : -1, n = 1;
    bool ok = number(r, "temperature", 0, 2, &t, e) && number(r, "top_p", 0, 1, &p, e) &&
              number(r, "top_k", 0, 1e6, &k, e) && number(r, "seed", -9.2e18, 9.2e18, &seed, e) &&
              number(r, "max_tokens", 1, 1e9, &max, e) &&
              number(r, "max_completion_tokens", 1, 1e9, &max, e) && number(r, "n", 1, 1, &n, e) &&
              stops(json_object_get(r, "stop"), sp, e);
    sp->temperature = (float)t;
    sp->top_p = (float)p;
    sp->top_k = (int)k;
    sp->seed = seed < 0 ? LLAMA_DEFAULT_SEED : (uint32_t)(long long)seed;
    sp->max_tokens = (long)max;
    return ok;
}

struct job *api_parse(struct server *s, enum job_kind kind, const char *body, size_t n,
                      struct api_error *e)
{
    json_error_t je;
    json_t *r = json_loadb(body, n, 0, &je);
    if (!json_is_object(r)) {
        json_decref(r);
        return bad(e, 400, "invalid_json", "the body is not a JSON object: %s", je.text);
    }
    json_t *model = json_object_get(r, "model");
    struct job *j = job_new();
    if (!j) {
        json_decref(r);
        return bad(e, 500, "out_of_memory", "out of memory");
    }
    j->kind = kind;
    bool ok = params(r, kind, &j->sp, e);
    if (ok && json_is_string(model) && strcmp(json_string_value(model), s->model_id) != 0) {
        bad(e, 404, "model_not_found", "The model '%s' does not exist; this server has '%s'",
            json_string_value(model), s->model_id);
        ok = false;
    }
    json_t *so = json_object_get(r, "stream_options");
    j->stream = json_is_true(json_object_get(r, "stream"));
    j->include_usage = json_is_true(json_object_get(so, "include_usage"));
    if (ok && kind == JOB_CHAT) {
        char *text = chat_prompt(s, json_object_get(r, "messages"), e);
        j->prompt = text ? tokenize(s, text, true, &j->n_prompt) : NULL;
        ok = text != NULL;
        free(text);
    } else if (ok) {
        j->prompt = completion_prompt(s, json_object_get(r, "prompt"), &j->n_prompt, e);
        ok = j->prompt != NULL;
    }
    json_decref(r);
    if (ok && j->n_prompt == 0) {
        bad(e, 400, "invalid_value", "the prompt is empty");
        ok = false;
    } else if (ok && j->n_prompt >= s->n_ctx_seq) {
        bad(e, 400, "context_length_exceeded",
            "This model's maximum context length is %zu tokens; the prompt has %zu", s->n_ctx_seq,
            j->n_prompt);
        ok = false;
    }
    if (!ok) {
        job_release(j);
        return NULL;
    }
    static unsigned long long counter;
    snprintf(j->id, sizeof(j->id), "%s-%llx%llx", kind == JOB_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)time(NULL), __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    j->created = (long long)time(NULL);
    j->t_arrival = now_s();
    return j;
}

static json_t *usage(const struct job *j)
{
    return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)j->n_prompt,
                     "completion_tokens", (json_int_t)j->n_gen, "total_tokens",
                     (json_int_t)(j->n_prompt + j->n_gen), "prompt_tokens_details", "cached_tokens",
                     (json_int_t)j->n_cached);
}

static json_t *envelope(const struct server *s, const struct job *j, bool chunk)
{
    const char *object = j->kind == JOB_COMPLETION ? "text_completion"
                         : chunk                   ? "chat.completion.chunk"
                                                   : "chat.completion";
    return json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", j->id, "object", object, "created",
                     (json_int_t)j->created, "model", s->model_id, "system_fingerprint",
                     s->fingerprint);
}

static char *dump(json_t *o, bool event)
{
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s || !event)
        return s;
    char *ev = NULL;
    if (asprintf(&ev, "data: %s\n\n", s) < 0)
        ev = NULL;
    free(s);
    return ev;
}

static json_t *text_or_null(const char *t, size_t n)
{
    return t ? json_stringn(t, n) : json_null();
}

char *api_response(const struct server *s, const struct job *j)
{
    json_t *o = envelope(s, j, false), *choice;
    const char *text = j->text ? j->text : "";
    if (j->kind == JOB_CHAT)
        choice = json_pack("{s:i,s:{s:s,s:o,s:n},s:n,s:s}", "index", 0, "message", "role",
                           "assistant", "content", json_stringn(text, j->len), "refusal",
                           "logprobs", "finish_reason", j->finish);
    else
        choice = json_pack("{s:i,s:o,s:n,s:s}", "index", 0, "text", json_stringn(text, j->len),
                           "logprobs", "finish_reason", j->finish);
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    json_object_set_new(o, "usage", usage(j));
    return dump(o, false);
}

char *api_chunk(const struct server *s, const struct job *j, const char *text, size_t n, bool first,
                const char *finish)
{
    json_t *o = envelope(s, j, true), *choice;
    json_t *fin = finish ? json_string(finish) : json_null();
    if (j->kind == JOB_CHAT) {
        json_t *delta = first    ? json_pack("{s:s,s:s}", "role", "assistant", "content", "")
                        : finish ? json_object()
                                 : json_pack("{s:o}", "content", text_or_null(text, n));
        choice = json_pack("{s:i,s:o,s:n,s:o}", "index", 0, "delta", delta, "logprobs",
                           "finish_reason", fin);
    } else
        choice = json_pack("{s:i,s:o,s:n,s:o}", "index", 0, "text",
                           json_stringn(text ? text : "", text ? n : 0), "logprobs",
                           "finish_reason", fin);
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    return dump(o, true);
}

char *api_usage_chunk(const struct server *s, const struct job *j)
{
    json_t *o = envelope(s, j, true);
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage(j));
    return dump(o, true);
}

char *api_error_json(const struct api_error *e)
{
    return dump(json_pack("{s:{s:s,s:s,s:n,s:s}}", "error", "message", e->message, "type", e->type,
                          "param", "code", e->code),
                false);
}

char *api_models(const struct server *s)
{
    return dump(json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id",
                          s->model_id, "object", "model", "created", (json_int_t)0, "owned_by",
                          "kvtier"),
                false);
}
