"""The component contract: what every attention, position, norm and FFN receives and declares.

- A factory is called as `factory(ctx, opts)`: `ctx` is the `Context` (what the stack knows),
  `opts` the component's own options, an instance of the dataclass it registered with.
- Options are declared once, typed, with defaults (`@dataclass class GQAOptions(AttentionOptions)`).
  `check_options` turns a config mapping into that dataclass, or fails in one line naming
  `model.<kind>.<option>` and the valid options.
- A component checks its own constraints with `need(...)` in its own file, before it allocates.
- Initialisation: every weight ~ N(0, init_std), biases 0. A module lists the children whose
  weights write into the residual stream in `residual_outputs` (scaled down with depth) and its
  parameters that are gains in `gains` (set to 1).
- Options that are widths (grow with d_model, as `d_ff`) are listed in the options class's `widths`
  (a ClassVar): model.parametrization=mup scales them along when it builds the model at its base width.
- Whatever other code needs to know it asks the component: `count_as` (which count group its
  parameters go to), `flops(t)`, `inactive_params()`, attention's `n_kv_heads` and
  `cache_bytes_per_token(...)`, a position's `hard_limit` and `max_len`, an FFN's `gated`.
- Auxiliary losses (any component): during its forward a module sets `self.aux_losses`, a dict
  name -> scalar tensor, already weighted (ffn=moe: {"moe_balance": ..., "moe_z": ...}). The training
  step calls `clear_aux_losses(model)` before the forward and `aux_losses(model)` right after it: the
  values summed by name over modules, and cleared, so a value from an earlier forward (validation,
  sampling) is never added. The step adds their sum to the objective's loss and logs each as
  `train_<name>` (zoo/training/module.py). Each DDP process adds its own, like its own loss.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard


class ConfigError(ValueError):
    """A bad model or training config, reported as one line that names the key."""


def need(ok: bool, key: str, msg: str) -> None:
    """Fail with `model.<key>: <msg>` unless ok: a component's own constraint check."""
    if not ok:
        raise ConfigError(f"model.{key}: {msg}")


@dataclass(frozen=True)
class Context:
    """What the stack knows when it builds a component; each component takes what it needs."""

    d_model: int
    n_heads: int
    max_seq_len: int
    layer: int = 0  # this block's index in the whole model (the encoder's blocks first)
    n_layers: int = 1  # blocks in the whole model
    causal: bool = False  # a decoder stack: each token sees only earlier ones
    cross: bool = False  # cross-attention: queries from the decoder, keys and values from the encoder
    rotary: bool = False  # the stack's position rotates queries and keys (its `rotary`; RoPE)
    bias: bool = True  # biases in linear layers and LayerNorm
    dropout: float = 0.0
    norm: Callable[..., Any] = field(default=lambda dim=None: _no_norm())  # the model's: norm(dim=None) -> a new one

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


def _no_norm() -> Any:
    raise TypeError("Context.norm: this context has no norm; zoo.models.stack.context sets the model's")


@dataclass(kw_only=True)
class Options:
    """A component without options of its own."""


def is_int(v: Any) -> TypeGuard[int]:
    """An integer from a config (YAML's true/false are ints in Python, not counts)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> TypeGuard[int | float]:
    """A finite int or float from a config, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _type_name(t: Any) -> str:
    if typing.get_origin(t) is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(t))
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(t))
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(t, str(t))


def _fits(value: Any, t: Any) -> bool:
    origin = typing.get_origin(t)
    if origin is typing.Literal:
        return value in typing.get_args(t)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in typing.get_args(t))
    if t is type(None):
        return value is None
    if t is bool:
        return isinstance(value, bool)
    if t is int:
        return is_int(value)
    if t is float:
        return is_number(value)
    if t is str:
        return isinstance(value, str)
    return True  # a type the checker does not know: the component checks it


def option_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def check_options(key: str, name: str, cls: type, values: Mapping) -> Any:
    """values (a component's config without `name`) -> an instance of its options dataclass.

    key is the config path (`attention`, `norm`, ...); errors are one line naming key.option."""
    fields, hints = option_fields(cls), typing.get_type_hints(cls)
    valid = ", ".join(sorted(fields)) or "none"
    for opt, value in values.items():
        need(opt in fields, f"{key}.{opt}", f"not an option of '{name}'; valid: {valid}")
        choices = typing.get_args(hints[opt]) if typing.get_origin(hints[opt]) is typing.Literal else None
        need(_fits(value, hints[opt]), f"{key}.{opt}", f"unknown {value!r}; valid: {', '.join(map(str, choices))}"
             if choices else f"expected {_type_name(hints[opt])}, got {value!r}")
    for opt, f in fields.items():
        missing = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        need(opt in values or not missing, f"{key}.{opt}", f"required by '{name}' ({_type_name(hints[opt])})")
    return cls(**{k: float(v) if hints[k] is float else v for k, v in values.items()})


def build(registry: Any, part: Any, ctx: Context) -> Any:
    """The component a resolved config's Part (zoo.schema) names, built with its options: `factory(ctx, opts)`."""
    return registry.get(part.name)(ctx, part.options)


def option_values(opts: Any) -> dict:
    """An options instance as a plain dict, for the resolved config."""
    return dataclasses.asdict(opts)


def linear_flops(module: Any) -> int:
    """2 FLOPs per weight of every linear layer in module (an nn.Module): its matrix products, per token."""
    from torch import nn

    return sum(2 * m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))


def aux_losses(model: Any) -> dict[str, Any]:
    """The auxiliary losses model's modules left in `aux_losses` since the last clear, summed by name; clears them."""
    out: dict[str, Any] = {}
    for m in model.modules():
        held = vars(m).get("aux_losses")  # not getattr: a module's missing-attribute path raises, every step
        for name, value in (held or {}).items():
            out[name] = out[name] + value if name in out else value
        if held:
            m.aux_losses = {}
    return out


def clear_aux_losses(model: Any) -> None:
    """Forget every auxiliary loss a module holds: call before a forward whose losses will be collected."""
    for m in model.modules():
        if vars(m).get("aux_losses"):
            m.aux_losses = {}
