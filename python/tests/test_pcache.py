"""The tier level: take / put / flush / close, write-behind, idle demotion, lifetimes."""
import gc
import weakref

import pytest
import torch

import kvtier
from conftest import IDENT, kv_entry, kv_pair, same


def open_pc(d, **kw):
    kw.setdefault("snapshot_debounce_ms", 10)
    return kvtier.PromptCache(d, **IDENT, **kw)


def test_ram_take_then_put_back(tmp_path):
    with kvtier.PromptCache(ram_max_bytes=1 << 30) as pc:  # RAM only
        e, (k, _) = kv_entry(range(30))
        pc.put(e)
        assert pc.contains(range(30)) and pc.peek_prefix_len(list(range(20)) + [7]) == 20
        t = pc.take(list(range(20)) + [7])
        assert t and not t.from_disk and t.entry.n_tokens == 20
        assert same(t.entry.caches[0].torch()[0], k[:, :, :20])
        c = t.entry.caches[0]
        c.append(*kv_pair(1, seed=3))  # copy-on-write: the RAM entry keeps its rows
        pc.put(kvtier.Entry(list(range(20)) + [7], [c]), t)
        again = pc.take(list(range(30)) + [1])
        assert same(again.entry.caches[0].torch()[0], k)
        assert pc.take([500, 501]) is None
        assert pc.stats()["cold"] is None and pc.ls() == []


def test_write_behind_persists_and_a_new_cache_restores(tmp_path):
    e, (k, v) = kv_entry(range(100), namespace="s")
    with open_pc(tmp_path) as pc:
        pc.put(e)
        r = pc.flush()
        assert r.durable and r.entries == 1 and r.longest_durable_prefix_tokens == 100
        assert [x.n_tokens for x in pc.ls()] == [100]
    with open_pc(tmp_path) as pc:
        t = pc.take(list(range(60)) + [5], "s")
        assert t.from_disk and t.entry.n_tokens == 60
        K, V = t.entry.caches[0].torch()
        assert same(K, k[:, :, :60]) and same(V, v[:, :, :60])
        assert pc.take(list(range(60)) + [5], "other") is None
    with kvtier.PromptCache(tmp_path, **dict(IDENT, config_fingerprint="x")) as pc:
        assert pc.take(list(range(60)) + [5], "s") is None


def test_idle_demotion_moves_entries_to_disk(tmp_path):
    with open_pc(tmp_path, write_behind=False) as pc:
        pc.put(kv_entry(range(50))[0])
        assert pc.stats()["cold"]["entries"] == 0
        assert pc.demote_idle(0) == 1
        pc.flush()
        st = pc.stats()
        assert st["records"] == 0 and st["demotions"] == 1 and st["cold"]["entries"] == 1
        t = pc.take(list(range(50)) + [1])
        assert t.from_disk and t.entry.n_tokens == 50


def test_tensor_deleted_while_its_save_is_queued_is_kept_and_saved_intact(tmp_path):
    k, v = kv_pair(200, seed=7)
    want_k, want_v = k.clone(), v.clone()
    kr, vr = weakref.ref(k), weakref.ref(v)
    pc = open_pc(tmp_path, write_behind=False)
    pc.put(kvtier.Entry(range(200), [kvtier.KVCache(k, v)]))
    del k, v
    gc.collect()
    assert kr() is not None and vr() is not None  # kvtier keeps the objects alive
    assert pc.demote_idle(0) == 1  # out of RAM, into the write-behind queue
    assert pc.flush().durable  # written by the library's writer thread
    gc.collect()
    assert kr() is None and vr() is None  # released, once, after the write
    [rec] = pc.ls()
    K, V = kvtier.load(rec.path).caches[0].torch()
    assert same(K, want_k) and same(V, want_v)
    pc.close()


def test_snapshot_of_a_dropped_tensor_is_saved_intact(tmp_path):
    k, v = kv_pair(300, seed=8)
    want_k = k.clone()
    pc = open_pc(tmp_path, snapshot_debounce_ms=0)
    pc.put(kvtier.Entry(range(300), [kvtier.KVCache(k, v)]))
    del k, v
    gc.collect()
    assert pc.flush().durable
    pc.clear()
    gc.collect()
    assert len(pc.ls()) == 1
    t = pc.take(list(range(300)) + [1])  # from disk, whatever layout it was saved in
    assert t.from_disk and same(t.entry.caches[0].torch()[0], want_k)
    pc.close()


def test_closed_prompt_cache_raises_state_error(tmp_path):
    pc = open_pc(tmp_path)
    pc.close()
    pc.close()
    with pytest.raises(kvtier.StateError, match="closed"):
        pc.take([1, 2, 3])
    with pytest.raises(kvtier.StateError):
        pc.put(kv_entry(range(3))[0])
    with pytest.raises(kvtier.StateError):
        pc.flush()


def test_bad_options_raise(tmp_path):
    with pytest.raises(kvtier.InvalidArgumentError):
        kvtier.PromptCache(tmp_path, ram_max_bytes=0, **IDENT)
    with pytest.raises(kvtier.InvalidArgumentError):
        kvtier.PromptCache(tmp_path, model_id="m")  # no fingerprint, no tokenizer hash
    with pytest.raises(kvtier.InvalidArgumentError):
        kvtier.PromptCache(tmp_path, background_cpus="4096", **IDENT)


def test_exit_closes_open_caches_before_the_interpreter_finalizes(tmp_path):
    import subprocess
    import sys
    code = (
        "import torch, kvtier\n"
        f"pc = kvtier.PromptCache({str(tmp_path)!r}, model_id='m', config_fingerprint='f',"
        " tokenizer_hash='t', snapshot_debounce_ms=0)\n"
        "k = torch.ones(1, 2, 4096, 64, dtype=torch.bfloat16)\n"
        "for i in range(8):\n"
        "    pc.put(kvtier.Entry(range(i * 5000, i * 5000 + 4096), [kvtier.KVCache(k, k)]))\n"
        "print('exiting', flush=True)\n"  # writes are still in flight: exit must not hang
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "exiting" in r.stdout, r.stderr


def test_threads_put_and_take_while_the_writer_releases_tensors(tmp_path):
    import threading
    errors = []
    with open_pc(tmp_path, snapshot_debounce_ms=0) as pc:
        def work(i):
            try:
                for j in range(10):
                    base = (i * 100 + j) * 1000
                    k, v = kv_pair(64, seed=base)
                    # wrapped torch tensors: the writer thread releases them (taking the GIL)
                    pc.put(kvtier.Entry(range(base, base + 64), [kvtier.KVCache(k, v)]))
                    t = pc.take(list(range(base, base + 64)) + [1])
                    assert t is not None and same(t.entry.caches[0].torch()[0], k)
            except Exception as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        r = pc.flush()
        assert r.durable and r.dropped == 0 and r.failed == 0
        st = pc.stats()
        assert st["cold"]["entries"] == 40 and st["hits"] >= 40  # every entry snapshotted
