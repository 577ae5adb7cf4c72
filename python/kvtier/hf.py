"""Hugging Face ``transformers``: persist and restore a model's ``DynamicCache``.

The cache's layers ([batch, kv_heads, tokens, head_dim] keys and values, usually CUDA tensors)
become one :class:`KVCache` each, saved straight from the device; a restore finds the longest
stored prefix of a prompt and reads it straight into new tensors on the device, as a
``DynamicCache`` the model continues from. Only full-attention layers (``DynamicLayer``) are
mapped; caches of other layer types (sliding windows, quantized, offloaded) raise
:class:`UnsupportedError` rather than being approximated.

    kvtier.hf.save_cache(store, prompt_ids, out.past_key_values)
    n, cache = kvtier.hf.restore_cache(store, prompt_ids)     # n tokens served, or (0, None)
    model(prompt_ids[:, n:], past_key_values=cache, ...)
"""
from typing import Any, List, Optional, Tuple

import torch

from .caches import KVCache
from .device import Device
from .entry import Entry
from .errors import UnsupportedError
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


def save_cache(store: Store, input_ids: Any, cache: Any, *,
               namespace: Optional[str] = None) -> None:
    """Store ``cache`` (the state after ``input_ids``) under those tokens, straight from the
    device, durable on return. The cache must hold exactly ``len(input_ids)`` tokens."""
    tok = _tokens(input_ids)
    caches = []
    for i, (k, v) in enumerate(_layers(cache)):
        if k.dim() != 4 or k.shape[0] != 1 or k.shape[2] != len(tok):
            raise UnsupportedError(f"layer {i}: keys of shape {tuple(k.shape)} for "
                                   f"{len(tok)} tokens (batch 1, [1, heads, tokens, dim])")
        caches.append(KVCache(k.contiguous(), v.contiguous()))
    store.put(Entry(tok, caches, namespace=namespace))


def restore_cache(store: Store, input_ids: Any, *, device: Any = None,
                  namespace: Optional[str] = None, cache_cls: Any = None
                  ) -> Tuple[int, Optional[Any]]:
    """The longest stored prefix of ``input_ids`` as a new ``DynamicCache`` on ``device``
    (default: CUDA device 0; :meth:`Device.host` gives CPU tensors): ``(n, cache)`` with the
    first ``n`` tokens served, or ``(0, None)`` on a miss (a corrupt entry is a miss). ``n`` is
    at most ``len(input_ids) - 1``: the last token is left for the model to compute its
    logits. ``cache_cls`` (default ``transformers.DynamicCache``) builds the cache."""
    if cache_cls is None:
        from transformers import DynamicCache as cache_cls
    tok = _tokens(input_ids)
    hit = store.find(tok, namespace)
    if not hit:
        return 0, None
    dev = device if isinstance(device, Device) else Device.cuda(
        torch.device(device or "cuda").index or 0)
    where = "cpu" if dev.ordinal < 0 else f"cuda:{dev.ordinal}"  # the host stand-in: CPU
    tensors: List[torch.Tensor] = []

    def place(h: Any) -> List[torch.Tensor]:
        for c in h.caches:
            if c["kind"] != "kv":
                raise UnsupportedError(f"a {c['kind']} cache is not a DynamicCache layer")
            for t in c["tensors"]:
                tensors.append(torch.empty(t["shape"], dtype=_TORCH_DTYPES[t["dtype"]],
                                           device=where))
        return tensors

    if store.restore_to_device(hit, dev, place) is None:
        return 0, None
    cache = cache_cls()
    n = hit.prefix_len
    for i in range(0, len(tensors), 2):
        cache.update(tensors[i][:, :, :n].contiguous(), tensors[i + 1][:, :, :n].contiguous(),
                     i // 2)
    return n, cache
