"""The kernel registry, the policy that picks from it, and the pass that applies it to a built model.

A `Kernel` names the component class it speeds up, when it runs, how it is built, and its implementation: a
mixin whose methods override the component's and call `super()` (the formula) wherever its conditions do not
hold at run time (another device or dtype, torch.compile, a shape it does not take). `apply_kernels` swaps the
class of every module it serves for one with the mixin in front: parameters, buffers and state_dict keys stay
as they were, so checkpoints and weight conversion never see a kernel.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from zoo import hardware
from zoo.component import ConfigError
from zoo.kernels import build
from zoo.registry import Registry

AUTO, NONE = "auto", "none"


@dataclass(frozen=True)
class Kernel:
    name: str
    target: type[nn.Module]  # the component class it speeds up (and the classes derived from it)
    impl: type  # the mixin: methods overriding the target's, each falling back to super() where `when` fails
    when: str  # when it runs, in words (device, dtype, shape, compiled or not): `python -m zoo.kernels list`
    dtypes: frozenset[torch.dtype]  # the activations' dtypes it computes; others take the formula
    # per dtype, the largest difference from the formula in a small model's outputs and gradients, relative to the
    # largest of each (tests/test_kernels.py; docs/performance.md)
    tolerance: dict[torch.dtype, float]
    devices: frozenset[str] = frozenset({"cpu"})
    source: str | None = None  # built from zoo/kernels/<source>.cpp (zoo.kernels.build); None: torch ops
    setup: Callable[[], object] | None = None  # once the build is loaded (e.g. the ops' shapes for torch.compile)
    accepts: Callable[[nn.Module], bool] = lambda module: True  # a module of the target class it serves
    fallback_for: str | None = None  # auto applies it only where that kernel is not (e.g. its build failed)
    overrides: frozenset[str] = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "overrides", frozenset(k for k, v in vars(self.impl).items() if callable(v)))

    def load(self) -> bool:
        """Whether the kernel can run in this process: built and loaded (said on one line when it is not)."""
        if self.source is None:
            return True
        if not build.load(self.source):
            return False
        if self.setup is not None:
            self.setup()
        return True

    def serves(self, module: nn.Module) -> bool:
        taken = {name for k in getattr(type(module), "_kernels", ()) for name in k.overrides}
        return isinstance(module, self.target) and self.accepts(module) and not (self.overrides & taken)

    def why_not(self, device: str, dtypes: frozenset[torch.dtype] | None) -> str | None:
        """Why it does nothing in a run on `device` computing in `dtypes` (None: any), or None when it may."""
        if device not in self.devices:
            return f"it runs on {', '.join(sorted(self.devices))}, this run on {device}"
        if dtypes is not None and not dtypes & self.dtypes:
            return f"it computes {_dtype_names(self.dtypes)}, this run {_dtype_names(dtypes)}"
        return None


KERNELS = Registry("kernel")


def register(kernel: Kernel) -> Kernel:
    KERNELS.register(kernel.name, kernel)
    return kernel


def auto_order() -> list[str]:
    """Every kernel, a fallback after the kernel it stands in for (so that one is tried first)."""
    return sorted(KERNELS.names(), key=lambda n: KERNELS.get(n).fallback_for is not None)


def check_policy(policy) -> list[str]:
    """The kernels `policy` selects, in the order they are tried: auto (all, by the rules each kernel applies at
    run time), none, or a list of names. Anything else is a ConfigError naming the valid choices."""
    if policy is None or policy == AUTO:
        return auto_order()
    if policy == NONE:
        return []
    names = [policy] if isinstance(policy, str) else policy
    valid = f"valid: {AUTO}, {NONE}, or a list of {', '.join(KERNELS.names())}"
    if not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"kernels: expected a name or a list of names, got {policy!r}; {valid}")
    if unknown := [n for n in names if n not in KERNELS]:
        raise ConfigError(f"kernels: unknown kernel '{unknown[0]}'; {valid}")
    return list(names)


# Lightning precision -> the dtypes activations are computed in (autocast: both)
PRECISION_DTYPES = {"32-true": {torch.float32}, "32": {torch.float32}, "64-true": {torch.float64},
                    "64": {torch.float64}, "bf16-mixed": {torch.float32, torch.bfloat16},
                    "bf16-true": {torch.bfloat16}, "16-mixed": {torch.float32, torch.float16},
                    "16-true": {torch.float16}, "bf16": {torch.float32, torch.bfloat16},
                    "16": {torch.float32, torch.float16}}  # the last two: Lightning's short names of the mixed ones


def apply_kernels(model: nn.Module, policy="auto", *, device: torch.device | str | None = None,
                  precision: str | int | torch.dtype | None = None) -> list[str]:
    """Apply the kernels `policy` selects to `model`'s modules (in place); return the names of those applied.

    device: where the model will run (default: where its parameters are); precision: a Lightning precision
    ('bf16-mixed') or a dtype the model computes in (default: any). A kernel that cannot help there, or whose
    build fails, is not applied (said on one line when the policy named it). Kernels applied earlier are removed
    first: `apply_kernels(model, 'none')` gives back the formulas."""
    names, named = check_policy(policy), policy not in (None, AUTO)
    remove_kernels(model)
    if device is None:
        device = next(model.parameters(), torch.empty(0)).device
    device = torch.device(device).type
    dtypes = _run_dtypes(precision)
    applied = []
    for name in names:
        kernel = KERNELS.get(name)
        if reason := kernel.why_not(device, dtypes):
            if named:
                print(f"zoo: kernel {name} not applied: {reason}", file=sys.stderr, flush=True)
            continue
        modules = [m for m in model.modules() if kernel.serves(m)]
        if not modules or not kernel.load():
            continue
        for module in modules:
            module.__class__ = _with_kernel(type(module), kernel)
        applied.append(name)
    return applied


def remove_kernels(model: nn.Module) -> None:
    """Every module back to its component's own class (the formula)."""
    for module in model.modules():
        module.__class__ = getattr(type(module), "_formula", type(module))


