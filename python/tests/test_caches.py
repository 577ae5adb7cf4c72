"""The six cache kinds built from tensors: round trips, growth, trim, clones, bad input."""
import numpy as np
import pytest
import torch

import kvtier
from conftest import kv_pair, same


def f16(rng, *shape):
    return rng.standard_normal(shape).astype(np.float16)


def all_kinds(rng):
    """One cache of each kind, built from numpy / torch tensors."""
    k, v = kv_pair(7)
    u32 = lambda *s: rng.integers(0, 2**32, size=s, dtype=np.uint32)  # noqa: E731
    u8 = lambda *s: rng.integers(0, 256, size=s, dtype=np.uint8)  # noqa: E731
    qkv = [u32(1, 2, 7, 8), f16(rng, 1, 2, 7, 1), f16(rng, 1, 2, 7, 1),
           u32(1, 2, 7, 8), f16(rng, 1, 2, 7, 1), f16(rng, 1, 2, 7, 1)]  # D=64, bits 4, g 64
    ring = [u32(1, 2, 5, 8), f16(rng, 1, 2, 5, 1), f16(rng, 1, 2, 5, 1),
            u32(1, 2, 5, 8), f16(rng, 1, 2, 5, 1), f16(rng, 1, 2, 5, 1)]
    tq = [rng.integers(-128, 128, size=(1, 2, 7, 64), dtype=np.int8), f16(rng, 1, 2, 7, 2),
          f16(rng, 1, 2, 7, 2), u8(1, 2, 7, 24), f16(rng, 1, 2, 7, 2)]  # headDim 64, k8 v3
    return [
        kvtier.KVCache(k, v),
        kvtier.RotatingCache(k.clone(), v.clone(), max_size=4, offset=9, idx=3),
        kvtier.QuantizedKVCache(*qkv, group_size=64, bits=4),
        kvtier.RotatingQuantizedKVCache(*ring, max_size=5, group_size=64, bits=4, offset=5,
                                        idx=5),
        kvtier.SSMCache(f16(rng, 1, 3, 24), rng.standard_normal((1, 2, 8, 8)).astype(np.float32),
                        offset=7),
        kvtier.TurboQuantCache(*tq, k_bits=8, v_bits=3),
    ]


def test_every_kind_round_trips_bit_exactly(tmp_path, rng):
    caches = all_kinds(rng)
    assert [c.kind for c in caches] == list(kvtier.KINDS)
    before = [[t.numpy().copy() for t in c.state()] for c in caches]
    infos = [c.info() for c in caches]
    path = tmp_path / "all.mlxkv"
    kvtier.save(path, kvtier.Entry(range(7), caches))
    header = kvtier.read_header(path)
    assert [c["kind"] for c in header.caches] == list(kvtier.KINDS)
    assert not header.trimmable  # the wrapped ring and the ssm cache
    back = kvtier.load(path)
    assert [type(c) for c in back.caches] == [type(c) for c in caches]
    assert [c.info() for c in back.caches] == infos
    for c, want in zip(back.caches, before):
        got = [t.numpy() for t in c.state()]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and np.array_equal(g.view(np.uint8), w.view(np.uint8))


def test_kv_append_grows_in_steps_and_trims():
    c = kvtier.KVCache()
    assert c.offset == 0 and c.capacity == 0
    k, v = kv_pair(3)
    kw, vw = c.append(k, v)
    assert c.offset == 3 and c.capacity == 256 and kw.shape == (1, 4, 3, 16)
    assert same(kw.torch(), k)
    k2, v2 = kv_pair(1, seed=1)
    kw, _ = c.append(k2, v2)
    assert same(kw.torch(), torch.cat([k, k2], dim=2))
    c.trim(2)
    assert c.offset == 2 and c.is_trimmable
    assert same(c.state()[0].torch(), k[:, :, :2])


def test_rotating_wraps_and_stops_being_trimmable():
    c = kvtier.RotatingCache(max_size=4)
    for i in range(3):
        k, v = kv_pair(1, seed=i)
        c.append(k, v)
    assert c.offset == 3 and c.is_trimmable
    c.append(*kv_pair(1, seed=3))
    assert c.offset == 4 and not c.is_trimmable  # offset == max_size: the ring is full
    k, v = kv_pair(1, seed=9)
    kw, _ = c.append(k, v)
    assert c.offset == 5 and kw.shape[2] == 4 and not c.is_trimmable
    with pytest.raises(kvtier.StateError):
        c.trim(1)


