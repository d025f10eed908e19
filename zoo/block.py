"""One Transformer block, used by every lineage: self-attention, optional cross-attention, FFN.

Which attention, norm, placement and FFN it holds was decided by the registries at build time;
the block only wires them together.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from zoo.layers.attention import KVCache
from zoo.layers.position import Position


class TransformerBlock(nn.Module):
    def __init__(self, make_attention: Callable[..., nn.Module], make_ffn: Callable[[], nn.Module],
                 make_norm: Callable[[], nn.Module], residual: type[nn.Module], cross: bool = False):
        super().__init__()
        self.attn = residual(make_attention(), make_norm)
        self.cross = residual(make_attention(cross=True), make_norm) if cross else None
        self.ffn = residual(make_ffn(), make_norm)

    def forward(self, x: torch.Tensor, pos: Position, mask: torch.Tensor | None, is_causal: bool,
                memory: torch.Tensor | None = None, memory_mask: torch.Tensor | None = None,
                cache: tuple[KVCache, KVCache] | None = None, offset: int = 0) -> torch.Tensor:
        self_cache, cross_cache = cache if cache is not None else (None, None)
        x = self.attn(x, pos=pos, mask=mask, is_causal=is_causal, cache=self_cache, offset=offset)
        if self.cross is not None:
            x = self.cross(x, pos=NO_POSITION, mask=memory_mask, context=memory, cache=cross_cache)
        return self.ffn(x)


NO_POSITION = Position(0, 1, 0)  # cross-attention compares two sequences: no relative positions
