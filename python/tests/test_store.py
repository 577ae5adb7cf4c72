"""The store level: put / find / restore / ls / stats, identity, caps, closed stores."""
import threading

import numpy as np
import pytest

import kvtier
from conftest import IDENT, kv_entry, same


def test_put_find_restore_trims_to_the_prefix(tmp_path):
    e, (k, v) = kv_entry(range(40), namespace="u1")
    with kvtier.Store(tmp_path, max_bytes=1 << 30, **IDENT) as s:
        s.put(e)
        prompt = list(range(25)) + [999, 998]
        hit = s.find(prompt, "u1")
        assert hit and hit.prefix_len == 25 and hit.n_tokens == 40 and hit.trimmable
        got = s.restore(hit)
        assert got.n_tokens == 25 and np.array_equal(got.tokens, np.arange(25))
        assert got.caches[0].offset == 25
        K, V = got.caches[0].torch()
        assert same(K, k[:, :, :25]) and same(V, v[:, :, :25])
        assert got.model_id == IDENT["model_id"]  # the store writes its identity
        full = s.get(list(range(40)) + [1], "u1")
        assert full.n_tokens == 40
        assert s.has_durable_prefix(range(30), "u1")  # a record starts with these tokens
        assert not s.has_durable_prefix(range(41), "u1")
        [rec] = s.ls()
        assert rec.namespace == "u1" and rec.n_tokens == 40 and rec.path.startswith(s.root)
        st = s.stats()
        assert st["entries"] == 1 and st["restores"] == 2 and st["max_bytes"] == 1 << 30


def test_namespace_and_fingerprint_separate_entries(tmp_path):
    e, _ = kv_entry(range(30), namespace="a")
    with kvtier.Store(tmp_path, **IDENT) as s:
        s.put(e)
        assert not s.find(range(31), "b")
        assert not s.find(range(31))  # None is the "" namespace
        assert s.find(range(31), "a")
    other = dict(IDENT, config_fingerprint="fp-2")
    with kvtier.Store(tmp_path, **other) as s:
        assert s.stats()["entries"] == 0 and not s.find(range(31), "a")
    with kvtier.Store(tmp_path, **IDENT) as s:  # reopened: recovered from the headers
        assert s.find(range(31), "a").prefix_len == 30


def test_a_hit_of_another_store_is_refused(tmp_path):
    ea, _ = kv_entry(range(30), seed=1)
    eb, _ = kv_entry(range(100, 130), seed=2)
    with kvtier.Store(tmp_path / "a", **IDENT) as a, kvtier.Store(tmp_path / "b", **IDENT) as b:
        a.put(ea)
        b.put(eb)
        hit = a.find(range(31))
        assert hit.id == b.find(range(100, 131)).id  # only the store tells the records apart
        with pytest.raises(ValueError, match="another store"):
            b.restore(hit)
        with pytest.raises(ValueError, match="another store"):
            b.restore_into(hit, [None, None])
        with pytest.raises(ValueError, match="another store"):
            b.restore_to_device(hit, kvtier.Device.host(), [None, None])
        assert b.stats()["entries"] == 1 and b.stats()["restore_misses"] == 0
        assert np.array_equal(a.restore(hit).tokens, np.arange(30))


def test_byte_cap_evicts_least_recently_used(tmp_path):
    with kvtier.Store(tmp_path, **IDENT) as s:
        s.put(kv_entry(range(50))[0])
        size = s.stats()["total_bytes"]
    with kvtier.Store(tmp_path, max_bytes=int(2.5 * size), **IDENT) as s:
        for i in range(1, 4):
            s.put(kv_entry(range(i * 100, i * 100 + 50), seed=i)[0])
        st = s.stats()
        assert st["entries"] == 2 and st["evictions"] >= 2
        assert st["total_bytes"] <= 2.5 * size
        assert not s.find(list(range(50)) + [7])


def test_closed_store_raises_state_error(tmp_path):
    s = kvtier.Store(tmp_path, **IDENT)
    s.close()
    s.close()  # idempotent
    assert s.closed
    for call in (lambda: s.find([1, 2]), lambda: s.put(kv_entry(range(3))[0]), s.stats,
                 s.ls, s.refresh, lambda: s.root):
        with pytest.raises(kvtier.StateError, match="closed"):
            call()


def test_read_only_store_refuses_put(tmp_path):
    with kvtier.Store(tmp_path, **IDENT) as s:
        s.put(kv_entry(range(10))[0])
    with kvtier.Store(tmp_path, read_only=True, **IDENT) as s:
        assert s.find(range(11)).prefix_len == 10
        with pytest.raises(kvtier.StateError):
            s.put(kv_entry(range(20))[0])


def test_a_second_store_sees_entries_after_refresh(tmp_path):
    with kvtier.Store(tmp_path, **IDENT) as a, kvtier.Store(tmp_path, **IDENT) as b:
        a.put(kv_entry(range(10))[0])
        assert not b.find(range(11))
        b.refresh()
        assert b.find(range(11)).prefix_len == 10


def test_many_threads_share_a_store(tmp_path):
    errors = []
    with kvtier.Store(tmp_path, **IDENT) as s:
        def work(i):
            try:
                e, (k, _) = kv_entry(range(i * 1000, i * 1000 + 64), seed=i, namespace=str(i))
                s.put(e)
                got = s.get(list(range(i * 1000, i * 1000 + 64)) + [0], str(i))
                assert same(got.caches[0].torch()[0], k)
            except Exception as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and s.stats()["entries"] == 8
