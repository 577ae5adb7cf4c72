"""Device memory from Python: restores into the host stand-in everywhere (destinations as
arrays, tensors or addresses; corrupt files and bad destinations refused), and on a machine
with CUDA, saves straight from CUDA tensors and restores straight into them, byte for byte."""
import numpy as np
import pytest
import torch

import kvtier

IDENT = dict(model_id="m/device", config_fingerprint="fp-dev", tokenizer_hash="tk-dev")
CUDA = torch.cuda.is_available()


def entry(n=700, seed=3, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    caches = []
    for _ in range(3):
        k = torch.randn(1, 4, n, 64, generator=g).to(torch.bfloat16).to(device)
        v = torch.randn(1, 4, n, 64, generator=g).to(torch.bfloat16).to(device)
        caches.append(kvtier.KVCache(k, v))
    return kvtier.Entry(np.arange(n, dtype=np.int32) * 3 + 1, caches, **IDENT)


def slot_bytes(e):
    return [t.contiguous().view(torch.uint8).cpu().numpy().tobytes()
            for c in e.caches for t in c.torch()]


def test_host_standin_load_to_device(tmp_path):
    e = entry()
    path = tmp_path / "a.mlxkv"
    kvtier.save(path, e, sync=False)
    want = slot_bytes(e)
    dev = kvtier.Device.host(8192, 4, 50)
    assert dev.name == "host stand-in" and dev.ordinal == -1
    dests = []

    def place(h):
        dests.extend(np.zeros(t["bytes"], np.uint8) for c in h.caches for t in c["tensors"])
        return dests

    h = kvtier.load_to_device(path, dev, place, **IDENT)
    assert len(h.tokens) == 700
    assert [d.tobytes() for d in dests] == want
    # addresses, and a skipped slot
    arrs = [np.zeros(len(w), np.uint8) for w in want]
    place2 = [a.ctypes.data for a in arrs]
    place2[1] = None
    kvtier.load_to_device(path, kvtier.Device.host(), place2)
    assert arrs[0].tobytes() == want[0] and not arrs[1].any() and arrs[2].tobytes() == want[2]


def test_host_standin_refusals(tmp_path):
    e = entry(n=300)
    path = tmp_path / "b.mlxkv"
    kvtier.save(path, e, sync=False)
    dev = kvtier.Device.host()
    n = sum(len(c.torch()) for c in e.caches)
    with pytest.raises(ValueError, match="holds 8 bytes"):
        kvtier.load_to_device(path, dev, [np.zeros(8, np.uint8)] * n)
    with pytest.raises(ValueError, match="destinations for"):
        kvtier.load_to_device(path, dev, [None])
    with pytest.raises(kvtier.MismatchError):
        kvtier.load_to_device(path, dev, [None] * n, model_id="other")
    with pytest.raises(TypeError):
        kvtier.load_to_device(path, "cuda", [None] * n)
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0x40  # inside the last slot
    path.write_bytes(bytes(raw))
    with pytest.raises(kvtier.CorruptError):
        kvtier.load_to_device(path, dev, [None] * n)


def test_store_restore_to_device_standin(tmp_path):
    e = entry(n=500)
    want = slot_bytes(e)
    with kvtier.Store(tmp_path / "s", **IDENT) as s:
        s.put(e)
        hit = s.find(np.append(e.tokens, 9))
        assert hit.prefix_len == 500
        dests = [torch.zeros(len(w), dtype=torch.uint8) for w in want]
        h = s.restore_to_device(hit, kvtier.Device.host(), dests)
        assert h is not None
        assert [d.numpy().tobytes() for d in dests] == want
        assert s.restore_to_device(s.find([12345]), kvtier.Device.host(), dests) is None


def test_cuda_unavailable_is_clear():
    if CUDA:
        pytest.skip("CUDA is available here: the CUDA tests run instead")
    with pytest.raises(kvtier.UnsupportedError, match="unavailable"):
        kvtier.Device.cuda(0)


@pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine")
def test_cuda_save_from_and_restore_into(tmp_path):
    e = entry(n=4000, device="cuda")
    want = slot_bytes(entry(n=4000))  # the same values, built in host memory
    k = e.caches[0].torch()[0]
    assert k.is_cuda and torch.equal(k, entry(n=4000).caches[0].torch()[0].cuda())
    assert slot_bytes(e) == want
    kvtier.save(tmp_path / "c.mlxkv", e)
    assert slot_bytes(kvtier.load(tmp_path / "c.mlxkv")) == want
    dev = kvtier.Device.cuda(0)
    assert dev.name.startswith("cuda:0")
    with kvtier.Store(tmp_path / "s", **IDENT) as s:
        s.put(e)
        hit = s.find(np.append(e.tokens, 1))
        dests = [torch.empty(len(w), dtype=torch.uint8, device="cuda") for w in want]
        assert s.restore_to_device(hit, dev, dests) is not None
        assert [d.cpu().numpy().tobytes() for d in dests] == want
        wrong = [torch.empty(len(w), dtype=torch.uint8) for w in want]  # host memory
        with pytest.raises(ValueError, match="another device"):
            s.restore_to_device(hit, dev, wrong)
    with pytest.raises(kvtier.UnsupportedError, match="device memory"):
        e.caches[0].append(torch.zeros(1, 4, 1, 64, dtype=torch.bfloat16),
                           torch.zeros(1, 4, 1, 64, dtype=torch.bfloat16))
    with kvtier.PromptCache(ram_max_bytes=1 << 30) as pc:
        with pytest.raises(kvtier.UnsupportedError, match="device memory"):
            pc.put(e)


def test_prompt_cache_takes_into_device_standin(tmp_path):
    e = entry(n=500)
    dev = kvtier.Device.host(8192, 3, 20)
    prompt = np.append(e.tokens[:300], np.int32(999999))  # diverges after 300 tokens
    want = [t[:, :, :300] for c in e.caches for t in c.torch()]
    dests = []

    def place(h):  # the final tensors, shaped as the cut header says
        dests[:] = [torch.empty(t["shape"], dtype=torch.bfloat16)
                    for c in h.caches for t in c["tensors"]]
        return dests

    opts = dict(ram_max_bytes=64 << 20, spill_queue_max_bytes=16 << 20, device=dev, **IDENT)
    with kvtier.PromptCache(tmp_path / "pc", **opts) as pc:
        pc.put(e)
        h, from_disk = pc.take_to_device(prompt, place)
        assert len(h.tokens) == 300 and not from_disk
        assert all(torch.equal(d, w) for d, w in zip(dests, want))
    with kvtier.PromptCache(tmp_path / "pc", **opts) as pc:  # a restart: streamed from disk
        h, from_disk = pc.take_to_device(prompt, place)
        assert len(h.tokens) == 300 and from_disk
        assert [d.shape[2] for d in dests] == [300] * 6
        assert all(torch.equal(d, w) for d, w in zip(dests, want))
        assert pc.take_to_device([12345, 1], place) is None
    with kvtier.PromptCache(ram_max_bytes=1 << 20) as pc:
        with pytest.raises(ValueError, match="without a device"):
            pc.take_to_device(prompt, place)


@pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine")
def test_cuda_prompt_cache_holds_device_entries(tmp_path):
    dev = kvtier.Device.cuda(0)
    e = entry(n=3000, device="cuda")
    want = [t[:, :, :2000].clone() for c in e.caches for t in c.torch()]
    dests = []

    def place(h):
        dests[:] = [torch.empty(t["shape"], dtype=torch.bfloat16, device="cuda")
                    for c in h.caches for t in c["tensors"]]
        return dests

    prompt = np.append(e.tokens[:2000], np.int32(999999))
    opts = dict(ram_max_bytes=256 << 20, spill_queue_max_bytes=64 << 20, device=dev, **IDENT)
    with kvtier.PromptCache(tmp_path / "pc", **opts) as pc:
        pc.put(e)  # copied into page-locked RAM
        assert pc.stats()["records"] == 1
        h, from_disk = pc.take_to_device(prompt, place)
        assert not from_disk and all(torch.equal(d, w) for d, w in zip(dests, want))
    with kvtier.PromptCache(tmp_path / "pc", **opts) as pc:  # saved by the write-behind
        h, from_disk = pc.take_to_device(prompt, place)
        assert from_disk and all(torch.equal(d, w) for d, w in zip(dests, want))
