"""Attention on attention (Huang et al. 2019, AoANet; x-transformers' on_attn): after attention, the attended vector
v_hat (the heads' outputs joined) and the query x give an information vector and a sigmoid gate,
    i = W_i [v_hat; x] + b_i        g = sigmoid(W_g [v_hat; x] + b_g)        out = g * i
a GLU that replaces the output projection, so a layer can pass on little where attention found nothing relevant.

An attention part (it adds weights), built on MHA: the attention itself is unchanged, so the fused kernel still
computes it. `query` true (default) is the paper's: both read the query too, here the attention's input x (in
cross-attention the decoder's); false is x-transformers' on_attn, a GLU of v_hat alone. Each token's output is its
own, so causality and cached decoding are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from zoo.component import Context
from zoo.layers.attention import Attention, AttentionOptions, KVCache
from zoo.layers.position import Position
from zoo.registry import ATTENTION


@dataclass(kw_only=True)
class AoAOptions(AttentionOptions):
    query: bool = True  # information and gate read the query as well as v_hat (the paper; false: x-transformers)


class AttentionOnAttention(Attention):
    residual_outputs = ("aoa",)  # writes into the residual stream: depth-scaled init

    def __init__(self, ctx: Context, opts: AoAOptions):
        super().__init__(ctx, opts, ctx.n_heads)
        self.out, self.out_dropout = nn.Identity(), nn.Identity()  # MHA's forward then gives v_hat (B, T, H * hd)
        self.query = opts.query
        self.aoa = nn.Linear(ctx.n_heads * self.head_dim + (ctx.d_model if opts.query else 0), 2 * ctx.d_model,
                             bias=ctx.bias)  # [information; gate]
        self.aoa_dropout = nn.Dropout(ctx.dropout)

    def forward(self, x: torch.Tensor, pos: Position, mask: torch.Tensor | None = None, is_causal: bool = False,
                context: torch.Tensor | None = None, cache: KVCache | None = None, offset: int = 0,
                value_embed: torch.Tensor | None = None) -> torch.Tensor:
        attended = super().forward(x, pos, mask, is_causal, context, cache, offset, value_embed)  # v_hat
        info, gate = self.aoa(torch.cat([attended, x], -1) if self.query else attended).chunk(2, dim=-1)
        return self.aoa_dropout(info * torch.sigmoid(gate))


@ATTENTION.register("attention_on_attention", options=AoAOptions, examples=[{}, {"query": False}])
def attention_on_attention(ctx: Context, opts: AoAOptions) -> AttentionOnAttention:
    """Attention on attention: a sigmoid-gated information vector of the attended vector and the query (Huang et al.
    2019)."""
    return AttentionOnAttention(ctx, opts)
