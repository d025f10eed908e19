"""Talking-heads attention (Shazeer et al. 2020, "Talking-Heads Attention"): the heads exchange information by
learned linear maps across the head dimension, on the scores before the softmax and/or on the weights after it.

Per query i and key j, with s_h = q_h . k_h / sqrt(d) the scores of head h:
    s'_g = s_g + sum_h P_gh s_h          (pre: mixed logits, before the mask and the softmax)
    w_g  = softmax_j(s'_g)
    w'_g = w_g + sum_h Q_gh w_h          (post: mixed weights, then y_g = sum_j w'_g v_g)
The paper learns the whole mixing matrix; zoo writes it as I + P, so the zoo's standard init (P ~ N(0, init_std))
starts each head close to itself, as x-transformers' identity (dirac) init does for its pre-softmax mix. Its
post-softmax mix is Q alone (initialised to I): zoo's I + Q is that matrix, so the two hold the same functions.

It is a part of its own (not an option) because it adds weights: two (n_heads, n_heads) matrices. The mix runs
over the query heads, so key/value heads may be shared (n_kv_heads, as GQA). Every query row is mixed on its own,
so causality, padding and cached decoding are unchanged; the fused kernel cannot mix heads, so it always takes
the written-out path (backend makes no difference).
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
class TalkingHeadsOptions(HeadsOptions):
    pre: bool = True  # mix the heads' scores before the softmax
    post: bool = True  # mix the heads' weights after the softmax


class TalkingHeads(Attention):
    def __init__(self, ctx: Context, opts: TalkingHeadsOptions):
        need(opts.pre or opts.post, "attention.pre", "talking_heads with neither pre nor post is mha; valid: pre "
             "or post (or both) true")
        super().__init__(ctx, opts, kv_heads(ctx, opts))
        H = ctx.n_heads
        self.pre_mix = nn.Parameter(torch.zeros(H, H)) if opts.pre else None  # P: (heads out, heads in)
        self.post_mix = nn.Parameter(torch.zeros(H, H)) if opts.post else None  # Q
        self.plain = False  # the fused kernel cannot mix heads

    def _weights(self, scores, mask, is_causal, qk_dim: int) -> torch.Tensor:
        scores = _mixed(scores / math.sqrt(qk_dim), self.pre_mix)  # (B, H, Tq, Tk)
        return _mixed(self._normalise(masked_scores(scores, mask, is_causal)), self.post_mix)

    def flops(self, t: int) -> int:
        """MHA's, and per mix a (heads x heads) product for each of the t keys of a query."""
        mixes = (self.pre_mix is not None) + (self.post_mix is not None)
        return super().flops(t) + mixes * 2 * self.n_heads ** 2 * t


def _mixed(t: torch.Tensor, mix: torch.Tensor | None) -> torch.Tensor:
    """t (B, H, Tq, Tk) with its heads mixed by I + mix (heads out, heads in); t itself without a mix."""
    return t if mix is None else t + torch.einsum("gh,bhij->bgij", mix.to(t.dtype), t)


@ATTENTION.register("talking_heads", options=TalkingHeadsOptions,
                    examples=[{}, {"post": False}, {"pre": False, "n_kv_heads": 2}])
def talking_heads(ctx: Context, opts: TalkingHeadsOptions) -> TalkingHeads:
    """Talking-heads attention: heads mixed before and/or after the softmax (Shazeer et al. 2020)."""
    return TalkingHeads(ctx, opts)
