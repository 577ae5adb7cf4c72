#!/usr/bin/env python3
"""End to end with transformers on a GPU: time to first token of a random-weight
LlamaForCausalLM (bf16, seeded, built on the GPU) for one long prompt, four ways:

  - re-prefill: the whole prompt, no cache;
  - RAM tier: the prompt's cache (all but the last token) put into a kvtier.hf prompt cache
    (page-locked RAM; the write-behind saves it, keeping the file in the page cache), dropped
    from the GPU, then restored by restore_cache and the last token computed;
  - restart, file resident: a new process builds the same model, opens the same prompt cache
    directory and restores from disk (page cache); and once more with the file's pages dropped.

Also checks that the restored K/V are byte-identical to the saved ones, whether two
continuations from the same K/V in one process agree (the GPU's determinism), and compares the
first continuation logits. Prints one JSON line per process and a summary.

usage: PYTHONPATH=build/default/python python3 python/bench/bench_hf_ttft.py \\
           [--dir DIR] [--layers 32] [--hidden 4096] [--tokens 16384] [--repeat 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import kvtier
import kvtier.hf


def build(args):
    cfg = LlamaConfig(vocab_size=32000, hidden_size=args.hidden,
                      intermediate_size=args.hidden * 11008 // 4096,
                      num_hidden_layers=args.layers, num_attention_heads=args.hidden // 128,
                      num_key_value_heads=8, max_position_embeddings=args.tokens + 64)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 32000, (1, args.tokens), generator=g).to("cuda")
    return model, prompt


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    r = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, r


def forward(model, ids, cache=None):
    with torch.no_grad():
        return model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)


def kv_of(cache):
    return kvtier.hf._layers(cache)


def kv_digest(cache, n):
    """A checksum of every K/V byte of the first ``n`` tokens (to compare across processes)."""
    h = 0
    for k, v in kv_of(cache):
        for t in (k[:, :, :n], v[:, :, :n]):
            w = t.contiguous().view(-1).view(torch.int16).to(torch.int64)
            i = torch.arange(1, w.numel() + 1, device=w.device, dtype=torch.int64)
            h = (h * 1000003 + int((w * i).sum())) & ((1 << 64) - 1)
    return h


def restore_ttft(model, pc, prompt, fresh=False):
    """The time to the first token through a restore, and (n, cache, logits, restore time):
    the cache holds the restored tokens and the one computed after them. The model starts
    as soon as the restore returns (a RAM hit's layers land while the first ones compute);
    the restore time, every copy done, is measured by a restore of its own before.
    ``fresh``: RAM cleared before each (a disk hit keeps a host copy in RAM)."""
    def restore_only():
        if fresh:
            pc.clear()
        n, cache = kvtier.hf.restore_cache(pc, prompt)
        return cache
    restore = timed(restore_only)[0]

    if fresh:
        pc.clear()

    def go():
        n, cache = kvtier.hf.restore_cache(pc, prompt)
        out = forward(model, prompt[:, n:], cache)
        return n, cache, out.logits[:, -1].float(), restore
    return timed(go)


def parent(args):
    model, prompt = build(args)
    forward(model, prompt[:, :256])  # warm-up
    prefill = [timed(lambda: forward(model, prompt))[0] for _ in range(args.repeat)]
    ref = forward(model, prompt[:, :-1])  # the cache of all but the last token
    ref_cache = ref.past_key_values
    saved = [(k.clone(), v.clone()) for k, v in kv_of(ref_cache)]

    def cont(kv):  # the last token from a copy of the saved K/V
        c = DynamicCache()
        for i, (k, v) in enumerate(kv):
            kvtier.hf._adopt(c, i, k.clone(), v.clone())
        return forward(model, prompt[:, -1:], c).logits[:, -1].float()
    a, b = cont(saved), cont(saved)
    deterministic = bool(torch.equal(a, b))
    torch.save(a.cpu(), os.path.join(args.dir, "logits-ref.pt"))

    # the snapshot to disk waits for the flush below, off the measured restores
    pc = kvtier.hf.prompt_cache(model, os.path.join(args.dir, "pc"),
                                ram_max_bytes=3 << 30, spill_queue_max_bytes=0,
                                snapshot_debounce_ms=600_000, keep_saved_cached=True)
    put_s = []
    for _ in range(args.repeat):
        pc.clear()
        put_s.append(timed(lambda: kvtier.hf.save_cache(pc, prompt[:, :-1], ref_cache))[0])
    ref = ref_cache = None  # evicted from the GPU
    torch.cuda.empty_cache()
    ram, ram_restore, same, logits_same = [], [], True, True
    for _ in range(args.repeat):
        t, (n, cache, logits, rs) = restore_ttft(model, pc, prompt)
        ram.append(t)
        ram_restore.append(rs)
        same = same and n == args.tokens - 1 and all(
            torch.equal(k[:, :, :n], sk) and torch.equal(v[:, :, :n], sv)
            for (k, v), (sk, sv) in zip(kv_of(cache), saved))
        logits_same = logits_same and bool(torch.equal(logits, a))
        del cache
    c = DynamicCache()
    for i, (k, v) in enumerate(saved):
        kvtier.hf._adopt(c, i, k, v)
    digest = kv_digest(c, args.tokens - 1)
    kv_bytes = sum(t.numel() * t.element_size() for kv in saved for t in kv)
    report = pc.flush()
    pc.close()
    del saved, c
    torch.cuda.empty_cache()
    res = dict(card=torch.cuda.get_device_name(0), tokens=args.tokens, layers=args.layers,
               hidden=args.hidden, kv_bytes=kv_bytes, prefill_s=prefill, put_s=put_s,
               ram_ttft_s=ram, ram_restore_s=ram_restore, kv_identical=same, logits_identical_ram=logits_same,
               deterministic_in_process=deterministic, durable=report.durable,
               kv_digest=digest)
    print(json.dumps(res), flush=True)
    model = None
    torch.cuda.empty_cache()
    child = subprocess.run([sys.executable, __file__, "--child"] + sys.argv[1:],
                           capture_output=True, text=True, timeout=900)
    if child.returncode:
        print(child.stderr[-4000:], file=sys.stderr)
        sys.exit(1)
    r = json.loads(child.stdout.strip().splitlines()[-1])
    print(json.dumps(r), flush=True)
    p = statistics.median(prefill)
    print(f"summary ({res['card']}): {args.layers} layers, hidden {args.hidden}, "
          f"{args.tokens} tokens, KV {kv_bytes / 2**30:.2f} GiB")
    print(f"  re-prefill TTFT {p:.3f} s; put into the RAM tier {statistics.median(put_s):.3f} s "
          f"({kv_bytes / 1e9 / statistics.median(put_s):.1f} GB/s)")
    print(f"  RAM tier TTFT {statistics.median(ram):.3f} s (restore "
          f"{statistics.median(ram_restore):.3f} s): {p / statistics.median(ram):.1f}x "
          f"faster (K/V identical: {same}; logits identical: {logits_same}; "
          f"deterministic in one process: {deterministic})")
    print(f"  restart, file resident TTFT {statistics.median(r['warm_ttft_s']):.3f} s (restore "
          f"{statistics.median(r['warm_restore_s']):.3f} s): "
          f"{p / statistics.median(r['warm_ttft_s']):.1f}x faster; cold "
          f"{r['cold_ttft_s']:.3f} s: {p / r['cold_ttft_s']:.2f}x (K/V identical: "
          f"{r['kv_digest'] == digest}; same identity: {r['served'] == args.tokens - 1}; "
          f"max |logit difference| {r['max_logit_diff']:.3g})")
    print(f"  restart, then the host copy the disk hits kept: TTFT {r['kept_ttft_s']:.3f} s: "
          f"{p / r['kept_ttft_s']:.1f}x faster (K/V identical: {r['kept_identical']})")


def drop_pages(root):
    for d, _, files in os.walk(root):
        for f in files:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)


def child(args):
    model, prompt = build(args)
    forward(model, prompt[:, :256])
    pc = kvtier.hf.prompt_cache(model, os.path.join(args.dir, "pc"), ram_max_bytes=3 << 30,
                                spill_queue_max_bytes=0, keep_saved_cached=True)
    warm, warm_restore, digest, served, diff = [], [], None, 0, float("nan")
    ref = torch.load(os.path.join(args.dir, "logits-ref.pt"))
    for _ in range(args.repeat):
        t, (n, cache, logits, rs) = restore_ttft(model, pc, prompt, fresh=True)
        warm.append(t)
        warm_restore.append(rs)
        served = n
        if cache is not None:
            digest = kv_digest(cache, n)
            diff = float((logits.cpu() - ref).abs().max())
        del cache
    # the disk hits kept a host copy in RAM (the pool pinned after the first): a RAM hit now
    kept, (n, cache, _, _) = restore_ttft(model, pc, prompt)
    kept_ok = n == served and kv_digest(cache, n) == digest
    del cache
    drop_pages(os.path.join(args.dir, "pc"))
    cold, _ = restore_ttft(model, pc, prompt, fresh=True)
    pc.close(flush=False)
    print(json.dumps(dict(warm_ttft_s=warm, warm_restore_s=warm_restore, cold_ttft_s=cold,
                          kept_ttft_s=kept, kept_identical=kept_ok,
                          served=served, kv_digest=digest, max_logit_diff=diff)), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/bench-hf-ttft")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    (child if args.child else parent)(args)


if __name__ == "__main__":
    main()
