"""Synthesizer (Tay et al. 2020, "Synthesizer: Rethinking Self-Attention in Transformer Models"): self-attention
whose weights are not made from query-key dot products but synthesized, per head h, as logits over the key
positions 0 .. max_seq_len - 1:

    dense       B_i = W2 relu(W1 x_i + b1) + b2      a row of max_seq_len per token i and head, from that token alone
    random      B_i = R[i]                           R a learned (max_seq_len, max_seq_len) matrix
    factorized  B_i = (R1 R2^T)[i]                   random, of rank `rank`: R1 and R2 are (max_seq_len, rank)
    y_i = W_o [sum_j softmax_j(B_i[j]) W_v x_j for each head]

each alone (`mix: none`) or with dot-product attention S_i[j] = q_i . k_j / sqrt(head_dim): `plus`
softmax(B + S), `alpha` alpha_h softmax(B) + (1 - alpha_h) softmax(S), alpha_h learned from 0.5 (the paper's
mixture, its weights summing to 1). Narang et al. 2021's rows: dense (synthetic=dense), dense plus, dense plus
alpha, factorized (synthetic=factorized: the factorized random one), random, random plus, random plus alpha.

Key j of query i reads column j, so a sequence of T tokens uses the first T columns, and a decoder masks the
columns after i as any causal attention. The weights depend on absolute positions up to max_seq_len: the part has
a hard limit there (`hard_limit`, `max_len`: generation slides past it, zoo.generate). Cached decoding keeps the
values (and keys with a dot-product half); a new query at position p takes its row at p (dense: from its own
token; random: R[p]) over the p + 1 cached keys, the row recomputation gives it (tests/test_catalogue_synthesizer.py).
Position schemes: a rotary one rotates only the dot-product half's queries and keys; a bias scheme (ALiBi, T5)
adds to the logits, synthetic or mixed; an absolute one adds to the embeddings, as always.
With model.memory_tokens m, the memory is positions 0 .. m - 1 (as the stack places it), so the weights cover
m + max_seq_len positions; the hard limit on tokens stays max_seq_len.
Every attention's options but backend (the weights are always written out) and qk_norm (mix=none has no queries or
keys, and an option is the registered name's, whatever its mix), both refused as unknown: sigmoid and sparse_topk
turn the logits into weights through AttentionBase._weights (alpha: each softmax on its own), head_scale scales each
head's output.
Cross-attention stays dot-product attention (the factory builds MHA there): its keys are the encoder's, whose
positions a decoder's synthetic row does not index, and the papers' encoder-decoders (Tay et al.'s translation,
Narang et al.'s T5) keep source attention as it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from zoo.component import Context, linear_flops, need
from zoo.layers.attention import Attention, AttentionBase, AttentionOptions, KVCache, WrittenOutOptions
from zoo.layers.position import Position
from zoo.registry import ATTENTION


@dataclass(kw_only=True)
class SynthesizerOptions(WrittenOutOptions):
    """Every attention's options but backend (its weights are always written out) and qk_norm, and its own."""

    widths: ClassVar[tuple[str, ...]] = ("width",)  # grows with d_model (zoo.mup scales it along)
    synthetic: Literal["dense", "random", "factorized"] = "dense"  # how the logits B are made
    mix: Literal["none", "plus", "alpha"] = "none"  # with dot-product attention: B + S, or a learned mix of softmaxes
    width: int | None = None  # dense: W1's output size; null: d_model
    rank: int = 8  # factorized: the rank k of R1 R2^T


