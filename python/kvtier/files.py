"""The file level: one entry per .mlxkv v3 file, saved crash-safely, validated on read."""
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np

from . import _ext
from .entry import Entry

PathLike = Union[str, os.PathLike]


@dataclass
class Header:
    """A validated header (no tensor bytes read). ``caches`` holds one dict per cache: kind,
    scalars, ``trimmable`` and ``tensors`` (dtype, shape, off, bytes, hash per slot)."""

    format_version: int
    created_at: Optional[int]
    model_id: Optional[str]
    config_fingerprint: Optional[str]
    tokenizer_hash: Optional[str]
    namespace: Optional[str]
    tokens: np.ndarray
    caches: List[Dict[str, Any]] = field(repr=False)
    file_size: int
    header_len: int
    data_start: int
    header_hash: int
    trimmable: bool
    indexable: bool


def save(path: PathLike, entry: Entry, *, created_at: Optional[int] = None,
         max_file_bytes: int = 0, sync: bool = True, drop_cache: bool = False) -> int:
    """Write ``entry`` to ``path`` crash-safely (``.tmp``, fsync, rename, fsync of the
    directory) and return the file size. The GIL is released while it writes.

    ``created_at``: ms since the epoch (default now). ``max_file_bytes``: refuse larger
    entries (TooLargeError). ``sync=False`` skips the fsyncs (tests, benchmarks).
    ``drop_cache``: drop the file's pages from the page cache afterwards."""
    return _ext.file_save(os.fspath(path), entry.tokens, entry._c_caches(), entry._meta(),
                          created_at or 0, max_file_bytes, not sync, drop_cache)


def _expect(path: PathLike, model_id: Optional[str], config_fingerprint: Optional[str],
            tokenizer_hash: Optional[str], namespace: Optional[str], n_layers: int,
            verify: bool, keep_cache: bool) -> Dict[str, Any]:
    return dict(path=os.fspath(path), model_id=model_id, config_fingerprint=config_fingerprint,
                tokenizer_hash=tokenizer_hash, ns=namespace, n_layers=n_layers,
                no_verify=not verify, keep_cache=keep_cache)


def load(path: PathLike, *, model_id: Optional[str] = None,
         config_fingerprint: Optional[str] = None, tokenizer_hash: Optional[str] = None,
         namespace: Optional[str] = None, n_layers: int = 0, verify: bool = True,
         keep_cache: bool = False) -> Entry:
    """Load the entry in ``path``: the header is validated, the given expectations checked
    (MismatchError), every tensor read straight into memory kvtier owns with its hash
    checked in the same pass (CorruptError). The caches' tensors reach torch and numpy
    without a copy (``cache.torch()``, ``cache.numpy()``). The GIL is released while it
    reads. ``keep_cache`` keeps the file's pages in the page cache."""
    return Entry._from_ext(_ext.file_load(**_expect(
        path, model_id, config_fingerprint, tokenizer_hash, namespace, n_layers, verify,
        keep_cache)))


def verify(path: PathLike, *, model_id: Optional[str] = None,
           config_fingerprint: Optional[str] = None, tokenizer_hash: Optional[str] = None,
           namespace: Optional[str] = None, n_layers: int = 0) -> None:
    """Check ``path`` fully (structure and every tensor hash) without building caches;
    returns None or raises (FormatError, CorruptError, MismatchError, UnsupportedError,
    OSError)."""
    _ext.file_verify(**_expect(path, model_id, config_fingerprint, tokenizer_hash, namespace,
                               n_layers, True, False))


#: Where a restore into caller memory puts the slots: a sequence of destinations (one per
#: tensor slot, caches in order; None skips a slot), or a callable that receives the
#: validated :class:`Header` and returns that sequence.
Place = Union[Sequence[Any], Callable[[Header], Sequence[Any]]]


def header_of(d: Dict[str, Any]) -> Header:
    m = d["meta"]
    return Header(format_version=d["format_version"],
                  created_at=None if d["created_at"] < 0 else d["created_at"],
                  model_id=m["model_id"], config_fingerprint=m["config_fingerprint"],
                  tokenizer_hash=m["tokenizer_hash"], namespace=m["ns"],
                  tokens=np.frombuffer(d["tokens"], dtype=np.int32).copy(),
                  caches=d["caches"], file_size=d["file_size"], header_len=d["header_len"],
                  data_start=d["data_start"], header_hash=d["header_hash"],
                  trimmable=d["trimmable"], indexable=d["indexable"])


def place_arg(place: Place) -> Any:
    """The form the extension takes: a sequence, or a callable of the header dict."""
    if callable(place):
        return lambda d: place(header_of(d))
    return list(place)


def load_into(path: PathLike, place: Place, *, model_id: Optional[str] = None,
              config_fingerprint: Optional[str] = None, tokenizer_hash: Optional[str] = None,
              namespace: Optional[str] = None, n_layers: int = 0, verify: bool = True,
              keep_cache: bool = False) -> Header:
    """Load the file's tensors into memory you own: an engine's preallocated KV buffers.

    ``place`` gives one destination per tensor slot (caches in order, each cache's slots in
    FORMAT.md order): a writable, C-contiguous numpy array or torch tensor of the slot's
    dtype and shape (numpy: uint16 for bfloat16), or raw bytes (a bytearray, a 1-D uint8
    array) of at least the slot's bytes; it receives them exactly as the file holds them
    (rows ``[0, offset)``, no capacity). None skips the slot. Anything else raises
    ValueError naming the slot, before any byte is read. Pass the sequence,
    or a callable that receives the validated :class:`Header` (shapes, dtypes, scalars)
    before any tensor byte is read. Same checks as :func:`load`, hashes verified in the
    same pass; on failure the destinations may hold part of the bytes. The GIL is released
    while it reads (the callable runs with the GIL held). Returns the header."""
    return header_of(_ext.file_load_into(**dict(
        _expect(path, model_id, config_fingerprint, tokenizer_hash, namespace, n_layers,
                verify, keep_cache), place=place_arg(place))))


def read_header(path: PathLike, *, max_header_bytes: int = 0) -> Header:
    """Read and validate the header only (cheap: no tensor bytes)."""
    return header_of(_ext.file_read_header(os.fspath(path), max_header_bytes))


def plan_size(entry: Entry) -> int:
    """The file size :func:`save` would write for ``entry``, from the plan alone."""
    return _ext.file_plan_size(entry.tokens, entry._c_caches(), entry._meta())
