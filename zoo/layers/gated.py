"""Gated attention (Qiu et al. 2025, "Gated Attention for Large Language Models"): each head's output is gated,
before the heads are joined and projected, by a sigmoid of the layer's input:
    y'_h = y_h * sigmoid(x W_h)          y_h = softmax(q_h k_h^T / sqrt(d)) v_h, x the attention's input
`gate` element (default): one gate per output number, W: d_model -> n_heads * head_dim (the paper's best, G1
elementwise; x-transformers' gate_values); head: one gate per head, W: d_model -> n_heads (the paper's
headwise; x-transformers' gate_values_headwise, and gate_value_heads with a bias). One part with an option, not
two: both are the same gate at two granularities. No bias, as the paper's x W_theta; zoo's standard init starts
every gate near sigmoid(0) = 1/2 (x-transformers zero-initialises W: exactly 1/2).

A part of its own (it adds weights); the attention itself is untouched, so the fused kernel still computes it.
Queries' heads are gated, so key/value heads may be shared (n_kv_heads, as GQA); in cross-attention the gate
reads the decoder's input. Each token's gate is its own, so causality and cached decoding are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from zoo.component import Context
from zoo.layers.attention import Attention, HeadsOptions, kv_heads
from zoo.registry import ATTENTION


@dataclass(kw_only=True)
class GatedOptions(HeadsOptions):
    gate: Literal["element", "head"] = "element"  # a gate per output number of each head, or one per head


class Gated(Attention):
    def __init__(self, ctx: Context, opts: GatedOptions):
        super().__init__(ctx, opts, kv_heads(ctx, opts))
        self.gate_width = self.head_dim if opts.gate == "element" else 1
        self.gate = nn.Linear(ctx.d_model, ctx.n_heads * self.gate_width, bias=False)

    def _output(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        g = self.gate(x).unflatten(-1, (-1, self.gate_width)).transpose(1, 2)  # (B, H, T, hd or 1)
        return super()._output(y * torch.sigmoid(g), x)


@ATTENTION.register("gated", options=GatedOptions, examples=[{}, {"gate": "head", "n_kv_heads": 2}])
def gated(ctx: Context, opts: GatedOptions) -> Gated:
    """Gated attention: each head's output times a sigmoid gate of the layer input (Qiu et al. 2025)."""
    return Gated(ctx, opts)
