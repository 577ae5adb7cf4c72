#!/usr/bin/python3
"""Benchmark of the Python binding (run by hand; docs/PYTHON.md has the figures).

1. Restore into torch: kvtier.load() plus a torch view of every tensor, against the C
   library's own kvt_file_load() of the same file timed in C, alternating in one process,
   cold (the file's pages dropped before each read) and warm (pages cached). Ratio = C time
   / Python time: 1.0 means the binding adds nothing.
2. Save and load against torch.save/torch.load and numpy.save/numpy.load of the same tensors
   (bf16 travels through numpy as int16 bits), every save fsync'ed, loads cold and warm.
   Ratio = peer time / kvtier time: above 1 means kvtier is faster.

Entries are model-shaped: 32 layers of bf16 K and V, 8 KV heads of 128 (128 KiB a token).
Prints medians of --repeat runs (default 5) as a table; --json FILE writes every sample.

usage: PYTHONPATH=build/default/python /usr/bin/python3 python/bench/bench_python.py \\
           [--dir DIR] [--size 256M,1G] [--repeat 5] [--json FILE]
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np
import torch

import kvtier
from kvtier import _ext

LAYERS, HEADS, HEAD_DIM = 32, 8, 128
TOKEN_BYTES = LAYERS * 2 * HEADS * HEAD_DIM * 2


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def make_tensors(nbytes, seed):
    tokens = max(1, nbytes // TOKEN_BYTES)
    g = torch.Generator().manual_seed(seed)
    shape = (1, HEADS, tokens, HEAD_DIM)
    return tokens, [torch.randint(-2**15, 2**15, shape, generator=g, dtype=torch.int16)
                    .view(torch.bfloat16) for _ in range(2 * LAYERS)]


def entry_of(tokens, tensors):
    caches = [kvtier.KVCache(tensors[2 * i], tensors[2 * i + 1]) for i in range(LAYERS)]
    return kvtier.Entry(np.arange(tokens), caches)


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm_cache(path):
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


def fsync_file(f):
    f.flush()
    os.fsync(f.fileno())


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def py_restore(path, warm):
    entry = kvtier.load(path, keep_cache=warm)
    return [t for c in entry.caches for t in c.torch()]


def bench_restore(path, repeat, warm):
    c_s, py_s = [], []
    for rep in range(repeat + 1):  # the first pair warms up
        # the order alternates, so neither side always runs on memory the other just freed
        for which in (("c", "py") if rep % 2 else ("py", "c")):
            warm_cache(path) if warm else drop_cache(path)
            if which == "c":
                c_s.append(_ext._c_load_seconds(path, keep_cache=warm))
            else:
                secs, ts = timed(lambda: py_restore(path, warm))
                assert ts[0].dtype == torch.bfloat16
                py_s.append(secs)
                del ts
    return c_s[1:], py_s[1:]  # the warm-up pair is dropped


def save_kvtier(path, entry):
    return kvtier.save(path, entry)


def save_torch(path, tensors):
    with open(path, "wb") as f:
        torch.save(tensors, f)
        fsync_file(f)


def save_numpy(path, tensors):
    with open(path, "wb") as f:
        for t in tensors:
            np.save(f, t.view(torch.int16).numpy())
        fsync_file(f)


def load_kvtier(path, warm):
    return py_restore(path, warm)


def load_torch(path, warm):
    return torch.load(path)


def load_numpy(path, warm):
    out = []
    with open(path, "rb") as f:
        for _ in range(2 * LAYERS):
            out.append(torch.from_numpy(np.load(f)).view(torch.bfloat16))
    return out


def bench_peers(d, tokens, tensors, repeat):
    entry = entry_of(tokens, tensors)
    paths = {n: os.path.join(d, f"peer.{n}") for n in ("kvtier", "torch", "numpy")}
    savers = {"kvtier": lambda p: save_kvtier(p, entry), "torch": lambda p: save_torch(p, tensors),
              "numpy": lambda p: save_numpy(p, tensors)}
    loaders = {"kvtier": load_kvtier, "torch": load_torch, "numpy": load_numpy}
    res = {f"{op}_{n}": [] for op in ("save", "cold", "warm") for n in paths}
    for rep in range(repeat + 1):
        for n, p in paths.items():
            if os.path.exists(p):
                os.unlink(p)
            secs, _ = timed(lambda: savers[n](p))
            if rep:
                res[f"save_{n}"].append(secs)
        for mode in ("cold", "warm"):
            for n, p in paths.items():
                warm_cache(p) if mode == "warm" else drop_cache(p)
                secs, ts = timed(lambda: loaders[n](p, mode == "warm"))
                assert len(ts) == 2 * LAYERS
                assert torch.equal(ts[-1].view(torch.int16), tensors[-1].view(torch.int16))
                del ts
                if rep:
                    res[f"{mode}_{n}"].append(secs)
    for p in paths.values():
        os.unlink(p)
    return res


def med(v):
    return statistics.median(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=None)
    ap.add_argument("--size", default="256M,1G")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    d = a.dir or tempfile.mkdtemp(prefix="kvtier-pybench.")
    samples = {}
    print(f"# kvtier Python bench: dir {d}, {a.repeat} repetitions, medians")
    print("| size | restore C / Python, cold | warm | save: torch / kvtier | numpy / kvtier "
          "| cold load: torch / kvtier | numpy / kvtier | warm load: torch / kvtier "
          "| numpy / kvtier |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in a.size.split(","):
        nbytes = parse_size(s)
        tokens, tensors = make_tensors(nbytes, seed=nbytes)
        path = os.path.join(d, "entry.mlxkv")
        kvtier.save(path, entry_of(tokens, tensors))
        r = {}
        for warm in (False, True):
            c_s, py_s = bench_restore(path, a.repeat, warm)
            tag = "warm" if warm else "cold"
            r[f"restore_{tag}_c"], r[f"restore_{tag}_py"] = c_s, py_s
        os.unlink(path)
        r.update(bench_peers(d, tokens, tensors, a.repeat))
        samples[s] = r

        def ratio(num, den):
            return med([x / y for x, y in zip(r[num], r[den])])

        print(f"| {s} ({tokens} tokens) "
              f"| {ratio('restore_cold_c', 'restore_cold_py'):.3f} "
              f"| {ratio('restore_warm_c', 'restore_warm_py'):.3f} "
              f"| {ratio('save_torch', 'save_kvtier'):.2f} "
              f"| {ratio('save_numpy', 'save_kvtier'):.2f} "
              f"| {ratio('cold_torch', 'cold_kvtier'):.2f} "
              f"| {ratio('cold_numpy', 'cold_kvtier'):.2f} "
              f"| {ratio('warm_torch', 'warm_kvtier'):.2f} "
              f"| {ratio('warm_numpy', 'warm_kvtier'):.2f} |", flush=True)
        gib = nbytes / (1 << 30)
        print(f"|  | C {gib / med(r['restore_cold_c']):.2f} GiB/s, Python "
              f"{gib / med(r['restore_cold_py']):.2f} GiB/s | C {gib / med(r['restore_warm_c']):.2f},"
              f" Python {gib / med(r['restore_warm_py']):.2f} GiB/s "
              f"| kvtier {gib / med(r['save_kvtier']):.2f} GiB/s | | kvtier "
              f"{gib / med(r['cold_kvtier']):.2f} GiB/s | | kvtier "
              f"{gib / med(r['warm_kvtier']):.2f} GiB/s | |", flush=True)
        del tensors
    if a.json:
        with open(a.json, "w") as f:
            json.dump(samples, f, indent=1)
    if not a.dir:
        os.rmdir(d)


if __name__ == "__main__":
    main()
