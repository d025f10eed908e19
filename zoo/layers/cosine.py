"""Cosine-similarity attention, QKNorm (Henry et al. 2020, "Query-Key Normalization for Transformers"): queries
and keys L2-normalised per head, so a score is the cosine of their angle, times a learned temperature g in place of
1 / sqrt(d):
    w = softmax(g * (q / |q|) . (k / |k|))
g is one learned scalar per layer, started at `scale`; null: the paper's g0 = log2(L^2 - L), L = max_seq_len (the
training length). x-transformers' qk_norm=True is the same with a fixed g (qk_norm_scale, 10).

A part of its own, not an option of the others, because it adds a weight (g) and replaces the scale. It computes
the scores differently but still as a scaled dot product, so the fused kernel runs it (q carries g, scale 1). With
attention.qk_norm set too, the model's norm runs first and the L2 normalisation after it. Keys are normalised
after the cache (it holds them as projected), so cached decoding equals recomputation; RoPE rotates before
(a rotation keeps a vector's length, so the order does not matter). n_kv_heads as GQA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zoo.component import Context, need
from zoo.layers.attention import Attention, HeadsOptions, kv_heads
from zoo.registry import ATTENTION


@dataclass(kw_only=True)
class CosineOptions(HeadsOptions):
    scale: float | None = None  # the temperature g's start; null: log2(max_seq_len^2 - max_seq_len) (the paper)


class Cosine(Attention):
    # not with norm=ngpt (AttentionPart.sphere): it normalises queries and keys itself, with its own temperature
    sphere = False

    def __init__(self, ctx: Context, opts: CosineOptions):
        super().__init__(ctx, opts, kv_heads(ctx, opts))
        L = ctx.max_seq_len
        g0 = math.log2(max(L * L - L, 2)) if opts.scale is None else opts.scale
        need(g0 > 0, "attention.scale", f"must be a number > 0 or null, got {g0}")
        self.temperature = nn.Parameter(torch.tensor(g0))  # g
        self.constants = {"temperature": g0}  # init_weights starts g there
        self.qk_dim = 1  # g is in the queries: the scores are not scaled again

    def _project(self, *args, **kw) -> tuple[torch.Tensor, ...]:
        q, k, v = super()._project(*args, **kw)
        return F.normalize(q, dim=-1) * self.temperature.to(q.dtype), F.normalize(k, dim=-1), v


@ATTENTION.register("cosine", options=CosineOptions, examples=[{}, {"scale": 10.0, "n_kv_heads": 2}])
def cosine(ctx: Context, opts: CosineOptions) -> Cosine:
    """Cosine-similarity attention: L2-normalised queries and keys, a learned temperature (Henry et al. 2020)."""
    return Cosine(ctx, opts)
