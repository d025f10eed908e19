"""Attention: one class covers MHA, GQA and MQA, self- and cross-attention, two backends.
(Multi-head latent attention, `mla`, is in zoo/layers/mla.py, built on the same `AttentionBase` and `KVCache`.)

n_kv_heads key/value heads are shared by groups of n_heads // n_kv_heads query heads:
MHA has n_kv_heads == n_heads (Vaswani et al. 2017), MQA one (Shazeer 2019), GQA in between
(Ainslie et al. 2023). Masks are built once per forward by `attention_mask` and shared by all layers.
Every attention is built as `factory(ctx, opts)` (zoo.component); `AttentionOptions` are the options
every variant has, and a variant's own options extend them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from zoo.component import Context, Options, linear_flops, need
from zoo.layers.mix import ScalarMix
from zoo.layers.ngpt import EigenScale, unit
from zoo.layers.position import Position
from zoo.registry import ATTENTION

BACKENDS = ("sdpa", "math")


@dataclass(kw_only=True)
class WrittenOutOptions(Options):
    """The options of every attention but `backend` and `qk_norm`: all that one with no fused kernel and not
    always queries and keys (the synthesizer's) has; there those two are refused as unknown keys."""

    window: int | None = None  # sliding window: keys at distance < window (the stack asks `window`)
    # Sigmoid attention (Ramapuram et al. 2024): weights sigmoid(score + b), b = -log(max_seq_len), each on its own,
    # in place of the softmax over keys.
    sigmoid: bool = False
    # Explicit sparse attention (Zhao et al. 2019): each query keeps its sparse_topk highest scores (ties kept), the
    # rest masked before the softmax; null: all.
    sparse_topk: int | None = None
    # NormFormer's head scaling (Shleifer et al. 2021; x-transformers' attn_head_scale): each head's output times a
    # learned scalar, from 1, before the output projection
    head_scale: bool = False


@dataclass(kw_only=True)
class AttentionOptions(WrittenOutOptions):
    """Options every attention variant has."""

    backend: Literal["sdpa", "math"] = "sdpa"  # sdpa (fused kernel) or math (explicit softmax; keeps weights)
    # Queries and keys normalised with the model's norm, before RoPE: true (or head) each head on its own (Qwen3,
    # Gemma 3); projection the whole query and key projections, all heads at once (OLMo 2); false: neither.
    qk_norm: bool | Literal["head", "projection"] = False


def qk_norms(ctx: Context, opts: AttentionOptions, dim: int, k_dim: int | None = None) -> tuple[nn.Module, nn.Module]:
    """The query and key norms qk_norm asks for, else identities. dim: the size a query norm normalises (a head, or
    the whole projection); k_dim: a key's, when it differs (0: keys have no part to normalise)."""
    k_dim = dim if k_dim is None else k_dim
    if not opts.qk_norm:
        return nn.Identity(), nn.Identity()
    return ctx.norm(dim), ctx.norm(k_dim) if k_dim else nn.Identity()


def check_window(opts: WrittenOutOptions) -> None:
    need(opts.window is None or opts.window > 0, "attention.window",
         f"must be a positive integer or null, got {opts.window!r}")


class KVCache:
    """What one attention layer keeps of past tokens during decoding: its keys and values (B, H_kv, T, hd), or
    the per-token tensors of its own it appends (MLA: one, its latent and rotary key side by side), each
    (B, heads, T, dim) with its own heads and dim. Buffers grow by doubling, so appending a token costs no
    copy of the past."""

    def __init__(self):
        self.buffers: list[torch.Tensor] = []
        self.len = 0
        self.past: dict[str, torch.Tensor] = {}  # per step of its block, the last inputs (model.shift_tokens)

    def append(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Add T tokens of each tensor (B, heads, T, dim), in the same order every call; return all so far."""
        t = xs[0].shape[2]
        if not self.buffers or self.len + t > self.buffers[0].shape[2]:
            cap = max(self.len + t, 2 * (self.buffers[0].shape[2] if self.buffers else 0), 64)
            new = [x.new_empty(*x.shape[:2], cap, x.shape[3]) for x in xs]
            for buf, old in zip(new, self.tensors, strict=False):
                buf[:, :, : self.len] = old
            self.buffers = new
        for buf, x in zip(self.buffers, xs, strict=True):
            buf[:, :, self.len: self.len + t] = x
        self.len += t
        return self.tensors

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(buf[:, :, : self.len] for buf in self.buffers)

    @property
    def keys(self) -> torch.Tensor:
        return self.tensors[0]

    @property
    def values(self) -> torch.Tensor:
        return self.tensors[1]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


class AttentionBase(nn.Module):
    """What every attention shares: the backends, attention-weight dropout, and `record` (keep the weights
    for `attention_maps`). A variant makes its own queries, keys and values and calls `_attend`.

    `plain`: the weights are softmax(q k^T / sqrt(d_k)) as the fused kernel computes them, so backend=sdpa takes
    it; a variant that changes the scores (talking heads) or an option that does (sigmoid, sparse_topk) computes
    them written out (`_weights`), whatever the backend."""

    count_as = "attention"
    residual_outputs = ("out",)  # writes into the residual stream: depth-scaled init

    def __init__(self, ctx: Context, opts: WrittenOutOptions):
        super().__init__()
        check_window(opts)
        self.window = opts.window  # the stack builds the mask every layer shares from it
        self.backend = opts.backend if isinstance(opts, AttentionOptions) else "math"
        self.dropout = ctx.dropout
        self.record = False  # when True, use the math backend and keep `weights` (B, H, Tq, Tk)
        self.weights: torch.Tensor | None = None
        # sigmoid's b = -log(n), n the training length (Ramapuram et al.): fixed, so a cached step gets the same b
        need(not opts.sigmoid or ctx.max_seq_len > 0, "attention.sigmoid", "needs model.max_seq_len > 0 for its "
             f"bias -log(max_seq_len), got {ctx.max_seq_len}; valid: false, or a positive max_seq_len")
        self.sigmoid_bias = -math.log(ctx.max_seq_len) if opts.sigmoid else None
        need(opts.sparse_topk is None or opts.sparse_topk > 0, "attention.sparse_topk",
             f"must be a positive integer or null, got {opts.sparse_topk}")
        self.sparse_topk = opts.sparse_topk
        self.plain = not opts.sigmoid and opts.sparse_topk is None
        self.head_scale = nn.Parameter(torch.ones(ctx.n_heads, 1, 1)) if opts.head_scale else None
        if opts.head_scale:
            self.constants = {"head_scale": 1.0}  # init_weights starts it at 1

    def _scale_heads(self, y: torch.Tensor) -> torch.Tensor:
        """Each head's output (B, H, T, hd) times its learned scalar (attention.head_scale), else unchanged."""
        return y if self.head_scale is None else y * self.head_scale

    def _attend(self, q, k, v, mask, is_causal, qk_dim: int | None = None) -> torch.Tensor:
        """softmax(q k^T / sqrt(qk_dim)) v. q (B, H, Tq, E); k (B, H_kv, Tk, E) and v (B, H_kv, Tk, Ev), each
        key/value head shared by H // H_kv query heads; qk_dim defaults to E."""
        if self.backend == "sdpa" and not self.record and self.plain:
            scale = None if qk_dim is None else 1 / math.sqrt(qk_dim)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training
                                                  else 0.0, is_causal=is_causal, scale=scale,
                                                  enable_gqa=q.shape[1] > k.shape[1])
        return self._written_out(q, k, v, mask, is_causal, qk_dim)

    def _written_out(self, q, k, v, mask, is_causal, qk_dim: int | None = None) -> torch.Tensor:
        """The math backend: weights(q k^T) v, written out so the weights can be kept."""
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        weights = self._weights(q @ k.transpose(-2, -1), mask, is_causal, qk_dim or q.shape[-1]).to(q.dtype)
        if self.record:
            self.weights = weights.detach()
        return F.dropout(weights, self.dropout if self.training else 0.0) @ v

    def _weights(self, scores, mask, is_causal, qk_dim: int) -> torch.Tensor:
        """Raw scores q k^T (B, H, Tq, Tk) -> the attention weights; a variant that changes the scores (talking
        heads) overrides this, and composes `masked_scores` and `_normalise`."""
        if self.plain:
            return self._softmax(scores, mask, is_causal, qk_dim)
        return self._normalise(masked_scores(scores / math.sqrt(qk_dim), mask, is_causal))

    def _normalise(self, scores: torch.Tensor) -> torch.Tensor:
        """Scaled, masked scores (masked: -inf) -> weights: softmax over the keys, or with attention.sigmoid each
        sigmoid(score + b), masked keys 0; with attention.sparse_topk k only each query's k highest scores count
        (masked keys are the lowest). Low-precision scores are normalised in float32."""
        if self.sparse_topk is not None and self.sparse_topk < scores.shape[-1]:
            kth = scores.topk(self.sparse_topk, dim=-1).values[..., -1:]  # (..., Tq, 1)
            # Scores within rounding of the k-th are ties, kept: equal keys (a repeated token) score the same in
            # exact arithmetic, but a cached step's product rounds differently from the full forward's.
            size = scores.masked_fill(scores.isinf(), 0).abs().amax(dim=-1, keepdim=True)
            scores = scores.masked_fill(scores < kth - 64 * torch.finfo(scores.dtype).eps * size, float("-inf"))
        if self.sigmoid_bias is not None:
            return torch.sigmoid(scores.to(torch.promote_types(scores.dtype, torch.float32)) + self.sigmoid_bias)
        return scores.softmax(dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))

    def _softmax(self, scores, mask, is_causal, qk_dim: int) -> torch.Tensor:
        return scores_softmax(scores, mask, is_causal, qk_dim)


