"""Token shift (model.shift_tokens; x-transformers' `shift_tokens`, from RWKV, Peng et al. 2023): each sublayer reads
some of its input's channels from neighbouring tokens, a cheap local mixing before attention or the FFN.

An option of the model, not a registered part: it wraps every sublayer of every block (self-attention,
cross-attention, FFN, whatever the part), inside the placement, after its norm, as x-transformers does.

With n = model.shift_tokens (0: off) the shifts are 0, 1, ..., n in a causal stack and -n, ..., n in a bidirectional
one (an encoder also reads the next tokens, as x-transformers does); the channels are cut into that many groups of
d_model // (number of shifts), group j taken from the token shifts[j] steps back, the channels left over unshifted.
n = 1 in a decoder: half the channels from the previous token. Past the sequence's ends the groups read zeros, and a
padded token's input is zeroed before any other reads it (x-transformers zeroes it for its attentions only, not its
FFNs): a padded row gives its real tokens what they get alone.

Cached decoding: each causal step keeps its last n inputs in the layer's KV cache (`KVCache.past`, one entry per
step), so the next tokens read them as a full forward would. That is n tokens per step, whatever the length: nothing
per token to add to cache_bytes_per_token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class ShiftInput:
    """What the block hands each shifted step besides its input."""

    padding: torch.Tensor | None  # (B, T): True for the real ones of this forward's tokens
    past: dict[str, torch.Tensor] | None  # the layer's KVCache.past (cached decoding); None: no cache


def token_shifts(n: int, causal: bool) -> tuple[int, ...]:
    """How many steps back each channel group reads: 0..n causal, -n..n bidirectional."""
    return tuple(range(0 if causal else -n, n + 1))


class TokenShift(nn.Module):
    """f(shift(x)): the sublayer f on its input with channel groups taken from earlier (and, bidirectional, later)
    tokens. key names this step in the layer's cache."""

    def __init__(self, f: nn.Module, n: int, causal: bool, key: str):
        super().__init__()
        self.f, self.n, self.causal, self.key = f, n, causal, key
        self.shifts = token_shifts(n, causal)

    def forward(self, x: torch.Tensor, shift: ShiftInput | None = None, **kw: Any) -> torch.Tensor:
        return self.f(self.shifted(x, shift), **kw)

    def shifted(self, x: torch.Tensor, shift: ShiftInput | None) -> torch.Tensor:
        """x (B, T, d) -> (B, T, d), its channel groups shifted."""
        if shift is not None and shift.padding is not None:
            x = x.masked_fill(~shift.padding[..., None], 0.0)
        b, t, d = x.shape
        kept = None if shift is None else shift.past
        if kept is not None and not self.causal:
            raise ValueError("token shift: a bidirectional stack reads later tokens, which a cache does not have")
        before = kept.get(self.key) if kept is not None else None
        before = x.new_zeros(b, self.n, d) if before is None else before  # the n tokens before these: zeros at 0
        full = torch.cat([before, x, x.new_zeros(b, self.n, d)], dim=1)  # (B, n + T + n, d)
        if kept is not None:
            kept[self.key] = full[:, t: t + self.n]  # the last n inputs, for the next tokens
        size = d // len(self.shifts)
        groups = [full[:, self.n - s: self.n - s + t, j * size: (j + 1) * size] for j, s in enumerate(self.shifts)]
        return torch.cat([*groups, x[..., len(self.shifts) * size:]], dim=-1)


def shifting(f: nn.Module, n: int, causal: bool, key: str) -> nn.Module:
    """f wrapped in a TokenShift when model.shift_tokens = n > 0, else f itself."""
    return TokenShift(f, n, causal, key) if n else f
