"""ResiDual (Xie et al. 2023, "ResiDual: Transformer with Dual Residual Connections"): a Post-LN stream and a
Pre-LN-like stream carried together through the stack.

Each sublayer f reads the Post-LN stream x_a and writes into both:
    x_a <- norm(x_a + f(x_a))        (Post-LN: the stream the sublayers read)
    x_d <- x_d + f(x_a)              (the dual stream: the un-normed branch outputs, summed as in Pre-LN)
with x_a = x_d = the embeddings at the start, and the stack's output x_a + norm(x_d). The Post-LN stream keeps
Post-LN's representational strength; the dual stream gives every layer a gradient path that does not shrink
with depth (the paper's argument against Pre-LN's collapse and Post-LN's vanishing gradients).

The dual stream is the state this placement carries (`carry`): the stack opens it from the embeddings, passes it
through every block, and closes it with its own norm before any final norm (the placement asks for none).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from zoo.component import Context
from zoo.registry import RESIDUAL


class DualStream(nn.Module):
    """The dual stream x_d, opened as the embeddings, closed as x_a + norm(x_d)."""

    def __init__(self, ctx: Context):
        super().__init__()
        self.norm = ctx.norm()

    def open(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"dual": x}

    def close(self, x: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        return x + self.norm(state["dual"])


@RESIDUAL.register("resi_dual")
class ResiDual(nn.Module):
    """norm(x + f(x)), the branch output also added to the carried dual stream. Without a carried state (a
    placement used alone) it is Post-LN."""

    final_norm, parallel, carry = False, False, DualStream

    def __init__(self, f: nn.Module, make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.norm, self.f = make_norm(), f

    def forward(self, x: torch.Tensor, state: dict[str, Any] | None = None, **kw) -> torch.Tensor:
        y = self.f(x, **kw)
        if state is not None:
            state["dual"] = state["dual"] + y
        return self.norm(x + y)
