"""The maximal update parametrization, muP (Yang et al. 2022, "Tensor Programs V", Tables 3 and 8), for AdamW.

`model.parametrization=mup` makes a model's best learning rate (and its activation scales during training) the
same at every width, so models of several sizes can be compared at one learning rate. With
width_mult = d_model / model.mup_base_d_model, and the model at the base width equal to the standard one:

- Which dimensions grow with width is read from shapes: the model is built on the meta device at the base width
  and at twice it (heads of the same size: the width grows by adding heads; widths a component declares, such
  as an explicit `ffn.d_ff`, scaled along), and each parameter's dimensions that differ between the two grow.
  No list of component names: a part works the day it is registered.
- hidden weights (two dimensions grow: q/k/v, attention out, FFN up/down, ...): init std / sqrt(width_mult),
  learning rate / width_mult, weight decay * width_mult (torch's AdamW decays by lr * weight_decay: their
  product is kept). So is a linear layer whose input grows and whose output does not (the MoE router, MLA's
  kv_down with a fixed kv_rank): Adam moves every weight by about the learning rate, so such a layer's output
  moves in proportion to its fan-in, which only lr / width_mult holds steady. (The `mup` package leaves those
  as vector-like.)
- vector-like (one dimension grows: embeddings, learned positions, biases, norm gains, the readout, a layer
  from a fixed size up to the width such as MLA's k_up) and fixed (none grows): init and learning rate as the
  standard parametrization.
- the readout (the output head, zoo.models.stack.Readout, and any head's layer from the width into a size that
  does not grow, a ScaledLinear: a factorized head's map to embed_dim, a mixture's prior): its input multiplied
  by 1 / width_mult (muP's output multiplier; a bias is added after, as the `mup` package's MuReadout). Tied
  to the embedding, the shared matrix keeps the embedding's init; untied, the head keeps N(0, init_std) at every
  width (MuReadout after its rescaling, not its zero-init option).
- attention scores: heads keep their size, so 1 / sqrt(head_dim) is the same at every width and muP's
  1 / head_dim is never needed. A width whose base cannot keep the head size (n_heads * base / d_model not an
  integer) is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import torch
from torch import nn

from zoo.component import ConfigError, need
from zoo.meta import on_meta, spec_of
from zoo.spec import ModelSpec

PARAMETRIZATIONS = ("standard", "mup")
MAX_BASE_D_MODEL = 65536  # above any model's width (5x GPT-3's); the base and twice it are built (on meta) to check
HIDDEN, VECTOR, FIXED = "hidden", "vector", "fixed"  # a parameter's muP role


def width_mult(cfg: ModelSpec) -> float:
    """d_model / mup_base_d_model under muP; 1 under the standard parametrization."""
    return cfg.d_model / cfg.mup_base_d_model if cfg.parametrization == "mup" else 1.0


def output_scale(cfg: ModelSpec) -> float:
    """What the readout multiplies its input by: 1 / width_mult (muP's output multiplier)."""
    return 1 / width_mult(cfg)


def scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
    """A readout's input times its output multiplier; x itself at 1 (the standard parametrization), so that the
    standard model's arithmetic is unchanged."""
    return x if scale == 1 else x * scale


def check(cfg: ModelSpec) -> None:
    """model.parametrization and model.mup_base_d_model, then (mup) that the base and double-base models build."""
    p, base = cfg.parametrization, cfg.mup_base_d_model
    need(p in PARAMETRIZATIONS, "parametrization", f"unknown {p!r}; valid: {', '.join(PARAMETRIZATIONS)}")
    need(isinstance(base, int) and not isinstance(base, bool) and 0 < base <= MAX_BASE_D_MODEL, "mup_base_d_model",
         f"must be an integer from 1 to {MAX_BASE_D_MODEL}, got {base!r}")
    if p == "mup":
        _reference_models(cfg)


def at_width(cfg: ModelSpec, d_model: int) -> ModelSpec:
    """cfg at another width: heads of the same size, and the widths components declare scaled along."""
    heads = cfg.n_heads * d_model / cfg.d_model
    need(heads == int(heads), "parametrization",
         f"mup keeps the head size ({cfg.d_model // cfg.n_heads}) at the base width "
         f"mup_base_d_model={cfg.mup_base_d_model}, which needs {heads:g} heads; valid: a d_model and n_heads "
         "whose head size divides mup_base_d_model")

    def scaled(part):  # a Part with the widths its options declare (ffn's d_ff, ...) scaled
        opts = part.options
        widths = {w: max(1, round(getattr(opts, w) * d_model / cfg.d_model))
                  for w in getattr(opts, "widths", ()) if getattr(opts, w) is not None}
        return dataclasses.replace(part, options=dataclasses.replace(opts, **widths))

    return dataclasses.replace(cfg, d_model=d_model, n_heads=int(heads), attention=scaled(cfg.attention),
                               position=scaled(cfg.position), norm=scaled(cfg.norm), ffn=scaled(cfg.ffn))


def _reference_models(cfg: ModelSpec) -> tuple[nn.Module, nn.Module]:
    """The model at the base width and at twice it, on the meta device (shapes only)."""
    base = cfg.mup_base_d_model
    models = []
    for d in (base, 2 * base):
        other = at_width(cfg, d)
        try:
            models.append(on_meta(other))
        except ConfigError as e:
            raise ConfigError(f"model.parametrization: mup's reference model at d_model={d} (n_heads="
                              f"{other.n_heads}) cannot be built: {e}") from None
    return models[0], models[1]


def roles(cfg: ModelSpec) -> dict[str, str]:
    """Each parameter's name -> its muP role (HIDDEN, VECTOR or FIXED): see the module docstring."""
    small, large = _reference_models(cfg)
    sizes = {name: p.shape for name, p in large.named_parameters()}
    grows = {name: [a != b for a, b in zip(p.shape, sizes[name], strict=True)]
             for name, p in small.named_parameters()}
    readout = {id(m.weight) for m in small.modules() if getattr(m, "readout", False)}
    out = {}
    for prefix, m in small.named_modules():
        for local, p in m.named_parameters(prefix="", recurse=False):
            name = f"{prefix}.{local}" if prefix else local
            if name not in grows:  # a shared (tied) parameter: named where it first appears
                continue
            n = sum(grows[name])
            fan_in_grows = isinstance(m, nn.Linear) and local == "weight" and grows[name][1]
            out[name] = HIDDEN if n >= 2 or (fan_in_grows and id(p) not in readout) else VECTOR if n else FIXED
    return out


def init_scale(role: str, cfg: ModelSpec) -> float:
    """The factor on a parameter's standard init std: 1 / sqrt(width_mult) for hidden weights, else 1."""
    return width_mult(cfg) ** -0.5 if role == HIDDEN else 1.0


def param_groups(model: nn.Module, lr: float, weight_decay: float, skip: Collection[nn.Parameter] = ()) -> list[dict]:
    """AdamW parameter groups for a zoo model: decoupled weight decay on matrices only (norms, biases, embeddings
    and learned positions are not decayed), and under muP hidden weights at lr / width_mult with weight decay
    * width_mult. A plain PyTorch user: `torch.optim.AdamW(param_groups(model, lr=1e-3, weight_decay=0.1))`.
    skip: parameters another optimizer updates (optim=muon's matrices), left out."""
    cfg = spec_of(model)
    mult = width_mult(cfg)
    role = roles(cfg) if mult != 1 else {}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decayed: dict[float, list] = {}
    not_decayed: dict[float, list] = {}
    skipped = {id(p) for p in skip}
    for name, p in model.named_parameters():
        if id(p) in skipped:
            continue
        decays = p.dim() >= 2 and id(p) not in embeddings and not name.endswith("position.weight")
        (decayed if decays else not_decayed).setdefault(mult if role.get(name) == HIDDEN else 1.0, []).append(p)
    # Decayed groups first, as before muP: a checkpoint's optimizer state lists its parameters in this order.
    return ([{"params": ps, "lr": lr / m, "weight_decay": weight_decay * m} for m, ps in decayed.items()]
            + [{"params": ps, "lr": lr / m, "weight_decay": 0.0} for m, ps in not_decayed.items()])
