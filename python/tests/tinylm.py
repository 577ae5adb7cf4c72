"""A small decoder-only transformer in torch whose layers keep their state in kvtier caches:
full-attention layers in a KVCache, sliding-window layers in a RotatingCache (the mix of
Gemma-style models). Random weights from a fixed seed; float32 compute, bfloat16 caches."""
import math

import torch

import kvtier

VOCAB, DIM, HEADS, KV_HEADS, HEAD_DIM, FFN = 96, 64, 4, 2, 16, 128
WINDOW = 32
LAYERS = ("window", "window", "full", "window")  # sliding-window and full-attention layers


def rope(x, pos):
    """Rotary embedding of x [B, H, L, D] at absolute positions pos [L]."""
    half = HEAD_DIM // 2
    freq = 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half)
    ang = pos.float()[:, None] * freq[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class TinyLM:
    def __init__(self, seed=0):
        g = torch.Generator().manual_seed(seed)

        def w(*shape):
            return torch.randn(*shape, generator=g) / math.sqrt(shape[0])

        self.embed = torch.randn(VOCAB, DIM, generator=g)
        self.layers = [dict(q=w(DIM, HEADS * HEAD_DIM), k=w(DIM, KV_HEADS * HEAD_DIM),
                            v=w(DIM, KV_HEADS * HEAD_DIM), o=w(HEADS * HEAD_DIM, DIM),
                            up=w(DIM, FFN), down=w(FFN, DIM)) for _ in LAYERS]
        self.out = w(DIM, VOCAB)

    @staticmethod
    def new_caches():
        return [kvtier.RotatingCache(max_size=WINDOW) if kind == "window" else kvtier.KVCache()
                for kind in LAYERS]

    def forward(self, tokens, caches):
        """Logits [L, VOCAB] for tokens (1-D) appended to caches (one per layer)."""
        tokens = torch.as_tensor(tokens, dtype=torch.long)
        L = tokens.shape[0]
        start = caches[0].offset
        pos = torch.arange(start, start + L)
        x = self.embed[tokens][None]  # [1, L, DIM]
        for kind, p, cache in zip(LAYERS, self.layers, caches):
            h = torch.nn.functional.rms_norm(x, (DIM,)) if hasattr(torch.nn.functional, "rms_norm") \
                else x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            q = (h @ p["q"]).view(1, L, HEADS, HEAD_DIM).transpose(1, 2)
            k = (h @ p["k"]).view(1, L, KV_HEADS, HEAD_DIM).transpose(1, 2)
            v = (h @ p["v"]).view(1, L, KV_HEADS, HEAD_DIM).transpose(1, 2)
            q, k = rope(q, pos), rope(k, pos)
            kw, vw = cache.append(k.to(torch.bfloat16).contiguous(),
                                  v.to(torch.bfloat16).contiguous())
            kw, vw = kw.torch().float(), vw.torch().float()
            S = kw.shape[2]
            rep = HEADS // KV_HEADS
            kw, vw = kw.repeat_interleave(rep, dim=1), vw.repeat_interleave(rep, dim=1)
            att = (q @ kw.transpose(-1, -2)) / math.sqrt(HEAD_DIM)
            if L > 1:
                # multi-token windows are in temporal order, ending at the last new token
                kpos = torch.arange(cache.offset - S, cache.offset)
                allowed = kpos[None, :] <= pos[:, None]
                if kind == "window":
                    allowed &= kpos[None, :] > pos[:, None] - WINDOW
                att = att.masked_fill(~allowed, float("-inf"))
            # a single new token may read every row of the window (ring order is irrelevant)
            a = torch.softmax(att, dim=-1) @ vw
            x = x + a.transpose(1, 2).reshape(1, L, HEADS * HEAD_DIM) @ p["o"]
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            x = x + torch.relu(h @ p["up"]) @ p["down"]
        return (x[0] @ self.out)

    def generate(self, caches, fed, pending, n):
        """Greedy: feed `pending` (a token list not yet in the caches), then produce n
        tokens. Returns (new tokens, fed tokens after the run, the last token not fed)."""
        out = []
        fed = list(fed)
        for _ in range(n):
            logits = self.forward(pending, caches)
            fed += list(pending)
            tok = int(logits[-1].argmax())
            out.append(tok)
            pending = [tok]
        return out, fed, pending
