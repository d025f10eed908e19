"""A zoo model built on the meta device: every shape and component, no memory, no initialisation. What the spec's
checks (zoo.build.checked), the counts (count_params, flops_per_token) and muP's reference widths (zoo.mup) build;
and `spec_of`, the spec a built model keeps."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from zoo.registry import MODEL
from zoo.spec import ModelSpec


class _SkipInit(TorchFunctionMode):  # type: ignore[misc]  # torch is read untyped (pyproject.toml)
    """torch.nn.init's functions do nothing: on the meta device there are no values to set, and torch's meta
    normal_ imports torch._dynamo into a process that may never compile (python -m zoo.sample; what that costs:
    docs/benchmarks.md, "Start-up and exit")."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "__module__", None) == "torch.nn.init":  # each takes the tensor first, by name or not
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def on_meta(cfg: ModelSpec) -> nn.Module:
    """The model a resolved spec describes, built on the meta device (each component checks its own constraints
    as it is built). The lineages are registered by zoo.models, which zoo.build imports."""
    with torch.device("meta"), _SkipInit():
        model: nn.Module = MODEL.get(cfg.name)(cfg)
        return model


def spec_of(model: nn.Module) -> ModelSpec:
    """The resolved config a zoo model was built from (its `cfg`)."""
    spec = getattr(model, "cfg", None)
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"{type(model).__name__} is not a zoo model (it has no ModelSpec in .cfg)")
    return spec
