"""ScaleNorm (Nguyen and Salazar 2019, "Transformers without Tears"): g * x / ||x||, one learned scalar g.

A norm type (the NORM registry), so it goes wherever the model's norm goes: `norm=pre_scale` (the paper's
PreNorm + ScaleNorm), `norm=post_scale`, `norm.type=scalenorm` with any placement, and a qk_norm over each head.
g starts at sqrt(dim), so a vector leaves with root-mean-square 1, as after an RMSNorm with unit gains
(x-transformers keeps g at 1 and multiplies by a fixed sqrt(dim): the same function).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from zoo.component import Context, Options, need
from zoo.registry import NORM


@dataclass(kw_only=True)
class ScaleNormOptions(Options):
    eps: float = 1e-5  # the floor of ||x|| (the paper's code clamps the norm, it adds nothing to it)


@NORM.register("scalenorm", options=ScaleNormOptions)
class ScaleNorm(nn.Module):
    """g * x / max(||x||, eps) over the last dimension; one parameter, whatever the width."""

    count_as = "norm"

    def __init__(self, ctx: Context, opts: ScaleNormOptions, dim: int | None = None):
        super().__init__()
        need(opts.eps > 0, "norm.eps", f"must be positive, got {opts.eps!r}; valid: a finite number > 0")
        self.dim, self.eps = dim or ctx.d_model, opts.eps
        self.g = nn.Parameter(torch.tensor(math.sqrt(self.dim)))
        self.constants = {"g": math.sqrt(self.dim)}  # init_weights sets it

    @property
    def weight(self) -> torch.Tensor:
        """The gain each feature gets, (dim,): g for every one (what LayerNorm's and RMSNorm's weight is)."""
        return self.g.expand(self.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))  # the norm in float32 at least, as RMSNorm's
        return (wide / wide.norm(dim=-1, keepdim=True).clamp(min=self.eps)).type_as(x) * self.g
