"""The store level: one directory of entries for one model, with a prefix index."""
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from . import _ext
from .device import device_handle
from .entry import Entry
from .files import Header, PathLike, Place, header_of, place_arg
from .tensors import as_tokens


@dataclass(frozen=True)
class Hit:
    """A find result. ``prefix_len == 0`` is a miss (``bool(hit)`` is False). Valid for the
    store that returned it, which ``store`` names: another store's restores raise
    ValueError."""

    prefix_len: int
    n_tokens: int
    id: int
    trimmable: bool
    store: int = 0

    def __bool__(self) -> bool:
        return self.prefix_len > 0

    def _t(self) -> Tuple[int, int, int, bool, int]:
        return (self.prefix_len, self.n_tokens, self.id, self.trimmable, self.store)


@dataclass(frozen=True)
class Record:
    """One indexed entry, as :meth:`Store.ls` lists it."""

    id: int
    path: str
    namespace: str
    n_tokens: int
    bytes: int
    mtime_ms: int
    trimmable: bool


def records(rows: List[Dict[str, Any]]) -> List[Record]:
    return [Record(id=r["id"], path=r["path"], namespace=r["ns"], n_tokens=r["n_tokens"],
                   bytes=r["bytes"], mtime_ms=r["mtime_ms"], trimmable=r["trimmable"])
            for r in rows]


class Store:
    """A store directory: ``<directory>/<config_fingerprint>/<nsHash>/<uuid>.mlxkv``.

    Opening recovers the directory (indexes the headers, reaps abandoned ``.tmp`` files,
    evicts to ``max_bytes``). Files of other models, tokenizers or format versions are
    skipped, never deleted. Safe from many threads and processes; every call releases the
    GIL. Use as a context manager, or call :meth:`close`.

    >>> with kvtier.Store("/var/cache/kv", model_id="m", config_fingerprint="fp",
    ...                   tokenizer_hash="tok", max_bytes=8 << 30) as store:
    ...     store.put(kvtier.Entry(tokens, caches))
    ...     entry = store.get(prompt)        # longest cached prefix, or None
    """

    def __init__(self, directory: PathLike, *, model_id: str, config_fingerprint: str,
                 tokenizer_hash: str, max_bytes: int = 0, n_layers: int = 0,
                 verify: bool = True, quarantine: bool = False,
                 read_only: bool = False) -> None:
        """``max_bytes``: byte cap (0 = 32 GiB), LRU eviction beyond it. ``n_layers``: the
        donor-layer count restores must have (0 = not checked). ``verify=False`` skips the
        tensor hash checks on restore. ``quarantine`` renames corrupt files to
        ``*.corrupt`` instead of deleting them. ``read_only`` inspects without changing
        anything on disk (put raises StateError)."""
        self._s = _ext.store_open(os.fspath(directory), model_id, config_fingerprint,
                                  tokenizer_hash, max_bytes, n_layers, not verify, quarantine,
                                  read_only)

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the store (idempotent). Further calls raise StateError."""
        self._s.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._s.closed

    @property
    def root(self) -> str:
        """The directory this store owns (``<directory>/<config_fingerprint>``)."""
        return self._s.root

    def find(self, tokens: Any, namespace: Optional[str] = None) -> Hit:
        """The longest usable cached prefix of ``tokens`` in ``namespace`` (index only, no
        I/O). Usable: at least one token is left to compute, and an entry longer than the
        match must be trimmable."""
        return Hit(*self._s.find(as_tokens(tokens), namespace))

    def restore(self, hit: Hit, *, trim: bool = True) -> Optional[Entry]:
        """Read the entry of ``hit`` (hash-checked). None when the file vanished, turned out
        corrupt (removed or quarantined, counted) or foreign. With ``trim`` (default) the
        entry is cut to ``hit.prefix_len`` tokens, ready to continue the prompt."""
        if not hit:
            return None
        t = self._s.restore(hit._t())
        if t is None:
            return None
        entry = Entry._from_ext(t)
        if trim and entry.n_tokens > hit.prefix_len:
            entry.trim(entry.n_tokens - hit.prefix_len)
        return entry

    def restore_into(self, hit: Hit, place: Place) -> Optional[Header]:
        """Read the entry of ``hit`` into memory you own (see :func:`kvtier.load_into` for
        ``place``). Returns the header (its caches' scalars say how many rows are live;
        trimming to ``hit.prefix_len`` is yours), or None on a miss."""
        if not hit:
            return None
        d = self._s.restore_into(hit._t(), place_arg(place))
        return None if d is None else header_of(d)

    def restore_to_device(self, hit: Hit, device: Any, place: Place) -> Optional[Header]:
        """:meth:`restore_into` into device memory (see :func:`kvtier.load_to_device`):
        ``device`` is a :class:`kvtier.Device`. Returns the header, or None on a miss (a
        corrupt entry is a miss, and its record is removed)."""
        if not hit:
            return None
        d = self._s.restore_to_device(hit._t(), device_handle(device),
                                      place_arg(place))
        return None if d is None else header_of(d)

    def get(self, tokens: Any, namespace: Optional[str] = None) -> Optional[Entry]:
        """``restore(find(tokens, namespace))``: the longest cached prefix, or None."""
        return self.restore(self.find(tokens, namespace))

    def put(self, entry: Entry) -> None:
        """Store ``entry`` under ``entry.namespace``, synchronously (durable on return).
        Raises on failure (disk full: KvtierOSError); partial files are removed and the
        store stays usable."""
        self._s.put(entry.tokens, entry._c_caches(), entry._meta(), entry.created_at or 0)

    def has_durable_prefix(self, tokens: Any, namespace: Optional[str] = None) -> bool:
        """Whether a durable entry of ``namespace`` starts with ``tokens`` and is exactly
        that long or trimmable (so ``tokens`` could be restored from disk)."""
        return self._s.has_durable_prefix(as_tokens(tokens), namespace)

    def refresh(self) -> None:
        """Pick up entries other processes published or removed, then evict to the cap."""
        self._s.refresh()

    def stats(self) -> Dict[str, Any]:
        """Counters: entries, total_bytes, max_bytes, restores, spills, store_failures,
        evictions, skipped_files, skipped_bytes, corrupt_files, restore_misses,
        restore_ms_last, longest_durable_prefix_tokens, tmp_reaped, and shared_chunks,
        shared_bytes: the chunks of shared prefixes (docs/SHARING.md), counted once in
        total_bytes."""
        return self._s.stats()

    def ls(self) -> List[Record]:
        """The indexed entries, in index order."""
        return records(self._s.list())

    def __repr__(self) -> str:
        return f"Store({'closed' if self.closed else self.root!r})"
