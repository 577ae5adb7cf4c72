/*
 * The engine thread (serve.h): queued jobs go to free slots (one llama.cpp sequence each);
 * every step decodes all busy slots in one batch: the next token of each generating slot
 * and prompt tokens of those still prefilling. A job's prompt starts from whichever is
 * longer, what its slot still holds or kvtier's longest cached prefix (RAM tier, then disk,
 * which other processes may have written, then the remote tier of --redis, which servers on
 * other hosts may have written); when it ends, the tokens its sequence holds are
 * saved to kvtier (a copy into the RAM tier, written to disk behind). A slot's state is
 * therefore in the RAM tier whenever another conversation takes the slot over.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

#define BATCH 512

struct slot {
    llama_seq_id seq;
    struct job *job;
    llama_token *tok; /* what the sequence holds: tok[0..n) at positions 0..n-1 */
    size_t n;
    llama_token next; /* sampled, to decode in the next step */
    bool generating, sampled;
    bool in_batch; /* has tokens in the batch being decoded */
    int i_batch;   /* the batch row whose logits are this slot's, or -1 */
    struct llama_sampler *smpl;
    uint64_t used; /* when it last ended a job */
};

static uint64_t clock_tick;

static size_t common_prefix(const llama_token *a, size_t na, const llama_token *b, size_t nb)
{
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i])
        i++;
    return i;
}

/* A free slot: the one holding the longest prefix of the prompt, else the least used. */
static struct slot *pick_slot(struct server *s, const struct job *j)
{
    struct slot *best = NULL;
    size_t best_len = 0;
    for (int i = 0; i < s->o.slots; i++) {
        struct slot *sl = &s->slots[i];
        if (sl->job)
            continue;
        size_t l = common_prefix(sl->tok, sl->n, j->prompt, j->n_prompt);
        if (!best || l > best_len || (l == best_len && sl->used < best->used)) {
            best = sl;
            best_len = l;
        }
    }
    return best;
}

static struct llama_sampler *sampler(const struct sample_params *sp)
{
    if (sp->temperature <= 0.0f)
        return llama_sampler_init_greedy();
    struct llama_sampler *c = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (sp->top_k > 0)
        llama_sampler_chain_add(c, llama_sampler_init_top_k(sp->top_k));
    if (sp->top_p < 1.0f)
        llama_sampler_chain_add(c, llama_sampler_init_top_p(sp->top_p, 1));
    llama_sampler_chain_add(c, llama_sampler_init_temp(sp->temperature));
    llama_sampler_chain_add(c, llama_sampler_init_dist(sp->seed));
    return c;
}

/* kvtier's longest prefix over its tiers, to compare with the slot's own (files of other
 * processes are seen after a refresh; the remote's index is merged by its own poll thread). */
static size_t cached_prefix(struct server *s, const struct job *j)
{
    kvt_pcache *pc = kvt_llama_pcache(s->kl);
    kvt_store_refresh(kvt_pcache_store(pc));
    return kvt_pcache_peek_longest(pc, j->prompt, j->n_prompt, kvt_llama_identity(s->kl)->ns);
}

/* Put the longest usable prefix of the job's prompt into the slot's sequence. */
static void slot_begin(struct server *s, struct slot *sl)
{
    struct job *j = sl->job;
    size_t own = s->kl ? common_prefix(sl->tok, sl->n, j->prompt, j->n_prompt) : 0;
    if (own >= j->n_prompt) /* at least one token is decoded, for its logits */
        own = j->n_prompt - 1;
    enum cache_source src = own ? SRC_SLOT : SRC_NONE;
    if (s->kl && cached_prefix(s, j) > own) {
        struct kvt_llama_loaded r;
        if (kvt_llama_load(s->kl, sl->seq, j->prompt, j->n_prompt, &r) != 0) {
            fprintf(stderr, "kvtier-llama serve: cache load failed: %s\n", kvt_last_error());
            llama_memory_seq_rm(llama_get_memory(s->ctx), sl->seq, -1, -1);
            r.n_tokens = 0;
        }
        own = r.n_tokens;
        src = !own ? SRC_NONE : r.from_remote ? SRC_REMOTE : r.from_disk ? SRC_DISK : SRC_RAM;
        if (src == SRC_REMOTE) /* another host's work: worth a line */
            fprintf(stderr,
                    "kvtier-llama serve: %zu prompt tokens from the remote tier (%.1f ms)\n", own,
                    r.ms);
    } else
        llama_memory_seq_rm(llama_get_memory(s->ctx), sl->seq, (llama_pos)own, -1);
    memcpy(sl->tok, j->prompt, own * sizeof(*sl->tok));
    sl->n = own;
    sl->generating = sl->sampled = false;
    sl->smpl = sampler(&j->sp);
    pthread_mutex_lock(&s->mu);
    j->n_cached = own;
    j->source = src;
    s->m.cached[src] += own;
    s->m.prompt_tokens += j->n_prompt;
    s->m.prefilled += j->n_prompt - own;
    pthread_mutex_unlock(&s->mu);
}

