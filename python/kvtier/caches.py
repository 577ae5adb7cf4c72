"""The six cache kinds (CACHES.md) as Python classes.

A cache is one donor layer's state. Build it from tensors (torch, numpy or kvtier tensors:
their memory is wrapped, not copied, and the objects stay alive until kvtier lets go of
them), or empty and let it grow with :meth:`Cache.append` (which copies the new rows).
Tensors must be contiguous, in host memory, of the dtypes the kind requires; anything else
raises ``TypeError`` / ``ValueError`` / :class:`kvtier.InvalidArgumentError` (a ValueError)
before the library sees it.
"""
from typing import Any, Dict, Optional, Sequence, Tuple, Type

from . import _ext
from .tensors import DTYPES, Tensor, TensorLike, to_numpy, to_torch

KINDS = ("kv", "rotating", "qkv", "rotating-qkv", "ssm", "turboquant")
_U32 = DTYPES["uint32"]


class Cache:
    """One layer's cache. Use a subclass: :class:`KVCache`, :class:`RotatingCache`,
    :class:`QuantizedKVCache`, :class:`RotatingQuantizedKVCache`, :class:`SSMCache`,
    :class:`TurboQuantCache`.

    Not thread-safe: one thread at a time per cache (a second thread gets a StateError).
    """

    kind: str = ""
    #: per tensor slot: the dtype code integer memory is read as (torch has no uint32), or -1
    _as_dtypes: Optional[Sequence[int]] = None

    def __init__(self, _c: Any) -> None:
        self._c = _c

    @staticmethod
    def _wrap(c: Any) -> "Cache":
        """The Python object of the right kind for an extension cache."""
        obj = _BY_KIND[c.kind].__new__(_BY_KIND[c.kind])
        Cache.__init__(obj, c)
        return obj

    @classmethod
    def _from_state(cls, tensors: Sequence[TensorLike], offset: int, **scalars: int) -> Any:
        return _ext.cache_from_state(KINDS.index(cls.kind), list(tensors), offset,
                                     dtypes=cls._as_dtypes, **scalars)

    @property
    def offset(self) -> int:
        """Tokens covered (rings: tokens ever seen, the RoPE position)."""
        return self._c.offset

    @property
    def nbytes(self) -> int:
        """Bytes of the state (kv kinds: the whole capacity buffers)."""
        return self._c.nbytes

    @property
    def capacity(self) -> int:
        """Rows allocated on the token axis (0 for ssm or an empty cache)."""
        return self._c.capacity

    @property
    def is_trimmable(self) -> bool:
        """Whether trim(n > 0) is allowed now (kv kinds always, rings until they wrap)."""
        return self._c.trimmable

    def info(self) -> Dict[str, Any]:
        """The scalars: kind, offset, idx, max_size, group_size, bits, k_bits, v_bits,
        head_dim (0 where the kind has none)."""
        return self._c.info()

    def state(self) -> Tuple[Tensor, ...]:
        """What is persisted, as views (no copy): rows [0, offset) for kv, qkv, turboquant;
        the whole buffers for rings and ssm. Raises StateError for an empty cache."""
        return self._c.state()

    def window(self) -> Tuple[Tensor, ...]:
        """What attention reads after the last append, as views (valid until the next
        append or trim, which may write into the same buffers)."""
        return self._c.window()

    def append(self, *tensors: TensorLike) -> Tuple[Tensor, ...]:
        """Append ``L = tensors[0].shape[2]`` tokens (the kind's tensors in FORMAT.md order,
        each [B, H, L, .]); the rows are copied. Returns :meth:`window`."""
        self._c.append(list(tensors), self._as_dtypes)
        return self._c.window()

    def trim(self, n: int) -> None:
        """Drop the last ``n`` tokens (StateError if not trimmable and n > 0)."""
        self._c.trim(n)

    def clone(self) -> "Cache":
        """A cache sharing these bytes, immune to later writes to either (copy-on-write)."""
        return Cache._wrap(self._c.clone())

    def torch(self) -> Tuple[Any, ...]:
        """:meth:`state` as torch tensors over the same bytes."""
        return to_torch(self.state())

    def numpy(self) -> Tuple[Any, ...]:
        """:meth:`state` as read-only numpy arrays over the same bytes."""
        return to_numpy(self.state())

    def __repr__(self) -> str:
        i = self.info()
        extra = "".join(f", {k}={v}" for k, v in i.items()
                        if k not in ("kind", "offset") and v)
        return f"{type(self).__name__}(offset={i['offset']}{extra})"


def _rows(t: TensorLike) -> int:
    """Rows on the token axis; 0 for what is no tensor of rank >= 3 (the extension then
    raises the precise TypeError or rank error)."""
    try:
        return int(t.shape[2])
    except (AttributeError, IndexError, TypeError):
        return 0


