/*
 * The prompt cache of a llama.cpp context (kvtier-llama.h): saves turn a sequence's state
 * blob into an entry whose caches are views of that blob (one copy out of llama.cpp, none
 * after), kept by the RAM tier and written behind to the store; loads take what the tier
 * chooses (kvt_pcache_take_into) and build the blob llama_state_seq_set_data() reads,
 * straight from the file's tensor bytes on a disk hit or from the entry's tensors on a RAM
 * or remote hit.
 */
#include "kvtier-llama.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama_identity.h"
#include "llama_state.h"

/*
 * llama.cpp applies a context's pending memory updates (the K-shift that
 * llama_memory_seq_add()/seq_div() leave, copies between streams) only when it next decodes,
 * and its state blob holds the K rows as they are: saved before that, rows rotated for the
 * old positions would be stored under the new ones. llama.h of this build has no call that
 * applies them (llama_kv_self_update() is gone); llama_context::memory_update(false), what
 * llama_decode() runs first, is exported by the one build this library maps (checked at
 * open). It touches neither the outputs nor the sequences, and returns at once when nothing
 * is pending.
 */
extern bool
llama_context_memory_update(struct llama_context *ctx,
                            bool optimize) __asm__("_ZN13llama_context13memory_updateEb");

struct kvt_llama {
    struct llama_context *ctx;
    struct llama_identity id;
    struct kvt_meta meta;
    char *ns;
    kvt_pcache *pc;
};

void kvt_llama_opts_init(struct kvt_llama_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->ram_max_bytes = 1ull << 30;
    o->demote_idle_ms = 300000;
}

/* Set exactly the declared adapters and control vector on @p ctx (clearing any others), so
 * that what the context runs is what the identity says. Nothing is changed on failure. */
static int adapters_apply(struct llama_context *ctx, const struct kvt_llama_opts *o)
{
    struct llama_adapter_lora **a = calloc(o->n_loras + 1, sizeof(*a));
    float *scales = calloc(o->n_loras + 1, sizeof(*scales));
    int rc = a && scales ? 0 : kvt_set_error(-ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < o->n_loras; i++) {
        a[i] = o->loras[i].adapter;
        scales[i] = o->loras[i].scale;
    }
    const struct kvt_llama_cvec *v = o->cvec;
    if (rc == 0 &&
        llama_set_adapter_cvec(ctx, v ? v->data : NULL, v ? v->len : 0, v ? v->n_embd : 0,
                               v ? v->il_start : 0, v ? v->il_end : 0))
        rc = kvt_set_error(-EINVAL,
                           "kvt_llama_open: llama.cpp refused the control vector "
                           "(n_embd %d, layers %d..%d, %zu floats)",
                           v->n_embd, v->il_start, v->il_end, v->len);
    if (rc == 0) /* takes any arrays it is given */
        llama_set_adapters_lora(ctx, a, o->n_loras, scales);
    free(a);
    free(scales);
    return rc;
}

int kvt_llama_open(struct llama_context *ctx, const struct kvt_llama_opts *o, kvt_llama **out)
{
    if (!out)
        return kvt_set_error(-EINVAL, "kvt_llama_open: no output");
    *out = NULL;
    if (!ctx || !o || !o->cache_dir || !o->cparams || (!o->model_path && !o->weights_digest))
        return kvt_set_error(-EINVAL, "kvt_llama_open: needs a context, cache_dir, cparams and "
                                      "model_path or weights_digest");
    kvt_llama *kl = calloc(1, sizeof(*kl));
    if (!kl)
        return kvt_set_error(-ENOMEM, "out of memory");
    kl->ctx = ctx;
    int rc = identity_derive(ctx, o, &kl->id);
    if (rc)
        goto fail;
    kl->ns = strdup(o->ns ? o->ns : "");
    if (!kl->ns) {
        rc = kvt_set_error(-ENOMEM, "out of memory");
        goto fail;
    }
    kl->meta =
        (struct kvt_meta){kl->id.model_id, kl->id.fingerprint, kl->id.tokenizer_hash, kl->ns};
    struct kvt_pcache_opts po;
    kvt_pcache_opts_init(&po);
    po.ram_max_bytes = o->ram_max_bytes;
    po.cold_dir = o->cache_dir;
    po.cold.model_id = kl->id.model_id;
    po.cold.config_fingerprint = kl->id.fingerprint;
    po.cold.tokenizer_hash = kl->id.tokenizer_hash;
    if (o->disk_max_bytes) /* 0: the default cap */
        po.cold.max_bytes = o->disk_max_bytes;
    po.cold.n_layers = kl->id.shape.n_layer;
    po.cold.share_prefixes = o->share_prefixes;
    po.demote_idle_ms = o->demote_idle_ms;
    po.background_cpus = o->background_cpus;
    po.log = o->log;
    po.log_ud = o->log_ud;
    po.remote = o->remote;
    rc = kvt_pcache_open(&po, &kl->pc);
    if (rc == 0 && (rc = adapters_apply(ctx, o)))
        kvt_pcache_close(kl->pc);
    if (rc)
        goto fail;
    *out = kl;
    return 0;
fail:
    free(kl->ns);
    free(kl);
    return rc;
}

