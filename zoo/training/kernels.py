"""The kernels of a run (zoo.kernels): applied once the model is built and the Trainer knows its device, before
training's clock starts; recorded on the banner, in summary.json (cpu_kind, kernels_policy, kernels) and in each
checkpoint, so a resume on another machine says in one line what changed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import torch

from zoo.kernels import apply_kernels, describe, kernel_record, record_changes
from zoo.training.checkpoint import CheckpointError
from zoo.training.console import say


class KernelsUsed(L.Callback):  # type: ignore[misc]  # Lightning is read untyped (pyproject.toml)
    """Applies the policy's kernels to `model` on construction; its state (the record) travels in checkpoints."""

    def __init__(self, model: torch.nn.Module, policy: Any, device: torch.device, precision: str) -> None:
        self.record = kernel_record(policy, apply_kernels(model, policy, device=device, precision=precision))

    @property
    def banner(self) -> str:
        return describe(self.record)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.record)

    def load_state_dict(self, state: dict[str, Any]) -> None:  # checked by check_state first
        if line := record_changes(state, self.record):
            say(line)


def check_state(state: Any) -> dict[str, Any]:
    """A checkpoint's kernel record, as data from outside: strings and lists of strings only."""
    names: Callable[[Any], bool] = lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v)  # noqa: E731
    if not isinstance(state, dict) or set(state) != {"cpu_kind", "kernels_policy", "kernels"} \
            or not isinstance(state["cpu_kind"], str) or not names(state["kernels"]) \
            or not (isinstance(state["kernels_policy"], str) or names(state["kernels_policy"])):
        raise CheckpointError("checkpoint: callback state KernelsUsed must hold cpu_kind, kernels_policy and kernels "
                              "(strings)")
    return state
