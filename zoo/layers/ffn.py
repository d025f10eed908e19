"""Position-wise feed-forward networks, built as `ffn(ctx, opts)` (zoo.component).

`d_ff=None` picks the usual hidden size: 4 * d_model for MLP, and for gated variants the
parameter-matched 2/3 of that (three matrices instead of two), rounded up to a multiple of 8.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from zoo.component import Context, Options, need
from zoo.layers.ngpt import EigenScale
from zoo.registry import FFN

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),  # GPT-2's "gelu_new"
    "silu": F.silu,  # Swish with beta = 1 (Ramachandran et al. 2017)
    "elu": F.elu,
    "selu": F.selu,
    "sigmoid": torch.sigmoid,  # the gate of the original GLU (Dauphin et al. 2017)
    "softplus": F.softplus,
    "identity": lambda x: x,  # no activation: the bilinear GLU (LiGLU)
}


def default_d_ff(d_model: int, gated: bool) -> int:
    if not gated:
        return 4 * d_model
    return 8 * ((2 * 4 * d_model // 3 + 7) // 8)


@dataclass(kw_only=True)
class FFNOptions(Options):
    d_ff: int | None = None  # hidden size; null: 4 * d_model, or 8/3 * d_model (to a multiple of 8) if gated
    post_act_norm: bool = False  # NormFormer (Shleifer et al. 2021): the model's norm over d_ff after the activation
    widths: ClassVar[tuple[str, ...]] = ("d_ff",)  # options that grow with d_model (zoo.mup scales them along)


class _FFN(nn.Module):
    count_as = "ffn"
    residual_outputs = ("down",)  # writes into the residual stream: depth-scaled init
    gated = False  # three matrices instead of two: the default d_ff is 2/3 of the plain one
    sphere = True  # built with ctx.sphere: nGPT's scaled hidden pre-activations (FFNPart.sphere)
    activation = "gelu"

    def __init__(self, ctx: Context, opts: FFNOptions):
        super().__init__()
        need(opts.d_ff is None or opts.d_ff > 0, "ffn.d_ff", f"must be a positive integer or null, got {opts.d_ff!r}")
        self.d_ff = opts.d_ff or default_d_ff(ctx.d_model, self.gated)
        self.act = ACTIVATIONS[self.activation]
        self.post_act_norm = ctx.norm(self.d_ff) if opts.post_act_norm else nn.Identity()
        self.dropout = nn.Dropout(ctx.dropout)
        # nGPT (ctx.sphere): the activation's input v <- s_v sqrt(d_model) v, and a gated FFN's u <- s_u u; s_u and
        # s_v from 1, stored at scale 1 (zoo/layers/ngpt.py). sqrt(d_model) brings v, a product of unit vectors,
        # back to the activation's working range.
        self.s_v = EigenScale(self.d_ff, 1.0, 1.0) if ctx.sphere else None
        self.s_u = EigenScale(self.d_ff, 1.0, 1.0) if ctx.sphere and self.gated else None
        self.v_scale = ctx.d_model ** 0.5

    def _activated(self, v: torch.Tensor) -> torch.Tensor:
        """act(v), v the activation's input, scaled first under nGPT (s_v sqrt(d_model))."""
        return self.act(v if self.s_v is None else self.s_v() * self.v_scale * v)

    @classmethod
    def resize(cls, opts: FFNOptions, size: int) -> FFNOptions:
        """Its hidden size set to size (budget=params)."""
        return replace(opts, d_ff=size)


class MLP(_FFN):
    """down(act(up(x))): the original Transformer FFN (ReLU) and GPT/BERT's (GELU)."""

    def __init__(self, ctx: Context, opts: FFNOptions):
        super().__init__(ctx, opts)
        self.up = nn.Linear(ctx.d_model, self.d_ff, bias=ctx.bias)
        self.down = nn.Linear(self.d_ff, ctx.d_model, bias=ctx.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down(self.post_act_norm(self._activated(self.up(x)))))


class GatedMLP(_FFN):
    """down(act(gate(x)) * up(x)): GLU variants (Shazeer 2020), e.g. SwiGLU in Llama."""

    gated = True
    activation = "silu"

    def __init__(self, ctx: Context, opts: FFNOptions):
        super().__init__(ctx, opts)
        self.gate = nn.Linear(ctx.d_model, self.d_ff, bias=ctx.bias)
        self.up = nn.Linear(ctx.d_model, self.d_ff, bias=ctx.bias)
        self.down = nn.Linear(self.d_ff, ctx.d_model, bias=ctx.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.up(x) if self.s_u is None else self.s_u() * self.up(x)  # nGPT's s_u
        return self.dropout(self.down(self.post_act_norm(self._activated(self.gate(x)) * u)))


# One registered subclass per variant: the class says which activation, nothing else changes. Narang et al.
# 2021's rows: silu is their Swish, glu the sigmoid-gated GLU, liglu the bilinear one (no activation).
for _name, _base, _act in [
    ("relu", MLP, "relu"), ("gelu", MLP, "gelu"), ("gelu_tanh", MLP, "gelu_tanh"), ("silu", MLP, "silu"),
    ("elu", MLP, "elu"), ("selu", MLP, "selu"), ("sigmoid", MLP, "sigmoid"), ("softplus", MLP, "softplus"),
    ("reglu", GatedMLP, "relu"), ("geglu", GatedMLP, "gelu"), ("geglu_tanh", GatedMLP, "gelu_tanh"),
    ("swiglu", GatedMLP, "silu"), ("glu", GatedMLP, "sigmoid"), ("liglu", GatedMLP, "identity"),
]:
    FFN.register(_name, type(_name.upper(), (_base,), {"activation": _act}), options=FFNOptions,
                 examples=[{}, {"post_act_norm": True}] if _name in ("gelu", "swiglu") else None)
