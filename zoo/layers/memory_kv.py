"""Persistent memory key/values (Sukhbaatar et al. 2019, "Augmenting Self-attention with Persistent Memory"):
each key/value head has n_mem_kv learned keys and values of its own, placed before the sequence's keys, which
every query sees:
    y_h = softmax(q_h [M_k,h ; K_h]^T / sqrt(d)) [M_v,h ; V_h]
The memory is a weight, not a token: it is not cached (the cache holds the sequence's keys and values, as MHA's)
and no position reaches it (RoPE rotates the sequence's keys; a position bias and the window leave it visible).
x-transformers' num_mem_kv. A part of its own, as it adds weights. Memory per key/value head, so n_kv_heads shares
them as GQA does; cross-attention prepends the same memory to the encoder's keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from zoo.component import Context, need
from zoo.layers.attention import Attention, HeadsOptions, KVCache, attention_mask, kv_heads
from zoo.layers.position import Position
from zoo.registry import ATTENTION


@dataclass(kw_only=True)
class MemoryKVOptions(HeadsOptions):
    n_mem_kv: int = 4  # learned keys and values per key/value head


class MemoryKV(Attention):
    # not with norm=ngpt (AttentionPart.sphere): its learned memory keys are not normalised with the tokens'
    sphere = False
    pools_queries = False  # model.funnel's pooled queries: not through this forward

    def __init__(self, ctx: Context, opts: MemoryKVOptions):
        need(opts.n_mem_kv > 0, "attention.n_mem_kv", f"must be a positive integer, got {opts.n_mem_kv}")
        super().__init__(ctx, opts, kv_heads(ctx, opts))
        self.n_mem_kv = opts.n_mem_kv
        self.mem_k = nn.Parameter(torch.zeros(self.n_kv_heads, opts.n_mem_kv, self.head_dim))  # (H_kv, n, hd)
        self.mem_v = nn.Parameter(torch.zeros(self.n_kv_heads, opts.n_mem_kv, self.head_dim))

    def forward(self, x: torch.Tensor, pos: Position, mask: torch.Tensor | None = None,
                is_causal: bool = False, context: torch.Tensor | None = None,
                cache: KVCache | None = None, offset: int = 0,
                value_embed: torch.Tensor | None = None, queries: int | None = None) -> torch.Tensor:
        need(queries is None, "funnel", "this attention does not pool its queries (pools_queries is false)")
        q, k, v = self._project(x, pos, context, cache, offset, value_embed)  # the cache holds no memory
        memory = lambda m: m.to(k.dtype).expand(k.shape[0], -1, -1, -1)  # noqa: E731  (B, H_kv, n, hd)
        k, v = torch.cat([memory(self.mem_k), k], dim=2), torch.cat([memory(self.mem_v), v], dim=2)
        return self._output(self._attend(q, k, v, self._with_memory(mask, is_causal, q.shape[2], k.shape[2]),
                                         False, self.qk_dim), x)

    def _with_memory(self, mask: torch.Tensor | None, is_causal: bool, t_q: int, t_k: int) -> torch.Tensor | None:
        """The sequence's mask (..., t_q, t_k - n) with n visible memory columns first; None: all visible."""
        n = self.n_mem_kv
        if is_causal:
            mask = attention_mask(t_q, t_k - n, True, None, self.mem_k.device)
        if mask is None:
            return None
        seen = mask.new_ones(*mask.shape[:-1], n) if mask.dtype == torch.bool else mask.new_zeros(*mask.shape[:-1], n)
        return torch.cat([seen, mask], dim=-1)

    def flops(self, t: int) -> int:
        """MHA's at context t, and the scores and weighted sum over the n_mem_kv memory keys."""
        return super().flops(t) + 4 * self.n_mem_kv * self.n_heads * self.head_dim


@ATTENTION.register("memory_kv", options=MemoryKVOptions, examples=[{}, {"n_mem_kv": 1, "n_kv_heads": 2}])
def memory_kv(ctx: Context, opts: MemoryKVOptions) -> MemoryKV:
    """Persistent memory: learned keys and values every query sees (Sukhbaatar et al. 2019)."""
    return MemoryKV(ctx, opts)
