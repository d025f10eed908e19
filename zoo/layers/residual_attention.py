"""Residual attention (He et al. 2020, RealFormer; x-transformers' residual_attn): each layer's pre-softmax scores
are its own plus the previous layer's, S_l = q_l k_l^T / sqrt(d) + S_(l-1), and S_l goes on to the next layer, a
residual path along the scores beside the one along the hidden states.

An attention part with the stack's score seam (zoo.component.AttentionPart.chains_scores): the stack hands its
self-attention layers one list per forward, from which each takes the previous layer's S and leaves its own. What
goes on is the paper's S: before the mask and any position bias (ALiBi, T5, dynamic), which every layer adds once
to its own; x-transformers hands on its scores after them, so a bias adds up over its layers (the two agree without
a bias: a masked key is masked in every layer). Cross-attention layers are not chained (x-transformers'
cross_residual_attn is not offered); they attend as MHA. With a KV cache each layer's S is of the new queries over
all keys, as the previous layer's is, so cached decoding equals recomputation. The scores are needed, so it is always
computed written out (backend is ignored).

The summed scores, masked, become weights as any attention's do (AttentionBase._normalise): the softmax, or with
attention.sigmoid / attention.sparse_topk those options' weights of them; what is handed on is S_l either way.
n_kv_heads shares key/value heads as GQA; S_l is per query head.
"""

from __future__ import annotations

import math

import torch

from zoo.component import Context, need
from zoo.layers.attention import Attention, HeadsOptions, KVCache, kv_heads, masked_scores
from zoo.layers.position import Position
from zoo.registry import ATTENTION


class ResidualAttention(Attention):
    pools_queries = False  # model.funnel's pooled queries: not through this forward

    chains_scores = True

    def __init__(self, ctx: Context, opts: HeadsOptions):
        super().__init__(ctx, opts, kv_heads(ctx, opts))
        self.plain = False  # it needs the scores: never the fused kernel
        self.chain: list[torch.Tensor] | None = None  # the stack's list of scores, during a forward

    def forward(self, x: torch.Tensor, pos: Position, mask: torch.Tensor | None = None, is_causal: bool = False,
                context: torch.Tensor | None = None, cache: KVCache | None = None, offset: int = 0,
                value_embed: torch.Tensor | None = None, queries: int | None = None,
                scores: list[torch.Tensor] | None = None) -> torch.Tensor:
        """As MHA's forward; scores: the stack's list, its last entry the previous layer's scores (empty at the
        first layer; None: not chained)."""
        need(queries is None, "funnel", "this attention does not pool its queries (pools_queries is false)")
        self.chain = scores  # read and extended by _weights, within this call
        try:
            return super().forward(x, pos, mask, is_causal, context, cache, offset, value_embed)
        finally:
            self.chain = None

    def _weights(self, scores, mask, is_causal, qk_dim: int) -> torch.Tensor:
        scores = scores / math.sqrt(qk_dim)  # (B, H, Tq, Tk)
        if self.chain:
            scores = scores + self.chain.pop()  # the previous layer's, of the same queries and keys
        if self.chain is not None:
            self.chain.append(scores)
        return self._normalise(masked_scores(scores, mask, is_causal))


@ATTENTION.register("residual_attention", options=HeadsOptions,
                    examples=[{}, {"window": 3}, {"n_kv_heads": 1, "sigmoid": True}, {"sparse_topk": 3}])
def residual_attention(ctx: Context, opts: HeadsOptions) -> ResidualAttention:
    """Residual attention: each layer's pre-softmax scores plus the previous layer's (He et al. 2020, RealFormer)."""
    return ResidualAttention(ctx, opts)
