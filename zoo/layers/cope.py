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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zoo.component import Context, need
from zoo.layers.attention import Attention, AttentionOptions, attention_mask
from zoo.registry import ATTENTION


@dataclass(kw_only=True)
class CoPEOptions(AttentionOptions):
    max_pos: int = 16  # rows of the position table: counts are clamped to max_pos - 1 (x-transformers' cope_max_pos)


class CoPE(Attention):
    constants = {"pos_emb": 0.0}  # the paper's and x-transformers' start: no position term

    def __init__(self, ctx: Context, opts: CoPEOptions):
        need(opts.max_pos >= 1, "attention.max_pos", f"must be a positive integer, got {opts.max_pos!r}")
        super().__init__(ctx, opts, ctx.n_heads)
        self.max_pos = opts.max_pos
        self.pos_emb = nn.Parameter(torch.zeros(opts.max_pos, self.head_dim))  # e[p], shared by the heads

    def _attend(self, q, k, v, mask, is_causal, qk_dim: int | None = None) -> torch.Tensor:
        return self._written_out(q, k, v, mask, is_causal, qk_dim)  # it needs the scores: never the fused kernel

    def _written_out(self, q, k, v, mask, is_causal, qk_dim: int | None = None) -> torch.Tensor:
        # (overrides the written-out form itself, which the kernels' attention_written_out calls directly)
        scores = masked(q @ k.transpose(-2, -1) / math.sqrt(qk_dim or q.shape[-1]), mask, is_causal)  # (B, H, Tq, Tk)
        weights = (scores + self.position_scores(q, scores)).softmax(
            dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)
        if self.record:
            self.weights = weights.detach()
        return F.dropout(weights, self.dropout if self.training else 0.0) @ v

    def position_scores(self, q: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """q_i . e[p_ij] (B, H, Tq, Tk) for masked scores (B, H, Tq, Tk) of the queries q (B, H, Tq, hd)."""
        gates = torch.sigmoid(scores.to(torch.promote_types(scores.dtype, torch.float32)))  # masked keys: 0
        pos = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=self.max_pos - 1)  # p_ij: keys j.. counted
        per_position = q @ self.pos_emb.t()  # (B, H, Tq, max_pos): q_i . e[p] at each whole p
        floor = pos.floor()
        low, high = per_position.gather(-1, floor.long()), per_position.gather(-1, pos.ceil().long())
        return (low + (pos - floor) * (high - low)).to(scores.dtype)  # e interpolated, then dotted: the same

    def flops(self, t: int) -> int:
        """Forward FLOPs per token at context t: MHA's, the q.e products (2 max_pos hd a head), and a few per score
        for the gate, the count and the interpolation (about 4 per score)."""
        return super().flops(t) + self.n_heads * (2 * self.max_pos * self.head_dim + 4 * t)


def masked(scores: torch.Tensor, mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
    """Scaled scores (..., Tq, Tk) with the stack's mask applied as the softmax would: a bool mask's hidden keys
    -inf, a float one (a position bias, -inf where hidden) added; is_causal: queries are the last of the keys."""
    if is_causal:
        mask = attention_mask(scores.shape[-2], scores.shape[-1], True, None, scores.device)
    if mask is None:
        return scores
    return scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask


@ATTENTION.register("cope", options=CoPEOptions, examples=[{}, {"max_pos": 4, "window": 3}])
def cope(ctx: Context, opts: CoPEOptions) -> CoPE:
    """CoPE: each score gains q . e[p], p the sum of sigmoid gates from the key to the query (Golovneva et al.
    2024)."""
    return CoPE(ctx, opts)