int kvt_llama_flush(kvt_llama *kl, int64_t timeout_ms)
{
    if (!kl)
        return kvt_set_error(-EINVAL, "kvt_llama_flush: no handle");
    struct kvt_flush_report r;
    int rc = kvt_pcache_flush(kl->pc, timeout_ms < 0 ? 120000 : timeout_ms, &r);
    if (rc == 0 && !r.durable)
        rc = kvt_set_error(-EIO,
                           "kvtier-llama: not durable: %llu dropped, %llu failed writes, %llu "
                           "entries gone from RAM before their snapshot, %llu snapshots and %llu "
                           "spills pending",
                           (unsigned long long)r.dropped, (unsigned long long)r.failed,
                           (unsigned long long)r.missing, (unsigned long long)r.pending_snapshots,
                           (unsigned long long)r.pending_spills);
    return rc;
}

void kvt_llama_close(kvt_llama *kl, int64_t flush_timeout_ms)
{
    if (!kl)
        return;
    kvt_llama_flush(kl, flush_timeout_ms);
    kvt_pcache_close(kl->pc);
    free(kl->ns);
    free(kl);
}

const struct kvt_meta *kvt_llama_identity(const kvt_llama *kl)
{
    return kl ? &kl->meta : NULL;
}

kvt_pcache *kvt_llama_pcache(kvt_llama *kl)
{
    return kl ? kl->pc : NULL;
}

/* ---- save -------------------------------------------------------------------------------- */

/* An entry of @p n tokens over the state blob in @p buf (the caches hold the references). */
static int entry_of_blob(kvt_llama *kl, kvt_buf *buf, llama_seq_id seq, const llama_token *tok,
                         size_t n, struct kvt_entry **out)
{
    const struct llama_shape *sh = &kl->id.shape;
    struct blob_map *m = calloc(1, sizeof(*m));
    kvt_cache **caches = calloc(sh->n_layer, sizeof(*caches));
    int rc = m && caches ? 0 : kvt_set_error(-ENOMEM, "out of memory");
    if (rc == 0)
        rc = blob_parse(sh, kvt_buf_data(buf), kvt_buf_size(buf), seq, m);
    if (rc == 0 && (sh->recurrent ? m->last_pos != (int32_t)n - 1 : m->cells != n))
        rc = kvt_set_error(KVT_E_STATE,
                           "kvtier-llama: sequence %d holds %u cells up to "
                           "position %d, not the %zu tokens given",
                           seq, m->cells, m->last_pos, n);
    if (rc == 0)
        rc = blob_to_caches(sh, m, buf, n, caches);
    if (rc == 0) {
        rc = kvt_entry_new(tok, n, caches, sh->n_layer, kl->ns, out);
        if (rc)
            for (uint32_t i = 0; i < sh->n_layer; i++)
                kvt_cache_free(caches[i]);
    }
    if (rc == 0) {
        struct kvt_entry *e = *out;
        e->meta.model_id = strdup(kl->id.model_id);
        e->meta.config_fingerprint = strdup(kl->id.fingerprint);
        e->meta.tokenizer_hash = strdup(kl->id.tokenizer_hash);
        if (!e->meta.model_id || !e->meta.config_fingerprint || !e->meta.tokenizer_hash) {
            kvt_entry_free(e);
            *out = NULL;
            rc = kvt_set_error(-ENOMEM, "out of memory");
        }
    }
    free(caches);
    free(m);
    return rc;
}

/* -EINVAL unless @p seq is one of the context's sequences (llama.cpp's state calls take any
 * id below its internal limit of 256 and place the cells there, and assert beyond it). */
static int check_seq(const kvt_llama *kl, llama_seq_id seq, const char *fn)
{
    uint32_t n_seq = llama_n_seq_max(kl->ctx);
    if (seq < 0 || (uint32_t)seq >= n_seq)
        return kvt_set_error(-EINVAL, "%s: sequence %d is not one of the context's %u", fn, seq,
                             n_seq);
    return 0;
}

