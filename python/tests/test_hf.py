"""The transformers adapter on a GPU: a random-weight LlamaForCausalLM prefills a prompt and
stores its DynamicCache straight from CUDA memory; a new process restores it straight into CUDA
memory and continues greedily. Tokens and logits must equal the uninterrupted run's."""
import json
import os
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device on this machine")

HERE = os.path.dirname(os.path.abspath(__file__))


def run(mode, work, store):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    r = subprocess.run([sys.executable, os.path.join(HERE, "hf_child.py"), mode, str(work),
                        str(store)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_restart_continues_identically(tmp_path):
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
