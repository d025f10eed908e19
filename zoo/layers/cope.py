"""CoPE, contextual position encoding (Golovneva et al. 2024; x-transformers' use_cope): positions counted by the
model, not by tokens. For query i and key j, each key k from j up to the query adds a gate g_ik = sigmoid(s_ik),
s the query's scores; the count p_ij = sum_k g_ik (clamped to max_pos - 1) is a fractional position, whose
embedding interpolates a learned table e between floor(p) and ceil(p); the score becomes s_ij + q_i . e[p_ij].

An attention part, not a position scheme: the gates are the layer's own scores and the added term reads its
queries, while a position scheme's score_bias sees neither (zoo.component.PositionPart). Like the paper and
x-transformers, the gates come from the final scores: scaled, with any position bias (ALiBi) and the mask applied,
so a masked key (a later token, padding, outside a window) has gate sigmoid(-inf) = 0 and is not counted; the
added term is not scaled by 1 / sqrt(d). The table starts at zero, as both do: a CoPE layer starts as plain
attention.

Keys after the query are masked in a causal stack, so p_ij = sum over keys j..end is the paper's sum over j..i. In
non-causal attention (an encoder, cross-attention), which the paper does not define, the same sum counts from key
j to the last key, as x-transformers' CoPE computes it without its causal check: a contextual position from the
end of the sequence. Each query's row is its own, so cached decoding equals recomputation. The scores are
needed, so it is always computed written out (backend is ignored).

The gated scores plus the term become weights as any attention's do (AttentionBase._normalise): the softmax, or
with attention.sigmoid / attention.sparse_topk those options' weights of the same logits, as x-transformers applies
its attn_fn after CoPE's term. n_kv_heads shares key/value heads as GQA; the table is shared by the query heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from zoo.component import Context, need
from zoo.layers.attention import Attention, HeadsOptions, kv_heads, masked_scores
from zoo.registry import ATTENTION


@dataclass(kw_only=True)
class CoPEOptions(HeadsOptions):
    max_pos: int = 16  # rows of the position table: counts are clamped to max_pos - 1 (x-transformers' cope_max_pos)


class CoPE(Attention):
    # not with norm=ngpt (AttentionPart.sphere): its position gates read the raw scores
    sphere = False
    pools_queries = False  # model.funnel's pooled queries: not through this forward
    constants = {"pos_emb": 0.0}  # the paper's and x-transformers' start: no position term

    def __init__(self, ctx: Context, opts: CoPEOptions):
        need(opts.max_pos >= 1, "attention.max_pos", f"must be a positive integer, got {opts.max_pos!r}")
        super().__init__(ctx, opts, kv_heads(ctx, opts))
        self.max_pos = opts.max_pos
        self.pos_emb = nn.Parameter(torch.zeros(opts.max_pos, self.head_dim))  # e[p], shared by the heads
        self.plain = False  # it needs the scores: never the fused kernel
        self.queries: torch.Tensor | None = None  # the queries of the written-out form, during its call

    def _written_out(self, q, k, v, mask, is_causal, qk_dim: int | None = None) -> torch.Tensor:
        # (the kernels' attention_written_out calls this directly) the term reads the queries: _weights sees scores
        self.queries = q
        try:
            return super()._written_out(q, k, v, mask, is_causal, qk_dim)
        finally:
            self.queries = None

    def _weights(self, scores, mask, is_causal, qk_dim: int) -> torch.Tensor:
        assert self.queries is not None  # set by _written_out, the only caller
        scores = masked_scores(scores / math.sqrt(qk_dim), mask, is_causal)  # (B, H, Tq, Tk), the gates' input
        return self._normalise(scores + self.position_scores(self.queries, scores))

    def position_scores(self, q: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """q_i . e[p_ij] (B, H, Tq, Tk) for masked scores (B, H, Tq, Tk) of the queries q (B, H, Tq, hd)."""
        gates = torch.sigmoid(scores.to(torch.promote_types(scores.dtype, torch.float32)))  # masked keys: 0
        pos = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=self.max_pos - 1)  # p_ij: keys j.. counted
        per_position = q @ self.pos_emb.t()  # (B, H, Tq, max_pos): q_i . e[p] at each whole p
        floor = pos.floor()
        low, high = per_position.gather(-1, floor.long()), per_position.gather(-1, pos.ceil().long())
        return (low + (pos - floor) * (high - low)).to(scores.dtype)  # e interpolated, then dotted: the same

    def flops(self, t: int) -> int:
        """Forward FLOPs per token at context t: MHA's (GQA's), the q.e products (2 max_pos hd a head), and a few per
        score for the gate, the count and the interpolation (about 4 per score)."""
        return super().flops(t) + self.n_heads * (2 * self.max_pos * self.head_dim + 4 * t)


@ATTENTION.register("cope", options=CoPEOptions, examples=[{}, {"max_pos": 4, "window": 3},
                                                           {"n_kv_heads": 1, "sigmoid": True}, {"sparse_topk": 3}])
def cope(ctx: Context, opts: CoPEOptions) -> CoPE:
    """CoPE: each score gains q . e[p], p the sum of sigmoid gates from the key to the query (Golovneva et al.
    2024)."""
    return CoPE(ctx, opts)
