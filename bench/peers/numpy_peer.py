#!/usr/bin/python3
"""numpy peer for `kvtier bench --peers`.

Takes the tensors of one .mlxkv file (the entry kvtier just saved), then saves and loads the
same tensors with numpy the way a Python engine would: np.save of every tensor into one file,
flush + fsync; np.load of every tensor back, from a cold page cache (fsync + fadvise
DONTNEED) and from a warm one. Prints one JSON object with the seconds of every repetition.
Warm-up repetitions run first, unreported: a fresh process's first save and first cold load
fill the page cache from memory the host has not backed yet (2-6x slower on a VM that backs
guest memory lazily), while kvtier's steps run in a process that has been working.
Run with Debian's /usr/bin/python3 (python3-numpy).
"""
import argparse
import json
import os
import struct
import sys
import time

import numpy as np

MAGIC = b"MLXBUNKV2\n"
# mlx dtype codes (FORMAT.md); bfloat16 has no numpy dtype and travels as its uint16 bits.
DTYPES = {0: np.bool_, 1: np.uint8, 2: np.uint16, 3: np.uint32, 4: np.uint64, 5: np.int8,
          6: np.int16, 7: np.int32, 8: np.int64, 9: np.float16, 10: np.float32,
          11: np.float64, 12: np.uint16, 13: np.complex64}


def read_tensors(path):
    """The tensors of an .mlxkv file, in header order (not timed)."""
    with open(path, "rb") as f:
        prefix = f.read(26)
        if len(prefix) != 26 or prefix[:10] != MAGIC:
            raise SystemExit(f"{path}: not an .mlxkv file")
        header_len, data_start = struct.unpack_from("<II", prefix, 10)
        header = json.loads(f.read(header_len))
        out = []
        for cache in header["caches"]:
            for slot in cache["tensors"]:
                dt = np.dtype(DTYPES[slot["dtype"]])
                count = slot["bytes"] // dt.itemsize
                f.seek(data_start + slot["off"])
                a = np.fromfile(f, dtype=dt, count=count)
                if a.size != count:
                    raise SystemExit(f"{path}: short tensor at {slot['off']}")
                out.append(a.reshape(slot["shape"]))
    return out


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fsync_dir(path):
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(path, tensors):
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for a in tensors:
            np.save(f, a, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(path)
    return time.perf_counter() - t0


def load(path, n):
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        out = [np.load(f, allow_pickle=False) for _ in range(n)]
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True, help=".mlxkv file whose tensors to use")
    ap.add_argument("--dir", required=True, help="directory for the numpy file")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="unreported repetitions first")
    args = ap.parse_args()

    tensors = read_tensors(args.src)
    nbytes = sum(a.nbytes for a in tensors)
    path = os.path.join(args.dir, "numpy-peer.npy")
    res = {"peer": "numpy", "numpy": np.__version__, "tensors": len(tensors),
           "tensor_bytes": nbytes, "save_s": [], "load_cold_s": [], "load_warm_s": []}
    warmup = max(0, args.warmup)
    for rep in range(warmup + max(1, args.repeat)):
        if os.path.exists(path):
            os.unlink(path)
        ts = save(path, tensors)
        drop_cache(path)
        tc, out = load(path, len(tensors))
        del out
        tw, out = load(path, len(tensors))  # the file is now in the page cache
        if rep >= warmup:
            res["save_s"].append(ts)
            res["load_cold_s"].append(tc)
            res["load_warm_s"].append(tw)
        same = len(out) == len(tensors) and all(
            a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
                a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
            for a, b in zip(out, tensors))
        del out
        if not same:
            raise SystemExit("numpy peer: loaded tensors differ from the saved ones")
    res["file_bytes"] = os.path.getsize(path)
    os.unlink(path)
    json.dump(res, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