/* The job is over (done, cancelled or failed): save what the sequence holds, free the slot. */
static void slot_end(struct server *s, struct slot *sl, const char *finish, const char *error)
{
    struct job *j = sl->job;
    pthread_mutex_lock(&s->mu);
    job_release_text(j, true);
    j->finish = finish;
    if (error) {
        snprintf(j->error, sizeof(j->error), "%s", error);
        j->status = 500;
    }
    j->done = true;
    s->busy--;
    s->m.generated += j->n_gen;
    pthread_cond_broadcast(&s->progress);
    job_release(j);
    pthread_mutex_unlock(&s->mu);
    if (s->kl && sl->n && kvt_llama_save(s->kl, sl->seq, sl->tok, sl->n) != 0)
        fprintf(stderr, "kvtier-llama serve: save failed: %s\n", kvt_last_error());
    llama_sampler_free(sl->smpl);
    sl->smpl = NULL;
    sl->job = NULL;
    sl->used = ++clock_tick;
}

/* Take queued jobs into free slots; drop those cancelled while queued. */
static void admit(struct server *s)
{
    for (;;) {
        pthread_mutex_lock(&s->mu);
        struct job *j = s->head;
        struct slot *sl = j ? pick_slot(s, j) : NULL;
        if (!sl) {
            pthread_mutex_unlock(&s->mu);
            return;
        }
        s->head = j->next;
        if (!s->head)
            s->tail = NULL;
        s->queued--;
        if (j->cancelled) {
            job_release(j);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        s->busy++;
        sl->job = j;
        pthread_mutex_unlock(&s->mu);
        slot_begin(s, sl);
    }
}

static void batch_add(struct llama_batch *b, llama_token t, size_t pos, llama_seq_id seq,
                      bool logits)
{
    int i = b->n_tokens++;
    b->token[i] = t;
    b->pos[i] = (llama_pos)pos;
    b->n_seq_id[i] = 1;
    b->seq_id[i][0] = seq;
    b->logits[i] = logits;
}

/* One batch: each generating slot's next token, then prompt tokens while there is room.
 * The tokens are recorded in the slots as decoded. */
static int fill_batch(struct server *s, struct llama_batch *b)
{
    b->n_tokens = 0;
    for (int i = 0; i < s->o.slots; i++) {
        struct slot *sl = &s->slots[i];
        sl->i_batch = -1;
        sl->in_batch = sl->job && sl->generating;
        if (sl->in_batch) {
            sl->i_batch = b->n_tokens;
            batch_add(b, sl->next, sl->n, sl->seq, true);
            sl->tok[sl->n++] = sl->next;
        }
    }
    for (int i = 0; i < s->o.slots && b->n_tokens < BATCH; i++) {
        struct slot *sl = &s->slots[i];
        struct job *j = sl->job;
        while (j && !sl->generating && b->n_tokens < BATCH) {
            bool last = sl->n + 1 == j->n_prompt;
            sl->in_batch = true;
            if (last)
                sl->i_batch = b->n_tokens;
            batch_add(b, j->prompt[sl->n], sl->n, sl->seq, last);
            sl->tok[sl->n] = j->prompt[sl->n];
            sl->n++;
            sl->generating = last;
        }
    }
    return b->n_tokens;
}

/* A sampled token: text, stop strings, limits. Returns the finish reason or NULL. */
static const char *take_token(struct server *s, struct slot *sl, llama_token t)
{
    struct job *j = sl->job;
    bool eog = llama_vocab_is_eog(s->vocab, t);
    char piece[256];
    int32_t n = eog ? 0 : llama_token_to_piece(s->vocab, t, piece, sizeof(piece), 0, false);
    pthread_mutex_lock(&s->mu);
    if (!sl->sampled)
        metrics_ttft(&s->m, now_s() - j->t_arrival);
    sl->sampled = true;
    if (eog) {
        pthread_mutex_unlock(&s->mu);
        return "stop";
    }
    j->n_gen++;
    job_append(j, piece, n > 0 ? (size_t)n : 0);
    bool stopped = job_release_text(j, false);
    pthread_cond_broadcast(&s->progress);
    pthread_mutex_unlock(&s->mu);
    if (stopped)
        return "stop";
    if ((j->sp.max_tokens > 0 && j->n_gen >= (size_t)j->sp.max_tokens) || sl->n + 1 >= s->n_ctx_seq)
        return "length";
    sl->next = t;
    return NULL;
}

static void step(struct server *s, struct llama_batch *b)
{
    for (int i = 0; i < s->o.slots; i++) { /* clients that left */
        struct slot *sl = &s->slots[i];
        pthread_mutex_lock(&s->mu);
        bool gone = sl->job && sl->job->cancelled;
        pthread_mutex_unlock(&s->mu);
        if (gone)
            slot_end(s, sl, NULL, NULL);
    }
    if (fill_batch(s, b) == 0)
        return;
    int rc = llama_decode(s->ctx, *b);
    pthread_mutex_lock(&s->mu);
    s->m.decode_steps++;
    for (int i = 0; i < s->o.slots; i++)
        s->m.decode_seqs += s->slots[i].in_batch;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->o.slots; i++) {
        struct slot *sl = &s->slots[i];
        if (sl->job && sl->in_batch && rc != 0) { /* it may hold part of the batch: drop all */
            fprintf(stderr, "kvtier-llama serve: llama_decode failed (%d)\n", rc);
            llama_memory_seq_rm(llama_get_memory(s->ctx), sl->seq, -1, -1);
            sl->n = 0;
            slot_end(s, sl, NULL, "llama_decode failed");
        }
        if (!sl->job || sl->i_batch < 0)
            continue;
        llama_token t = llama_sampler_sample(sl->smpl, s->ctx, sl->i_batch);
        const char *finish = take_token(s, sl, t);
        if (finish)
            slot_end(s, sl, finish, NULL);
    }
}

