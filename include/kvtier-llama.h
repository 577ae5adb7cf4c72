/*
 * kvtier for llama.cpp — a persistent prompt cache for programs that embed llama.cpp.
 *
 * A sequence's state (its attention K/V or recurrent state, as llama_state_seq_get_data()
 * gives it) becomes a kvtier entry keyed by the tokens it holds: kept in a RAM tier, written
 * behind to a store directory, found again by longest prefix and loaded back into any
 * sequence, in this process or a later one. Built as its own library (libkvtier-llama); the
 * core library never links llama.cpp.
 *
 * Caveats
 *  - llama.cpp build: the state layout mapped here is that of llama.cpp 0.5.0
 *    (llama_version() "0.5.0-dev"); kvt_llama_open() refuses any other build
 *    (KVT_E_UNSUPPORTED).
 *  - Identity: entries are keyed by the model's architecture and hyper-parameters, a digest
 *    of its weights and of its vocabulary, the LoRA adapters and control vector the handle
 *    declares, and every context setting that changes what the state's bytes mean
 *    (docs/LLAMA.md lists them). Another model, quantization, tokenizer, adapter or cache
 *    setting never loads another's state: it is a miss. Settings that only change how much
 *    the context holds (n_seq_max, kv_unified, swa_full, n_ctx) are not part of it.
 *  - Adapters: llama.h cannot report which LoRA adapters or control vector a context runs,
 *    so the handle declares them (struct kvt_llama_opts) and kvt_llama_open() sets exactly
 *    those on the context. Setting others afterwards (llama_set_adapters_lora(),
 *    llama_set_adapter_cvec()) is not seen: close the handle and open one that declares them.
 *  - Pending memory updates: a K-shift after llama_memory_seq_add()/seq_div() is applied by
 *    llama.cpp only when it next decodes; kvt_llama_save() applies it first, so the entry
 *    holds the rows the context will attend to. A shift llama.cpp cannot run (a memory
 *    whose llama_memory_can_shift() is false) aborts there as at llama.cpp's next decode.
 *  - Mapping (docs/LLAMA.md): attention layers become `kv` caches, sliding-window layers
 *    `rotating` caches, recurrent layers `ssm` caches. Hybrid memories, M-RoPE cells and
 *    shared-memory contexts are refused (KVT_E_UNSUPPORTED) rather than mapped
 *    approximately. Contexts with several streams work (each sequence is one stream).
 *  - Threads: a kvt_llama is used from the thread that runs the context (calls into llama.cpp
 *    are not locked); the write-behind to disk runs on kvtier's writer thread on copies that
 *    llama.cpp never sees.
 *  - Returns: 0, -errno or a KVT_E_* code; kvt_last_error() has the message.
 */
#ifndef KVTIER_LLAMA_H
#define KVTIER_LLAMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The llama_version() of the only llama.cpp build whose state layout this library maps. */
#define KVT_LLAMA_KNOWN_VERSION "0.5.0-dev"

typedef struct kvt_llama kvt_llama;

/** A LoRA adapter the context runs with. */
struct kvt_llama_lora {
    struct llama_adapter_lora *adapter; /* as llama_adapter_lora_init() returned it */
    /* The adapter's identity: the bytes of its GGUF file (read once at open), or a digest the
     * caller already has. One of the two is required. */
    const char *path;
    const char *digest;
    float scale; /* as llama_set_adapters_lora() takes it; 0: not applied, not identity */
};

/** A control vector, as llama_set_adapter_cvec() takes it (its bytes are the identity). */
struct kvt_llama_cvec {
    const float *data; /* n_embd floats per layer, from layer 1 */
    size_t len;        /* floats at data */
    int32_t n_embd, il_start, il_end;
};

struct kvt_llama_opts {
    const char *cache_dir; /* store directory (required) */
    const char *ns;        /* namespace of this program's entries; NULL = "" */
    /* The weights digest: the bytes of the GGUF file the model was loaded from (read once at
     * open), or a digest the caller already has (e.g. the model's published sha256). One of
     * the two is required. */
    const char *model_path;
    const char *weights_digest;
    /* The parameters the context was created with (required): their layout- and
     * meaning-changing fields are part of the identity. */
    const struct llama_context_params *cparams;
    /* What the context runs on top of the model: kvt_llama_open() sets exactly these LoRA
     * adapters and this control vector (NULL: none) on it, clearing any others, and they
     * are part of the identity. */
    const struct kvt_llama_lora *loras;
    size_t n_loras;
    const struct kvt_llama_cvec *cvec;
    uint64_t ram_max_bytes;      /* RAM tier; default 1 GiB */
    uint64_t disk_max_bytes;     /* store cap; default 32 GiB */
    int64_t demote_idle_ms;      /* move RAM entries idle this long to disk; default 300000 */
    const char *background_cpus; /* CPUs of kvtier's writer and timer threads; NULL = all */
    bool share_prefixes;         /* the store keeps prompts shared by several entries once
                                    (kvt_store_opts.share_prefixes, docs/SHARING.md); default off */
    kvt_log_fn log;
    void *log_ud;
    /* Optional remote tier shared with other hosts (kvt_pcache_opts.remote; its identity
     * defaults to this handle's): saves are uploaded behind the disk write, loads consult it
     * after RAM and disk. NULL = none. */
    const struct kvt_remote_opts *remote;
};