def attention_weights(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
                      qk_dim: int | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(qk_dim)) with the mask (causal: queries are the last of the keys), in q's dtype.
    q (B, H, Tq, E) and k (B, H, Tk, E) -> (B, H, Tq, Tk); qk_dim defaults to E."""
    return scores_softmax(q @ k.transpose(-2, -1), mask, is_causal, qk_dim or q.shape[-1]).to(q.dtype)


def scores_softmax(scores: torch.Tensor, mask: torch.Tensor | None, is_causal: bool, qk_dim: int) -> torch.Tensor:
    """softmax(scores / sqrt(qk_dim)) over keys (..., Tq, Tk) with the mask (causal: queries are the last of the
    keys). Low-precision scores are normalised in float32 for accuracy (the caller rounds the result back);
    float32 and float64 stay as they are."""
    scores = masked_scores(scores / math.sqrt(qk_dim), mask, is_causal)
    return scores.softmax(dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))


def masked_scores(scores: torch.Tensor, mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
    """Scores (..., Tq, Tk) with the mask applied: a bool mask's hidden keys -inf, a float mask (a position bias,
    -inf where hidden) added; causal: queries are the last of the keys."""
    if is_causal:  # eager reuses the cached mask; under torch.compile dynamo traces the builder itself
        build = attention_mask.__wrapped__ if torch.compiler.is_compiling() else attention_mask
        mask = build(scores.shape[-2], scores.shape[-1], True, None, scores.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return scores


class Attention(AttentionBase):
    """MHA, GQA and MQA: n_kv_heads key/value heads, each shared by n_heads // n_kv_heads query heads."""

    sphere = True  # built with ctx.sphere: nGPT's unit queries and keys, scaled by s_qk (`_on_sphere`)
    pools_queries = True  # forward's `queries` (model.funnel); a variant whose forward does not pass them says False

    def __init__(self, ctx: Context, opts: AttentionOptions, n_kv_heads: int):
        super().__init__(ctx, opts)
        d_model, n_heads, bias = ctx.d_model, ctx.n_heads, ctx.bias
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, ctx.head_dim
        q_dim, kv_dim = n_heads * self.head_dim, n_kv_heads * self.head_dim
        self.split = (q_dim, kv_dim, kv_dim)
        if ctx.cross:  # queries from the decoder, keys and values from the encoder's output
            self.q, self.kv = nn.Linear(d_model, q_dim, bias=bias), nn.Linear(d_model, 2 * kv_dim, bias=bias)
        else:  # one fused projection: a single matrix product for q, k and v
            self.qkv = nn.Linear(d_model, q_dim + 2 * kv_dim, bias=bias)
        self.out = nn.Linear(q_dim, d_model, bias=bias)
        self.out_dropout = nn.Dropout(ctx.dropout)
        self.value_dim = None if ctx.cross else kv_dim  # model.value_embeddings: the tables' width
        # v = a * v + b * ve (model.value_embeddings), on the layers the stack gives a table
        self.value_mix = ScalarMix("attention", 0.5, 0.5) if ctx.value_embed and not ctx.cross else None
        # model.value_residual: the stack's first layer keeps its values for the later layers to mix in
        self.keep_values, self.kept_values = ctx.keep_values and not ctx.cross, None
        self.norm_projection = opts.qk_norm == "projection"  # else per head, when on
        self.q_norm, self.k_norm = qk_norms(ctx, opts, *((q_dim, kv_dim) if self.norm_projection else (self.head_dim,)))
        self.qk_dim: int | None = None  # scores are scaled by 1 / sqrt(qk_dim); None: the head size
        # nGPT's s_qk per query head and channel, from 1 (stored at scale 1 / sqrt(d_model), zoo/layers/ngpt.py)
        on = ctx.sphere and self.sphere  # a variant that cannot (sphere False): refused (Placement.refuses, zoo.build)
        self.s_qk = EigenScale((n_heads, 1, self.head_dim), 1.0, 1 / math.sqrt(d_model)) if on else None

    def forward(self, x: torch.Tensor, pos: Position, mask: torch.Tensor | None = None,
                is_causal: bool = False, context: torch.Tensor | None = None,
                cache: KVCache | None = None, offset: int = 0,
                value_embed: torch.Tensor | None = None, queries: int | None = None) -> torch.Tensor:
        """queries: only x's first `queries` rows ask, the rest answer (keys and values) through the same projections
        (model.funnel's pool-q-only: pooled rows, then the unpooled ones); the answering rows' output is 0."""
        q, k, v = self._project(x, pos, context, cache, offset, value_embed, queries)
        if queries is None:
            return self._output(self._attend(q, k, v, mask, is_causal, self.qk_dim), x)
        y = self._output(self._attend(q, k, v, mask, is_causal, self.qk_dim), x[:, :queries])
        return F.pad(y, (0, 0, 0, x.shape[1] - queries))

    def _project(self, x: torch.Tensor, pos: Position, context: torch.Tensor | None, cache: KVCache | None,
                 offset: int, value_embed: torch.Tensor | None, queries: int | None = None) -> tuple[torch.Tensor, ...]:
        """Queries (B, H, T, hd) of x; keys and values (B, H_kv, S, hd) of x and the cache, or of the context
        (queries: of x's first `queries` rows, and of the rest)."""
        if context is None and queries is not None:
            q = self.qkv(x[:, :queries]).split(self.split, dim=-1)[0]
            _, k, v = self.qkv(x[:, queries:]).split(self.split, dim=-1)
        elif context is None:
            q, k, v = self.qkv(x).split(self.split, dim=-1)
        if context is None:
            if self.keep_values:
                self.kept_values = v  # (B, T, kv_dim): the new tokens' only; the stack takes and clears it
            if self.value_mix is not None:  # the new tokens' value embeddings join their values, then the cache
                v = self.value_mix(v, value_embed)
            q, k, v = self._normed(q, self.q_norm), self._normed(k, self.k_norm), self._heads(v)  # (B, H, T, hd)
            q, k = self._on_sphere(*pos.rotate(q, k, offset))
            if cache is not None:
                k, v = cache.append(k, v)
        else:
            q = self._normed(self.q(x), self.q_norm)
            if cache is not None and cache.len:  # the encoder output is fixed: project it once
                q, k, v = self._on_sphere(q, q)[0], cache.keys, cache.values
            else:
                k, v = self.kv(context).chunk(2, dim=-1)
                (q, k), v = self._on_sphere(q, self._normed(k, self.k_norm)), self._heads(v)
                if cache is not None:
                    cache.append(k, v)
        return q, k, v

    def _on_sphere(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """nGPT (ctx.sphere): q, k (B, heads, T, hd) -> s_qk * Norm(q), s_qk * Norm(k), scored at sqrt(hd); else as
        they are. Both scales are put on q, as s_qk^2 (the same scores: (s q) . (s k) = (s^2 q) . k), so a key head
        shared by several query heads (GQA) needs none of its own; and hd too: the backends' 1 / sqrt(hd) times hd
        is the paper's sqrt(hd)."""
        if self.s_qk is None:
            return q, k
        return unit(q) * (self.s_qk() ** 2 * self.head_dim), unit(k)

    def _output(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The heads' outputs y (B, H, T, hd) -> (B, T, d_model); x is the layer's input (a gate reads it)."""
        return self.out_dropout(self.out(self._scale_heads(y).transpose(1, 2).flatten(2)))

    def cache_bytes_per_token(self, element_size: int) -> int:
        """KV-cache bytes one token adds to this layer: its keys and values."""
        return 2 * self.n_kv_heads * self.head_dim * element_size

    def flops(self, t: int) -> int:
        """Forward FLOPs per token at context t: the projections, then q.k scores and the weighted sum."""
        return linear_flops(self) + 4 * t * self.n_heads * self.head_dim

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)

    def _normed(self, t: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """A query or key projection (B, T, heads * hd) -> heads (B, heads, T, hd), normalised (qk_norm) over the
        whole projection or over each head."""
        return self._heads(norm(t)) if self.norm_projection else norm(self._heads(t))


@ATTENTION.register("mha", options=AttentionOptions, examples=[{}, {"window": 3}, {"qk_norm": True}, {"sigmoid": True},
                                                                  {"sparse_topk": 3},
                                                                  {"head_scale": True}])
def mha(ctx: Context, opts: AttentionOptions) -> Attention:
    """Multi-head attention: a key/value head per query head (Vaswani et al. 2017)."""
    return Attention(ctx, opts, ctx.n_heads)


@ATTENTION.register("mqa", options=AttentionOptions)
def mqa(ctx: Context, opts: AttentionOptions) -> Attention:
    """Multi-query attention: one key/value head shared by all query heads (Shazeer 2019)."""
    return Attention(ctx, opts, 1)


@dataclass(kw_only=True)
class GQAOptions(AttentionOptions):
    n_kv_heads: int  # key/value heads, each shared by n_heads // n_kv_heads query heads


@dataclass(kw_only=True)
class HeadsOptions(AttentionOptions):
    """The options of a variant built on `Attention` that may share key/value heads as GQA does."""

    n_kv_heads: int | None = None  # key/value heads, each shared by n_heads // n_kv_heads query heads; null: n_heads


def kv_heads(ctx: Context, opts: GQAOptions | HeadsOptions) -> int:
    """The key/value heads opts.n_kv_heads asks for (null: one per query head), checked against ctx.n_heads."""
    kv = ctx.n_heads if opts.n_kv_heads is None else opts.n_kv_heads
    need(kv > 0, "attention.n_kv_heads", f"must be a positive integer, got {kv}")
    need(ctx.n_heads % kv == 0, "attention.n_kv_heads", f"n_heads={ctx.n_heads} is not divisible by n_kv_heads={kv}")
    return kv


@ATTENTION.register("gqa", options=GQAOptions, examples=[{"n_kv_heads": 2}, {"n_kv_heads": 2, "qk_norm": "projection"},
                                                         {"n_kv_heads": 2, "sigmoid": True}])
def gqa(ctx: Context, opts: GQAOptions) -> Attention:
    """Grouped-query attention: groups of query heads share a key/value head (Ainslie et al. 2023)."""
    return Attention(ctx, opts, kv_heads(ctx, opts))


@lru_cache(maxsize=32)
def attention_mask(t_q: int, t_k: int, causal: bool, window: int | None,
                   device: torch.device) -> torch.Tensor | None:
    """Which keys each query may see, (t_q, t_k) bool, or None when it sees all of them.

    Queries are the last t_q of the t_k positions (bottom-right aligned, as with a KV cache).
    Causal: key j <= query i. Window w: the query sees keys within distance < w, itself included:
    w keys when causal (Mistral's sliding_window), 2w - 1 when bidirectional (w - 1 on each side)."""
    if not causal and window is None:
        return None
    q_pos = torch.arange(t_k - t_q, t_k, device=device)[:, None]
    k_pos = torch.arange(t_k, device=device)[None, :]
    allowed = torch.ones(t_q, t_k, dtype=torch.bool, device=device)
    if causal:
        allowed &= k_pos <= q_pos
    if window is not None:
        allowed &= (q_pos - k_pos).abs() < window
    return allowed


@lru_cache(maxsize=32)
def _diagonal(t_q: int, t_k: int, device: torch.device) -> torch.Tensor:
    return torch.eye(t_k, dtype=torch.bool, device=device)[t_k - t_q:]


def attention_bias(t_q: int, t_k: int, causal: bool, window: int | None, pos: Position,
                   padding: torch.Tensor | None, device: torch.device, dtype: torch.dtype):
    """The (mask, is_causal) pair every layer's attention gets, built once per forward.

    Plain causal self-attention passes no mask and lets the kernel mask (is_causal); a position
    bias (ALiBi) and key padding (B, t_k; True = real token) are folded in when present."""
    bias = pos.score_bias(t_q, t_k, t_k - t_q)
    if causal and window is None and bias is None and padding is None and t_q in (1, t_k):
        return None, t_q > 1  # one new token sees every cached key: no mask at all
    mask = attention_mask(t_q, t_k, causal, window, device)
    if padding is not None:
        # Every query keeps its own key, so a padded query never has all keys masked (NaN rows).
        pad = padding[:, None, None, :] | _diagonal(t_q, t_k, device)  # (B, 1, t_q, t_k)
        mask = pad if mask is None else mask & pad
    if bias is not None:
        bias = bias.to(dtype)
        mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    return mask, False


def cross_attention_mask(padding: torch.Tensor | None) -> torch.Tensor | None:
    """Which encoder positions cross-attention may see, (B, 1, 1, S), from the source padding (B, S).

    A source row that is all padding would leave every query with no key (NaN on the math path, a
    backend-dependent value in the kernels); such a row sees all its keys instead, like the
    encoder's padded queries, which keep their own key."""
    if padding is None:
        return None
    return (padding | ~padding.any(dim=-1, keepdim=True))[:, None, None, :]


@torch.no_grad()
def attention_maps(model: nn.Module, *inputs, **kw) -> dict[str, torch.Tensor]:
    """Run `model(*inputs, **kw)` once and return every attention layer's weights (B, H, Tq, Tk),
    keyed by module name (e.g. 'decoder.blocks.0.attn.f'), computed with the math backend."""
    layers = {name: m for name, m in model.named_modules() if isinstance(m, AttentionBase)}
    try:
        for m in layers.values():
            m.record = True
        model(*inputs, **kw)
        return {name: m.weights for name, m in layers.items()}
    finally:
        for m in layers.values():
            m.record, m.weights = False, None
