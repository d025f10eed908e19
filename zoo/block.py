"""One Transformer block, used by every lineage: self-attention, optional cross-attention, FFN.

Which attention, norm, placement and FFN it holds was decided by the registries at build time;
the block only wires them together.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from zoo.component import Context, Options, build
from zoo.layers.attention import KVCache
from zoo.layers.position import Position
from zoo.registry import ATTENTION, FFN


class TransformerBlock(nn.Module):
    def __init__(self, ctx: Context, cfg: dict, residual: type[nn.Module], cross: bool = False):
        super().__init__()
        self.attn = residual(build(ATTENTION, cfg["attention"], ctx), ctx.norm)
        cross_ctx = replace(ctx, cross=True)
        self.cross = residual(build(ATTENTION, cfg["attention"], cross_ctx), ctx.norm) if cross else None
        self.ffn = residual(build(FFN, cfg["ffn"], ctx), ctx.norm)

    def forward(self, x: torch.Tensor, pos: Position, mask: torch.Tensor | None, is_causal: bool,
                memory: torch.Tensor | None = None, memory_mask: torch.Tensor | None = None,
                cache: tuple[KVCache, KVCache] | None = None, offset: int = 0) -> torch.Tensor:
        self_cache, cross_cache = cache if cache is not None else (None, None)
        x = self.attn(x, pos=pos, mask=mask, is_causal=is_causal, cache=self_cache, offset=offset)
        if self.cross is not None:
            x = self.cross(x, pos=NO_POSITION, mask=memory_mask, context=memory, cache=cross_cache)
        return self.ffn(x)


NO_POSITION = Position(Context(d_model=1, n_heads=1, max_seq_len=0), Options())  # cross-attention: no positions
