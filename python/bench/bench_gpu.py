#!/usr/bin/env python3
"""GPU benchmark of kvtier's device paths against torch and safetensors (run by hand on a
machine with CUDA; docs/DEVICE.md has the figures).

The same tensors (32 layers of bf16 K and V, [1, 8, n, 128], on CUDA device 0) go through:
  - kvtier: Store.put straight from the CUDA tensors (durable), then
    Store.restore_to_device into preallocated CUDA tensors;
  - torch: torch.save of the tensors (fsync'ed), then torch.load(map_location="cuda");
  - safetensors: save_file (fsync'ed), then load_file(device="cuda").
Loads run cold (the file's pages dropped first) and warm; every load ends with
torch.cuda.synchronize(). Prints medians of --repeat runs in GB/s, and each peer's time over
kvtier's (above 1: kvtier is faster).

usage: PYTHONPATH=build/default/python python3 python/bench/bench_gpu.py \\
           [--dir DIR] [--size 256M,1G,4G] [--repeat 3]
"""
import argparse
import os
import shutil
import statistics
import time

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import kvtier
from bench_python import drop_cache, warm_cache  # same folder

LAYERS, HEADS, DIM = 32, 8, 128
IDENT = dict(model_id="bench/gpu", config_fingerprint="fp", tokenizer_hash="tk")


def parse_size(s):
    units = {"G": 1 << 30, "M": 1 << 20, "K": 1 << 10}
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def fsynced(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def run_size(d, nbytes, repeat):
    n = nbytes // (LAYERS * 2 * HEADS * DIM * 2)
    g = torch.Generator(device="cuda").manual_seed(1)
    ts = [torch.randn(1, HEADS, n, DIM, generator=g, device="cuda").to(torch.bfloat16)
          for _ in range(2 * LAYERS)]
    named = {f"t{i}": t for i, t in enumerate(ts)}
    tok = np.arange(n, dtype=np.int32)
    dev = kvtier.Device.cuda(0)
    dests = [torch.empty_like(t) for t in ts]
    tpath, spath = f"{d}/bench.pt", f"{d}/bench.safetensors"
    res = {k: [] for k in ("kvtier save", "torch save", "safetensors save",
                           "kvtier cold", "torch cold", "safetensors cold",
                           "kvtier warm", "torch warm", "safetensors warm")}
    for r in range(repeat):
        store_dir = f"{d}/store{r}"
        with kvtier.Store(store_dir, **IDENT) as s:
            e = kvtier.Entry(tok, [kvtier.KVCache(ts[2 * i], ts[2 * i + 1])
                                   for i in range(LAYERS)])
            res["kvtier save"].append(timed(lambda: s.put(e)))
            res["torch save"].append(timed(lambda: (torch.save(named, tpath), fsynced(tpath))))
            res["safetensors save"].append(timed(lambda: (save_file(named, spath),
                                                          fsynced(spath))))
            hit = s.find(np.append(tok, 0))
            path = s.ls()[0].path
            for mode in ("cold", "warm"):
                for p in (path, tpath, spath):
                    drop_cache(p) if mode == "cold" else warm_cache(p)
                res[f"kvtier {mode}"].append(timed(
                    lambda: s.restore_to_device(hit, dev, dests)))
                res[f"torch {mode}"].append(timed(
                    lambda: torch.load(tpath, map_location="cuda")))
                res[f"safetensors {mode}"].append(timed(
                    lambda: load_file(spath, device="cuda")))
            assert all(torch.equal(a, b) for a, b in zip(ts, dests))
        for p in (tpath, spath):
            os.unlink(p)
        shutil.rmtree(store_dir)
    gb = sum(t.numel() * 2 for t in ts) / 1e9
    print(f"{gb * 1e9 / 1048576:8.0f} MiB")
    for step in ("save", "cold", "warm"):
        k = statistics.median(res[f"kvtier {step}"])
        row = f"    {step:5s} kvtier {gb / k:6.2f} GB/s"
        for peer in ("torch", "safetensors"):
            p = statistics.median(res[f"{peer} {step}"])
            row += f" | {peer} {gb / p:6.2f} GB/s ({p / k:5.2f}x)"
        print(row, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--size", default="256M,1G,4G")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"bench_gpu: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"{a.repeat} repetitions (medians; (Nx) = peer time / kvtier time)", flush=True)
    for s in a.size.split(","):
        run_size(a.dir, parse_size(s), a.repeat)


if __name__ == "__main__":
    main()
