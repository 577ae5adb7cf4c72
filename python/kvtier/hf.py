"""Hugging Face ``transformers``: persist and restore a model's ``DynamicCache``.

The cache's layers ([batch, kv_heads, tokens, head_dim] keys and values, usually CUDA tensors)
become one :class:`KVCache` each, saved straight from the device; a restore finds the longest
stored prefix of a prompt and reads it straight into new tensors on the device, as a
``DynamicCache`` the model continues from. Only full-attention layers (``DynamicLayer``) are
mapped; caches of other layer types (sliding windows, quantized, offloaded) raise
:class:`UnsupportedError` rather than being approximated.

    pc = kvtier.hf.prompt_cache(model, "/var/cache/kv")       # identity from the model
    kvtier.hf.save_cache(pc, prompt_ids, out.past_key_values)  # to page-locked RAM, then disk
    n, cache = kvtier.hf.restore_cache(pc, prompt_ids)         # n tokens served, or (0, None)
    model(prompt_ids[:, n:], past_key_values=cache, ...)

Through a :class:`PromptCache` opened on the model's device, a put copies the cache into
page-locked host memory (the write-behind saves it to disk), and a restore copies the longest
cached prefix from there, or streams it from disk, straight into the tensors the new cache is
made of. The identity (:func:`identity`) is derived from the model's configuration, dtype and
weights, so another model or fine-tune never restores these entries.
"""
import hashlib
import json
import struct
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from .caches import KVCache
from .device import Device
from .entry import Entry
from .errors import UnsupportedError
from .pcache import PromptCache
from .store import Store

_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16,
                 "float32": torch.float32}


def _layers(cache: Any) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) of every layer of a ``DynamicCache`` (transformers 4.56+ or older)."""
    if hasattr(cache, "layers"):
        out = []
        for i, layer in enumerate(cache.layers):
            if type(layer).__name__ != "DynamicLayer":
                raise UnsupportedError(f"layer {i}: {type(layer).__name__} is not mapped "
                                       "(full-attention DynamicLayer only)")
            out.append((layer.keys, layer.values))
        return out
    return list(zip(cache.key_cache, cache.value_cache))


def _tokens(ids: Any) -> Any:
    t = torch.as_tensor(ids)
    if t.dim() == 2:
        if t.shape[0] != 1:
            raise UnsupportedError("one sequence at a time (batch size 1)")
        t = t[0]
    return t.to("cpu", torch.int32).numpy()


# Two fixed odd multipliers (as signed 64-bit): the weightings of weights_digest's sums.
_K1, _K2 = -7046029254386353131, 0x2545F4914F6CDD1D


def weights_digest(model: Any) -> str:
    """A digest of every parameter and buffer of ``model`` (names, dtypes, shapes and bytes),
    computed where they live: each tensor's bytes as 64-bit words, summed under two fixed
    position weightings (wrapping), then the sums hashed; any changed word changes it."""
    h = hashlib.blake2b(digest_size=16)
    named = sorted(list(model.named_parameters()) + list(model.named_buffers()),
                   key=lambda kv: kv[0])
    for name, t in named:
        t = t.detach().contiguous().reshape(-1)
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        b = t.view(torch.uint8)
        if b.numel() % 8:
            b = torch.cat([b, b.new_zeros(8 - b.numel() % 8)])
        w = b.view(torch.int64)
        i = torch.arange(1, w.numel() + 1, device=w.device, dtype=torch.int64)
        sums = (w * (i * _K1)).sum(), ((w ^ (i * _K2)) * _K1).sum()
        h.update(struct.pack("<qq", int(sums[0]), int(sums[1])))
    return h.hexdigest()


def identity(model: Any, *, tokenizer: Any = None,
             digest: Optional[str] = None) -> Dict[str, str]:
    """The store identity of ``model``: ``model_id`` (its name or class),
    ``config_fingerprint`` (its configuration, parameter dtype and :func:`weights_digest`, or
    ``digest`` when the caller has one) and ``tokenizer_hash`` (the tokenizer's vocabulary, or
    the configured vocabulary size without one)."""
    cfg = getattr(model, "config", None)
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else {"repr": repr(model)}
    d = {k: v for k, v in d.items() if k not in ("_name_or_path", "transformers_version")}
    dtype = next(iter(model.parameters())).dtype
    fp = hashlib.blake2b(digest_size=16)
    fp.update(json.dumps(d, sort_keys=True, default=str).encode())
    fp.update(f"|{dtype}|{digest or weights_digest(model)}".encode())
    if tokenizer is not None:
        vocab = sorted(tokenizer.get_vocab().items())
        tok = hashlib.blake2b(json.dumps(vocab).encode(), digest_size=16).hexdigest()
    else:
        tok = f"vocab-{getattr(cfg, 'vocab_size', 0)}"
    name = getattr(cfg, "name_or_path", "") or type(model).__name__
    return dict(model_id=name, config_fingerprint=fp.hexdigest(), tokenizer_hash=tok)


def model_device(model: Any) -> Device:
    """The :class:`Device` of ``model``'s parameters: its CUDA device, or the host stand-in."""
    dev = next(iter(model.parameters())).device
    return Device.cuda(dev.index or 0) if dev.type == "cuda" else Device.host()