int kvt_llama_save(kvt_llama *kl, llama_seq_id seq, const llama_token *tok, size_t n)
{
    if (!kl || !tok || n == 0)
        return kvt_set_error(-EINVAL, "kvt_llama_save: needs a handle, a sequence and tokens");
    int rc = check_seq(kl, seq, "kvt_llama_save");
    if (rc)
        return rc;
    llama_synchronize(kl->ctx); /* the last decode's outputs are copied out before the update */
    llama_context_memory_update(kl->ctx, false);
    llama_memory_t mem = llama_get_memory(kl->ctx);
    llama_pos pmax = llama_memory_seq_pos_max(mem, seq);
    if (pmax != (llama_pos)n - 1)
        return kvt_set_error(KVT_E_STATE,
                             "kvt_llama_save: sequence %d ends at position %d, "
                             "%zu tokens given",
                             seq, pmax, n);
    size_t size = llama_state_seq_get_size(kl->ctx, seq);
    kvt_buf *buf;
    rc = size ? kvt_buf_new_uninit(size, &buf)
              : kvt_set_error(KVT_E_STATE, "kvt_llama_save: llama.cpp has no state size");
    if (rc)
        return rc;
    if (llama_state_seq_get_data(kl->ctx, kvt_buf_data(buf), size, seq) != size) {
        kvt_buf_unref(buf);
        return kvt_set_error(KVT_E_STATE, "kvt_llama_save: llama.cpp could not copy the state");
    }
    struct kvt_entry *e = NULL;
    rc = entry_of_blob(kl, buf, seq, tok, n, &e);
    kvt_buf_unref(buf);
    if (rc)
        return rc;
    return kvt_pcache_put(kl->pc, e, NULL);
}

/* ---- load -------------------------------------------------------------------------------- */

static double mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* A blob being built for llama_state_seq_set_data(). */
struct blob_build {
    kvt_llama *kl;
    llama_seq_id seq;
    struct blob_plan plan;
    kvt_buf *blob;
    uint8_t *vt; /* token-major V of every layer, when V is transposed */
    size_t vt_off[KVT_LLAMA_MAX_LAYERS];
};

static void build_free(struct blob_build *b)
{
    kvt_buf_unref(b->blob);
    free(b->vt);
    b->blob = NULL;
    b->vt = NULL;
}

/* Plan the blob for header @p h, allocate it and write everything but the tensor bytes. */
static int build_begin(struct blob_build *b, const struct kvt_header *h)
{
    const struct llama_shape *sh = &b->kl->id.shape;
    int rc = blob_plan_header(sh, h, &b->plan);
    if (rc == 0)
        rc = kvt_buf_new_uninit(b->plan.size, &b->blob);
    if (rc == 0 && b->plan.v_trans) {
        size_t total = 0; /* each below the blob's size, which did not overflow */
        for (uint32_t il = 0; il < sh->n_layer; il++) {
            b->vt_off[il] = total;
            total += b->plan.part[2 * il + 1].bytes;
        }
        b->vt = malloc(total + 1);
        if (!b->vt)
            rc = kvt_set_error(-ENOMEM, "out of memory");
    }
    if (rc == 0)
        blob_write_meta(sh, &b->plan, b->seq, kvt_buf_data(b->blob));
    return rc;
}

/* Where slot @p k's bytes go. */
static uint8_t *build_slot(struct blob_build *b, size_t k)
{
    if (b->plan.v_trans && k % 2 == 1)
        return b->vt + b->vt_off[k / 2];
    return (uint8_t *)kvt_buf_data(b->blob) + b->plan.part[k].off;
}

static int place(void *ud, const struct kvt_header *h, void **dst)
{
    struct blob_build *b = ud;
    int rc = build_begin(b, h);
    for (size_t k = 0; rc == 0 && k < 2 * h->n_caches; k++)
        dst[k] = build_slot(b, k);
    return rc;
}

/* Finish the blob (transposed V) and hand it to llama.cpp; *@p ms: set_data's time. */
static int build_apply(struct blob_build *b, double *ms)
{
    uint8_t *blob = kvt_buf_data(b->blob);
    for (uint32_t il = 0; b->plan.v_trans && il < b->plan.n_layer; il++)
        blob_put_transposed(&b->plan.part[2 * il + 1],
                            il < b->plan.n_base ? b->plan.cells : b->plan.swa_cells,
                            b->vt + b->vt_off[il], blob);
    double t0 = mono_ms();
    size_t got = llama_state_seq_set_data(b->kl->ctx, blob, b->plan.size, b->seq);
    *ms = mono_ms() - t0;
    if (got != b->plan.size) {
        llama_memory_seq_rm(llama_get_memory(b->kl->ctx), b->seq, -1, -1);
        return kvt_set_error(KVT_E_STATE,
                             "kvtier-llama: llama.cpp refused the state of %u "
                             "cells (is the context large enough?)",
                             b->plan.cells);
    }
    return 0;
}

