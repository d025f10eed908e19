"""optim=adamw (the default): torch.optim.AdamW for every parameter, with decoupled weight decay on weight
matrices only and, under model.parametrization=mup, muP's per-group learning rates (zoo/mup.py)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from zoo.component import is_number
from zoo.hardware import adamw_implementation
from zoo.mup import param_groups
from zoo.optim.base import OptimOptions, check_schedule, refuse
from zoo.registry import OPTIM


@dataclass(kw_only=True)
class AdamWOptions(OptimOptions):
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    eps: float = 1.0e-8
    fused: bool | None = None  # AdamW's fused kernel; null: on a CUDA GPU, and on CPU in bf16 (zoo.hardware)


def check_adamw(values: Mapping) -> None:
    """AdamW's own values (betas, eps, fused), wherever AdamW updates some of the parameters."""
    betas = values["betas"]
    if not isinstance(betas, (list, tuple)) or len(betas) != 2 or not all(is_number(b) and 0 <= b < 1 for b in betas):
        refuse("betas", betas, "two numbers in [0, 1), e.g. [0.9, 0.99]")
    if not is_number(values["eps"]) or values["eps"] <= 0:
        refuse("eps", values["eps"], "a finite number > 0")
    if not (values["fused"] is None or isinstance(values["fused"], bool)):  # 1 == True: ask the type
        refuse("fused", values["fused"], "true, false, or null (fused on a CUDA GPU, and on CPU in bf16)")


def adamw(model: nn.Module, opts: AdamWOptions, lr: float, device: torch.device, precision: Any,
          skip: Collection[nn.Parameter] = ()) -> torch.optim.AdamW:
    """torch's AdamW at peak `lr` over the model's parameters but `skip`, in zoo/mup.py's groups."""
    return torch.optim.AdamW(param_groups(model, lr, opts.weight_decay, skip), lr=lr, betas=tuple(opts.betas),
                             eps=opts.eps, **adamw_implementation(opts.fused, device, precision))


@OPTIM.register("adamw", options=AdamWOptions)
class AdamW:
    """Every parameter to torch.optim.AdamW."""

    state_per_param = {"adamw": 2}  # its two moments

    @staticmethod
    def check(values: Mapping, run: Mapping) -> None:
        check_schedule(values)
        check_adamw(values)

    @staticmethod
    def takes(model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
        return {"adamw": list(model.named_parameters())}

    @staticmethod
    def build(model: nn.Module, opts: AdamWOptions, device: torch.device, precision: Any) -> torch.optim.Optimizer:
        return adamw(model, opts, opts.lr, device, precision)