def applied_kernels(model: nn.Module) -> list[str]:
    """The kernels applied to some module of `model`, each once, in the order of the modules."""
    names = [k.name for m in model.modules() for k in getattr(type(m), "_kernels", ())]
    return list(dict.fromkeys(names))


_CLASSES: dict[tuple[type, str], type] = {}


def _with_kernel(cls: type, kernel: Kernel) -> type:
    """cls with kernel's mixin in front (its methods first, super() the formula's), made once per pair."""
    key = (cls, kernel.name)
    if key not in _CLASSES:
        _CLASSES[key] = type(f"{cls.__name__}_{kernel.name}", (kernel.impl, cls), {
            "_formula": getattr(cls, "_formula", cls), "_kernels": (*getattr(cls, "_kernels", ()), kernel),
            "__module__": kernel.impl.__module__})
    return _CLASSES[key]


def _run_dtypes(precision) -> frozenset[torch.dtype] | None:
    if precision is None:
        return None
    if isinstance(precision, torch.dtype):
        return frozenset({precision})
    dtypes = PRECISION_DTYPES.get(str(precision))
    return None if dtypes is None else frozenset(dtypes)


def _dtype_names(dtypes) -> str:
    return ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))


def kernel_record(policy, applied: list[str]) -> dict:
    """What summary.json and the checkpoint say about the kernels of a run."""
    return {"cpu_kind": hardware.cpu_kind(), "kernels_policy": policy if isinstance(policy, str) else list(policy),
            "kernels": list(applied)}


def describe(record: dict) -> str:
    """The banner's line: 'kernels auto: rmsnorm_cpp, rope_cpp (CPU kind avx512_bf16)'."""
    policy = record["kernels_policy"]
    policy = policy if isinstance(policy, str) else "[" + ",".join(policy) + "]"
    return f"kernels {policy}: {', '.join(record['kernels']) or 'none applied'} (CPU kind {record['cpu_kind']})"


def record_changes(saved: dict, now: dict) -> str | None:
    """One line saying what a resume changed against its checkpoint's record (CPU kind, kernels), or None:
    'resumed on another machine or policy: CPU kind amx -> avx512_bf16; kernels rmsnorm_cpp, rope_cpp -> none'."""
    def said(v) -> str:
        return ", ".join(v) or "none" if isinstance(v, list) else str(v)

    changed = [f"{what} {said(saved[key])} -> {said(now[key])}" for key, what in
               (("cpu_kind", "CPU kind"), ("kernels", "kernels")) if saved[key] != now[key]]
    return f"resumed on another machine or policy: {'; '.join(changed)}" if changed else None
