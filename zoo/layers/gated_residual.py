"""A gated residual (x-transformers' `gate_residual`; GRU gating after Parisotto et al. 2019's GTrXL): the residual
add x + y replaced by a GRU cell whose input is the branch's output y = f(norm(x)) and whose state is the stream
x: x' = (1 - z) * n + z * x, with z and n the cell's update gate and candidate (torch.nn.GRUCell).

A placement of its own (`gated`: presets `norm=gated_ln`, `gated_rms`), on Pre-LN branches as x-transformers'
(its default pre-norm), so with a final norm. The gate's width is the norm's (every norm's weight has one gain per
channel). It starts near the identity: the update gate's bias from 2, so z = sigmoid(2) = 0.88 of the stream
passes (GTrXL's b_g > 0; x-transformers keeps torch's default init, the same function). The gate has biases
whatever model.bias says (that start is one). Parameters per residual
step: 6 d^2 + 6 d, counted as norm parameters (the residual step's own); FLOPs: 12 d^2 per token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from zoo.registry import RESIDUAL


class GRUGate(nn.GRUCell):
    """GRUCell(input=y, state=x) over every token at once: (B, T, d) in, (B, T, d) out."""

    count_as = "norm"  # the residual step's own parameters (count_params has no residual group)

    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return super().forward(y.reshape(-1, y.shape[-1]), x.reshape(-1, x.shape[-1])).reshape_as(x)

    def flops(self, t: int) -> int:
        return 2 * (self.weight_ih.numel() + self.weight_hh.numel())  # two matrix products per token


@RESIDUAL.register("gated")
class GatedResidual(nn.Module):
    """GRU(f(norm(x)), x) instead of x + f(norm(x))."""

    final_norm, parallel = True, False

    def __init__(self, f: nn.Module, make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.norm, self.f = make_norm(), f
        d = self.norm.weight.shape[-1]
        self.gate = GRUGate(d, d)

    def forward(self, x: torch.Tensor, **kw) -> torch.Tensor:
        return self.gate(self.f(self.norm(x), **kw), x)

    def init_for_depth(self, blocks: int) -> None:
        d = self.gate.hidden_size
        with torch.no_grad():  # biases 0 as the zoo's (theirs are named bias_ih, bias_hh: init_weights draws them),
            self.gate.bias_ih.zero_()
            self.gate.bias_hh.zero_()
            self.gate.bias_hh[d:2 * d].fill_(2.0)  # but the update gate's, in torch's order (reset, update, new)
