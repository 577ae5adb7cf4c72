/*
 * GET /metrics (serve.h): Prometheus text of the server's counters and of kvtier's tiers.
 */
#include <stdio.h>
#include <stdlib.h>

#include "serve.h"

const double ttft_bounds[TTFT_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                          0.5,   1,    2.5,   5,    10,  30};

void metrics_ttft(struct metrics *m, double secs)
{
    m->ttft_count++;
    m->ttft_sum += secs;
    for (int i = 0; i < TTFT_BUCKETS; i++)
        if (secs <= ttft_bounds[i])
            m->ttft_le[i]++;
}

static void family(FILE *f, const char *name, const char *help, const char *type)
{
    fprintf(f, "# HELP kvtier_%s %s\n# TYPE kvtier_%s %s\n", name, help, name, type);
}

/* A family of one sample. */
static void one(FILE *f, const char *name, const char *help, const char *type, uint64_t v)
{
    family(f, name, help, type);
    fprintf(f, "kvtier_%s %llu\n", name, (unsigned long long)v);
}

static void labelled(FILE *f, const char *name, const char *label, const char *value, uint64_t v)
{
    fprintf(f, "kvtier_%s{%s=\"%s\"} %llu\n", name, label, value, (unsigned long long)v);
}

static void counters(FILE *f, const struct metrics *m)
{
    static const char *const src[SRC_COUNT] = {"none", "slot", "ram", "disk", "remote"};
    family(f, "requests_total", "Completion requests accepted, by endpoint.", "counter");
    labelled(f, "requests_total", "endpoint", "chat", m->requests[JOB_CHAT]);
    labelled(f, "requests_total", "endpoint", "completions", m->requests[JOB_COMPLETION]);
    one(f, "request_errors_total", "Requests answered with an error status.", "counter", m->errors);
    one(f, "prompt_tokens_total", "Prompt tokens of started requests.", "counter",
        m->prompt_tokens);
    family(f, "cached_tokens_total",
           "Prompt tokens not prefilled, by where they came from: the slot's own sequence, "
           "kvtier's RAM tier, its disk or the remote tier (--redis).",
           "counter");
    for (int i = SRC_SLOT; i < SRC_COUNT; i++)
        labelled(f, "cached_tokens_total", "source", src[i], m->cached[i]);
    one(f, "prefilled_tokens_total", "Prompt tokens decoded.", "counter", m->prefilled);
    one(f, "generated_tokens_total", "Completion tokens generated.", "counter", m->generated);
    one(f, "decode_steps_total", "llama_decode calls, each one batch across the busy slots.",
        "counter", m->decode_steps);
    one(f, "decode_sequences_total", "Sequences in those batches, summed over the calls.",
        "counter", m->decode_seqs);
    family(f, "time_to_first_token_seconds", "From a request's arrival to its first token.",
           "histogram");
    for (int i = 0; i < TTFT_BUCKETS; i++)
        fprintf(f, "kvtier_time_to_first_token_seconds_bucket{le=\"%g\"} %llu\n", ttft_bounds[i],
                (unsigned long long)m->ttft_le[i]);
    fprintf(f, "kvtier_time_to_first_token_seconds_bucket{le=\"+Inf\"} %llu\n",
            (unsigned long long)m->ttft_count);
    fprintf(f, "kvtier_time_to_first_token_seconds_sum %.6f\n", m->ttft_sum);
    fprintf(f, "kvtier_time_to_first_token_seconds_count %llu\n",
            (unsigned long long)m->ttft_count);
}

char *metrics_text(struct server *s)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    struct kvt_pcache_stats st = {0};
    struct kvt_remote_stats rst = {0};
    if (s->kl)
        kvt_pcache_get_stats(kvt_llama_pcache(s->kl), &st);
    if (s->remote)
        kvt_remote_get_stats(s->remote, &rst);
    pthread_mutex_lock(&s->mu);
    struct metrics m = s->m;
    size_t queued = s->queued, busy = s->busy;
    pthread_mutex_unlock(&s->mu);
    counters(f, &m);
    family(f, "cache_bytes", "Bytes of cached prompt state, by tier.", "gauge");
    labelled(f, "cache_bytes", "tier", "ram", st.total_bytes);
    labelled(f, "cache_bytes", "tier", "disk", st.cold.total_bytes);
    labelled(f, "cache_bytes", "tier", "remote", rst.bytes);
    family(f, "cache_entries", "Cached prompts, by tier.", "gauge");
    labelled(f, "cache_entries", "tier", "ram", st.records);
    labelled(f, "cache_entries", "tier", "disk", st.cold.entries);
    labelled(f, "cache_entries", "tier", "remote", rst.entries);
    one(f, "pending_writes", "Cached prompts waiting for the write-behind to disk.", "gauge",
        st.pending_spills + st.pending_snapshots);
    one(f, "slots_busy", "Slots running a request.", "gauge", busy);
    one(f, "requests_queued", "Requests waiting for a slot.", "gauge", queued);
    fclose(f);
    return buf;
}
