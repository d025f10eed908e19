"""Normalisation layers. Every norm has the constructor shape `(dim, eps, bias)`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.registry import NORM


@NORM.register("layernorm")
class LayerNorm(nn.LayerNorm):
    """LayerNorm (Ba et al. 2016): centre, scale to unit variance, then gain and optional bias."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True):
        super().__init__(dim, eps=eps, bias=bias)


@NORM.register("rmsnorm")
class RMSNorm(nn.Module):
    """RMSNorm (Zhang and Sennrich 2019): x / rms(x) * gain. No centring and no bias."""

    def __init__(self, dim: int, eps: float = 1e-6, bias: bool = False):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 so bf16 activations keep their precision, as Llama does.
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).type_as(x) * self.weight