class Synthesizer(AttentionBase):
    """Synthetic attention weights per head over max_seq_len absolute key positions, alone or mixed with q.k."""

    hard_limit = True  # rows and columns exist up to max_seq_len only (zoo.generate asks every module)
    order_aware = True  # its weights belong to absolute positions: no set operation even with position=none

    def __init__(self, ctx: Context, opts: SynthesizerOptions):
        super().__init__(ctx, opts)  # window, sigmoid, sparse_topk, head_scale: every attention's, shared
        # the positions it weighs: model.memory_tokens' (before the sequence, positions 0..), then max_seq_len tokens
        d, H, L, bias = ctx.d_model, ctx.n_heads, ctx.memory_tokens + ctx.max_seq_len, ctx.bias
        self.dot = opts.mix != "none"
        need(opts.rank > 0, "attention.rank", f"must be a positive integer, got {opts.rank!r}")
        width = d if opts.width is None else opts.width
        need(width > 0, "attention.width", f"must be a positive integer or null (d_model), got {width!r}")
        self.n_heads = self.n_kv_heads = H
        self.head_dim, self.positions, self.max_len = ctx.head_dim, L, ctx.max_seq_len  # max_len: tokens (generate)
        self.kind, self.mix, self.rank = opts.synthetic, opts.mix, opts.rank
        if self.kind == "dense":
            self.dense = nn.Sequential(nn.Linear(d, width, bias=bias), nn.ReLU(), nn.Linear(width, H * L, bias=bias))
        elif self.kind == "random":
            self.random = nn.Parameter(torch.empty(H, L, L))
        else:
            self.left = nn.Parameter(torch.empty(H, L, opts.rank))  # R1
            self.right = nn.Parameter(torch.empty(H, L, opts.rank))  # R2
        self.v = nn.Linear(d, d, bias=bias)
        if self.dot:
            self.qk = nn.Linear(d, 2 * d, bias=bias)
        if self.mix == "alpha":
            self.alpha = nn.Parameter(torch.empty(H))
            # an even mix at the start (init_weights), with head_scale's 1 when on
            self.constants = {**getattr(self, "constants", {}), "alpha": 0.5}
        self.out = nn.Linear(d, d, bias=bias)
        self.out_dropout = nn.Dropout(ctx.dropout)

    def forward(self, x: torch.Tensor, pos: Position, mask: torch.Tensor | None = None, is_causal: bool = False,
                context: torch.Tensor | None = None, cache: KVCache | None = None, offset: int = 0) -> torch.Tensor:
        B, T, _ = x.shape
        t_k = offset + T  # the queries are positions offset .. t_k - 1, the keys 0 .. t_k - 1
        need(t_k <= self.positions, "max_seq_len", f"the synthesizer's weights cover {self.positions} positions, this "
             f"sequence reaches {t_k}; valid: sequences of at most max_seq_len tokens, or a larger max_seq_len")
        heads = lambda t: t.unflatten(-1, (self.n_heads, -1)).transpose(1, 2)  # (B, T, d) -> (B, H, T, hd)
        v = heads(self.v(x))
        if self.dot:
            q, k = self.qk(x).chunk(2, dim=-1)
            q, k = pos.rotate(heads(q), heads(k), offset)
            if cache is not None:
                k, v = cache.append(k, v)
        elif cache is not None:
            (v,) = cache.append(v)
        logits = self._synthetic(x, offset, t_k).to(v.dtype)  # (B or 1, H, T, t_k)
        # AttentionBase._weights turns logits into weights: the softmax, or sigmoid / sparse_topk when asked
        if self.mix == "none":
            weights = self._weights(logits, mask, is_causal, 1)
        elif self.mix == "plus":
            weights = self._weights(logits + q @ k.transpose(-2, -1) / math.sqrt(self.head_dim), mask, is_causal, 1)
        else:
            a = self.alpha.to(v.dtype)[:, None, None]
            weights = a * self._weights(logits, mask, is_causal, 1) + (1 - a) * self._weights(
                q @ k.transpose(-2, -1), mask, is_causal, self.head_dim)
        weights = weights.to(v.dtype)
        if self.record:
            self.weights = weights.detach()
        y = self._scale_heads(F.dropout(weights, self.dropout if self.training else 0.0) @ v)  # (B, H, T, hd)
        return self.out_dropout(self.out(y.transpose(1, 2).reshape(B, T, -1)))

    def _synthetic(self, x: torch.Tensor, offset: int, t_k: int) -> torch.Tensor:
        """The logits B of the queries at offset .. t_k - 1 over the keys 0 .. t_k - 1: (B, H, T, t_k) for dense,
        (1, H, T, t_k) for random and factorized (the same for every sequence)."""
        if self.kind == "dense":
            return self.dense(x).unflatten(-1, (self.n_heads, self.positions)).transpose(1, 2)[..., :t_k]
        if self.kind == "random":
            return self.random[None, :, offset:t_k, :t_k]
        return (self.left[:, offset:t_k] @ self.right[:, :t_k].transpose(-2, -1))[None]

    def cache_bytes_per_token(self, element_size: int) -> int:
        """Cache bytes one token adds: its values, and its keys with a dot-product half."""
        return (2 if self.dot else 1) * self.n_heads * self.head_dim * element_size

    def flops(self, t: int) -> int:
        """Forward FLOPs per token at context t: the projections (dense: its MLP, H * max_seq_len logits per
        token), the weighted sum of values, q.k scores with a dot-product half, a row of R1 R2^T if factorized."""
        d = self.n_heads * self.head_dim
        return linear_flops(self) + 2 * t * d * (2 if self.dot else 1) + (
            2 * t * self.rank * self.n_heads if self.kind == "factorized" else 0)


@ATTENTION.register("synthesizer", options=SynthesizerOptions, examples=[
    {}, {"mix": "plus"}, {"mix": "alpha"}, {"synthetic": "random"},
    {"synthetic": "random", "mix": "alpha"}, {"synthetic": "factorized", "rank": 3, "mix": "plus"}])
def synthesizer(ctx: Context, opts: SynthesizerOptions) -> AttentionBase:
    """Synthesizer (Tay et al. 2020): dense, random or factorized synthetic attention weights, alone or mixed with
    dot-product attention; in cross-attention plain dot-product attention (MHA)."""
    if ctx.cross:  # MHA with every attention's options that were given (backend: its default)
        return Attention(ctx, AttentionOptions(**{f.name: getattr(opts, f.name) for f in fields(WrittenOutOptions)}),
                         ctx.n_heads)
    return Synthesizer(ctx, opts)