static void *engine_main(void *arg)
{
    struct server *s = arg;
    struct llama_batch b = llama_batch_init(BATCH + s->o.slots, 0, 1);
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && !s->busy && !s->head)
            pthread_cond_wait(&s->wake, &s->mu);
        bool stop = s->stopping && !s->busy;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        if (!s->stopping)
            admit(s);
        step(s, &b);
    }
    llama_batch_free(b);
    return NULL;
}

static void free_slots(struct server *s)
{
    for (int i = 0; i < s->o.slots; i++)
        free(s->slots[i].tok);
    free(s->slots);
    s->slots = NULL;
}

int sched_start(struct server *s)
{
    s->slots = calloc((size_t)s->o.slots, sizeof(*s->slots));
    if (!s->slots)
        return -1;
    bool ok = true;
    for (int i = 0; i < s->o.slots; i++) {
        s->slots[i].seq = i;
        s->slots[i].tok = malloc(s->n_ctx_seq * sizeof(llama_token));
        ok = ok && s->slots[i].tok;
    }
    if (ok && pthread_create(&s->engine, NULL, engine_main, s) == 0)
        return 0;
    free_slots(s);
    return -1;
}

bool sched_submit(struct server *s, struct job *j)
{
    pthread_mutex_lock(&s->mu);
    bool ok = !s->stopping;
    if (ok) {
        j->refs++;
        if (s->tail)
            s->tail->next = j;
        else
            s->head = j;
        s->tail = j;
        s->queued++;
        s->m.requests[j->kind]++;
        pthread_cond_signal(&s->wake);
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

void sched_stop(struct server *s)
{
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    for (struct job *j = s->head, *next; j; j = next) {
        next = j->next;
        snprintf(j->error, sizeof(j->error), "the server is shutting down");
        j->status = 503;
        j->done = true;
        job_release(j);
    }
    s->head = s->tail = NULL;
    s->queued = 0;
    pthread_cond_broadcast(&s->progress);
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->engine, NULL);
    free_slots(s);
}
