"""kvtier: a persistent prompt cache for LLM inference engines (Python binding).

Saves the KV / SSM state of prompts to disk crash-safely (.mlxkv v3 files), finds the
longest cached prefix of a new prompt, and restores it at disk speed, straight into memory
that torch and numpy read without a copy.

Three levels:

- files: :func:`save`, :func:`load`, :func:`verify`, :func:`read_header`,
  :func:`load_into` (into memory you own);
- :class:`Store`: a directory of entries for one model, with a prefix index;
- :class:`PromptCache`: the RAM prompt cache over a store, with write-behind and idle
  demotion;
- :class:`Device`: restores straight into CUDA tensors (:func:`load_to_device`,
  :meth:`Store.restore_to_device`) and saves straight from them.

An :class:`Entry` is a token prefix plus one cache per layer: :class:`KVCache`,
:class:`RotatingCache`, :class:`QuantizedKVCache`, :class:`RotatingQuantizedKVCache`,
:class:`SSMCache`, :class:`TurboQuantCache`. Failures raise :class:`KvtierError`
subclasses carrying kvtier's code and message.
"""
from . import _ext
from .caches import (KINDS, Cache, KVCache, QuantizedKVCache, RotatingCache,
                     RotatingQuantizedKVCache, SSMCache, TurboQuantCache)
from .device import Device, load_to_device
from .entry import Entry
from .errors import (CorruptError, FormatError, InvalidArgumentError, KvtierError,
                     KvtierOSError, MismatchError, RefusedError, StateError, TimeoutError,
                     TooLargeError, UnsupportedError)
from .files import Header, load, load_into, plan_size, read_header, save, verify
from .pcache import FlushReport, PromptCache, Take
from .store import Hit, Record, Store
from .tensors import Tensor, as_tokens

__version__ = f"{_ext.VERSION_MAJOR}.{_ext.VERSION_MINOR}.{_ext.VERSION_PATCH}"

strerror = _ext.strerror
buf_cache_limit = _ext.buf_cache_limit
buf_cache_bytes = _ext.buf_cache_bytes

__all__ = [
    "KINDS", "Cache", "KVCache", "RotatingCache", "QuantizedKVCache",
    "RotatingQuantizedKVCache", "SSMCache", "TurboQuantCache", "Entry", "Tensor", "as_tokens",
    "save", "load", "load_into", "verify", "read_header", "plan_size", "Header",
    "Store", "Hit", "Record", "PromptCache", "Take", "FlushReport", "Device", "load_to_device",
    "KvtierError", "FormatError", "CorruptError", "MismatchError", "UnsupportedError",
    "TooLargeError", "StateError", "RefusedError", "TimeoutError", "InvalidArgumentError",
    "KvtierOSError", "strerror", "buf_cache_limit", "buf_cache_bytes",
]
