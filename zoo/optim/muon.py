"""optim=muon: torch.optim.Muon for the hidden weight matrices, AdamW for the rest, as Muon's authors prescribe
(Keller Jordan, "Muon: An optimizer for hidden layers in neural networks", 2024; Moonshot AI, "Muon is Scalable for
LLM Training", 2025, for adjust_lr_fn=match_rms_adamw).

Muon takes the weight of every linear layer but the output head: the attention and FFN projections (MLA's
down- and up-projections, an MoE's router and each expert's matrices: the experts are separate linear layers, so
Muon orthogonalises each expert's matrix on its own), the encoder_only head's dense transform. AdamW takes the
rest: token embeddings (and the head tied to them), an untied head (`readout`: zoo.models.stack.Readout, and
zoo.models.stack.ScaledLinear, a head's layer out of the width: a factorized head's map to embed_dim, a mixture
of softmaxes' prior and its latents where embed_dim fixes their width), learned position tables and position
biases, norm gains, biases and any scalar or vector a part adds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from zoo.component import ConfigError, is_int, is_number
from zoo.optim.adamw import AdamWOptions, adamw, check_adamw
from zoo.optim.base import Combined, check_schedule, refuse
from zoo.registry import OPTIM

MAX_NS_STEPS = 99  # torch.optim.Muon refuses 100 or more
# Lightning's strategies (every name containing one of these) whose optimizer sees shards, not whole matrices
SHARDING = {"fsdp": "FSDP shards each weight matrix across processes",
            "deepspeed": "DeepSpeed's ZeRO hands the optimizer flat shards of the parameters"}


@dataclass(kw_only=True)
class MuonOptions(AdamWOptions):
    lr: float = 0.02  # Muon's peak learning rate, for the hidden matrices (Keller Jordan's default)
    min_lr: float = 0.002  # the schedule ends at min_lr / lr of every group's peak: AdamW's too
    adamw_lr: float = 1.0e-3  # AdamW's peak learning rate, for the parameters Muon does not take
    weight_decay: float = 0.0  # decoupled, on Muon's matrices and AdamW's (an untied head); Keller Jordan's: none
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5  # Newton-Schulz iterations that orthogonalise each update
    # original: the update times sqrt(max(1, rows / cols)) (Keller Jordan); match_rms_adamw: times
    # 0.2 * sqrt(max(rows, cols)), which gives it AdamW's RMS, so AdamW's lr and weight decay carry over (Moonshot)
    adjust_lr_fn: Literal["original", "match_rms_adamw"] = "original"


def hidden_matrices(model: nn.Module) -> set[int]:
    """The ids of the weights Muon takes: every linear layer's but the output head's (and not an embedding tied
    to it)."""
    head = {id(m.weight) for m in model.modules() if getattr(m, "readout", False)}
    return {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear) and id(m.weight) not in head}


@OPTIM.register("muon", options=MuonOptions)
class Muon:
    """torch.optim.Muon for the hidden matrices, torch.optim.AdamW for the rest, stepped as one (Combined)."""

    state_per_param = {"muon": 1, "adamw": 2}  # Muon keeps one momentum buffer; AdamW its two moments

    @staticmethod
    def check(values: Mapping, run: Mapping) -> None:
        if not hasattr(torch.optim, "Muon"):  # pyproject allows torch>=2.5; Muon came with torch 2.9
            raise ConfigError(f"optim: muon needs torch.optim.Muon (torch 2.9 or newer), and this is torch "
                              f"{torch.__version__}; valid: optim=adamw, or a newer torch")
        check_schedule(values)
        check_adamw(values)
        if not is_number(values["adamw_lr"]) or values["adamw_lr"] <= 0:
            refuse("adamw_lr", values["adamw_lr"], "a finite number > 0")
        if not is_number(values["momentum"]) or not 0 <= values["momentum"] < 1:
            refuse("momentum", values["momentum"], "a number in [0, 1)")
        if not is_int(values["ns_steps"]) or not 1 <= values["ns_steps"] <= MAX_NS_STEPS:
            refuse("ns_steps", values["ns_steps"], f"an integer in [1, {MAX_NS_STEPS}]")
        # Under muP (the ladders) Muon takes every matrix whose learning rate muP would divide by the width
        # multiplier and sizes its step from the matrix's shape, which keeps the updates flat across widths
        # (tests/test_mup.py's coordinate check); AdamW's part keeps muP's groups. match_rms_adamw gives each
        # matrix AdamW's step instead, which muP would have to scale.
        if (run.get("model") or {}).get("parametrization") == "mup" and values["adjust_lr_fn"] != "original":
            raise ConfigError(f"optim.adjust_lr_fn: {values['adjust_lr_fn']!r} with model.parametrization=mup gives "
                              "each matrix AdamW's step size, which muP would divide by the width multiplier; valid: "
                              "original with mup (Muon's own step, from each matrix's shape), or "
                              "model.parametrization=standard")
        strategy = str((run.get("trainer") or {}).get("strategy", ""))
        sharding = next((why for name, why in SHARDING.items() if name in strategy), None)
        if sharding:
            raise ConfigError(f"optim: muon with trainer.strategy={strategy}: {sharding}, and Muon orthogonalises "
                              f"whole matrices; valid: optim=adamw with {strategy}, or optim=muon with trainer=ddp "
                              "(or one device)")

    @staticmethod
    def takes(model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
        hidden = hidden_matrices(model)
        named = list(model.named_parameters())
        return {"muon": [(n, p) for n, p in named if id(p) in hidden],
                "adamw": [(n, p) for n, p in named if id(p) not in hidden]}

    @staticmethod
    def build(model: nn.Module, opts: MuonOptions, device: torch.device, precision: Any) -> torch.optim.Optimizer:
        matrices = [p for _, p in Muon.takes(model)["muon"]]
        muon = torch.optim.Muon(matrices, lr=opts.lr, weight_decay=opts.weight_decay, momentum=opts.momentum,
                                nesterov=opts.nesterov, ns_steps=opts.ns_steps, adjust_lr_fn=opts.adjust_lr_fn)
        return Combined(muon=muon, adamw=adamw(model, opts, opts.adamw_lr, device, precision, skip=matrices))