class KVCache(Cache):
    """Plain KV: ``keys`` [B, H, T, Dk] and ``values`` [B, H, T, Dv] of one activation dtype
    (float16, bfloat16, float32). Always trimmable.

    ``KVCache()`` is empty; ``KVCache(k, v)`` wraps the tensors (no copy) with
    ``offset = T`` unless given (rows past ``offset`` are capacity)."""

    kind = "kv"

    def __init__(self, keys: Optional[TensorLike] = None, values: Optional[TensorLike] = None,
                 *, offset: Optional[int] = None) -> None:
        if keys is None:
            super().__init__(_ext.cache_new(0))
            return
        off = _rows(keys) if offset is None else offset
        super().__init__(self._from_state([keys, values], off))


class RotatingCache(Cache):
    """Sliding-window ring of ``max_size`` tokens: ``keys``, ``values`` [B, H, S, D] in ring
    order, ``offset`` = tokens ever seen, ``idx`` = next write slot. Trimmable until the ring
    wraps (offset < max_size).

    ``RotatingCache(max_size=W)`` is empty; with tensors, offset and idx default to S."""

    kind = "rotating"

    def __init__(self, keys: Optional[TensorLike] = None, values: Optional[TensorLike] = None,
                 *, max_size: int, offset: Optional[int] = None,
                 idx: Optional[int] = None) -> None:
        if keys is None:
            super().__init__(_ext.cache_new(1, max_size=max_size))
            return
        s = _rows(keys)
        super().__init__(self._from_state(
            [keys, values], s if offset is None else offset, idx=s if idx is None else idx,
            max_size=max_size))


class QuantizedKVCache(Cache):
    """Affine-quantized KV: ``(k_packed, k_scales, k_biases, v_packed, v_scales, v_biases)``,
    each [B, H, T, .]; packed is uint32 (torch int32 is read as uint32) with last dim
    ``D * bits / 32``, scales and biases an activation dtype with last dim ``D / group_size``.
    The quantization itself is the engine's; kvtier moves the bytes."""

    kind = "qkv"
    _as_dtypes = (_U32, -1, -1, _U32, -1, -1)

    def __init__(self, *tensors: TensorLike, group_size: int = 64, bits: int = 4,
                 offset: Optional[int] = None) -> None:
        if not tensors:
            super().__init__(_ext.cache_new(2, group_size=group_size, bits=bits))
            return
        off = _rows(tensors[0]) if offset is None else offset
        super().__init__(self._from_state(tensors, off, group_size=group_size, bits=bits))


class RotatingQuantizedKVCache(Cache):
    """The ring of :class:`RotatingCache` over the six arrays of :class:`QuantizedKVCache`."""

    kind = "rotating-qkv"
    _as_dtypes = (_U32, -1, -1, _U32, -1, -1)

    def __init__(self, *tensors: TensorLike, max_size: int, group_size: int = 64,
                 bits: int = 4, offset: Optional[int] = None,
                 idx: Optional[int] = None) -> None:
        if not tensors:
            super().__init__(_ext.cache_new(3, max_size=max_size, group_size=group_size,
                                            bits=bits))
            return
        s = _rows(tensors[0])
        super().__init__(self._from_state(
            tensors, s if offset is None else offset, idx=s if idx is None else idx,
            max_size=max_size, group_size=group_size, bits=bits))


class SSMCache(Cache):
    """Gated-DeltaNet state: ``conv`` [B, K-1, C] and ``recurrent`` [B, Hv, Dv, Dk]
    (activation dtypes). ``offset`` is bookkeeping. Never trimmable; grows with
    :meth:`update`, not append."""

    kind = "ssm"

    def __init__(self, conv: Optional[TensorLike] = None,
                 recurrent: Optional[TensorLike] = None, *, offset: int = 0) -> None:
        if conv is None:
            super().__init__(_ext.cache_new(4))
            return
        super().__init__(self._from_state([conv, recurrent], offset))

    def update(self, conv: TensorLike, recurrent: TensorLike, n_tokens: int) -> None:
        """Replace conv and recurrent (copied) and advance offset by ``n_tokens``."""
        self._c.ssm_update(conv, recurrent, n_tokens)


class TurboQuantCache(Cache):
    """TurboQuant: ``(k_idx, k_scales, k_zeros, v_packed, v_scales)``, each [B, H, T, .]
    (k_idx int8 at k_bits 8, else uint8; scales and zeros float16; v_packed uint8).
    ``head_dim`` in {64, 128, 256, 512} (0: from the tensors)."""

    kind = "turboquant"

    def __init__(self, *tensors: TensorLike, k_bits: int = 8, v_bits: int = 3,
                 head_dim: int = 0, offset: Optional[int] = None) -> None:
        if not tensors:
            super().__init__(_ext.cache_new(5, k_bits=k_bits, v_bits=v_bits))
            return
        off = _rows(tensors[0]) if offset is None else offset
        if not head_dim and len(tensors) > 1 and len(getattr(tensors[1], "shape", ())) == 4:
            head_dim = int(tensors[1].shape[3]) * 32  # scales: one per group of 32
        super().__init__(self._from_state(tensors, off, k_bits=k_bits, v_bits=v_bits,
                                          head_dim=head_dim))


_BY_KIND: Dict[str, Type[Cache]] = {
    c.kind: c for c in (KVCache, RotatingCache, QuantizedKVCache, RotatingQuantizedKVCache,
                        SSMCache, TurboQuantCache)
}
