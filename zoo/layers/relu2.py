"""Squared ReLU: down(relu(up(x))^2), the Primer FFN (So et al. 2021), as the NanoGPT speedrun uses it.

A plain MLP (zoo/layers/ffn.py) with relu(x)^2 for its activation: the same width, resize and init."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zoo.layers.ffn import ACTIVATIONS, MLP, FFNOptions
from zoo.registry import FFN


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


ACTIVATIONS["relu2"] = relu_squared  # an activation by name, as the other MLPs' (MLP reads `activation`)


@FFN.register("relu2", options=FFNOptions, examples=[{}, {"d_ff": 48}])
class ReLU2(MLP):
    """down(relu(up(x))^2); d_ff = 4 * d_model by default, as relu's."""

    activation = "relu2"
