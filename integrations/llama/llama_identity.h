/*
 * The identity a llama.cpp context's entries are stored under, derived from the loaded model
 * and the context (docs/LLAMA.md, "Identity"): model_id names the model; the fingerprint
 * (the store's directory key) digests everything that changes the state's layout or meaning;
 * the tokenizer hash digests the vocabulary.
 */
#ifndef KVT_LLAMA_IDENTITY_H
#define KVT_LLAMA_IDENTITY_H

#include "kvtier-llama.h"
#include "llama_state.h"

struct llama_identity {
    char model_id[160];
    char fingerprint[40];
    char tokenizer_hash[40];
    struct llama_shape shape;
};

/**
 * Derive the identity of @p ctx. Refuses other llama.cpp builds and memory kinds the mapping
 * does not take. @return 0, -EINVAL, -errno (model file), KVT_E_UNSUPPORTED.
 */
int identity_derive(struct llama_context *ctx, const struct kvt_llama_opts *o,
                    struct llama_identity *id);

#endif
