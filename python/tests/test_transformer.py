"""End to end on a real (small) torch transformer: generate, persist through PromptCache,
restart the process, take the prefix from disk and continue: the same tokens as without
the restart. A diverging prompt reuses the shared prefix and matches a full recompute."""
import json
import os
import subprocess
import sys

import numpy as np
import torch

import kvtier
from conftest import IDENT
from tinylm import WINDOW, TinyLM

NS = "conversation-7"
# Reusing a prefix computes the rest in another chunk shape than a full recompute; float32
# sums in another order differ in the last bits, and bf16 cache rows may round apart by one
# ulp. Stated tolerance: max |logit difference| <= 1e-3 x the largest |logit|.
REL_TOL = 1e-3


def run_child(directory, requests):
    here = os.path.dirname(__file__)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [here] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    r = subprocess.run([sys.executable, os.path.join(here, "e2e_child.py"), str(directory),
                        json.dumps({"seed": 0, "requests": requests})],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_generation_continues_identically_in_a_new_process(tmp_path):
    model = TinyLM(0)
    prompt = np.random.default_rng(1).integers(0, 96, size=24).tolist()
    with kvtier.PromptCache(tmp_path, **IDENT, snapshot_debounce_ms=0) as pc:
        caches = TinyLM.new_caches()
        logits = model.forward(prompt, caches)
        # entry A: the prompt (24 tokens < WINDOW: the rings have not wrapped, trimmable)
        pc.put(kvtier.Entry(prompt, caches, namespace=NS))
        t0 = int(logits[-1].argmax())
        gen, fed, pending = model.generate(caches, prompt, [t0], 15)
        # entry B: 39 tokens, the rings wrapped; generation goes on with the same caches
        assert caches[0].offset == 39 > WINDOW and not caches[0].is_trimmable
        pc.put(kvtier.Entry(fed, caches, namespace=NS))
        rest, _, _ = model.generate(caches, fed, pending, 16)
        report = pc.flush()
        assert report.durable and report.entries == 2
    assert len(set([t0] + gen + rest)) > 4  # the model produces varied text, not one token

    diverging = prompt[:12] + np.random.default_rng(2).integers(0, 96, size=12).tolist()
    other_fp = dict(IDENT, config_fingerprint="another-model")
    results = run_child(tmp_path, [
        {"mode": "continue", "ident": IDENT, "ns": NS, "query": fed + pending, "n": 16},
        {"mode": "diverge", "ident": IDENT, "ns": NS, "query": diverging, "n": 8},
        {"mode": "continue", "ident": other_fp, "ns": NS, "query": fed + pending, "n": 1},
        {"mode": "continue", "ident": IDENT, "ns": "someone-else", "query": fed + pending,
         "n": 1},
    ])
    cont, div, miss_fp, miss_ns = results

    # restart: the 39-token prefix came from disk, the continuation is token-identical
    assert cont["hit"] == 39 and cont["from_disk"]
    assert cont["tokens"] == rest

    # diverging prompt: entry A trimmed to the 12 shared tokens, then the rest computed
    assert div["hit"] == 12 and div["from_disk"]
    assert div["max_abs_diff"] <= REL_TOL * div["logit_scale"], div
    assert div["tokens_reused"] == div["tokens_full"]

    assert miss_fp == {"hit": 0} and miss_ns == {"hit": 0}


def test_restored_ring_matches_the_live_one_bit_for_bit(tmp_path):
    model = TinyLM(0)
    caches = TinyLM.new_caches()
    model.generate(caches, [], list(range(40)), 5)  # wraps the rings
    kvtier.save(tmp_path / "e.mlxkv", kvtier.Entry(range(44), caches))
    back = kvtier.load(tmp_path / "e.mlxkv").caches
    for live, restored in zip(caches, back):
        assert live.info() == restored.info()
        for a, b in zip(live.torch(), restored.torch()):
            assert torch.equal(a, b)
    a = model.forward([7], caches)
    b = model.forward([7], back)
    assert torch.equal(a, b)
