"""The transformers adapter. On the host stand-in (everywhere, a CPU model and a cache class
with DynamicCache's interface): the identity follows the weights, and a prompt cache derived
from the model restores the saved prefix, cut, into the very tensors of the new cache, from RAM
and after a restart from disk. On a GPU: a random-weight LlamaForCausalLM prefills a prompt and
stores its DynamicCache straight from CUDA memory; a new process restores it straight into CUDA
memory and continues greedily. Tokens and logits must equal the uninterrupted run's."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import kvtier
import kvtier.hf

HERE = os.path.dirname(os.path.abspath(__file__))
GPU = torch.cuda.is_available()


class LegacyCache:
    """DynamicCache's interface before transformers 4.56 (per-layer key and value lists)."""

    def __init__(self):
        self.key_cache, self.value_cache = [], []

    def update(self, k, v, i):
        if len(self.key_cache) <= i:
            self.key_cache.append(k)
            self.value_cache.append(v)
        else:
            self.key_cache[i] = torch.cat([self.key_cache[i], k], dim=-2)
            self.value_cache[i] = torch.cat([self.value_cache[i], v], dim=-2)


class TinyModel(torch.nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.proj = torch.nn.Linear(16, 16)
        self.config = SimpleNamespace(vocab_size=1000, name_or_path="tiny",
                                      to_dict=lambda: {"layers": 3, "heads": 2})


def kv_state(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    cache = LegacyCache()
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
        n, cache = kvtier.hf.restore_cache(pc, ids, cache_cls=LegacyCache)
        assert n == 399
        other = ids.clone()
        other[0, 250] = 999  # diverges after 250 tokens: cut, not sliced afterwards
        n2, cut = kvtier.hf.restore_cache(pc, other, cache_cls=LegacyCache)
        assert n2 == 250 and cut.key_cache[0].shape == (1, 2, 250, 8)
        assert cut.key_cache[0].is_contiguous()
    for i in range(3):
        assert torch.equal(cache.key_cache[i], saved.key_cache[i])
        assert torch.equal(cut.value_cache[i], saved.value_cache[i][:, :, :250])
    with kvtier.hf.prompt_cache(model, tmp_path / "pc", **opts) as pc:  # a restart: disk
        n, cache = kvtier.hf.restore_cache(pc, ids, cache_cls=LegacyCache)
        assert n == 399 and all(torch.equal(cache.key_cache[i], saved.key_cache[i])
                                for i in range(3))
    tuned = TinyModel(0)
    with torch.no_grad():
        tuned.proj.weight[3, 5] += 1e-3  # a fine-tune: another identity, never restored
    assert kvtier.hf.identity(tuned) != kvtier.hf.identity(model)
    assert kvtier.hf.identity(TinyModel(0)) == kvtier.hf.identity(model)
    with kvtier.hf.prompt_cache(tuned, tmp_path / "pc", **opts) as pc:
        assert kvtier.hf.restore_cache(pc, ids, cache_cls=LegacyCache) == (0, None)
    with kvtier.PromptCache(ram_max_bytes=1 << 20) as pc:
        with pytest.raises(kvtier.UnsupportedError, match="no device"):
            kvtier.hf.restore_cache(pc, ids, cache_cls=LegacyCache)


def run(mode, work, store):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, os.path.join(HERE, "hf_child.py"), mode, str(work),
                        str(store)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GPU, reason="no CUDA device on this machine")
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