/* Build the blob from a taken entry (RAM or remote) and hand it to llama.cpp; takes @p t. */
static int load_entry(kvt_llama *kl, llama_seq_id seq, struct kvt_take *t,
                      struct kvt_llama_loaded *r)
{
    struct kvt_entry *e = t->entry;
    struct kvt_tensor *ts = calloc(2 * e->n_caches + 1, sizeof(*ts));
    struct kvt_header h = {0};
    struct blob_build b = {.kl = kl, .seq = seq};
    int rc = ts ? blob_describe(e, &h, ts) : kvt_set_error(-ENOMEM, "out of memory");
    if (rc == 0)
        rc = build_begin(&b, &h);
    bool misfit = rc == KVT_E_MISMATCH; /* never the case for this process's own saves */
    for (size_t k = 0; rc == 0 && k < 2 * e->n_caches; k++)
        kvt_tensor_copy_out(&ts[k], build_slot(&b, k));
    double set_ms = 0;
    if (rc == 0)
        rc = build_apply(&b, &set_ms);
    if (rc == 0)
        *r = (struct kvt_llama_loaded){.n_tokens = e->n_tokens,
                                       .n_entry = e->n_tokens,
                                       .from_disk = t->from_disk,
                                       .set_ms = set_ms,
                                       .from_remote = t->from_remote};
    for (size_t k = 0; ts && k < 2 * e->n_caches; k++)
        kvt_tensor_release(&ts[k]);
    free(ts);
    free(h.caches);
    build_free(&b);
    kvt_retain_release(t->retain);
    kvt_entry_free(e);
    /* a remote entry llama.cpp refuses is a miss, as a disk one is */
    return misfit || (rc == KVT_E_STATE && t->from_remote) ? 0 : rc;
}

/* Hand llama.cpp the blob a disk restore placed: entry @p h, of which @p plen tokens match. */
static int load_placed(kvt_llama *kl, struct blob_build *b, const struct kvt_header *h, size_t plen,
                       struct kvt_llama_loaded *r)
{
    double set_ms = 0;
    int rc = build_apply(b, &set_ms);
    /* an entry longer than the match is trimmable (the tier checked) */
    if (rc == 0 && plen < h->n_tokens &&
        !llama_memory_seq_rm(llama_get_memory(kl->ctx), b->seq, (llama_pos)plen, -1)) {
        llama_memory_seq_rm(llama_get_memory(kl->ctx), b->seq, -1, -1);
        rc = kvt_set_error(KVT_E_STATE, "kvtier-llama: llama.cpp cannot trim the state");
    }
    if (rc == 0)
        *r = (struct kvt_llama_loaded){
            .n_tokens = plen, .n_entry = h->n_tokens, .from_disk = true, .set_ms = set_ms};
    /* llama.cpp refused the state (and emptied the sequence): a miss */
    return rc == KVT_E_STATE ? 0 : rc;
}

int kvt_llama_load(kvt_llama *kl, llama_seq_id seq, const llama_token *tok, size_t n,
                   struct kvt_llama_loaded *r)
{
    if (!r)
        return kvt_set_error(-EINVAL, "kvt_llama_load: no result");
    memset(r, 0, sizeof(*r));
    if (!kl || (!tok && n))
        return kvt_set_error(-EINVAL, "kvt_llama_load: needs a handle, a sequence and tokens");
    int rc = check_seq(kl, seq, "kvt_llama_load");
    if (rc)
        return rc;
    double t0 = mono_ms();
    /* the tier decides which tier serves; a disk hit goes straight into the blob */
    struct blob_build b = {.kl = kl, .seq = seq};
    struct kvt_take_into into = {.place = place, .ud = &b};
    struct kvt_take t;
    rc = kvt_pcache_take_into(kl->pc, tok, n, kl->ns, &into, &t);
    if (rc == 0 && into.header)
        rc = load_placed(kl, &b, into.header, into.prefix_len, r);
    build_free(&b); /* also what a disk restore that fell back to RAM placed */
    kvt_header_free(into.header);
    if (rc == 0 && t.entry)
        rc = load_entry(kl, seq, &t, r);
    if (rc == 0 && r->n_tokens == 0)
        llama_memory_seq_rm(llama_get_memory(kl->ctx), seq, -1, -1);
    r->ms = mono_ms() - t0;
    return rc;
}
