"""The transformers adapter (kvtier.hf).

On every machine, through the host stand-in device, with what torch offers (transformers is not
packaged in Debian 12, so its DynamicCache is stood in for by a class with the interface the
adapter uses): a small torch decoder prefills a prompt, stores the cache and continues greedily;
a restore from a reopened store into CPU tensors continues with the same tokens and
bit-identical logits. The identity follows the weights, and a prompt cache derived from the
model restores the saved prefix, cut, into the very tensors of the new cache, from RAM and after
a restart from disk.

On a GPU with transformers installed: a random-weight LlamaForCausalLM prefills a prompt and
stores its DynamicCache straight from CUDA memory; a new process restores it straight into CUDA
memory and continues greedily. Tokens and logits must equal the uninterrupted run's."""
import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import kvtier
import kvtier.hf

HERE = os.path.dirname(os.path.abspath(__file__))
IDENT = dict(model_id="hf/standin", config_fingerprint="fp-hf-cpu", tokenizer_hash="tk-hf")


class StandInDynamicCache:
    """transformers' DynamicCache as the adapter uses it (its layout before 4.56):
    ``key_cache``/``value_cache`` lists, ``update`` appending along the token axis."""

    def __init__(self):
        self.key_cache, self.value_cache = [], []

    def update(self, k, v, layer_idx):
        if layer_idx == len(self.key_cache):
            self.key_cache.append(k)
            self.value_cache.append(v)
        else:
            self.key_cache[layer_idx] = torch.cat([self.key_cache[layer_idx], k], dim=-2)
            self.value_cache[layer_idx] = torch.cat([self.value_cache[layer_idx], v], dim=-2)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def get_seq_length(self):
        return self.key_cache[0].shape[-2] if self.key_cache else 0


class TinyDecoder:
    """Three attention layers (4 query heads over 2 KV heads of 16, bfloat16 caches, float32
    compute), random weights from a fixed seed, continuing whatever cache it is given."""

    VOCAB, DIM, HEADS, KV_HEADS, HD = 64, 64, 4, 2, 16

    def __init__(self):
        g = torch.Generator().manual_seed(7)
        d, h = self.DIM, self.HEADS * self.HD

        def w(*shape):
            return torch.randn(*shape, generator=g) / math.sqrt(shape[0])
        self.embed = torch.randn(self.VOCAB, d, generator=g)
        self.layers = [dict(q=w(d, h), k=w(d, self.KV_HEADS * self.HD),
                            v=w(d, self.KV_HEADS * self.HD), o=w(h, d)) for _ in range(3)]
        self.out = w(d, self.VOCAB)

    def __call__(self, ids, cache):
        """Logits [L, VOCAB] of ids (1-D), appended to cache."""
        L, start = len(ids), cache.get_seq_length()
        x = self.embed[ids][None]
        for i, p in enumerate(self.layers):
            q = (x @ p["q"]).view(1, L, self.HEADS, self.HD).transpose(1, 2)
            k = (x @ p["k"]).view(1, L, self.KV_HEADS, self.HD).transpose(1, 2)
            v = (x @ p["v"]).view(1, L, self.KV_HEADS, self.HD).transpose(1, 2)
            ks, vs = cache.update(k.to(torch.bfloat16), v.to(torch.bfloat16), i)
            rep = self.HEADS // self.KV_HEADS
            ks = ks.float().repeat_interleave(rep, dim=1)
            vs = vs.float().repeat_interleave(rep, dim=1)
            att = q @ ks.transpose(-1, -2) / math.sqrt(self.HD)
            kpos, qpos = torch.arange(ks.shape[2]), torch.arange(start, start + L)
            att = att.masked_fill(kpos[None, :] > qpos[:, None], float("-inf"))
            a = torch.softmax(att, dim=-1) @ vs
            x = x + a.transpose(1, 2).reshape(1, L, -1) @ p["o"]
        return x[0] @ self.out


def greedy(model, cache, last, steps=8):
    """Feed ``last``, then ``steps`` greedy tokens: the tokens and the first step's logits."""
    tokens, first = [], None
    for _ in range(steps):
        logits = model(torch.tensor([last]), cache)[-1]
        first = logits if first is None else first
        last = int(logits.argmax())
        tokens.append(last)
    return tokens, first


