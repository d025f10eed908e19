"""Norm placement: where the norm sits relative to the residual connection.

Each placement wraps a sublayer f (attention or FFN) and a norm factory; its forward is the
textbook formula. `final_norm` says whether the stack needs a norm after the last block (the default
that `model.final_norm: true|false` overrides);
`n_norms` how many norms one wrapped sublayer holds (for the analytic parameter count).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from zoo.registry import RESIDUAL


@RESIDUAL.register("pre")
class PreNorm(nn.Module):
    """x + f(norm(x)): GPT-2, Llama. Gradients pass the identity path untouched (Xiong et al. 2020)."""

    final_norm, n_norms = True, 1

    def __init__(self, f: nn.Module, make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.norm, self.f = make_norm(), f

    def forward(self, x: torch.Tensor, **kw) -> torch.Tensor:
        return x + self.f(self.norm(x), **kw)


@RESIDUAL.register("post")
class PostNorm(nn.Module):
    """norm(x + f(x)): the original Transformer and BERT; needs warm-up to train deep stacks."""

    final_norm, n_norms = False, 1

    def __init__(self, f: nn.Module, make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.norm, self.f = make_norm(), f

    def forward(self, x: torch.Tensor, **kw) -> torch.Tensor:
        return self.norm(x + self.f(x, **kw))


@RESIDUAL.register("sandwich")
class SandwichNorm(nn.Module):
    """x + norm_out(f(norm(x))): Peri-LN / sandwich-LN, bounds each sublayer's contribution."""

    final_norm, n_norms = True, 2

    def __init__(self, f: nn.Module, make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.norm, self.f, self.norm_out = make_norm(), f, make_norm()

    def forward(self, x: torch.Tensor, **kw) -> torch.Tensor:
        return x + self.norm_out(self.f(self.norm(x), **kw))
