"""The tier level: the RAM prompt cache an engine talks to, with a store as its cold tier."""
import atexit
import os
import weakref
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from . import _ext
from .entry import Entry
from .errors import from_code
from .device import Device, device_handle
from .files import Header, PathLike, Place, header_of, place_arg
from .store import Record, records
from .tensors import as_tokens

_open_caches: "weakref.WeakSet[PromptCache]" = weakref.WeakSet()


@dataclass
class Take:
    """A taken prefix: ``entry`` (caches trimmed to ``entry.n_tokens``), whether it came
    from disk, and the hold on its donor that :meth:`PromptCache.put` hands back."""

    entry: Entry
    from_disk: bool
    _retain: Any = None


@dataclass
class FlushReport:
    """What a flush achieved. ``durable``: nothing dirty or pending, nothing dropped,
    failed or missing during the flush."""

    durable: bool
    pending_snapshots: int
    pending_spills: int
    pending_spill_bytes: int
    dropped: int
    failed: int
    missing: int
    entries: int
    longest_durable_prefix_tokens: int


class PromptCache:
    """A RAM prompt cache with an optional cold tier on disk (a :class:`Store` directory).

    ``take(prompt)`` returns the longest cached prefix, from RAM or disk; ``put(entry)``
    inserts the entry after generation. With a cold tier, fresh entries are snapshotted to
    disk behind the caller's back (write-behind, on the library's writer thread), entries
    evicted from RAM spill to disk, and entries idle for ``demote_idle_ms`` move to disk.
    :meth:`flush` makes everything durable. Caches put here are shared, not copied: tensors
    they wrap stay alive until the writer has saved them, even if Python drops them.

    Safe from any thread; every call releases the GIL. Use as a context manager (flushes
    and closes on exit) or call :meth:`close`.
    """

    def __init__(self, cold_dir: Optional[PathLike] = None, *, model_id: Optional[str] = None,
                 config_fingerprint: Optional[str] = None,
                 tokenizer_hash: Optional[str] = None, ram_max_bytes: int = 8_000_000_000,
                 max_bytes: int = 0, n_layers: int = 0, verify: bool = True,
                 spill_queue_max_bytes: int = 2 << 30, write_behind: bool = True,
                 demote_idle_ms: int = 300_000, snapshot_debounce_ms: int = 1000,
                 flush_timeout_ms: int = 120_000,
                 background_cpus: Optional[str] = None, device: Optional[Device] = None,
                 keep_saved_cached: bool = False, share_prefixes: bool = True) -> None:
        """``cold_dir`` (with model_id, config_fingerprint, tokenizer_hash: the model
        identity; another fingerprint or namespace never matches) enables the cold tier.
        ``ram_max_bytes``: RAM tier cap. ``max_bytes``: the store's cap (0 = 32 GiB).
        ``write_behind``: snapshot fresh entries to disk (``snapshot_debounce_ms`` after
        their put). ``demote_idle_ms``: move entries idle this long to disk (0 = off).
        ``background_cpus``: CPU list ("2-7") for the writer and timer threads.
        ``device``: entries in its memory (CUDA tensors) are put into page-locked host memory
        of the RAM tier (one region of ``ram_max_bytes + spill_queue_max_bytes``, allocated
        at the first such put), and :meth:`take_to_device` lands takes in its memory.
        ``keep_saved_cached``: saved files stay in the page cache, so that a restarted
        process restores them at memory speed. ``share_prefixes`` (on by default): entries that
        begin with the same prompt (over 256 tokens) store it once on disk (docs/SHARING.md);
        off, each entry is one whole ``.mlxkv`` file."""
        self._pc = _ext.pcache_open(
            ram_max_bytes, None if cold_dir is None else os.fspath(cold_dir), model_id,
            config_fingerprint, tokenizer_hash, max_bytes, n_layers, not verify,
            spill_queue_max_bytes, write_behind, demote_idle_ms, snapshot_debounce_ms,
            flush_timeout_ms, background_cpus,
            None if device is None else device_handle(device), keep_saved_cached,
            share_prefixes)
        self.device = device
        _open_caches.add(self)

    def __enter__(self) -> "PromptCache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close(flush=exc[0] is None)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._pc.closed

    def take(self, tokens: Any, namespace: Optional[str] = None) -> Optional[Take]:
        """The longest usable cached prefix of ``tokens``: a trimmed clone of a RAM entry
        (which stays in RAM), or an entry restored from disk when the disk prefix is
        longer. None on a miss."""
        t = self._pc.take(as_tokens(tokens), namespace)
        if t is None:
            return None
        entry, retain, from_disk = t
        return Take(Entry._from_ext(entry), from_disk, retain)

    def take_to_device(self, tokens: Any, place: Place, namespace: Optional[str] = None,
                       layerwise: bool = False) -> Optional[Tuple[Any, ...]]:
        """:meth:`take` into the memory of the cache's device: ``place`` is given the header
        of the taken prefix (its tokens; each tensor cut to the prefix) and returns one
        contiguous destination per tensor (a tensor on the device, or an address); the bytes
        are copied there from page-locked RAM, or streamed from the file of a disk hit. Every
        copy has finished on return. ``(header, from_disk)``, or None on a miss.

        ``layerwise``: return once a RAM hit's copies are queued, with a third item, a
        ``DeviceTake``: ``wait(slot, stream)`` makes CUDA stream ``stream`` (a handle, e.g.
        ``torch.cuda.current_stream().cuda_stream``) wait until tensor ``slot`` has landed,
        without the host waiting; read no tensor before its wait. ``end()`` (also run when it
        is collected) waits on the host for all of them."""
        t = self._pc.take_to_device(as_tokens(tokens), place_arg(place), namespace,
                                    layerwise)
        if t is None:
            return None
        return (header_of(t[0]),) + tuple(t[1:])

    def put(self, entry: Entry, take: Optional[Take] = None) -> None:
        """Insert ``entry`` (under ``entry.namespace``). Its caches are shared with the
        cache (copy-on-write): keep using them. Pass the :class:`Take` the generation
        started from, to hand its hold back."""
        retain = None
        if take is not None:
            retain, take._retain = take._retain, None
        self._pc.put(entry.tokens, entry._c_caches(), entry._meta(), retain)

    def flush(self, timeout_ms: int = -1) -> FlushReport:
        """Make everything in RAM durable: wait for running snapshots and the queue, then
        snapshot every dirty entry. ``timeout_ms < 0``: the ``flush_timeout_ms`` option.
        Raises :class:`kvtier.TimeoutError` (with ``.report``) when time runs out."""
        rc, d = self._pc.flush(timeout_ms)
        report = FlushReport(**d)
        if rc < 0:
            exc = from_code(rc, "flush: timed out")
            exc.report = report
            raise exc
        return report

    def stats(self) -> Dict[str, Any]:
        """records, total_bytes, hits, misses, demotions, pending_spills,
        pending_spill_bytes, dropped_spills, failed_spills, pending_snapshots, and ``cold``:
        the store's statistics (None without a cold tier)."""
        return self._pc.stats()

    def demote_idle(self, idle_ms: int = 0) -> int:
        """Move every RAM entry idle for at least ``idle_ms`` to the cold tier now; returns
        the count (0 without a cold tier). ``demote_idle(0)`` drains RAM to disk."""
        return self._pc.demote_idle(idle_ms, 0)

    def clear(self) -> None:
        """Release every RAM entry without spilling."""
        self._pc.clear()

    def peek_prefix_len(self, tokens: Any, namespace: Optional[str] = None) -> int:
        """The RAM prefix length take() would find; changes nothing."""
        return self._pc.peek_prefix_len(as_tokens(tokens), namespace)

    def contains(self, tokens: Any, namespace: Optional[str] = None) -> bool:
        """Whether RAM holds an entry with exactly these tokens."""
        return self._pc.find_exact(as_tokens(tokens), namespace)

    def ls(self) -> List[Record]:
        """The entries of the cold tier ([] without one)."""
        return records(self._pc.cold_list())

    def close(self, flush: bool = True) -> None:
        """Flush (unless ``flush=False``), then stop the background threads, discard queued
        spills, release RAM and close the store. Idempotent."""
        if self._pc.closed:
            return
        try:
            if flush:
                self.flush()
        finally:
            self._pc.close()
            _open_caches.discard(self)

    def __repr__(self) -> str:
        return f"PromptCache({'closed' if self.closed else 'open'})"


@atexit.register
def _close_all() -> None:
    # The writer thread must stop before the interpreter finalizes: it may still have to
    # release Python tensors, which needs the GIL. Exit does not flush: call flush() first.
    for pc in list(_open_caches):
        pc.close(flush=False)
