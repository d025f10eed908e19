"""Lightweight and dynamic convolution in place of self-attention (Wu et al. 2019, "Pay Less Attention with
Lightweight and Dynamic Convolutions"): each token mixes only its neighbours, by a kernel of width `kernel`
normalised with a softmax, instead of attending over the whole sequence.

The paper's block, which replaces the attention sublayer (norms and residuals stay the block's):
    u = GLU(W_I x + b_I)                            the input projection d -> 2d, halved by a gated linear unit
    y_i,c = sum_{j=1..k} softmax(W_h)_j u_{i+j-p, c}  h = c // (d / H): H heads of channels share a kernel
    out = W_O y + b_O
lightweight_conv: W a learned (H, k); dynamic_conv: W_h predicted from the current token, W(i) = W_D u_i + b_D,
(H * k) numbers per token. Decoders pad causally (p = k: the kernel sees the current and k - 1 earlier tokens);
encoders centre it ((k - 1) // 2 before, the rest after), and treat padded tokens as zeros, as fairseq does.
The kernel weights get the block's attention dropout (DropConnect, as the paper).

A registered attention that attends to nothing: a rotary position does not apply (no queries or keys), an absolute
one still adds to the embeddings, and a bias scheme (ALiBi, T5, dynamic) adds its bias for each tap's distance to
the kernel's logits, as it would to attention scores. It is order_aware (its kernel tells neighbours apart), and in
cross-attention the factory builds MHA: the encoder's outputs are not the decoder's neighbours, and the paper's
encoder-decoder keeps its encoder-decoder attention. Cached decoding: the cache holds each token's u (d numbers; zoo's
cache counts tokens by what it holds), and a new token is convolved with the last k - 1 of them, as recomputation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zoo.component import Context, Options, linear_flops, need
from zoo.layers.attention import Attention, AttentionOptions, KVCache
from zoo.layers.position import Position
from zoo.registry import ATTENTION


@dataclass(kw_only=True)
class ConvolutionOptions(Options):
    kernel: int = 7  # the kernel width k (Wu et al.: 3, 7, 15, then 31 in deeper layers)


class Convolution(nn.Module):
    """GLU input projection, a softmax-normalised depthwise convolution with H heads of channels, output projection."""

    count_as = "attention"
    residual_outputs = ("out",)  # writes into the residual stream: depth-scaled init
    window, record, order_aware = None, False, True  # no mask of its own; no attention weights to keep

    def __init__(self, ctx: Context, opts: ConvolutionOptions, dynamic: bool):
        super().__init__()
        k, d, H = opts.kernel, ctx.d_model, ctx.n_heads
        need(k >= 1, "attention.kernel", f"must be a positive integer, got {k!r}")
        self.kernel, self.causal, self.dynamic, self.dropout = k, ctx.causal, dynamic, ctx.dropout
        self.n_heads = self.n_kv_heads = H
        self.head_dim = ctx.head_dim
        self.before = k - 1 if ctx.causal else (k - 1) // 2  # tokens the kernel sees before the current one
        self.glu_in = nn.Linear(d, 2 * d, bias=ctx.bias)
        if dynamic:
            self.kernel_from_token = nn.Linear(d, H * k, bias=ctx.bias)
        else:
            self.weight = nn.Parameter(torch.empty(H, k))
        self.out = nn.Linear(d, d, bias=ctx.bias)
        self.out_dropout = nn.Dropout(ctx.dropout)

    def forward(self, x: torch.Tensor, pos: Position, mask: torch.Tensor | None = None, is_causal: bool = False,
                context: torch.Tensor | None = None, cache: KVCache | None = None, offset: int = 0) -> torch.Tensor:
        B, T, d = x.shape
        u = F.glu(self.glu_in(x), dim=-1)  # (B, T, d)
        if self.dynamic:  # each token's own kernel, from its u
            logits = self.kernel_from_token(u).unflatten(-1, (self.n_heads, self.kernel))  # (B, T, H, k)
        else:
            logits = self.weight
        bias = pos.score_bias(self.kernel, self.kernel)  # a bias scheme's (H, k, k); its row `before` is the bias
        if bias is not None:  # of each tap's distance, before - j, added to the kernel's logits as to scores
            logits = logits + bias[:, self.before].to(logits.dtype)
        if not self.causal and mask is not None and mask.dim() == 4:
            u = u * real_tokens(mask)[..., None].to(u.dtype)  # padded tokens count as zeros
        past = u.new_zeros(B, self.before, d)  # before the first token: zeros
        if cache is not None:  # decoding: the last `before` tokens' u from the cache, zeros where there are fewer
            if cache.len and self.before:
                past = torch.cat([past, cache.tensors[0][:, 0, -self.before:]], dim=1)[:, -self.before:]
            cache.append(u[:, None])  # (B, 1, T, d)
        after = self.kernel - 1 - self.before
        windows = torch.cat([past, u, u.new_zeros(B, after, d)], dim=1).unfold(1, self.kernel, 1)  # (B, T, d, k)
        w = F.dropout(logits.softmax(dim=-1), self.dropout if self.training else 0.0)
        y = (windows.unflatten(2, (self.n_heads, self.head_dim)) * w.unsqueeze(-2)).sum(-1)  # (B, T, H, hd)
        return self.out_dropout(self.out(y.flatten(2)))

    def cache_bytes_per_token(self, element_size: int) -> int:
        """Cache bytes one token adds: its u, d_model numbers (a step reads the last kernel - 1 of them)."""
        return self.n_heads * self.head_dim * element_size

    def flops(self, t: int) -> int:
        """Forward FLOPs per token, whatever the context: the projections (dynamic: its kernel's too), then k
        multiply-adds per channel."""
        return linear_flops(self) + 2 * self.kernel * self.n_heads * self.head_dim


def real_tokens(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) True for real tokens, from an encoder's attention mask (B, 1, T, T) (zoo.layers.attention's
    attention_bias): every query sees each real key, a padded key only its own query, so a key is real when a
    query other than its own sees it (or it is alone)."""
    seen = mask if mask.dtype == torch.bool else mask > float("-inf")
    T = seen.shape[-1]
    others = seen[:, 0] & ~torch.eye(T, dtype=torch.bool, device=seen.device)
    return others.any(dim=-2) | (T == 1)


def _conv_or_mha(ctx: Context, opts: ConvolutionOptions, dynamic: bool) -> nn.Module:
    return Attention(ctx, AttentionOptions(), ctx.n_heads) if ctx.cross else Convolution(ctx, opts, dynamic)


@ATTENTION.register("lightweight_conv", options=ConvolutionOptions, examples=[{}, {"kernel": 4}])
def lightweight_conv(ctx: Context, opts: ConvolutionOptions) -> nn.Module:
    """Lightweight convolution (Wu et al. 2019): a learned softmax-normalised kernel per head of channels; in
    cross-attention plain MHA."""
    return _conv_or_mha(ctx, opts, dynamic=False)


@ATTENTION.register("dynamic_conv", options=ConvolutionOptions, examples=[{}, {"kernel": 2}])
def dynamic_conv(ctx: Context, opts: ConvolutionOptions) -> nn.Module:
    """Dynamic convolution (Wu et al. 2019): each token's kernel predicted from it, W_D u_i, softmax-normalised; in
    cross-attention plain MHA."""
    return _conv_or_mha(ctx, opts, dynamic=True)