def test_host_standin_restore_continues_identically(tmp_path):
    model = TinyDecoder()
    prompt = torch.randint(0, TinyDecoder.VOCAB, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = StandInDynamicCache()
        model(prompt[0, :-1], cache)
        with kvtier.Store(tmp_path, **IDENT) as store:
            kvtier.hf.save_cache(store, prompt[:, :-1], cache)
        saved = [t.clone() for t in cache.key_cache + cache.value_cache]
        ref_tokens, ref_logits = greedy(model, cache, int(prompt[0, -1]))

        with kvtier.Store(tmp_path, **IDENT) as store:  # reopened: found on disk
            n, restored = kvtier.hf.restore_cache(store, prompt, device=kvtier.Device.host(),
                                                  cache_cls=StandInDynamicCache)
            assert kvtier.hf.restore_cache(store, prompt + 1, device=kvtier.Device.host(),
                                           cache_cls=StandInDynamicCache) == (0, None)
            # a torch device or its name says the same: "cpu" is the host, never CUDA 0
            for dev in ("cpu", torch.device("cpu")):
                m, by_name = kvtier.hf.restore_cache(store, prompt, device=dev,
                                                     cache_cls=StandInDynamicCache)
                assert m == 39
                assert all(torch.equal(a, b) for a, b in
                           zip(by_name.key_cache + by_name.value_cache, saved))
            with pytest.raises(kvtier.UnsupportedError, match="only cpu and cuda"):
                kvtier.hf.restore_cache(store, prompt, device="meta", cache_cls=StandInDynamicCache)
        assert n == 39 and isinstance(restored, StandInDynamicCache)
        got = restored.key_cache + restored.value_cache
        assert all(t.device.type == "cpu" and t.dtype == torch.bfloat16 for t in got)
        assert all(torch.equal(a, b) for a, b in zip(got, saved))
        tokens, logits = greedy(model, restored, int(prompt[0, -1]))
    assert tokens == ref_tokens
    assert torch.equal(logits, ref_logits)


def test_standin_layerwise_restore_continues_identically(tmp_path):
    """The layer-wise restore from a prompt cache (slow stand-in copies): each layer waits
    for its own copies when the model reaches it, and the continuation is the uninterrupted
    one. (That the restore returns before a RAM hit's copies are done is test_tier_device's:
    the stand-in's Python entries are host memory, uploaded through the staging ring.)"""
    model = TinyDecoder()
    prompt = torch.randint(0, TinyDecoder.VOCAB, (1, 40), generator=torch.Generator().manual_seed(2))
    dev = kvtier.Device.host(copy_delay_us=30000)
    with torch.no_grad(), kvtier.PromptCache(tmp_path / "pc", ram_max_bytes=8 << 20,
                                             device=dev, **IDENT) as pc:
        cache = StandInDynamicCache()
        model(prompt[0, :-1], cache)
        kvtier.hf.save_cache(pc, prompt[:, :-1], cache)
        ref_tokens, ref_logits = greedy(model, cache, int(prompt[0, -1]))
        n, restored = kvtier.hf.restore_cache(pc, prompt, cache_cls=StandInDynamicCache)
        assert n == 39 and restored._kvtier_take is not None
        tokens, logits = greedy(model, restored, int(prompt[0, -1]))
    assert tokens == ref_tokens
    assert torch.equal(logits, ref_logits)


class TinyModel(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.proj = torch.nn.Linear(16, 16)
        self.config = SimpleNamespace(vocab_size=1000, name_or_path="tiny",
                                      to_dict=lambda: {"layers": 3, "heads": 2})


def kv_state(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    cache = StandInDynamicCache()
    for i in range(3):
        cache.update(torch.randn(1, 2, n, 8, generator=g), torch.randn(1, 2, n, 8, generator=g),
                     i)
    return cache


def test_standin_prompt_cache_restores_into_the_final_tensors(tmp_path):
    model = TinyModel(0)
    ids = torch.arange(1, 401).unsqueeze(0)
    saved = kv_state(399)
    opts = dict(ram_max_bytes=32 << 20, spill_queue_max_bytes=8 << 20)
    with kvtier.hf.prompt_cache(model, tmp_path / "pc", **opts) as pc:
        assert pc.device.ordinal == -1  # a CPU model: the host stand-in
        kvtier.hf.save_cache(pc, ids[:, :-1], saved)
        n, cache = kvtier.hf.restore_cache(pc, ids, cache_cls=StandInDynamicCache)
        assert n == 399
        other = ids.clone()
        other[0, 250] = 999  # diverges after 250 tokens: cut, not sliced afterwards
        n2, cut = kvtier.hf.restore_cache(pc, other, cache_cls=StandInDynamicCache)
        assert n2 == 250 and cut.key_cache[0].shape == (1, 2, 250, 8)
        assert cut.key_cache[0].is_contiguous()
    kvtier.hf.wait_restored(cache)
    kvtier.hf.wait_restored(cut)
    for i in range(3):
        assert torch.equal(cache.key_cache[i], saved.key_cache[i])
        assert torch.equal(cut.value_cache[i], saved.value_cache[i][:, :, :250])
    # the adapter keeps entries whole unless sharing is asked for (SHARING.md §8)
    assert list((tmp_path / "pc").rglob("*.mlxkv"))
    assert not list((tmp_path / "pc").rglob("*.kvchunk"))
    with kvtier.hf.prompt_cache(model, tmp_path / "pc", **opts) as pc:  # a restart: disk
        n, cache = kvtier.hf.restore_cache(pc, ids, cache_cls=StandInDynamicCache)
        assert n == 399 and all(torch.equal(cache.key_cache[i], saved.key_cache[i])
                                for i in range(3))
    with kvtier.hf.prompt_cache(model, tmp_path / "shared", share_prefixes=True, **opts) as pc:
        kvtier.hf.save_cache(pc, ids[:, :-1], saved)
    assert list((tmp_path / "shared").rglob("*.kvchunk"))
    with kvtier.hf.prompt_cache(model, tmp_path / "shared", share_prefixes=True, **opts) as pc:
        n, cache = kvtier.hf.restore_cache(pc, ids, cache_cls=StandInDynamicCache)
        kvtier.hf.wait_restored(cache)
        assert n == 399 and all(torch.equal(cache.key_cache[i], saved.key_cache[i])
                                for i in range(3))
    tuned = TinyModel(0)
    with torch.no_grad():
        tuned.proj.weight[3, 5] += 1e-3  # a fine-tune: another identity, never restored
    assert kvtier.hf.identity(tuned) != kvtier.hf.identity(model)
    assert kvtier.hf.identity(TinyModel(0)) == kvtier.hf.identity(model)
    with kvtier.hf.prompt_cache(tuned, tmp_path / "pc", **opts) as pc:
        assert kvtier.hf.restore_cache(pc, ids, cache_cls=StandInDynamicCache) == (0, None)
    with kvtier.PromptCache(ram_max_bytes=1 << 20) as pc:
        with pytest.raises(kvtier.UnsupportedError, match="no device"):
            kvtier.hf.restore_cache(pc, ids, cache_cls=StandInDynamicCache)


def run(mode, work, store):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, os.path.join(HERE, "hf_child.py"), mode, str(work),
                        str(store)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_restart_continues_identically(tmp_path):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512,
                      num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                      max_position_embeddings=2048)
    cfg.to_json_file(str(tmp_path / "config.json"))
    torch.save(LlamaForCausalLM(cfg).state_dict(), tmp_path / "weights.pt")
    torch.save(torch.randint(0, 1000, (1, 300)), tmp_path / "prompt.pt")
    store = tmp_path / "store"

    ref = run("uninterrupted", tmp_path, store)
    got = run("restored", tmp_path, store)
    assert got["served"] == 299  # every token but the last came from the store
    assert got["tokens"] == ref["tokens"]
    a = torch.load(tmp_path / "logits-uninterrupted.pt")
    b = torch.load(tmp_path / "logits-restored.pt")
    print(f"max |logit difference| {float((a - b).abs().max()):.3g}")
    assert torch.equal(a, b)
