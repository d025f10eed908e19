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
from functools import cache, lru_cache
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from zoo import native
from zoo.component import Context, Options, linear_flops, need
from zoo.hardware import compiled_softmax_kernel_from, fused_attention_backward_from
from zoo.layers.position import Position
from zoo.registry import ATTENTION

BACKENDS = ("sdpa", "math")


@dataclass(kw_only=True)
class AttentionOptions(Options):
    """Options every attention variant has."""

    window: int | None = None  # sliding window: keys at distance < window (the stack builds the mask)
    backend: Literal["sdpa", "math"] = "sdpa"  # sdpa (fused kernel) or math (explicit softmax; keeps weights)
    qk_norm: bool = False  # normalise each head's queries and keys with the model's norm (OLMo 2, Gemma 3)


def qk_norms(ctx: Context, opts: AttentionOptions, dim: int, k_dim: int | None = None) -> tuple[nn.Module, nn.Module]:
    """The per-head query and key norms qk_norm asks for (before RoPE, as OLMo 2), else identities.
    dim: the size of a query head; k_dim: of a key head, when it differs (0: keys have no part to normalise)."""
    k_dim = dim if k_dim is None else k_dim
    if not opts.qk_norm:
        return nn.Identity(), nn.Identity()
    return ctx.norm(dim), ctx.norm(k_dim) if k_dim else nn.Identity()


def check_window(opts: AttentionOptions) -> None:
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
    for `attention_maps`). A variant makes its own queries, keys and values and calls `_attend`."""

    count_as = "attention"
    residual_outputs = ("out",)  # writes into the residual stream: depth-scaled init

    def __init__(self, ctx: Context, opts: AttentionOptions):
        super().__init__()
        check_window(opts)
        self.backend, self.dropout = opts.backend, ctx.dropout
        self.record = False  # when True, use the math backend and keep `weights` (B, H, Tq, Tk)
        self.weights: torch.Tensor | None = None

    def _attend(self, q, k, v, mask, is_causal, qk_dim: int | None = None) -> torch.Tensor:
        """softmax(q k^T / sqrt(qk_dim)) v. q (B, H, Tq, E); k (B, H_kv, Tk, E) and v (B, H_kv, Tk, Ev), each
        key/value head shared by H // H_kv query heads; qk_dim defaults to E."""
        dropout = self.dropout if self.training else 0.0
        groups = q.shape[1] // k.shape[1]
        scale = None if qk_dim is None else 1 / math.sqrt(qk_dim)
        if self.backend == "sdpa" and not self.record and not _slow_fused_backward(q, k.shape[2], mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                                  is_causal=is_causal, scale=scale, enable_gqa=groups > 1)
        # math: softmax(q k^T / sqrt(d_k)) v, written out so the weights can be kept.
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        weights = attention_weights(q, k, mask, is_causal, qk_dim)
        if self.record:
            self.weights = weights.detach()
        return F.dropout(weights, dropout) @ v


def attention_weights(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
                      qk_dim: int | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(qk_dim)) with the mask (causal: queries are the last of the keys), in q's dtype.
    q (B, H, Tq, E) and k (B, H, Tk, E) -> (B, H, Tq, Tk); qk_dim defaults to E. Low-precision scores are
    normalised in float32: for bf16 on CPU in one pass each way by zoo/layers/softmax.cpp where it is built (six
    torch passes otherwise, more time than the two matrix products around them), else by torch ops."""
    scores, root_d = q @ k.transpose(-2, -1), math.sqrt(qk_dim or q.shape[-1])
    if _softmax_kernel(scores, mask, k.shape[-2]):
        return attention_softmax(scores, 1 / root_d, is_causal)
    scores = scores / root_d
    if is_causal:  # eager reuses the cached mask; under torch.compile dynamo traces the builder itself
        build = attention_mask.__wrapped__ if torch.compiler.is_compiling() else attention_mask
        mask = build(q.shape[2], k.shape[2], True, None, q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    # bf16/fp16 scores are normalised in float32 for accuracy; float32 and float64 stay as they are.
    return scores.softmax(dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)


class Attention(AttentionBase):
    """MHA, GQA and MQA: n_kv_heads key/value heads, each shared by n_heads // n_kv_heads query heads."""

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
        self.q_norm, self.k_norm = qk_norms(ctx, opts, self.head_dim)

    def forward(self, x: torch.Tensor, pos: Position, mask: torch.Tensor | None = None,
                is_causal: bool = False, context: torch.Tensor | None = None,
                cache: KVCache | None = None, offset: int = 0) -> torch.Tensor:
        B, T, _ = x.shape
        if context is None:
            q, k, v = self.qkv(x).split(self.split, dim=-1)
            q, k, v = self.q_norm(self._heads(q)), self.k_norm(self._heads(k)), self._heads(v)  # (B, H, T, hd)
            q, k = pos.rotate(q, k, offset)
            if cache is not None:
                k, v = cache.append(k, v)
        else:
            q = self.q_norm(self._heads(self.q(x)))
            if cache is not None and cache.len:  # the encoder output is fixed: project it once
                k, v = cache.keys, cache.values
            else:
                k, v = (self._heads(t) for t in self.kv(context).chunk(2, dim=-1))
                k = self.k_norm(k)
                if cache is not None:
                    cache.append(k, v)
        y = self._attend(q, k, v, mask, is_causal)
        return self.out_dropout(self.out(y.transpose(1, 2).reshape(B, T, -1)))

    def cache_bytes_per_token(self, element_size: int) -> int:
        """KV-cache bytes one token adds to this layer: its keys and values."""
        return 2 * self.n_kv_heads * self.head_dim * element_size

    def flops(self, t: int) -> int:
        """Forward FLOPs per token at context t: the projections, then q.k scores and the weighted sum."""
        return linear_flops(self) + 4 * t * self.n_heads * self.head_dim

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.unflatten(-1, (-1, self.head_dim)).transpose(1, 2)


