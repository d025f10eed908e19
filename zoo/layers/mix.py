"""A learned two-scalar mix, a * x + b * y, from the start its use gives (a0, b0).

The speedrun's (modded-nanogpt) two uses, each one per layer:
- value embeddings (model.value_embeddings): an attention's values v = a * v + b * ve, ve a token's vector from
  an extra embedding table, from (0.5, 0.5) as the speedrun's and ResFormer's (Zhou et al. 2024) mix of the
  first layer's values;
- embedding skips (model.embed_skip): a block's input x = a * x + b * x0, x0 the stack's embedding output, from
  (1, 0): the input unchanged until training moves b.
"""

from __future__ import annotations

import torch
from torch import nn


class ScalarMix(nn.Module):
    """a * x + b * y with learned scalars a and b, starting at (a0, b0)."""

    def __init__(self, count_as: str, a0: float, b0: float):
        super().__init__()
        self.count_as = count_as  # counted with the part it serves (attention) or with the embeddings (skips)
        self.constants = {"a": a0, "b": b0}  # init_weights sets them
        self.a, self.b = nn.Parameter(torch.tensor(float(a0))), nn.Parameter(torch.tensor(float(b0)))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.a * x + self.b * y

    def flops(self, t: int) -> int:
        return 0  # two scalar products per feature: no matrix product
