"""Shared helpers of the kvtier pytest suite."""
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # tinylm, for the transformer tests

import kvtier  # noqa: E402

IDENT = dict(model_id="test/tiny", config_fingerprint="fp-1", tokenizer_hash="tok-1")


def kv_pair(tokens=10, heads=4, dim=16, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, heads, tokens, dim, generator=g).to(dtype)
    v = torch.randn(1, heads, tokens, dim, generator=g).to(dtype)
    return k, v


def kv_entry(tokens, seed=0, namespace=None, **kw):
    k, v = kv_pair(len(tokens), seed=seed, **kw)
    return kvtier.Entry(tokens, [kvtier.KVCache(k, v)], namespace=namespace), (k, v)


def same(a, b):
    """Bit-identical torch tensors (bf16 included)."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


@pytest.fixture
def ident():
    return dict(IDENT)


@pytest.fixture
def rng():
    return np.random.default_rng(0)