def prompt_cache(model: Any, cold_dir: Any = None, *, tokenizer: Any = None,
                 digest: Optional[str] = None, **opts: Any) -> PromptCache:
    """A :class:`PromptCache` for ``model``: its :func:`identity`, on its device
    (:func:`model_device`); ``opts`` are PromptCache's (``ram_max_bytes``, ...).
    ``share_prefixes`` is off unless given: restores of shared entries into GPU memory cost
    several times a whole entry's today (docs/SHARING.md §8)."""
    opts.setdefault("device", model_device(model))
    opts.setdefault("share_prefixes", False)
    return PromptCache(cold_dir, **identity(model, tokenizer=tokenizer, digest=digest), **opts)


def _torch_device(dev: Device) -> str:
    return "cpu" if dev.ordinal < 0 else f"cuda:{dev.ordinal}"


def _adopt(cache: Any, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
    """Make ``k``, ``v`` layer ``i`` of ``cache`` as they are (``update`` would copy them)."""
    cache.update(k[:, :, :0], v[:, :, :0], i)  # creates and initialises the layer
    if hasattr(cache, "layers"):
        cache.layers[i].keys, cache.layers[i].values = k, v
    else:
        cache.key_cache[i], cache.value_cache[i] = k, v


def save_cache(store: Union[Store, PromptCache], input_ids: Any, cache: Any, *,
               namespace: Optional[str] = None) -> None:
    """Store ``cache`` (the state after ``input_ids``) under those tokens. Into a
    :class:`Store`: straight from the device, durable on return. Into a :class:`PromptCache`
    opened on the cache's device: copied into its page-locked RAM (the write-behind saves it).
    The cache must hold exactly ``len(input_ids)`` tokens."""
    tok = _tokens(input_ids)
    caches = []
    for i, (k, v) in enumerate(_layers(cache)):
        if k.dim() != 4 or k.shape[0] != 1 or k.shape[2] != len(tok):
            raise UnsupportedError(f"layer {i}: keys of shape {tuple(k.shape)} for "
                                   f"{len(tok)} tokens (batch 1, [1, heads, tokens, dim])")
        caches.append(KVCache(k.contiguous(), v.contiguous()))
    store.put(Entry(tok, caches, namespace=namespace))


def _place_kv(tensors: List[torch.Tensor], device: str) -> Any:
    """A placement of every kv tensor of a header as a new tensor on ``device``."""
    def place(h: Any) -> List[torch.Tensor]:
        tensors.clear()
        for c in h.caches:
            if c["kind"] != "kv":
                raise UnsupportedError(f"a {c['kind']} cache is not a DynamicCache layer")
            for t in c["tensors"]:
                tensors.append(torch.empty(t["shape"], dtype=_TORCH_DTYPES[t["dtype"]],
                                           device=device))
        return tensors
    return place


def _as_device(device: Any) -> Device:
    """A :class:`Device` for ``device``: itself, or from a torch device or its name ("cpu":
    the host stand-in; "cuda" or "cuda:N": that GPU; None: CUDA device 0)."""
    if isinstance(device, Device):
        return device
    d = torch.device(device or "cuda")
    if d.type == "cpu":
        return Device.host()
    if d.type == "cuda":
        return Device.cuda(d.index or 0)
    raise UnsupportedError(f"restore_cache: device {device!r}: only cpu and cuda devices are supported")


def restore_cache(store: Union[Store, PromptCache], input_ids: Any, *, device: Any = None,
                  namespace: Optional[str] = None, cache_cls: Any = None
                  ) -> Tuple[int, Optional[Any]]:
    """The longest cached prefix of ``input_ids`` as a new ``DynamicCache``: ``(n, cache)``
    with the first ``n`` tokens served, or ``(0, None)`` on a miss (a corrupt entry is a
    miss). ``n`` is at most ``len(input_ids) - 1``: the last token is left for the model to
    compute its logits. From a :class:`PromptCache` (opened with a device): RAM, then disk,
    then remote, the bytes landing in the cache's final tensors on that device. From a
    :class:`Store`: restored into tensors on ``device``: a :class:`Device`, or a torch device
    or its name ("cpu" restores into host memory; default: CUDA device 0)."""
    if cache_cls is None:
        from transformers import DynamicCache
        cache_cls = DynamicCache
    tok = _tokens(input_ids)
    tensors: List[torch.Tensor] = []
    pending = None
    if isinstance(store, PromptCache):
        if store.device is None:
            raise UnsupportedError("the prompt cache has no device (PromptCache(device=...))")
        r = store.take_to_device(tok, _place_kv(tensors, _torch_device(store.device)),
                                 namespace, layerwise=True)
        if r is None:
            return 0, None
        n, pending = len(r[0].tokens), r[2]
    else:
        hit = store.find(tok, namespace)
        if not hit:
            return 0, None
        dev = _as_device(device)
        if store.restore_to_device(hit, dev, _place_kv(tensors, _torch_device(dev))) is None:
            return 0, None
        n = hit.prefix_len
        tensors = [t[:, :, :n].contiguous() if t.shape[2] != n else t for t in tensors]
    cache = cache_cls()
    for i in range(0, len(tensors), 2):
        _adopt(cache, i // 2, tensors[i], tensors[i + 1])
    if pending is not None:
        _wait_per_layer(cache, pending, tensors)
    return n, cache


def _stream_handle(t: torch.Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _wait_per_layer(cache: Any, pending: Any, tensors: List[torch.Tensor]) -> None:
    """Layer ``i`` of ``cache`` is read only once the current stream has waited for its
    copies (slots ``2i``, ``2i + 1``): the restore overlaps the model's first layers."""
    update = cache.update
    waited = set()

    def waiting_update(k: torch.Tensor, v: torch.Tensor, layer_idx: int, *a: Any,
                       **kw: Any) -> Any:
        if layer_idx not in waited:
            waited.add(layer_idx)
            s = _stream_handle(k)
            pending.wait(2 * layer_idx, s)
            pending.wait(2 * layer_idx + 1, s)
        return update(k, v, layer_idx, *a, **kw)

    cache.update = waiting_update
    # ended (its copies done) when the cache goes, before the tensors they write are freed
    cache._kvtier_take = (tensors, pending)


def wait_restored(cache: Any) -> None:
    """Make the current stream wait for every layer of a cache :func:`restore_cache` made
    (before reading its tensors other than through the model)."""
    held = getattr(cache, "_kvtier_take", None)
    if held is None:
        return
    pending = held[1]
    layers = _layers(cache)
    s = _stream_handle(layers[0][0]) if layers else 0
    for slot in range(2 * len(layers)):
        pending.wait(slot, s)
