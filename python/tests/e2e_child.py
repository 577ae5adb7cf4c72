"""The second process of the transformer test: a fresh interpreter that takes prefixes from
the disk tier the first process wrote, continues them with TinyLM, and prints JSON.

usage: e2e_child.py DIR REQUEST_JSON
"""
import json
import sys

import torch

import kvtier
from tinylm import TinyLM


def continue_prefix(model, pc, req):
    """Take the prefix of req["query"] and greedily generate req["n"] tokens."""
    t = pc.take(req["query"], req["ns"])
    if t is None:
        return {"hit": 0}
    caches, fed = t.entry.caches, t.entry.n_tokens
    out, _, _ = model.generate(caches, req["query"][:fed], req["query"][fed:], req["n"])
    return {"hit": fed, "from_disk": t.from_disk, "tokens": out}


def diverge(model, pc, req):
    """Reuse the shared prefix of a diverging prompt, against a full recompute."""
    q = req["query"]
    t = pc.take(q, req["ns"])
    if t is None:
        return {"hit": 0}
    p = t.entry.n_tokens
    reused = model.forward(q[p:], t.entry.caches)
    fresh_caches = TinyLM.new_caches()
    full = model.forward(q, fresh_caches)[p:]
    a, _, _ = model.generate(t.entry.caches, q, [int(reused[-1].argmax())], req["n"])
    b, _, _ = model.generate(fresh_caches, q, [int(full[-1].argmax())], req["n"])
    return {"hit": p, "from_disk": t.from_disk, "max_abs_diff": float((reused - full).abs().max()),
            "logit_scale": float(full.abs().max()), "tokens_reused": a, "tokens_full": b}


def main():
    directory, req = sys.argv[1], json.loads(sys.argv[2])
    torch.manual_seed(0)
    model = TinyLM(req["seed"])
    out = []
    for r in req["requests"]:
        with kvtier.PromptCache(directory, **r["ident"]) as pc:
            out.append((continue_prefix if r["mode"] == "continue" else diverge)(model, pc, r))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