def test_clone_is_isolated_from_later_writes():
    k, v = kv_pair(4)
    c = kvtier.KVCache()
    c.append(k, v)
    snap = c.clone()
    c.trim(2)
    k2, v2 = kv_pair(2, seed=5)
    c.append(k2, v2)  # writes rows the clone references: must copy first
    assert same(snap.state()[0].torch(), k)
    assert same(c.state()[0].torch(), torch.cat([k[:, :, :2], k2], dim=2))


def test_ssm_update_replaces_state():
    rng = np.random.default_rng(1)
    c = kvtier.SSMCache()
    conv, rec = f16(rng, 1, 3, 8), rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    c.update(conv, rec, 5)
    assert c.offset == 5 and not c.is_trimmable
    assert np.array_equal(c.state()[1].numpy(), rec)


# ---- bad input: clear exceptions, never a crash ----

def test_non_contiguous_tensors_are_refused():
    k, v = kv_pair(6)
    with pytest.raises(ValueError, match="contiguous"):
        kvtier.KVCache(k.transpose(2, 3), v.transpose(2, 3))
    a = np.zeros((1, 2, 8, 6), dtype=np.float16)[:, :, ::2]
    with pytest.raises(ValueError, match="contiguous"):
        kvtier.KVCache(a, a)
    c = kvtier.KVCache()
    with pytest.raises(ValueError, match="contiguous"):
        c.append(k[:, :, ::2], v[:, :, ::2])
    assert c.offset == 0


def test_wrong_types_and_dtypes_are_refused():
    k, v = kv_pair(3)
    with pytest.raises(TypeError, match="expected a torch tensor"):
        kvtier.KVCache([[1.0]], v)
    with pytest.raises(TypeError):
        kvtier.KVCache(k, None)
    with pytest.raises(kvtier.InvalidArgumentError, match="activation dtype"):
        kvtier.KVCache(k.to(torch.int64), v.to(torch.int64))
    with pytest.raises(kvtier.InvalidArgumentError, match="V dtype"):
        kvtier.KVCache(k, v.float())
    with pytest.raises(TypeError, match="dtype"):
        kvtier.KVCache(k.to(torch.complex128), v.to(torch.complex128))
    with pytest.raises(TypeError):
        kvtier.Entry(range(3), [k])


def test_shapes_that_do_not_fit_the_kind_are_refused():
    k, v = kv_pair(3)
    with pytest.raises(kvtier.InvalidArgumentError, match="rank"):
        kvtier.KVCache(k[0], v[0])
    with pytest.raises(kvtier.InvalidArgumentError, match="axis"):
        kvtier.KVCache(k, v[:, :2].contiguous())
    # more live rows than the tensors hold; the message names what was being done
    with pytest.raises(kvtier.InvalidArgumentError,
                       match=r"^kv cache from tensors: 3 rows hold fewer than offset 9 tokens$"):
        kvtier.KVCache(k, v, offset=9)
    q = np.zeros((1, 2, 3, 7), dtype=np.uint32)  # 7 * 32 != 1 * 64 * 4
    s = np.zeros((1, 2, 3, 1), dtype=np.float16)
    with pytest.raises(kvtier.InvalidArgumentError, match="last dimension"):
        kvtier.QuantizedKVCache(q, s, s, q, s, s, group_size=64, bits=4)
    with pytest.raises(kvtier.InvalidArgumentError, match="bits"):
        kvtier.QuantizedKVCache(group_size=64, bits=7)
    with pytest.raises(kvtier.InvalidArgumentError, match="maxSize"):
        kvtier.RotatingCache(max_size=0)
    c = kvtier.KVCache()
    c.append(k, v)
    with pytest.raises(kvtier.InvalidArgumentError):
        c.append(*kv_pair(2, dim=8))  # head dim differs from the rows held
    assert c.offset == 3


def test_empty_cache_cannot_be_persisted(tmp_path):
    with pytest.raises(kvtier.StateError):
        kvtier.save(tmp_path / "x.mlxkv", kvtier.Entry([1], [kvtier.KVCache()]))
    assert not (tmp_path / "x.mlxkv").exists()
    assert list(tmp_path.iterdir()) == []
