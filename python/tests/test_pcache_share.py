"""Shared prefixes in the prompt cache: branches off one long prompt store it once on disk,
and each comes back whole after a restart."""
import os

import torch

import kvtier
from conftest import IDENT, kv_pair, same

CHUNK = 256  # tokens per shared chunk (docs/SHARING.md)
PROMPT, OWN = 600, 50  # a prompt of two whole chunks and more, then each branch's own tokens


def branches(n=2):
    """Entries that begin with the same prompt (the same tokens, so the same K/V rows) and go
    on with tokens and rows of their own, as conversations off one system prompt do."""
    k, v = kv_pair(PROMPT)
    out = []
    for i in range(n):
        k2, v2 = kv_pair(OWN, seed=1 + i)
        tokens = list(range(PROMPT)) + [100000 * (i + 1) + j for j in range(OWN)]
        out.append((tokens, torch.cat([k, k2], 2), torch.cat([v, v2], 2)))
    return out


def files_under(d):
    return {f: os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs}


def fill(directory, entries, **kw):
    with kvtier.PromptCache(directory, **IDENT, snapshot_debounce_ms=10, **kw) as pc:
        for tokens, k, v in entries:
            pc.put(kvtier.Entry(tokens, [kvtier.KVCache(k, v)]))
        assert pc.flush().durable
        return pc.stats()["cold"]


def test_branches_store_their_prompt_once_and_restore_after_a_restart(tmp_path):
    bs = branches()
    whole = fill(tmp_path / "whole", bs, share_prefixes=False)
    shared = fill(tmp_path / "shared", bs)  # sharing is the default
    chunks = (PROMPT + OWN - 1) // CHUNK  # every chunk of a branch lies in the prompt
    assert whole["entries"] == 2 and whole["shared_chunks"] == 0
    assert shared["entries"] == 2 and shared["shared_chunks"] == chunks
    files = files_under(tmp_path / "shared")
    chunk_files = [n for n in files if n.endswith(".kvchunk")]
    assert len(chunk_files) == chunks  # one copy, not one per branch
    assert len([n for n in files if n.endswith(".kvshare")]) == 2
    assert shared["shared_bytes"] == sum(files[n] for n in chunk_files)
    assert shared["total_bytes"] == sum(files.values())  # each chunk counted once
    assert shared["total_bytes"] < whole["total_bytes"]

    assert all(n.endswith(".mlxkv") for n in files_under(tmp_path / "whole"))

    with kvtier.PromptCache(tmp_path / "shared", **IDENT) as pc:
        for tokens, k, v in bs:
            t = pc.take(tokens + [7])
            assert t.from_disk and t.entry.n_tokens == PROMPT + OWN
            K, V = t.entry.caches[0].torch()
            assert same(K, k) and same(V, v)
        t = pc.take(list(range(PROMPT)) + [7])  # the prompt alone, from either branch
        assert t.from_disk and t.entry.n_tokens == PROMPT
        assert same(t.entry.caches[0].torch()[0], bs[0][1][:, :, :PROMPT])


def test_a_shared_branch_restores_into_tensors_the_caller_allocated(tmp_path):
    bs = branches()
    fill(tmp_path, bs)
    with kvtier.Store(tmp_path, **IDENT) as s:
        for tokens, k, v in bs:
            hit = s.find(tokens + [7])
            assert hit.prefix_len == PROMPT + OWN
            out = [torch.empty_like(k), torch.empty_like(v)]
            h = s.restore_into(hit, out)
            assert h.caches[0]["offset"] == PROMPT + OWN
            assert same(out[0], k) and same(out[1], v)