/** Fill @p o with the defaults (no directory, no model path). */
KVT_API void kvt_llama_opts_init(struct kvt_llama_opts *o);

/**
 * Open the prompt cache of context @p ctx (which must outlive the handle): derive the
 * identity, open the RAM tier and its store (recovering what earlier processes left), then
 * set the declared adapters and control vector on the context (the only change open makes
 * to it, and only when everything else succeeded).
 * @return 0, -EINVAL (missing option, an adapter without a path or digest, a control vector
 *         llama.cpp refuses), KVT_E_UNSUPPORTED (another llama.cpp build, or a memory kind
 *         the mapping refuses), a store error or -errno (model or adapter file unreadable).
 */
KVT_API int kvt_llama_open(struct llama_context *ctx, const struct kvt_llama_opts *o,
                           kvt_llama **out);
/**
 * Make everything saved durable (waits up to @p flush_timeout_ms, < 0 = two minutes), then
 * close. NULL allowed. Does not touch the context. To learn whether the flush succeeded, call
 * kvt_llama_flush() first.
 */
KVT_API void kvt_llama_close(kvt_llama *kl, int64_t flush_timeout_ms);

/**
 * Persist what sequence @p seq holds: @p tok[0..n) are the tokens at its positions 0..n-1
 * (attention memory: n cells at positions 0..n-1; recurrent: the state after n tokens). The
 * context's pending memory updates (a K-shift after llama_memory_seq_add(), copies between
 * streams) are applied first, as llama_decode() would; the logits of the last decode stay
 * readable. The state is copied out of llama.cpp once (llama_state_seq_get_data) into the
 * entry, which the RAM tier keeps and writes behind to disk; the context is free to go on.
 * @return 0, -EINVAL (no handle or tokens, @p seq outside [0, llama_n_seq_max())),
 *         KVT_E_STATE (the sequence does not hold exactly those positions),
 *         KVT_E_UNSUPPORTED (state the mapping refuses), -ENOMEM.
 */
KVT_API int kvt_llama_save(kvt_llama *kl, llama_seq_id seq, const llama_token *tok, size_t n);

/** What kvt_llama_load() did. */
struct kvt_llama_loaded {
    size_t n_tokens;  /* tokens now in the sequence (0: a miss; the sequence is then empty) */
    size_t n_entry;   /* tokens of the entry it came from (> n_tokens when trimmed) */
    bool from_disk;   /* read from the store (else from the RAM tier) */
    double ms;        /* wall time of the load, llama_state_seq_set_data included */
    double set_ms;    /* of which llama_state_seq_set_data */
    bool from_remote; /* read from the remote tier (from_disk is set too) */
};

/**
 * Load the longest usable cached prefix of @p tok[0..n) into sequence @p seq, replacing what
 * it held: at least one token is always left for the caller to decode (the logits of the
 * next token come from that decode). The caller then decodes @p tok[r->n_tokens..n) at
 * positions r->n_tokens onward. An attention entry longer than the match is trimmed with
 * llama_memory_seq_rm(); recurrent state only serves exact prefixes. The prompt cache picks
 * the tier (kvt_pcache_take_into(): RAM, then disk, then the remote tier when o->remote is
 * set) and reads each at most once per load. A corrupt, vanished or foreign entry file is a
 * miss and never reaches llama.cpp. From disk, the tensor bytes go from the file straight
 * into the state buffer that llama_state_seq_set_data() reads.
 * An entry llama.cpp refuses (no room in the context, rows of another size) is a miss too.
 * @return 0 (see r->n_tokens; a miss is not an error; the sequence is then empty), -EINVAL
 *         (no handle, result or tokens, or @p seq outside [0, llama_n_seq_max()): nothing is
 *         placed and the context is untouched), -ENOMEM, or KVT_E_STATE when llama.cpp
 *         refuses a RAM entry's state.
 */
KVT_API int kvt_llama_load(kvt_llama *kl, llama_seq_id seq, const llama_token *tok, size_t n,
                           struct kvt_llama_loaded *r);

/** Wait until everything saved so far is on disk (@p timeout_ms < 0: two minutes).
 * @return 0 when durable, KVT_E_TIMEOUT, or a store error. */
KVT_API int kvt_llama_flush(kvt_llama *kl, int64_t timeout_ms);

/** The identity entries are stored under (strings valid until close). */
KVT_API const struct kvt_meta *kvt_llama_identity(const kvt_llama *kl);
/** The prompt cache underneath (stats, clear, demotion); valid until close. */
KVT_API kvt_pcache *kvt_llama_pcache(kvt_llama *kl);

#ifdef __cplusplus
}
#endif
#endif /* KVTIER_LLAMA_H */
