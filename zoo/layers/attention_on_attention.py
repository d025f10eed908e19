"""Attention on attention (Huang et al. 2019, AoANet; x-transformers' on_attn): after attention, the attended vector
v_hat (the heads' outputs joined) and the query x give an information vector and a sigmoid gate,
    i = W_i [v_hat; x] + b_i        g = sigmoid(W_g [v_hat; x] + b_g)        out = g * i
a GLU that replaces the output projection, so a layer can pass on little where attention found nothing relevant.

An attention part (it adds weights), built on MHA: the attention itself is unchanged, so the fused kernel still
computes it. `query` true (default) is the paper's: both read the query too, here the attention's input x (in
cross-attention the decoder's); false is x-transformers' on_attn, a GLU of v_hat alone. Each token's output is its
own, so causality and cached decoding are unchanged. n_kv_heads shares key/value heads as GQA (v_hat is the query
heads' outputs joined, as MHA's); the options of every attention (sigmoid, sparse_topk) apply to the attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from zoo.component import Context
from zoo.layers.attention import Attention, HeadsOptions, kv_heads
from zoo.registry import ATTENTION


@dataclass(kw_only=True)
class AoAOptions(HeadsOptions):
    query: bool = True  # information and gate read the query as well as v_hat (the paper; false: x-transformers)


class AttentionOnAttention(Attention):
    residual_outputs = ("aoa",)  # writes into the residual stream: depth-scaled init

    def __init__(self, ctx: Context, opts: AoAOptions):
        super().__init__(ctx, opts, kv_heads(ctx, opts))
        del self.out, self.out_dropout  # the GLU below takes the output projection's place
        self.query = opts.query
        self.aoa = nn.Linear(ctx.n_heads * self.head_dim + (ctx.d_model if opts.query else 0), 2 * ctx.d_model,
                             bias=ctx.bias)  # [information; gate]
        self.aoa_dropout = nn.Dropout(ctx.dropout)

    def _output(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The heads' outputs y (B, H, T, hd) joined are v_hat; x, the layer's input, is the query."""
        attended = y.transpose(1, 2).flatten(2)  # v_hat (B, T, H * hd)
        info, gate = self.aoa(torch.cat([attended, x], -1) if self.query else attended).chunk(2, dim=-1)
        return self.aoa_dropout(info * torch.sigmoid(gate))


@ATTENTION.register("attention_on_attention", options=AoAOptions, examples=[{}, {"query": False},
                                                                              {"n_kv_heads": 1, "sparse_topk": 3}])
def attention_on_attention(ctx: Context, opts: AoAOptions) -> AttentionOnAttention:
    """Attention on attention: a sigmoid-gated information vector of the attended vector and the query (Huang et al.
    2019)."""
    return AttentionOnAttention(ctx, opts)
