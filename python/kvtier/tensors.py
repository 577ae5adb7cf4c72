"""Conversions shared by the package: dtypes, token arrays, tensors to torch and numpy."""
from typing import Any, Sequence, Tuple

import numpy as np

from . import _ext

Tensor = _ext.Tensor

# mlx dtype codes (FORMAT.md), for the per-slot dtype a cache kind requires
DTYPES = {"bool": 0, "uint8": 1, "uint16": 2, "uint32": 3, "uint64": 4, "int8": 5, "int16": 6,
          "int32": 7, "int64": 8, "float16": 9, "float32": 10, "float64": 11, "bfloat16": 12,
          "complex64": 13}

TensorLike = Any  # torch.Tensor, numpy.ndarray, kvtier.Tensor or any buffer / DLPack object


def as_tokens(tokens: Any) -> np.ndarray:
    """Tokens as a contiguous int32 numpy array (what the library takes)."""
    if hasattr(tokens, "detach") and hasattr(tokens, "cpu"):  # a torch tensor
        tokens = tokens.detach().cpu().numpy()
    a = np.asarray(tokens)
    if a.ndim != 1:
        a = a.reshape(-1)
    if a.size == 0:
        return np.zeros(0, dtype=np.int32)
    if a.dtype != np.int32:
        if not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"tokens must be integers, got {a.dtype}")
        if a.min() < -2**31 or a.max() >= 2**31:
            raise ValueError("tokens must fit in int32")
        a = a.astype(np.int32)
    return np.ascontiguousarray(a)


def to_torch(tensors: Sequence[Tensor]) -> Tuple[Any, ...]:
    """torch views of kvtier tensors (no copy)."""
    return tuple(t.torch() for t in tensors)


def to_numpy(tensors: Sequence[Tensor]) -> Tuple[np.ndarray, ...]:
    """Read-only numpy views of kvtier tensors (no copy)."""
    return tuple(t.numpy() for t in tensors)
