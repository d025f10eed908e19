"""What every optimizer shares (zoo.optim's contract, described in its package): the options every one takes, the
refusals, resolving and checking a config's optim entry, and Combined, one optimizer over several."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from zoo.component import ConfigError, Options, check_options, is_int, is_number, option_fields
from zoo.registry import OPTIM
from zoo.spec import Part

DEFAULT = "adamw"  # what a config without optim.name trains with (every run saved before the group existed)


@dataclass(kw_only=True)
class OptimOptions(Options):
    """What every optimizer takes: the peak learning rate, the schedule and decoupled weight decay."""

    lr: float = 1.0e-3
    min_lr: float = 1.0e-4  # cosine decay ends here at trainer.max_steps
    warmup_steps: int = 100
    weight_decay: float = 0.1  # decoupled, on weight matrices only


def refuse(key: str, value: Any, valid: str) -> None:
    raise ConfigError(f"optim.{key}: got {value!r}; valid: {valid}")


def check_schedule(values: Mapping) -> None:
    """OptimOptions' values: a positive peak, a floor under it, whole warm-up steps, non-negative decay."""
    lr = values["lr"]
    if not is_number(lr) or lr <= 0:
        refuse("lr", lr, "a finite number > 0")
    min_lr = values["min_lr"]
    if not is_number(min_lr) or not 0 <= min_lr <= lr:  # a negative floor makes the schedule ascend
        refuse("min_lr", min_lr, f"a number in [0, optim.lr={lr}]")
    if not is_int(values["warmup_steps"]) or values["warmup_steps"] < 0:
        refuse("warmup_steps", values["warmup_steps"], "an integer >= 0")
    if not is_number(values["weight_decay"]) or values["weight_decay"] < 0:
        refuse("weight_decay", values["weight_decay"], "a finite number >= 0")


def _name(node: Mapping) -> str:
    name = node.get("name", DEFAULT)
    if not isinstance(name, str) or name not in OPTIM:
        raise ConfigError(f"optim.name: unknown optimizer {name!r}; valid: {', '.join(OPTIM.names())}")
    return name


def resolve(node: Mapping | None) -> Part:
    """A run config's optim section -> Part(name, options): the optimizer and its typed options, the defaults
    filled in (a section without `name` is AdamW's, as every run saved before the group existed)."""
    node = dict(node or {})
    name = _name(node)
    values = {k: v for k, v in node.items() if k != "name"}
    return Part(name, check_options("optim", name, OPTIM.options(name), values, section=""))


def check(node: Mapping | None, run: Mapping) -> None:
    """The optim section of a run config (`run`, plain): each bad value one ConfigError line naming its key."""
    node = dict(node or {})
    name = _name(node)
    fields = option_fields(OPTIM.options(name))
    for key in node:
        if key != "name" and key not in fields:
            raise ConfigError(f"optim.{key}: not an option of '{name}'; valid: {', '.join(sorted(fields))}")
    OPTIM.get(name).check({**dataclasses.asdict(OPTIM.options(name)()), **node}, run)
    resolve(node)  # the types its ranges leave (true/false, one of a list of names)


def state_numbers(model: torch.nn.Module, optim: Part) -> int:
    """How many numbers the optimizer's state keeps for `model` (a meta model will do): its parameters times what
    each torch optimizer keeps per parameter (AdamW two moments, Muon one momentum buffer)."""
    part = OPTIM.get(optim.name)
    return sum(part.state_per_param[inner] * p.numel() for inner, params in part.takes(model).items()
               for _, p in params)


class Combined(torch.optim.Optimizer):
    """Several torch optimizers, each over its own parameters, stepped as one (optim=muon: Muon and AdamW).

    Why one object, not Lightning's manual optimization with two: Lightning's automatic loop then stays as it is
    for every optimizer. Its step counter (global_step, max_steps, the schedule, checkpoint names) counts one step
    per batch, where two manual optimizers would count two; gradient clipping (trainer.gradient_clip_val),
    accumulation and the mixed-precision plugins (float16's scaler unscales through param_groups) work on
    param_groups, which here are the parts' own group dicts, so the one LambdaLR schedule scales every group
    of every part; and the checkpoint holds one optimizer state, the parts' state dicts by name."""

    def __init__(self, **parts: torch.optim.Optimizer):
        self.parts = parts
        super().__init__([p for o in parts.values() for g in o.param_groups for p in g["params"]], {})
        self.param_groups = [g for o in parts.values() for g in o.param_groups]  # the parts' dicts, not copies

    @property
    def state(self) -> dict:  # a view: each parameter's state dict is the part's own (moving it moves theirs)
        return {p: s for o in self.parts.values() for p, s in o.state.items()}

    @state.setter
    def state(self, value: Any) -> None:
        pass  # Optimizer.__init__ sets an empty one; the state is the parts'

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:  # Lightning's closure: forward and backward, run once for all the parts
            with torch.enable_grad():
                loss = closure()
        for o in self.parts.values():
            o.step()
        return loss

    def state_dict(self) -> dict:
        return {name: o.state_dict() for name, o in self.parts.items()}

    def load_state_dict(self, state_dict: dict) -> None:
        if set(state_dict) != set(self.parts):
            raise ValueError(f"optimizer state for {sorted(state_dict)}, expected {sorted(self.parts)}")
        for name, o in self.parts.items():
            o.load_state_dict(state_dict[name])
        # torch's load_state_dict gives each part new group dicts: point at those, in the same list (Lightning's
        # wrapper and the schedule hold it), or the schedule would scale stale copies after a resume.
        self.param_groups[:] = [g for o in self.parts.values() for g in o.param_groups]

