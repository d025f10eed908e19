"""Position-wise feed-forward networks. Constructor shape: `(d_model, d_ff, bias, dropout)`.

`d_ff=None` picks the usual hidden size: 4 * d_model for MLP, and for gated variants the
parameter-matched 2/3 of that (three matrices instead of two), rounded up to a multiple of 8.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from zoo.registry import FFN

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),  # GPT-2's "gelu_new"
    "silu": F.silu,
}


def default_d_ff(d_model: int, gated: bool) -> int:
    if not gated:
        return 4 * d_model
    return 8 * ((2 * 4 * d_model // 3 + 7) // 8)


class MLP(nn.Module):
    """down(act(up(x))): the original Transformer FFN (ReLU) and GPT/BERT's (GELU)."""

    gated = False
    activation = "gelu"

    def __init__(self, d_model: int, d_ff: int | None, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        d_ff = d_ff or default_d_ff(d_model, self.gated)
        self.act = ACTIVATIONS[self.activation]
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down(self.act(self.up(x))))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): GLU variants (Shazeer 2020), e.g. SwiGLU in Llama."""

    gated = True
    activation = "silu"

    def __init__(self, d_model: int, d_ff: int | None, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        d_ff = d_ff or default_d_ff(d_model, self.gated)
        self.act = ACTIVATIONS[self.activation]
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down(self.act(self.gate(x)) * self.up(x)))


# One registered subclass per variant: the class says which activation, nothing else changes.
for _name, _base, _act in [
    ("relu", MLP, "relu"), ("gelu", MLP, "gelu"), ("gelu_tanh", MLP, "gelu_tanh"),
    ("reglu", GatedMLP, "relu"), ("geglu", GatedMLP, "gelu"), ("swiglu", GatedMLP, "silu"),
]:
    FFN.register(_name, type(_name.upper(), (_base,), {"activation": _act}))
