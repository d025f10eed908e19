"""Normalisation layers, built as `norm(ctx, opts, dim=None)`: dim defaults to d_model (a norm
over each head's queries and keys passes the head size)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zoo.component import Context, Options, need
from zoo.registry import NORM


@dataclass(kw_only=True)
class NormOptions(Options):
    eps: float = 1e-5  # added to the variance (or mean square) before the square root


def _check(opts: NormOptions) -> None:
    need(opts.eps > 0, "norm.eps", f"must be positive, got {opts.eps!r}; valid: a finite number > 0")


@NORM.register("layernorm", options=NormOptions)
class LayerNorm(nn.LayerNorm):
    """LayerNorm (Ba et al. 2016): centre, scale to unit variance, then gain and optional bias."""

    count_as, constants = "norm", {"weight": 1.0}

    def __init__(self, ctx: Context, opts: NormOptions, dim: int | None = None):
        _check(opts)
        super().__init__(dim or ctx.d_model, eps=opts.eps, bias=ctx.bias)


@NORM.register("rmsnorm", options=NormOptions)
class RMSNorm(nn.Module):
    """RMSNorm (Zhang and Sennrich 2019): x / rms(x) * gain. No centring and no bias."""

    count_as, constants = "norm", {"weight": 1.0}

    def __init__(self, ctx: Context, opts: NormOptions, dim: int | None = None):
        super().__init__()
        _check(opts)
        self.eps = opts.eps
        self.weight = nn.Parameter(torch.ones(dim or ctx.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 at least, so bf16 activations keep their precision (as Llama does) and float64 its own.
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        return F.rms_norm(wide, (x.shape[-1],), eps=self.eps).type_as(x) * self.weight
