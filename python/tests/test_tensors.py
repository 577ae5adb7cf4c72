"""Zero copy between kvtier and torch / numpy, both ways, and buffer lifetimes."""
import gc
import sys
import weakref

import numpy as np
import pytest
import torch
import torch.utils.dlpack

import kvtier
from conftest import kv_pair, same


def test_restored_tensors_reach_torch_without_copy(tmp_path):
    k, v = kv_pair(300)
    kvtier.save(tmp_path / "e.mlxkv", kvtier.Entry(range(300), [kvtier.KVCache(k, v)]))
    entry = kvtier.load(tmp_path / "e.mlxkv")
    kt, vt = entry.caches[0].state()
    tk = kt.torch()
    assert tk.dtype == torch.bfloat16
    assert tk.data_ptr() == kt.data_ptr  # same memory, no copy
    assert same(tk, k)
    # restore capacity (300 rows and an eighth): the view is strided over it
    assert entry.caches[0].capacity == 338
    assert tk.stride() == (4 * 338 * 16, 338 * 16, 16, 1)
    assert same(torch.utils.dlpack.from_dlpack(vt), v)  # the __dlpack__ protocol


def test_numpy_view_is_zero_copy_and_read_only():
    a = np.arange(2 * 3 * 4 * 8, dtype=np.float16).reshape(2, 3, 4, 8)
    c = kvtier.KVCache(a, a + 1)
    kt, _ = c.state()
    arr = np.asarray(kt)
    assert arr.__array_interface__["data"][0] == kt.data_ptr == a.ctypes.data
    assert np.array_equal(arr, a)
    assert not arr.flags.writeable
    with pytest.raises(ValueError):
        arr[0, 0, 0, 0] = 1
    assert memoryview(kt).readonly


def test_bfloat16_reaches_numpy_as_uint16_bits():
    k, v = kv_pair(5)
    kt, _ = kvtier.KVCache(k, v).state()
    a = kt.numpy()
    assert a.dtype == np.uint16
    assert torch.equal(torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16), k)


def test_torch_input_is_wrapped_not_copied_and_released_once():
    k, v = kv_pair(8)
    kr = weakref.ref(k)
    c = kvtier.KVCache(k, v)
    assert c.state()[0].data_ptr == k.data_ptr()
    del k
    gc.collect()
    assert kr() is not None  # kvtier holds the Python object
    del c
    gc.collect()
    assert kr() is None  # released when the cache let go


def test_numpy_input_refcount_returns_exactly():
    a = np.zeros((1, 2, 4, 8), dtype=np.float32)
    b = np.zeros((1, 2, 4, 8), dtype=np.float32)
    before = sys.getrefcount(a)
    c = kvtier.KVCache(a, b)
    assert sys.getrefcount(a) > before
    clone = c.clone()
    del c
    assert sys.getrefcount(a) > before  # the clone still shares the bytes
    del clone
    assert sys.getrefcount(a) == before  # one release, not two, not none


def test_dlpack_capsule_deleter_runs_when_torch_tensor_dies():
    k, v = kv_pair(4)
    cache = kvtier.KVCache(k.clone(), v.clone())
    kt, _ = cache.state()
    base = kt._buf_refcount
    t = kt.torch()
    assert kt._buf_refcount == base + 1
    del t
    gc.collect()
    assert kt._buf_refcount == base
    cap = kt.__dlpack__()
    assert kt._buf_refcount == base + 1
    del cap  # an unconsumed capsule frees its reference too
    assert kt._buf_refcount == base


def test_uint32_becomes_int32_in_torch_with_the_same_bits():
    packed = np.arange(1 * 2 * 3 * 8, dtype=np.uint32).reshape(1, 2, 3, 8) * 0x01010101
    scales = np.ones((1, 2, 3, 1), dtype=np.float16)
    c = kvtier.QuantizedKVCache(packed, scales, scales.copy(), packed.copy(), scales.copy(),
                                scales.copy(), group_size=64, bits=4)
    t = c.torch()[0]
    assert t.dtype == torch.int32
    assert np.array_equal(t.numpy().view(np.uint32), packed)
    assert c.state()[0].numpy().dtype == np.uint32
