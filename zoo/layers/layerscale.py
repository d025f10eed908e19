"""LayerScale (Touvron et al. 2021, CaiT): x + diag(lambda) f(norm(x)), a learned scale per channel of each
residual branch's output, from a small lambda chosen by depth.

A placement of its own (`layerscale`: presets `norm=layerscale_ln`, `layerscale_rms`), not an option of `pre`:
it changes the residual step's formula and holds parameters of the step, as ReZero's alpha (zoo/layers/rezero.py),
which is its one-scalar special case. CaiT places it on Pre-LN branches, so it has Pre-LN's final norm.
lambda starts at 0.1 for up to 18 blocks, 1e-5 up to 24, 1e-6 beyond (CaiT, section 3.1), set by
`init_for_depth` once the model's depth is known; the width is the norm's (every norm's weight has one gain per
channel). Parameters: d_model per residual step, counted as norm parameters; no FLOPs counted.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from zoo.layers.rezero import Gain
from zoo.registry import RESIDUAL


def layerscale_start(blocks: int) -> float:
    """CaiT's initial lambda for a model of `blocks` blocks."""
    return 0.1 if blocks <= 18 else 1e-5 if blocks <= 24 else 1e-6


@RESIDUAL.register("layerscale")
class LayerScale(nn.Module):
    """x + lambda * f(norm(x)), lambda a vector over the channels."""

    final_norm, parallel = True, False

    def __init__(self, f: nn.Module, make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.norm, self.f = make_norm(), f
        self.scale = Gain(layerscale_start(1), dim=self.norm.weight.shape[-1])

    def forward(self, x: torch.Tensor, **kw) -> torch.Tensor:
        return x + self.scale(self.f(self.norm(x), **kw))

    def init_for_depth(self, blocks: int) -> None:
        self.scale.constants = {"gain": layerscale_start(blocks)}
        with torch.no_grad():
            self.scale.gain.fill_(layerscale_start(blocks))
