"""Restores into memory the caller owns: load_into and Store.restore_into."""
import numpy as np
import pytest
import torch

import kvtier
from conftest import IDENT, kv_entry, kv_pair, same


def empty_like_slots(header):
    """One torch destination per slot, shaped and typed from the header."""
    dt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    return [torch.empty(s["shape"], dtype=dt[s["dtype"]])
            for c in header.caches for s in c["tensors"]]


def test_load_into_torch_tensors_the_caller_allocated(tmp_path):
    k, v = kv_pair(300)
    k2, v2 = kv_pair(300, seed=3)
    p = tmp_path / "e.mlxkv"
    kvtier.save(p, kvtier.Entry(range(300), [kvtier.KVCache(k, v), kvtier.KVCache(k2, v2)]))
    dests = []

    def place(h):
        assert h.tokens.shape == (300,)  # the validated header, before any tensor byte
        dests.extend(empty_like_slots(h))
        return dests

    h = kvtier.load_into(p, place)
    assert [c["offset"] for c in h.caches] == [300, 300] and len(dests) == 4
    for d, want in zip(dests, (k, v, k2, v2)):
        assert same(d, want)  # the bytes landed in the caller's tensors


def test_load_into_a_ready_sequence_with_skips(tmp_path):
    k, v = kv_pair(40, dtype=torch.float16)
    p = tmp_path / "e.mlxkv"
    kvtier.save(p, kvtier.Entry(range(40), [kvtier.KVCache(k, v)]))
    dk = np.empty((1, 4, 40, 16), dtype=np.float16)
    h = kvtier.load_into(p, [dk, None])
    assert np.array_equal(dk, k.numpy()) and h.tokens.shape == (40,)


def test_bad_destinations_raise(tmp_path):
    k, v = kv_pair(40)
    p = tmp_path / "e.mlxkv"
    kvtier.save(p, kvtier.Entry(range(40), [kvtier.KVCache(k, v)]))
    small = torch.empty(1, 4, 39, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="holds"):
        kvtier.load_into(p, [small, None])
    ro = np.zeros(1 * 4 * 40 * 16, dtype=np.uint16)
    ro.setflags(write=False)
    with pytest.raises((BufferError, ValueError)):
        kvtier.load_into(p, [ro, None])
    with pytest.raises(ValueError, match="destinations"):
        kvtier.load_into(p, [None])
    with pytest.raises(ValueError, match="contiguous"):
        kvtier.load_into(p, [torch.empty(1, 4, 16, 40, dtype=torch.bfloat16).transpose(2, 3),
                             None])
    with pytest.raises(ZeroDivisionError):
        kvtier.load_into(p, lambda h: 1 / 0)  # the callable's own exception comes through


def test_store_restore_into(tmp_path):
    e, (k, v) = kv_entry(range(64), namespace="n")
    with kvtier.Store(tmp_path, **IDENT) as s:
        s.put(e)
        hit = s.find(list(range(30)) + [1], "n")
        out = []
        h = s.restore_into(hit, lambda hd: out.extend(empty_like_slots(hd)) or out)
        assert h.caches[0]["offset"] == 64
        assert same(out[0][:, :, :hit.prefix_len], k[:, :, :30]) and same(out[1], v)
        assert s.restore_into(s.find([5000, 5001], "n"), []) is None
