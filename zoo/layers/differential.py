"""Differential attention (Ye et al. 2024, "Differential Transformer"): each head's queries and keys are split in two
halves, each half makes its own softmax map, and the head attends with their difference, cancelling the attention
noise the two maps share:
    y_h = (softmax(q1_h k1_h^T / sqrt(d)) - lambda softmax(q2_h k2_h^T / sqrt(d))) v_h      d = head_dim / 2
    lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init            lq1, lk1, lq2, lk2: learned, size d, per layer
    lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1))                         l: the layer's number, counted from 1
    y'_h = (1 - lambda_init) norm(y_h)                                each head normalised on its own
The norm is the model's over each head: with RMSNorm the paper's code (one gain of head_dim shared by the heads),
with LayerNorm the paper's GroupNorm (one group per head). l is ctx.layer + 1, the block's place in the whole model:
an encoder-decoder's decoder counts on after the encoder's blocks (its layers sit after them on the path from the
source), and its cross-attention takes its block's l. `lambda_init` set to a number fixes it (the paper's ablation).

Heads: zoo's n_heads counts differential heads (the paper's h), each with a query and key of head_dim split into two
halves of head_dim / 2 and a value of head_dim, so the projections are MHA's at the same n_heads. The paper compares
a Transformer of 2h heads with h differential heads; in zoo that is mha at n_heads=2h against differential at
n_heads=h, each half as wide as the Transformer's heads: the choice stays a config number, not a hidden halving.
By linearity y_h = A1 v - lambda A2 v: two calls of the shared `_attend`, so the fused kernel, GQA sharing (both halves
of a key head serve its group), the other options and cached decoding (keys cached as halves) work as for MHA.
Attention dropout drops each map on its own. lambda's vectors take the standard init, N(0, init_std) (the paper's
code: N(0, 0.1)), so lambda starts near lambda_init. A part of its own: it adds those vectors and the head norm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from zoo.component import Context, need
from zoo.layers.attention import Attention, HeadsOptions, KVCache, kv_heads
from zoo.layers.position import Position
from zoo.registry import ATTENTION


@dataclass(kw_only=True)
class DifferentialOptions(HeadsOptions):
    lambda_init: float | None = None  # null: the paper's 0.8 - 0.6 exp(-0.3 (l - 1)) at layer l; a number: fixed


def paper_lambda_init(layer: int) -> float:
    """The paper's lambda_init at the block with index `layer` (from 0): 0.8 - 0.6 exp(-0.3 (l - 1)), l = layer + 1."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


class Differential(Attention):
    # not with norm=ngpt (AttentionPart.sphere): two softmaxes over half-width heads: no one s_qk per head
    sphere = False
    pools_queries = False  # model.funnel's pooled queries: not through this forward

    def __init__(self, ctx: Context, opts: DifferentialOptions):
        need(ctx.head_dim % (4 if ctx.rotary else 2) == 0, "n_heads", f"differential attention splits each head "
             f"(d_model / n_heads = {ctx.head_dim}) into two halves{', each rotated by RoPE' if ctx.rotary else ''}; "
             f"valid: n_heads with d_model / n_heads a multiple of {4 if ctx.rotary else 2}")
        lam = opts.lambda_init
        need(lam is None or 0 <= lam < 1, "attention.lambda_init", f"must be in [0, 1) (the heads are scaled by "
             f"1 - lambda_init), got {lam}; valid: null (the paper's schedule) or a number in [0, 1)")
        super().__init__(ctx, opts, kv_heads(ctx, opts))
        self.half = self.head_dim // 2
        self.lambda_init = paper_lambda_init(ctx.layer) if lam is None else lam
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            torch.nn.Parameter(torch.zeros(self.half)) for _ in range(4))
        self.head_norm = ctx.norm(self.head_dim)

    def forward(self, x: torch.Tensor, pos: Position, mask: torch.Tensor | None = None,
                is_causal: bool = False, context: torch.Tensor | None = None,
                cache: KVCache | None = None, offset: int = 0,
                value_embed: torch.Tensor | None = None, queries: int | None = None) -> torch.Tensor:
        need(queries is None, "funnel", "this attention does not pool its queries (pools_queries is false)")
        q, k, v = self._project(x, pos, context, cache, offset, value_embed)  # q (B, 2H, T, d), k (B, 2H_kv, S, d)
        y1 = self._attend(q[:, 0::2], k[:, 0::2], v, mask, is_causal)  # (B, H, T, hd); scaled by 1 / sqrt(d)
        first = self.weights
        y2 = self._attend(q[:, 1::2], k[:, 1::2], v, mask, is_causal)
        lam = self.lambda_()
        if self.record and first is not None and self.weights is not None:  # attention_maps: the difference
            self.weights = first - lam * self.weights
        y = self.head_norm((y1 - lam * y2).transpose(1, 2)).transpose(1, 2)  # each head normalised on its own
        return self._output(y * (1 - self.lambda_init), x)

    def lambda_(self) -> torch.Tensor:
        """lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init, a scalar."""
        return (self.lambda_q1 @ self.lambda_k1).exp() - (self.lambda_q2 @ self.lambda_k2).exp() + self.lambda_init

    def _normed(self, t: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
        """A query or key projection (B, T, heads * hd) -> halves (B, 2 heads, T, hd / 2), head h's at 2h and 2h + 1;
        qk_norm normalises each whole head (both halves) as MHA's; RoPE then rotates each half."""
        heads = super()._normed(t, norm)  # (B, heads, T, hd)
        return heads.unflatten(-1, (2, self.half)).transpose(2, 3).flatten(1, 2)

    def flops(self, t: int) -> int:
        """The projections; both halves' scores (MHA's q.k FLOPs together), two weighted sums of the values, and
        the difference."""
        return super().flops(t) + 2 * t * self.n_heads * self.head_dim + 2 * self.n_heads * self.head_dim


@ATTENTION.register("differential", options=DifferentialOptions,
                    examples=[{}, {"n_kv_heads": 2, "lambda_init": 0.5}, {"qk_norm": True}])
def differential(ctx: Context, opts: DifferentialOptions) -> Differential:
    """Differential attention: the difference of two softmax maps per head (Ye et al. 2024)."""
    return Differential(ctx, opts)
