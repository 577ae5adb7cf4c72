"""Device memory: restores straight into CUDA tensors, and saves straight from them.

CUDA is loaded at run time (the driver's ``libcuda.so.1``): without a GPU, ``Device.cuda()``
raises :class:`UnsupportedError` and :meth:`Device.host` gives a stand-in whose "device
memory" is host memory (for tests). Entries built from CUDA tensors (``KVCache(k, v)`` with
``k.is_cuda``) are saved by :func:`kvtier.save` and :meth:`Store.put` straight from the device;
they cannot be appended to, and a :class:`PromptCache` holds them only when opened with their
device (``PromptCache(device=Device.cuda(0))``: page-locked host copies).
"""
from typing import Any, Optional

from . import _ext
from .files import Header, PathLike, Place, _expect, header_of, place_arg


class Device:
    """A device restores write into: ``Device.cuda(0)`` or ``Device.host()``."""

    def __init__(self, _d: Any) -> None:
        self._d = _d

    @classmethod
    def cuda(cls, ordinal: int = 0) -> "Device":
        """CUDA device ``ordinal`` (its primary context: the one torch uses), opened once per
        process. Raises UnsupportedError where there is no driver or no such device."""
        return cls(_ext.device_cuda(ordinal))

    @classmethod
    def host(cls, staging_chunk: int = 0, staging_depth: int = 0,
             copy_delay_us: int = 0) -> "Device":
        """The host-memory stand-in: its copies run in order on a worker thread, each taking
        at least ``copy_delay_us``. Destinations are CPU tensors, arrays or addresses."""
        return cls(_ext.device_host(staging_chunk, staging_depth, copy_delay_us))

    @property
    def name(self) -> str:
        return self._d.name

    @property
    def ordinal(self) -> int:
        """The CUDA ordinal; -1 for the stand-in."""
        return self._d.ordinal

    def __repr__(self) -> str:
        return f"Device({self.name!r})"


def device_handle(device: Any) -> Any:
    """The extension's handle of a :class:`Device` (TypeError for anything else)."""
    if not isinstance(device, Device):
        raise TypeError(f"expected a kvtier.Device, got {type(device).__name__}")
    return device._d


def load_to_device(path: PathLike, device: Device, place: Place, *,
                   model_id: Optional[str] = None, config_fingerprint: Optional[str] = None,
                   tokenizer_hash: Optional[str] = None, namespace: Optional[str] = None,
                   n_layers: int = 0, verify: bool = True, keep_cache: bool = False) -> Header:
    """:func:`kvtier.load_into` into device memory: ``place`` gives one destination per slot,
    a contiguous CUDA tensor on ``device`` of the slot's dtype and shape, or a 1-D uint8 one
    of at least its bytes (or a device address, or None). The file streams through
    page-locked staging, each chunk hashed there and copied to the device while the next is
    read; every copy has finished on return. On failure the destinations may hold part of
    the bytes. Returns the header."""
    return header_of(_ext.file_load_to_device(**dict(
        _expect(path, model_id, config_fingerprint, tokenizer_hash, namespace, n_layers,
                verify, keep_cache), device=device_handle(device), place=place_arg(place))))