@ATTENTION.register("mha", options=AttentionOptions, examples=[{}, {"window": 3}, {"qk_norm": True}])
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


@ATTENTION.register("gqa", options=GQAOptions, examples=[{"n_kv_heads": 2}])
def gqa(ctx: Context, opts: GQAOptions) -> Attention:
    """Grouped-query attention: groups of query heads share a key/value head (Ainslie et al. 2023)."""
    kv = opts.n_kv_heads
    need(kv > 0, "attention.n_kv_heads", f"must be a positive integer, got {kv}")
    need(ctx.n_heads % kv == 0, "attention.n_kv_heads", f"n_heads={ctx.n_heads} is not divisible by n_kv_heads={kv}")
    return Attention(ctx, opts, kv)


# Low-precision training on CPU: the key length from which the fused kernel's backward is faster than the
# written-out form on this CPU (None: never), with the softmax in torch ops or on zoo's kernel; and from which
# compiled models take zoo's softmax kernel over inductor's own. Read once, here, so torch.compile sees constants.
FUSED_BACKWARD_FROM = fused_attention_backward_from()
FUSED_BACKWARD_FROM_SOFTMAX_KERNEL = fused_attention_backward_from(softmax_kernel=True)
COMPILED_SOFTMAX_KERNEL_FROM = compiled_softmax_kernel_from()


def _softmax_kernel(x: torch.Tensor, mask: torch.Tensor | None, t_k: int) -> bool:
    """Whether attention weights from scores like x (the scores, or the queries they are made from) over t_k keys
    come from zoo/layers/softmax.cpp: bf16 on CPU, causal or unmasked, where the kernel builds; under torch.compile
    from COMPILED_SOFTMAX_KERNEL_FROM keys (below, inductor's fusion of the torch ops is as fast or faster)."""
    if mask is not None or x.dtype != torch.bfloat16 or x.device.type != "cpu":
        return False
    if torch.compiler.is_compiling() and (COMPILED_SOFTMAX_KERNEL_FROM is None or t_k < COMPILED_SOFTMAX_KERNEL_FROM):
        return False
    return _softmax_ops()


def _softmax_ops() -> bool:
    """Whether zoo/layers/softmax.cpp is loaded here (zoo.native), its shapes registered for torch.compile."""
    return native.load("softmax") and _register_softmax_ops()


# torch.compile asks once, while tracing, and keeps the answer. This is what torch.compiler.assume_constant_result
# marks, set here without calling it: it imports torch._dynamo (a second or more: docs/benchmarks.md, "Start-up and
# exit"), compiling or not (tests/test_properties.py checks that the decorator still sets this attribute).
_softmax_ops._dynamo_marked_constant = True


@cache
def _register_softmax_ops() -> bool:
    """The shapes of softmax.cpp's ops, which torch.compile traces them by."""
    torch.library.register_fake("zoo::attention_softmax", lambda scores, scale, causal: (
        torch.empty_like(scores), scores.new_empty((*scores.shape[:-1], 2), dtype=torch.float32)))
    torch.library.register_fake("zoo::attention_softmax_backward",
                                lambda grad, scores, stats, scale, causal: torch.empty_like(scores))
    return True


class _AttentionSoftmax(torch.autograd.Function):
    """softmax.cpp's two ops as one differentiable function, in eager mode and in compiled graphs (a plain
    autograd.Function: torch.library.register_autograd's wrapper made a small model's step slower, docs/benchmarks.md,
    "zoo's CPU kernels (AMX)")."""

    @staticmethod
    def forward(ctx, scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
        p, stats = torch.ops.zoo.attention_softmax(scores, scale, causal)
        ctx.save_for_backward(scores, stats)
        ctx.scale, ctx.causal = scale, causal
        return p

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        if torch.is_grad_enabled():  # create_graph=True: the kernel would record nothing to differentiate
            raise RuntimeError("zoo::attention_softmax has no second derivative; ZOO_NATIVE=0 uses torch's formula, "
                               "which has")
        scores, stats = ctx.saved_tensors
        return torch.ops.zoo.attention_softmax_backward(grad, scores, stats, ctx.scale, ctx.causal), None, None


def attention_softmax(scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """softmax(scores * scale) over keys for bf16 CPU scores (..., Tq, Tk), causal: queries are the last of the
    keys; by zoo/layers/softmax.cpp (differentiable once)."""
    if not _softmax_ops():
        raise RuntimeError("zoo/layers/softmax.cpp is not built here (zoo.native: ZOO_NATIVE=0 or no C++ compiler)")
    return _AttentionSoftmax.apply(scores.contiguous(), scale, causal)


def _slow_fused_backward(q: torch.Tensor, t_k: int, mask: torch.Tensor | None = None) -> bool:
    """Whether low-precision training takes the written-out form instead of the fused kernel: on CPU, where the
    kernel's bf16/fp16 backward is slower than the product form, at every length on CPUs without AMX and below a
    length on CPUs with AMX (zoo.hardware: the benchmark rows). Inference and float32 keep the kernel."""
    if q.device.type != "cpu" or q.dtype not in (torch.bfloat16, torch.float16) or not q.requires_grad:
        return False
    start = FUSED_BACKWARD_FROM_SOFTMAX_KERNEL if _softmax_kernel(q, mask, t_k) else FUSED_BACKWARD_FROM
    return start is None or t_k < start


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
