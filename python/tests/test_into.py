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
    with pytest.raises(ValueError, match=r"layer 0, tensor 0\) is bfloat16 \[1, 4, 39, 16\]"):
        kvtier.load_into(p, [small, None])
    with pytest.raises(ValueError, match="holds 100 bytes, the slot has 5120"):
        kvtier.load_into(p, [bytearray(100), None])
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


def test_typed_destinations_must_be_the_slots_dtype_and_shape(tmp_path):
    k, v = kv_pair(200, heads=4, dim=64)
    p = tmp_path / "e.mlxkv"
    kvtier.save(p, kvtier.Entry(range(200), [kvtier.KVCache(k, v)]))
    bf16 = dict(dtype=torch.bfloat16)
    wrong = {
        "float32": ([torch.zeros(1, 4, 200, 64), torch.zeros(1, 4, 200, 64, **bf16)],
                    r"destination 0 \(layer 0, tensor 0\) is float32 \[1, 4, 200, 64\], the "
                    r"slot is bfloat16 \[1, 4, 200, 64\]"),
        "more rows": ([torch.zeros(1, 4, 200, 64, **bf16), torch.zeros(1, 4, 256, 64, **bf16)],
                      r"\(layer 0, tensor 1\) is bfloat16 \[1, 4, 256, 64\], the slot is "
                      r"bfloat16 \[1, 4, 200, 64\]"),
        "flat bf16": ([torch.zeros(4 * 200 * 64, **bf16), None], r"\[51200\]"),
        "numpy float16": ([np.zeros((1, 4, 200, 64), np.float16), None], "float16"),
        "torch uint8 4-D": ([torch.zeros(1, 4, 200, 128, dtype=torch.uint8), None], "uint8"),
    }
    for name, (dests, msg) in wrong.items():
        with pytest.raises(ValueError, match=msg):
            kvtier.load_into(p, dests)
        for d in dests:
            assert d is None or not torch.as_tensor(d).float().any(), name  # nothing read
        with kvtier.Store(tmp_path / "s", **IDENT) as s:  # a restore checks the same way
            s.put(kvtier.Entry(range(200), [kvtier.KVCache(k, v)]))
            with pytest.raises(ValueError, match=msg):
                s.restore_into(s.find(range(201)), dests)
            with pytest.raises(ValueError, match=msg):
                s.restore_to_device(s.find(range(201)), kvtier.Device.host(), dests)

    # what fits: the exact tensors; numpy's bfloat16 stand-in (the bit patterns as uint16);
    # raw bytes of at least the slot's size
    kt, vn = torch.empty(1, 4, 200, 64, **bf16), np.empty((1, 4, 200, 64), np.uint16)
    kvtier.load_into(p, [kt, vn])
    assert same(kt, k) and same(torch.from_numpy(vn.view(np.int16)).view(torch.bfloat16), v)
    raw, mv = bytearray(k.numel() * 2 + 10), memoryview(bytearray(v.numel() * 2))
    kvtier.load_into(p, [raw, mv])
    assert bytes(raw[:k.numel() * 2]) == k.view(torch.int16).numpy().tobytes()
    assert mv.tobytes() == v.view(torch.int16).numpy().tobytes()
    flat = torch.empty(k.numel() * 2, dtype=torch.uint8)
    kvtier.load_into(p, [flat, None])
    assert flat.numpy().tobytes() == k.view(torch.int16).numpy().tobytes()
