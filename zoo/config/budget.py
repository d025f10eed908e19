"""budget=params / active_params: an FFN or attention variant resized to the baseline's size, so a sweep over
them compares models of one size. Counted as zoo.build counts, on the meta device, on changed copies of the
resolved spec (dataclasses.replace): the model is resolved once, before."""

from __future__ import annotations

import dataclasses
from typing import Any

from zoo.build import checked, count_params
from zoo.component import ConfigError, check_options, option_fields, option_values, resize_options
from zoo.registry import ATTENTION, FFN
from zoo.spec import ModelSpec, Part

# budget=<key> -> the count_params entry match_params equalises: all parameters, or those a token uses
BUDGETS = {"params": "total", "active_params": "active"}


class OverBudget(ConfigError):
    """No size of the FFN brings the model down to the baseline's count. Whatever the vocabulary and context: the
    embeddings and positions count alike in both, so a sweep can know it before any data loads (sizing.preflight)."""


def _part(key: str, registry: Any, name: str, values: dict[str, Any]) -> Part[Any]:
    return Part(name, check_options(key, name, registry.options(name), values))


def match_params(spec: ModelSpec, tolerance: float = 0.01, count: str = "total") -> tuple[ModelSpec, dict[str, Any]]:
    """Resize the FFN so the model has the parameters of the baseline (MHA, 4x GELU FFN) within 1%: the FFN says
    how (its `resize(opts, size)`, zoo.component.FFNPart); `d_ff` in the record is the size it was given.

    count: "total" (budget=params) or "active" (budget=active_params: the parameters one token uses,
    fewer than total for sparse FFNs such as ffn=moe; the dense baseline's are all active).
    Returns the resized model and the record summary.json keeps under `budget`."""
    # The baseline keeps the options every attention has (window, backend, ...), not a variant's own (n_kv_heads).
    shared = option_fields(ATTENTION.options("mha"))
    attention = {k: v for k, v in option_values(spec.attention.options).items() if k in shared}
    baseline = dataclasses.replace(spec, attention=_part("attention", ATTENTION, "mha", attention),
                                   ffn=_part("ffn", FFN, "gelu", {"d_ff": None}))
    target = count_params(baseline)[count]
    ffn = spec.ffn.name

    def with_size(size: int) -> ModelSpec:
        values = option_values(resize_options(FFN, ffn, spec.ffn.options, size))
        return dataclasses.replace(spec, ffn=_part("ffn", FFN, ffn, values))

    def at(size: int) -> int:
        return count_params(with_size(size))[count]

    per_unit = (at(16) - at(8)) / 8  # the count is linear in the size (FFNPart.resize)
    if per_unit <= 0:
        raise ConfigError(f"budget: ffn '{ffn}' keeps its {count} parameters whatever size its "
                          "resize(opts, size) is given; valid: an FFN whose parameters grow with its size")
    exact = 8 + (target - at(8)) / per_unit
    if exact < 1:  # e.g. ffn=pkm, whose values (not scaled by its size) can match the baseline's FFN
        raise OverBudget(f"budget: no size of ffn '{ffn}' fits with {spec.attention.name}: at size 1 the model "
                         f"still has {round(at(8) - 7 * per_unit):,} {count} parameters, more than the baseline's "
                         f"{target:,} (the FFN's parameters that its size does not scale); valid: fewer of those (the "
                         f"FFN's other options), or budget=null")
    d_ff = max(8, 8 * round(exact / 8))  # a multiple of 8, as the defaults are, unless that misses by > 1%
    if abs(at(d_ff) - target) > tolerance * target:
        d_ff = max(1, round(exact))
    params = at(d_ff)
    if abs(params - target) > tolerance * target:
        raise ConfigError(f"budget: no d_ff brings {ffn} with {spec.attention.name} "
                          f"within {tolerance:.0%} of the baseline's {target} {count} parameters")
    kind = next(k for k, v in BUDGETS.items() if v == count)
    record = {"kind": kind, "baseline": "mha + gelu", "target_params": target, "d_ff": d_ff, "params": params,
              "deviation": (params - target) / target}
    return checked(with_size(d_ff)), record
