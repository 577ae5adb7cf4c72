/*
 * Synthetic entries whose bytes derive from their tokens, so that whatever a store hands
 * back can be checked against a rebuild from the same tokens (the store suites and the
 * multi-process stress program must agree on them byte for byte).
 */
#ifndef KVT_TEST_SYNTH_H
#define KVT_TEST_SYNTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

/** Head dim of the kv layers: keys and values are [1, 1, n, SYNTH_HEAD_DIM] bfloat16. */
#define SYNTH_HEAD_DIM 4

/** A kv layer over @p n rows; every row derives from the tokens up to it and @p layer. */
int synth_kv(const int32_t *tok, size_t n, int layer, kvt_cache **out);
/** An ssm layer whose state derives from the whole token list. */
int synth_ssm(const int32_t *tok, size_t n, kvt_cache **out);
/** Kv layer 0, plus an ssm layer when the entry must not be trimmable. */
int synth_entry(const int32_t *tok, size_t n, const char *ns, bool trimmable,
                struct kvt_entry **out);

#endif
