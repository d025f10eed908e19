"""Fixup (Zhang et al. 2019, "Fixup Initialization: Residual Learning Without Normalization"): no norm; each
residual branch starts at zero output and its inner weights scaled down with depth, plus scalar biases and a scalar
multiplier around the branch.

The placement `fixup` (`norm=fixup`; the norm type then serves only qk_norm, embed_norm, a final_norm set true):
    x + scale * f(x + bias_in) + bias_out
with scalars from scale = 1, biases 0 (Fixup's rule 3: a scalar multiplier per branch and scalar biases; the biases
Fixup puts before each inner layer and activation are the sublayers' own linear biases here, model.bias). Its
initialisation (init_for_depth), after the zoo's draws, for L residual branches (2 per block):
- rule 2: the branch's last layers (the weights its parts list in `residual_outputs`: attention `out`, FFN `down`)
  start at 0;
- rule 2: every other weight matrix in the branch is scaled by L^(-1/(2m-2)), m = 2 layers per branch in zoo's
  attention (value, output) and FFN (up, down): L^(-1/2). We scale all of them, queries and keys too, having no
  way to tell the value path from the rest of a fused projection without naming the part.
It composes with model.parametrization=mup (the rescale multiplies muP's draws) and makes residual_init moot (the
last layers are zero either way). No final norm, as the paper's network.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from zoo.component import declared
from zoo.registry import RESIDUAL


class FixupScalars(nn.Module):
    """The branch's scalar input bias, multiplier and output bias."""

    count_as = "norm"  # counted in the norm group: they stand where the norm would
    constants = {"bias_in": 0.0, "scale": 1.0, "bias_out": 0.0}

    def __init__(self):
        super().__init__()
        self.bias_in, self.scale, self.bias_out = (nn.Parameter(torch.tensor(v)) for v in self.constants.values())

    def flops(self, t: int) -> int:
        return 0  # scalar operations


@RESIDUAL.register("fixup")
class Fixup(nn.Module):
    """x + scale * f(x + bias_in) + bias_out, initialised by Fixup's rules."""

    final_norm, parallel = False, False
    layers_per_branch = 2  # Fixup's m: zoo's attention (value, output) and FFN (up, down)

    def __init__(self, f: nn.Module, make_norm: Callable[[], nn.Module]):
        super().__init__()
        # held as `branch`, not `f` as other placements hold theirs: its weights start from other values (Fixup's
        # rules), and their names say so (swapping a placement keeps the draws only of the weights that keep a name)
        self.branch, self.scalars = f, FixupScalars()

    def forward(self, x: torch.Tensor, **kw) -> torch.Tensor:
        s = self.scalars
        return x + s.scale * self.branch(x + s.bias_in, **kw) + s.bias_out

    def init_for_depth(self, blocks: int) -> None:
        branches = 2 * blocks  # L: an attention and an FFN per block
        last = {id(getattr(m, name).weight) for m in self.branch.modules() if hasattr(m, "count_as")
                for name in declared(m, "residual_outputs")}
        factor = branches ** (-1 / (2 * self.layers_per_branch - 2))
        with torch.no_grad():
            for m in self.branch.modules():
                if isinstance(m, nn.Linear):
                    m.weight.zero_() if id(m.weight) in last else m.weight.mul_(factor)
