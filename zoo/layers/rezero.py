"""ReZero (Bachlechner et al. 2020): x + alpha * f(x), one learned scalar alpha per residual step, from 0.

Two norm placements (the RESIDUAL registry), so the `norm` group picks them as it picks pre and post:
- `rezero`: x + alpha * f(x), the paper's, with no norm in the block and none after the last (`norm=rezero`;
  the norm type then serves only what else asks for one: qk_norm, embed_norm, a final_norm set true);
- `rezero_pre`: x + alpha * f(norm(x)), Narang et al. 2021's "ReZero + LayerNorm" / "+ RMS Norm" rows as we read
  them (the scalar on a Pre-LN branch), with a final norm as Pre-LN's (`norm=rezero_ln`, `norm=rezero_rms`).
Each block starts as the identity: alpha = 0, so the first steps' gradients reach alpha through f(x), not f's
weights (theirs are zero until alpha moves). alpha counts as a norm parameter (it takes the norm's place).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from zoo.registry import RESIDUAL


class Gain(nn.Module):
    """A learned multiplier of a residual branch's output: one scalar (ReZero) or one per channel (LayerScale),
    from `start` (init_weights sets it: `constants`)."""

    count_as = "norm"  # counted in the norm group: it stands where a norm would (count_params has no residual group)

    def __init__(self, start: float, dim: int | None = None):
        super().__init__()
        self.gain = nn.Parameter(torch.full(() if dim is None else (dim,), float(start)))
        self.constants = {"gain": float(start)}

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.gain * y

    def flops(self, t: int) -> int:
        return 0  # an elementwise product: no matrix product


@RESIDUAL.register("rezero")
class ReZero(nn.Module):
    """x + alpha * f(x), alpha from 0: no norm at all (Bachlechner et al. 2020)."""

    final_norm, parallel = False, False

    def __init__(self, f: nn.Module, make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.f, self.alpha = f, Gain(0.0)

    def forward(self, x: torch.Tensor, **kw) -> torch.Tensor:
        return x + self.alpha(self.f(x, **kw))


@RESIDUAL.register("rezero_pre")
class ReZeroPre(nn.Module):
    """x + alpha * f(norm(x)), alpha from 0: ReZero on a Pre-LN branch (Narang et al. 2021's ReZero + norm)."""

    final_norm, parallel = True, False

    def __init__(self, f: nn.Module, make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.norm, self.f, self.alpha = make_norm(), f, Gain(0.0)

    def forward(self, x: torch.Tensor, **kw) -> torch.Tensor:
        return x + self.alpha(self.f(self.norm(x), **kw))
