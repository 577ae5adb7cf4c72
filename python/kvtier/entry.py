"""An entry: the exact token prefix and one cache per donor layer, with identity metadata."""
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .caches import Cache
from .tensors import as_tokens


class Entry:
    """Tokens (int32) plus one :class:`Cache` per donor layer.

    ``namespace`` separates tenants or conversations sharing a store ("" when None).
    ``model_id``, ``config_fingerprint`` and ``tokenizer_hash`` are written into files saved
    with :func:`kvtier.save`; a store and a prompt cache fill them from their own identity.
    """

    def __init__(self, tokens: Any, caches: Sequence[Cache], *,
                 namespace: Optional[str] = None, model_id: Optional[str] = None,
                 config_fingerprint: Optional[str] = None,
                 tokenizer_hash: Optional[str] = None,
                 created_at: Optional[int] = None) -> None:
        self.tokens: np.ndarray = as_tokens(tokens)
        self.caches: List[Cache] = list(caches)
        for i, c in enumerate(self.caches):
            if not isinstance(c, Cache):
                raise TypeError(f"caches[{i}]: expected a kvtier cache, got {type(c).__name__}")
        self.namespace = namespace
        self.model_id = model_id
        self.config_fingerprint = config_fingerprint
        self.tokenizer_hash = tokenizer_hash
        #: ms since the epoch (None: absent / now on save)
        self.created_at = created_at

    @property
    def n_tokens(self) -> int:
        """Number of tokens."""
        return int(self.tokens.shape[0])

    @property
    def nbytes(self) -> int:
        """Sum of the caches' state bytes."""
        return sum(c.nbytes for c in self.caches)

    @property
    def is_trimmable(self) -> bool:
        """Whether every cache is trimmable."""
        return all(c.is_trimmable for c in self.caches)

    def trim(self, n: int) -> None:
        """Drop the last ``n`` tokens from the tokens and every cache (StateError when a
        cache is not trimmable; nothing changes then)."""
        if n <= 0:
            return
        if not self.is_trimmable:
            from .errors import StateError
            raise StateError("entry is not trimmable (a wrapped ring or an ssm cache)")
        for c in self.caches:
            c.trim(n)
        self.tokens = self.tokens[:max(0, self.n_tokens - n)].copy()

    def _meta(self) -> Dict[str, Optional[str]]:
        return {"model_id": self.model_id, "config_fingerprint": self.config_fingerprint,
                "tokenizer_hash": self.tokenizer_hash, "ns": self.namespace}

    def _c_caches(self) -> List[Any]:
        return [c._c for c in self.caches]

    @classmethod
    def _from_ext(cls, t: Any) -> "Entry":
        tokens, caches, meta, created_at = t
        return cls(np.frombuffer(tokens, dtype=np.int32).copy(),
                   [Cache._wrap(c) for c in caches], namespace=meta["ns"],
                   model_id=meta["model_id"], config_fingerprint=meta["config_fingerprint"],
                   tokenizer_hash=meta["tokenizer_hash"],
                   created_at=None if created_at < 0 else created_at)

    def __repr__(self) -> str:
        ns = f", namespace={self.namespace!r}" if self.namespace else ""
        return f"Entry(n_tokens={self.n_tokens}, caches={len(self.caches)}{ns})"
