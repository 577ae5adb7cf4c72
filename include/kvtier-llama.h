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
 *    of its weights and of its vocabulary, and every context setting that changes the state's
 *    layout or meaning (docs/LLAMA.md lists them). Another model, quantization, tokenizer or
 *    cache setting never loads another's state: it is a miss.
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
    uint64_t ram_max_bytes;      /* RAM tier; default 1 GiB */
    uint64_t disk_max_bytes;     /* store cap; default 32 GiB */
    int64_t demote_idle_ms;      /* move RAM entries idle this long to disk; default 300000 */
    const char *background_cpus; /* CPUs of kvtier's writer and timer threads; NULL = all */
    kvt_log_fn log;
    void *log_ud;
};

/** Fill @p o with the defaults (no directory, no model path). */
KVT_API void kvt_llama_opts_init(struct kvt_llama_opts *o);

/**
 * Open the prompt cache of context @p ctx (which must outlive the handle): derive the
 * identity, open the RAM tier and its store (recovering what earlier processes left).
 * @return 0, -EINVAL (missing option), KVT_E_UNSUPPORTED (another llama.cpp build, or a
 *         memory kind the mapping refuses), a store error or -errno (model file unreadable).
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
 * state is copied out of llama.cpp once (llama_state_seq_get_data) into the entry, which the
 * RAM tier keeps and writes behind to disk; the context is free to go on at once.
 * @return 0, -EINVAL, KVT_E_STATE (the sequence does not hold exactly those positions),
 *         KVT_E_UNSUPPORTED (state the mapping refuses), -ENOMEM.
 */
KVT_API int kvt_llama_save(kvt_llama *kl, llama_seq_id seq, const llama_token *tok, size_t n);

/** What kvt_llama_load() did. */
struct kvt_llama_loaded {
    size_t n_tokens; /* tokens now in the sequence (0: a miss; the sequence is then empty) */
    size_t n_entry;  /* tokens of the entry it came from (> n_tokens when trimmed) */
    bool from_disk;  /* read from the store (else from the RAM tier) */
    double ms;       /* wall time of the load, llama_state_seq_set_data included */
    double set_ms;   /* of which llama_state_seq_set_data */
};

/**
 * Load the longest usable cached prefix of @p tok[0..n) into sequence @p seq, replacing what
 * it held: at least one token is always left for the caller to decode (the logits of the
 * next token come from that decode). The caller then decodes @p tok[r->n_tokens..n) at
 * positions r->n_tokens onward. An attention entry longer than the match is trimmed with
 * llama_memory_seq_rm(); recurrent state only serves exact prefixes. A corrupt, vanished or
 * foreign entry file is a miss and never reaches llama.cpp. From disk, the tensor bytes go
 * from the file straight into the state buffer that llama_state_seq_set_data() reads.
 * An entry llama.cpp refuses (no room in the context, rows of another size) is a miss too.
 * @return 0 (see r->n_tokens; a miss is not an error; the sequence is then empty), -EINVAL,
 *         -ENOMEM, or KVT_E_STATE when llama.cpp refuses a RAM entry's state.
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
