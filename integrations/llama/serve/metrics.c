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

static void counter(FILE *f, const char *name, const char *help, const char *type)
{
    fprintf(f, "# HELP kvtier_%s %s\n# TYPE kvtier_%s %s\n", name, help, name, type);
}

char *metrics_text(struct server *s)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    struct kvt_pcache_stats st = {0};
    if (s->kl)
        kvt_pcache_get_stats(kvt_llama_pcache(s->kl), &st);
    pthread_mutex_lock(&s->mu);
    struct metrics m = s->m;
    size_t queued = s->queued, busy = s->busy;
    pthread_mutex_unlock(&s->mu);
    static const char *const src[SRC_COUNT] = {"none", "slot", "ram", "disk"};
    counter(f, "requests_total", "Completion requests accepted, by endpoint.", "counter");
    fprintf(f, "kvtier_requests_total{endpoint=\"chat\"} %llu\n",
            (unsigned long long)m.requests[JOB_CHAT]);
    fprintf(f, "kvtier_requests_total{endpoint=\"completions\"} %llu\n",
            (unsigned long long)m.requests[JOB_COMPLETION]);
    counter(f, "request_errors_total", "Requests answered with an error status.", "counter");
    fprintf(f, "kvtier_request_errors_total %llu\n", (unsigned long long)m.errors);
    counter(f, "prompt_tokens_total", "Prompt tokens of started requests.", "counter");
    fprintf(f, "kvtier_prompt_tokens_total %llu\n", (unsigned long long)m.prompt_tokens);
    counter(f, "cached_tokens_total",
            "Prompt tokens not prefilled, by where they came from: the slot's own sequence, "
            "kvtier's RAM tier or its disk.",
            "counter");
    for (int i = SRC_SLOT; i < SRC_COUNT; i++)
        fprintf(f, "kvtier_cached_tokens_total{source=\"%s\"} %llu\n", src[i],
                (unsigned long long)m.cached[i]);
    counter(f, "prefilled_tokens_total", "Prompt tokens decoded.", "counter");
    fprintf(f, "kvtier_prefilled_tokens_total %llu\n", (unsigned long long)m.prefilled);
    counter(f, "generated_tokens_total", "Completion tokens generated.", "counter");
    fprintf(f, "kvtier_generated_tokens_total %llu\n", (unsigned long long)m.generated);
    counter(f, "decode_steps_total", "llama_decode calls, each one batch across the busy slots.",
            "counter");
    fprintf(f, "kvtier_decode_steps_total %llu\n", (unsigned long long)m.decode_steps);
    counter(f, "decode_sequences_total", "Sequences in those batches, summed over the calls.",
            "counter");
    fprintf(f, "kvtier_decode_sequences_total %llu\n", (unsigned long long)m.decode_seqs);
    counter(f, "time_to_first_token_seconds", "From a request's arrival to its first token.",
            "histogram");
    for (int i = 0; i < TTFT_BUCKETS; i++)
        fprintf(f, "kvtier_time_to_first_token_seconds_bucket{le=\"%g\"} %llu\n", ttft_bounds[i],
                (unsigned long long)m.ttft_le[i]);
    fprintf(f, "kvtier_time_to_first_token_seconds_bucket{le=\"+Inf\"} %llu\n",
            (unsigned long long)m.ttft_count);
    fprintf(f, "kvtier_time_to_first_token_seconds_sum %.6f\n", m.ttft_sum);
    fprintf(f, "kvtier_time_to_first_token_seconds_count %llu\n", (unsigned long long)m.ttft_count);
    counter(f, "cache_bytes", "Bytes of cached prompt state, by tier.", "gauge");
    fprintf(f, "kvtier_cache_bytes{tier=\"ram\"} %llu\n", (unsigned long long)st.total_bytes);
    fprintf(f, "kvtier_cache_bytes{tier=\"disk\"} %llu\n", (unsigned long long)st.cold.total_bytes);
    counter(f, "cache_entries", "Cached prompts, by tier.", "gauge");
    fprintf(f, "kvtier_cache_entries{tier=\"ram\"} %llu\n", (unsigned long long)st.records);
    fprintf(f, "kvtier_cache_entries{tier=\"disk\"} %llu\n", (unsigned long long)st.cold.entries);
    counter(f, "pending_writes", "Cached prompts waiting for the write-behind to disk.", "gauge");
    fprintf(f, "kvtier_pending_writes %llu\n",
            (unsigned long long)(st.pending_spills + st.pending_snapshots));
    counter(f, "slots_busy", "Slots running a request.", "gauge");
    fprintf(f, "kvtier_slots_busy %zu\n", busy);
    counter(f, "requests_queued", "Requests waiting for a slot.", "gauge");
    fprintf(f, "kvtier_requests_queued %zu\n", queued);
    fclose(f);
    return buf;
}
