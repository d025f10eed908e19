"""ffn=pkm: a product key memory in place of the FFN (Lample et al. 2019, "Large Memory Layers with Product Keys").

A memory of n_keys^2 value vectors (each d_model wide) that a token reads sparsely, per head:
- a query q = norm(W x + b) of `k_dim` numbers, split in two halves q1, q2;
- two sets of `n_keys` sub-keys c_i, c'_j (k_dim / 2 each); the memory's keys are every pair (c_i, c'_j), with
  score q . (c_i, c'_j) = q1 . c_i + q2 . c'_j;
- the best `topk` of those n_keys^2 scores are found exactly without scoring them all: the top-k of q1 . c_i and
  of q2 . c'_j give k * k candidates, which hold the top-k of all pairs (a pair outside them is beaten by k pairs
  inside), and the top-k of the candidates is taken;
- w = softmax of those k scores; the head's output is sum w_k v_(i_k, j_k).
`heads` heads, each with its own query and sub-keys, read the one shared set of values; their outputs add.

The query norm (`query_norm`) is the paper's batch norm by default (they report it keeps more of the memory in use);
`layer` normalises each head's query on its own, `none` skips it. Both are without gain and bias: a gain on q is
the same as a scale of the sub-keys. Batch norm in training mode takes its statistics over every position in the
batch, later ones and padding included, as the paper's; in evaluation (and so in generation) it uses running
statistics and each token's output is its own, so cached decoding equals recomputation.

Costs (from the module): the values a token does not read are `inactive_params` (count_params' `active`);
`flops` counts the query, the 2 * n_keys sub-key scores per head, the k * k candidate sums and the weighted sum.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import torch
from torch import nn

from zoo.component import Context, Options, linear_flops, need
from zoo.registry import FFN

QUERY_NORMS = ("batch", "layer", "none")


@dataclass(kw_only=True)
class PKMOptions(Options):
    n_keys: int = 32  # sub-keys per half: the memory holds n_keys^2 values of d_model each
    topk: int = 8  # values read per head (and sub-keys kept per half)
    heads: int = 4  # memory heads: each its own query and sub-keys, all reading the same values
    k_dim: int | None = None  # query and key size (even: two halves); null: d_model
    query_norm: Literal["batch", "layer", "none"] = "batch"  # the paper's batch norm on the query
    widths: ClassVar[tuple[str, ...]] = ("k_dim",)  # options that grow with d_model (zoo.mup scales them along)


class ProductKeyMemory(nn.Module):
    count_as = "ffn"
    residual_outputs = ("values",)  # writes into the residual stream: depth-scaled init

    def __init__(self, ctx: Context, opts: PKMOptions):
        super().__init__()
        k_dim = opts.k_dim or ctx.d_model
        need(opts.n_keys >= 1, "ffn.n_keys", f"must be a positive integer, got {opts.n_keys}")
        need(1 <= opts.topk <= opts.n_keys, "ffn.topk", f"must be between 1 and n_keys={opts.n_keys}, got {opts.topk}")
        need(opts.heads >= 1, "ffn.heads", f"must be a positive integer, got {opts.heads}")
        need(k_dim >= 2 and k_dim % 2 == 0, "ffn.k_dim", f"must be an even integer >= 2 (two halves), got {k_dim}")
        need(opts.query_norm in QUERY_NORMS, "ffn.query_norm",
             f"unknown {opts.query_norm!r}; valid: {', '.join(QUERY_NORMS)}")
        self.n_keys, self.topk, self.heads, self.k_dim = opts.n_keys, opts.topk, opts.heads, k_dim
        self.query = nn.Linear(ctx.d_model, opts.heads * k_dim, bias=ctx.bias)
        self.query_norm: nn.Module = {
            "batch": nn.BatchNorm1d(opts.heads * k_dim, affine=False),  # over every token of the batch
            "layer": nn.LayerNorm(k_dim, elementwise_affine=False),  # over each head's query
            "none": nn.Identity()}[opts.query_norm]
        self.keys = nn.Parameter(torch.empty(opts.heads, 2, opts.n_keys, k_dim // 2))  # (H, half, n_keys, k_dim/2)
        self.values = nn.Embedding(opts.n_keys ** 2, ctx.d_model)  # slot i * n_keys + j: the pair (c_i, c'_j)
        self.dropout = nn.Dropout(ctx.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, k = x.shape[:-1].numel(), self.topk
        q = self.query(x.reshape(n, -1))  # (N, H * k_dim)
        q = self.query_norm(q) if isinstance(self.query_norm, nn.BatchNorm1d) else \
            self.query_norm(q.view(n, self.heads, self.k_dim)).view(n, -1)
        q = q.view(n, self.heads, 2, self.k_dim // 2)
        half_scores = torch.einsum("nhsd,hscd->nhsc", q, self.keys)  # (N, H, 2, n_keys)
        s, i = half_scores.topk(k, dim=-1)  # (N, H, 2, k): the best sub-keys of each half
        cand = (s[:, :, 0, :, None] + s[:, :, 1, None, :]).flatten(2)  # (N, H, k * k): the candidate pairs
        slot = (i[:, :, 0, :, None] * self.n_keys + i[:, :, 1, None, :]).flatten(2)
        best, j = cand.topk(k, dim=-1)  # (N, H, k)
        w = best.softmax(-1)
        v = self.values(slot.gather(-1, j))  # (N, H, k, d_model)
        out = (w.unsqueeze(-1).to(v.dtype) * v).sum((1, 2))  # heads add
        return self.dropout(out.view(x.shape))

    @classmethod
    def resize(cls, opts: PKMOptions, size: int) -> PKMOptions:
        """Its query and key size set to size (budget=params): the count grows linearly with it (the values,
        n_keys^2 * d_model, do not change, so a memory far larger than the baseline's FFN cannot be matched)."""
        return replace(opts, k_dim=size)

    def inactive_params(self) -> int:
        """The values a token does not read: all but heads * topk of the n_keys^2 (at most that many are read)."""
        unread = self.n_keys ** 2 - min(self.n_keys ** 2, self.heads * self.topk)
        return unread * self.values.weight.shape[1]

    def flops(self, t: int) -> int:
        """One token: the query, its scores against both halves' sub-keys, the k * k candidate sums, and the
        weighted sum of heads * topk values."""
        d = self.values.weight.shape[1]
        scores = 2 * self.heads * self.n_keys * self.k_dim  # 2 halves x n_keys x k_dim / 2 multiply-adds
        return linear_flops(self.query) + scores + self.heads * self.topk ** 2 + 2 * self.heads * self.topk * d


FFN.register("pkm", ProductKeyMemory, options=PKMOptions,
             examples=[{}, {"n_keys": 5, "topk": 3, "heads": 3, "k_dim": 8, "query_norm": "layer"},
                       {"n_keys": 4, "topk": 4, "heads": 1, "query_norm": "none"}])
