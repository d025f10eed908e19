"""Norm placement: where the norm sits relative to the residual connection.

Each placement wraps a sublayer f (attention or FFN) and a norm factory; its forward is the
textbook formula. `final_norm` says whether the stack needs a norm after the last block (the default
that `model.final_norm: true|false` overrides).
`parallel` says how the block hands over its sublayers: False, one at a time, each in its own residual
step (pre, post, sandwich); True, all at once, by name, in one residual step (parallel).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from zoo.registry import RESIDUAL


@RESIDUAL.register("pre")
class PreNorm(nn.Module):
    """x + f(norm(x)): GPT-2, Llama. Gradients pass the identity path untouched (Xiong et al. 2020)."""

    final_norm, parallel = True, False

    def __init__(self, f: nn.Module, make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.norm, self.f = make_norm(), f

    def forward(self, x: torch.Tensor, **kw) -> torch.Tensor:
        return x + self.f(self.norm(x), **kw)


@RESIDUAL.register("post")
class PostNorm(nn.Module):
    """norm(x + f(x)): the original Transformer and BERT; needs warm-up to train deep stacks."""

    final_norm, parallel = False, False

    def __init__(self, f: nn.Module, make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.norm, self.f = make_norm(), f

    def forward(self, x: torch.Tensor, **kw) -> torch.Tensor:
        return self.norm(x + self.f(x, **kw))


@RESIDUAL.register("sandwich")
class SandwichNorm(nn.Module):
    """x + norm_out(f(norm(x))): Peri-LN / sandwich-LN, bounds each sublayer's contribution."""

    final_norm, parallel = True, False

    def __init__(self, f: nn.Module, make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.norm, self.f, self.norm_out = make_norm(), f, make_norm()

    def forward(self, x: torch.Tensor, **kw) -> torch.Tensor:
        return x + self.norm_out(self.f(self.norm(x), **kw))


class Branches(nn.ModuleDict):
    """Sublayers side by side on one input; the output is the sum of theirs."""

    def forward(self, h: torch.Tensor, **kw: dict) -> torch.Tensor:
        # kw: each sublayer's own keyword arguments, under its name ("attn", "cross", "ffn")
        return sum(f(h, **kw[name]) for name, f in self.items())


@RESIDUAL.register("parallel")
class ParallelNorm(nn.Module):
    """x + attn(norm(x)) + ffn(norm(x)): GPT-J (Wang and Komatsuzaki 2021), PaLM (Chowdhery et al. 2022).

    One norm feeds every branch, as in GPT-J and PaLM. A block is one residual step, so the attention and
    FFN input projections could be fused into one matrix product (PaLM; here they run one after the
    other), at the cost that the FFN no longer sees the same block's attention output.
    In an encoder-decoder's decoder, cross-attention is a third branch on the same norm,
    x + attn(norm(x)) + cross(norm(x), memory) + ffn(norm(x)): the block stays one residual step, and
    no branch sees another's output (a sequential cross-attention would feed the FFN but not attn)."""

    final_norm, parallel = True, True

    def __init__(self, fs: dict[str, nn.Module], make_norm: Callable[[], nn.Module]):
        super().__init__()
        self.norm, self.f = make_norm(), Branches(fs)

    def forward(self, x: torch.Tensor, **kw: dict) -> torch.Tensor:
        return x + self.f(self.norm(x), **kw)
