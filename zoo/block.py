"""One Transformer block, used by every lineage: self-attention, optional cross-attention, FFN.

Which attention, norm, placement and FFN it holds was decided by the registries at build time;
the block only wires them together. A sequential placement (pre, post, sandwich) wraps each sublayer
in its own residual step, run in turn; a parallel one (`placement.parallel`) wraps them all in one step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from zoo.component import Context, Options, build, declared
from zoo.layers.attention import KVCache
from zoo.layers.mix import ScalarMix
from zoo.layers.position import Position
from zoo.registry import ATTENTION, FFN
from zoo.schema import ModelSpec


class TransformerBlock(nn.Module):
    def __init__(self, ctx: Context, cfg: ModelSpec, residual: Any, cross: bool = False):
        """residual: the placement's wrapper class (zoo.layers.residual), from the RESIDUAL registry."""
        super().__init__()
        sublayers = {"attn": build(ATTENTION, cfg.attention, ctx)}
        if cross:
            sublayers["cross"] = build(ATTENTION, cfg.attention, replace(ctx, cross=True))
        sublayers["ffn"] = build(FFN, cfg.ffn, ctx)
        self.parallel: nn.Module | None
        self.window = sublayers["attn"].window  # the stack's mask follows its self-attention's window
        self.value_dim = declared(sublayers["attn"], "value_dim")  # the width of a value embedding, if it takes one
        # model.embed_skip: the block's input is a * x + b * x0, x0 the stack's embedding output (a=1, b=0 at init)
        self.embed_skip = ScalarMix("embedding", 1.0, 0.0) if cfg.embed_skip else None
        if residual.parallel:  # one residual step around all of them, on one norm
            self.parallel, self.attn, self.cross, self.ffn = residual(sublayers, ctx.norm), None, None, None
        else:  # one residual step around each, in turn
            self.parallel = None
            self.attn, self.cross, self.ffn = (residual(sublayers[k], ctx.norm) if k in sublayers else None
                                               for k in ("attn", "cross", "ffn"))

    def forward(self, x: torch.Tensor, pos: Position, mask: torch.Tensor | None, is_causal: bool,
                memory: torch.Tensor | None = None, memory_mask: torch.Tensor | None = None,
                cache: tuple[KVCache, KVCache] | None = None, offset: int = 0, x0: torch.Tensor | None = None,
                value_embed: torch.Tensor | None = None, state: Any = None) -> torch.Tensor:
        """x0: the stack's embedding output (model.embed_skip); value_embed: this layer's value embedding of the
        tokens (model.value_embeddings), given only to a layer that has a table; state: what the placement carries
        beside x (its `carry`), handed to each residual step."""
        self_cache, cross_cache = cache if cache is not None else (None, None)
        kw: dict[str, dict[str, Any]] = {
            "attn": dict(pos=pos, mask=mask, is_causal=is_causal, cache=self_cache, offset=offset),
            "cross": dict(pos=NO_POSITION, mask=memory_mask, context=memory, cache=cross_cache), "ffn": {}}
        if value_embed is not None:  # an attention without value embeddings keeps the plain signature
            kw["attn"]["value_embed"] = value_embed
        if self.embed_skip is not None:
            x = self.embed_skip(x, x0)
        carried = {} if state is None else {"state": state}
        if self.parallel is not None:
            return self.parallel(x, **carried, **kw)
        for name, step in (("attn", self.attn), ("cross", self.cross), ("ffn", self.ffn)):
            if step is not None:  # cross: only in a decoder that cross-attends
                x = step(x, **carried, **kw[name])
        return x


NO_POSITION = Position(Context(d_model=1, n_heads=1, max_seq_len=0), Options())  # cross-attention: no positions
