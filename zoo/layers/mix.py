"""A learned two-scalar mix, a * x + b * y, starting at a = 1, b = 0: the input unchanged until training moves b.

The speedrun's (modded-nanogpt) two uses, each one per layer:
- value embeddings (model.value_embeddings): an attention's values v = a * v + b * ve, ve a token's vector from
  an extra embedding table (ResFormer, Zhou et al. 2024, mixes the first layer's values in the same way);
- embedding skips (model.embed_skip): a block's input x = a * x + b * x0, x0 the stack's embedding output.
"""

from __future__ import annotations

import torch
from torch import nn


class ScalarMix(nn.Module):
    """a * x + b * y with learned scalars a (init 1: a gain) and b (init 0)."""

    gains, zeros = ("a",), ("b",)  # init_weights sets them

    def __init__(self, count_as: str):
        super().__init__()
        self.count_as = count_as  # counted with the part it serves (attention) or with the embeddings (skips)
        self.a, self.b = nn.Parameter(torch.ones(())), nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.a * x + self.b * y

    def flops(self, t: int) -> int:
        return 0  # two scalar products per feature: no matrix product
