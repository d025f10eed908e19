"""Hyper-connections (Zhu et al. 2024, "Hyper-Connections"): n residual streams (model.residual_streams, the
expansion rate), mixed by learned connections around each sublayer T (its norm included, as Pre-LN's f(norm(.))).

With the streams H (n, d) of a token, per residual step (the paper's eqs. 5-7):
    h = A_m^T H                  the width connection: the sublayer's input, a mix of the streams
    H' = B^T T(h) + A_r^T H      the depth connection B writes T's output to each stream; A_r mixes the streams
A_m (n,), A_r (n, n), B (n,) start as Pre-LN (the paper's eq. 14): A_m = e_{k mod n} for block k of the model
(its attention and FFN alike), A_r = I, B = 1. `hyper_dynamic` adds the paper's dynamic connections
(DHC, eqs. 11-13), from the normed streams Hn = norm(H):
    A_m(H) = A_m + s_a tanh(Hn W_m),  A_r(H) = A_r + s_a tanh(Hn W_r),  B(H) = B + s_b tanh(Hn W_b)
with W_m, W_b (d,) and W_r (d, n) from 0 and the learned scalars s_a = s_b = 0.01.

The stack opens the streams as n copies of the embeddings and closes them as their sum, before the final norm
(the paper's sum of the last layer's streams): stream 0 rides as the block's x, the others in the carried state.
Every stream of a token is that token's alone, so cached decoding needs nothing beyond the attentions' caches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from zoo.component import Context
from zoo.registry import RESIDUAL


class Streams(nn.Module):
    """The n streams beside x: opened as copies of the embeddings, closed as the sum of all n."""

    def __init__(self, ctx: Context):
        super().__init__()
        self.n = ctx.residual_streams

    def open(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"rest": x.unsqueeze(-2).expand(*x.shape[:-1], self.n - 1, x.shape[-1])}  # (B, T, n - 1, d)

    def close(self, x: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        return x + state["rest"].sum(-2)


class Connections(nn.Module):
    """A_m, A_r, B of one residual step, and its dynamic part (W_m, W_r, W_b, s_a, s_b) when dynamic."""

    count_as = "norm"  # the residual's own parameters, counted with the norms, as the other placements' scalars

    def __init__(self, n: int, step: int, d: int, dynamic: bool, make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.n, self.step, self.d = n, step, d
        self.width_in, self.width_mix, self.depth = (nn.Parameter(torch.empty(n)), nn.Parameter(torch.empty(n, n)),
                                                     nn.Parameter(torch.empty(n)))
        self.norm = make_norm() if dynamic else None
        made = (lambda *shape: nn.Parameter(torch.empty(shape))) if dynamic else (lambda *shape: None)
        self.w_in: nn.Parameter | None = made(d)
        self.w_mix: nn.Parameter | None = made(d, n)
        self.w_depth: nn.Parameter | None = made(d)
        self.s_width: nn.Parameter | None = made()
        self.s_depth: nn.Parameter | None = made()
        self.init_for_depth(0)

    def init_for_depth(self, blocks: int) -> None:
        """Pre-LN at the start (eq. 14), whatever init_weights drew; the dynamic weights 0, their scales 0.01."""
        with torch.no_grad():
            self.width_in.copy_(torch.eye(self.n)[self.step % self.n])
            self.width_mix.copy_(torch.eye(self.n))
            self.depth.fill_(1.0)
            for p in (self.w_in, self.w_mix, self.w_depth):
                if p is not None:
                    p.zero_()
            for p in (self.s_width, self.s_depth):
                if p is not None:
                    p.fill_(0.01)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Streams (B, T, n, d) -> A_m (.., n), A_r (.., n, n), B (.., n): static, or per token when dynamic."""
        if self.norm is None:
            return self.width_in, self.width_mix, self.depth
        hn = self.norm(h)
        return (self.width_in + self.s_width * torch.tanh(hn @ self.w_in),
                self.width_mix + self.s_width * torch.tanh(hn @ self.w_mix),
                self.depth + self.s_depth * torch.tanh(hn @ self.w_depth))

    def flops(self, t: int) -> int:
        """Per token: the mixes (n x d for A_m^T H, n x n x d for A_r^T H, n x d for B^T y), and the dynamic
        projections (n x d x (n + 2)), 2 FLOPs per multiply-add."""
        mixes = 2 * self.n * self.d * (self.n + 2)
        return 2 * mixes if self.norm is not None else mixes


class HyperConnection(nn.Module):
    """Streams H -> H' = B^T f(norm(A_m^T H)) + A_r^T H; x is stream 0, the others ride in the carried state. Built
    alone (no context, no state) it is one stream: Pre-LN."""

    final_norm, parallel, carry, contextual = True, False, Streams, True
    dynamic = False

    def __init__(self, f: nn.Module, make_norm: Callable[[], nn.Module], ctx: Context | None = None):
        super().__init__()
        n, step = (ctx.residual_streams, ctx.layer) if ctx is not None else (1, 0)
        self.norm, self.f = make_norm(), f
        d = ctx.d_model if ctx is not None else 0
        self.connections = Connections(n, step, d, self.dynamic and ctx is not None, make_norm)

    def forward(self, x: torch.Tensor, state: dict[str, Any] | None = None, **kw: Any) -> torch.Tensor:
        h = x.unsqueeze(-2) if state is None else torch.cat([x.unsqueeze(-2), state["rest"]], dim=-2)  # (B, T, n, d)
        width_in, width_mix, depth = self.connections(h)
        y = self.f(self.norm(torch.einsum("...n,...nd->...d", width_in, h)), **kw)
        h = depth.unsqueeze(-1) * y.unsqueeze(-2) + torch.einsum("...nm,...nd->...md", width_mix, h)
        if state is not None:
            state["rest"] = h[..., 1:, :]
        return h[..., 0, :]


@RESIDUAL.register("hyper")
class StaticHyperConnection(HyperConnection):
    """Static hyper-connections (SHC): A_m, A_r, B learned, the same for every token."""


@RESIDUAL.register("hyper_dynamic")
class DynamicHyperConnection(HyperConnection):
    """Dynamic hyper-connections (DHC): A_m, A_r, B shifted per token by tanh projections of the normed streams."""

    dynamic = True
