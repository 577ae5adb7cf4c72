"""The file level: save / load / verify / read_header, and what bad files raise."""
import errno
import os
import threading
import time

import numpy as np
import pytest
import torch

import kvtier
from conftest import IDENT, kv_entry, kv_pair, same


def test_save_load_keeps_tokens_meta_and_bytes(tmp_path):
    k, v = kv_pair(20, dtype=torch.float16)
    e = kvtier.Entry(np.arange(100, 120), [kvtier.KVCache(k, v)], namespace="chat-1", **IDENT)
    size = kvtier.save(tmp_path / "a.mlxkv", e, created_at=1767225600000)
    assert size == os.path.getsize(tmp_path / "a.mlxkv") == kvtier.plan_size(e)
    h = kvtier.read_header(tmp_path / "a.mlxkv")
    assert (h.model_id, h.config_fingerprint, h.tokenizer_hash, h.namespace) == \
        (IDENT["model_id"], IDENT["config_fingerprint"], IDENT["tokenizer_hash"], "chat-1")
    assert h.created_at == 1767225600000 and h.format_version == 3 and h.indexable
    assert h.caches[0]["tensors"][0]["shape"] == (1, 4, 20, 16)
    back = kvtier.load(tmp_path / "a.mlxkv", namespace="chat-1", n_layers=1, **IDENT)
    assert np.array_equal(back.tokens, np.arange(100, 120)) and back.namespace == "chat-1"
    assert back.created_at == 1767225600000
    K, V = back.caches[0].torch()
    assert same(K, k) and same(V, v)
    kvtier.verify(tmp_path / "a.mlxkv", **IDENT)


def test_expectations_that_differ_raise_mismatch(tmp_path):
    e, _ = kv_entry(range(5), namespace="a")
    e.model_id = "m1"
    kvtier.save(tmp_path / "a.mlxkv", e)
    with pytest.raises(kvtier.MismatchError) as ei:
        kvtier.load(tmp_path / "a.mlxkv", model_id="m2")
    assert ei.value.code == kvtier._ext.E_MISMATCH and "model" in ei.value.message
    with pytest.raises(kvtier.MismatchError, match="ns"):
        kvtier.load(tmp_path / "a.mlxkv", namespace="b")
    with pytest.raises(kvtier.MismatchError):
        kvtier.load(tmp_path / "a.mlxkv", n_layers=3)


def test_corrupt_bytes_never_reach_the_caller(tmp_path):
    e, _ = kv_entry(range(64))
    p = tmp_path / "a.mlxkv"
    kvtier.save(p, e)
    h = kvtier.read_header(p)
    raw = bytearray(p.read_bytes())
    raw[h.data_start + 100] ^= 0x40  # one bit of tensor data
    p.write_bytes(raw)
    with pytest.raises(kvtier.CorruptError, match="L3|hash"):
        kvtier.load(p)
    with pytest.raises(kvtier.CorruptError):
        kvtier.verify(p)
    kvtier.load(p, verify=False)  # asked not to check: loads
    p.write_bytes(raw[: h.data_start + 50])  # truncated
    with pytest.raises(kvtier.CorruptError):
        kvtier.load(p, verify=False)


def test_other_files_raise_format_and_os_errors(tmp_path):
    (tmp_path / "junk").write_bytes(b"not an mlxkv file at all" * 10)
    with pytest.raises(kvtier.FormatError):
        kvtier.read_header(tmp_path / "junk")
    with pytest.raises(kvtier.KvtierOSError) as ei:
        kvtier.load(tmp_path / "missing.mlxkv")
    assert isinstance(ei.value, OSError) and ei.value.errno == errno.ENOENT
    assert ei.value.code == -errno.ENOENT


def test_max_file_bytes_refuses_before_writing(tmp_path):
    e, _ = kv_entry(range(64))
    with pytest.raises(kvtier.TooLargeError):
        kvtier.save(tmp_path / "a.mlxkv", e, max_file_bytes=1000)
    assert list(tmp_path.iterdir()) == []


def test_load_releases_the_gil(tmp_path):
    k = torch.zeros(1, 8, 8192, 128, dtype=torch.bfloat16)  # 16 MiB per tensor
    e = kvtier.Entry(range(8192), [kvtier.KVCache(k, k.clone()) for _ in range(4)])
    p = tmp_path / "big.mlxkv"
    kvtier.save(p, e, sync=False)
    ticks = []
    done = threading.Event()

    def spin():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.0005)

    t = threading.Thread(target=spin)
    t.start()
    calls = []
    for _ in range(3):
        for call in (kvtier.load, kvtier.verify):
            t0 = time.perf_counter()
            call(p)
            calls.append((t0, time.perf_counter()))
    done.set()
    t.join()
    # Holding the GIL, a call would let no tick happen inside it.
    inside = sum(1 for x in ticks for a, b in calls if a < x < b)
    assert inside >= 10, (inside, calls)


def test_restores_allocate_the_entry_plus_a_proportional_margin(tmp_path):
    # 8 tokens of a Llama-3-8B-like geometry (32 layers x K, V of 8 heads x 128, bfloat16):
    # 1 MiB of tensors, restored into about that much memory, not 256 rows per tensor
    g = torch.Generator().manual_seed(5)
    caches = [kvtier.KVCache(*(torch.randn(1, 8, 8, 128, generator=g).to(torch.bfloat16)
                               for _ in range(2))) for _ in range(32)]
    kvtier.save(tmp_path / "small.mlxkv", kvtier.Entry(range(8), caches))
    with kvtier.Store(tmp_path / "s", **IDENT) as s:
        s.put(kvtier.Entry(range(8), caches))
        restored = [kvtier.load(tmp_path / "small.mlxkv"), s.get(range(9))]
    for e in restored:
        held = sum(c.nbytes for c in e.caches)
        assert 1 << 20 < held <= (1 << 20) * 9 // 8, held  # one row of margin on 8
        assert all(c.capacity == 9 for c in e.caches)
        # the margin is there for the next decode step: it writes in place
        c = e.caches[0]
        before = c.state()[0].data_ptr
        c.append(*(torch.zeros(1, 8, 1, 128, dtype=torch.bfloat16) for _ in range(2)))
        assert c.offset == 9 and c.capacity == 9 and c.state()[0].data_ptr == before
    # the margin grows with the entry (an eighth) up to the 256-row step of large ones
    for n, cap in ((100, 113), (300, 338), (1000, 1024), (2048, 2304)):
        kvtier.save(tmp_path / f"{n}.mlxkv", kvtier.Entry(range(n), [kvtier.KVCache(
            *(torch.zeros(1, 2, n, 16, dtype=torch.bfloat16) for _ in range(2)))]))
        assert kvtier.load(tmp_path / f"{n}.mlxkv").caches[0].capacity == cap, n
