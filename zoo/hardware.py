"""What this machine computes fast, and the choices that follow from it, each backed by benchmark rows.

- The CPU's kind (`cpu_kind`: AMX, AVX-512 BF16 or neither), read once per process; zoo.kernels' rules and the
  run's record name it.
- `trainer.precision=auto` (the default): bf16-mixed where the hardware computes bf16 natively (AMX or
  AVX-512 BF16 on CPU, a GPU with native bf16), float32 otherwise (`resolve_precision`).
- AdamW's kernel (`adamw_implementation`: train.py's optimizer, zoo/training/module.py, and the benchmark's).

Which implementation a component runs (zoo's C++ kernels, the written-out attention) is zoo.kernels' choice, not
this module's. The rows are in docs/benchmarks.md (`python -m zoo.bench --only choices`, one section per CPU kind);
a rule changes with them, not with one machine's impression.
"""

from __future__ import annotations

import contextlib
from functools import lru_cache
from pathlib import Path

import torch

AUTO = "auto"


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux); empty where there is none."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    return frozenset()


@lru_cache(maxsize=1)
def cpu_kind() -> str:
    """'amx' (AMX bf16 tiles: Intel Sapphire Rapids and later), 'avx512_bf16' (bf16 dot products without AMX:
    AMD Zen 4 and later, Intel Cooper Lake) or 'none' (bf16 is emulated: slower than float32)."""
    flags = cpu_flags()
    if flags:
        amx, avx = "amx_bf16" in flags, "avx512_bf16" in flags
    else:  # no /proc/cpuinfo (macOS, Windows): torch's own probe of the CPU
        amx, avx = torch.cpu._is_amx_tile_supported(), torch.cpu._is_avx512_bf16_supported()
    return "amx" if amx else "avx512_bf16" if avx else "none"


@lru_cache(maxsize=1)
def instruction_set() -> str:
    """The CPU's instruction set as far as a run's numbers depend on it: the vector level torch's CPU kernels
    dispatch to (torch.backends.cpu.get_cpu_capability(): AVX512, AVX2, ...) and what computes bf16 (cpu_kind),
    e.g. 'avx512+amx', 'avx512+avx512_bf16', 'avx2'. A float32 run repeats to every digit on machines of one
    instruction set; on another, oneDNN and torch take other code paths and the digits differ within seed noise
    (docs/reliability.md, "Reproducibility across machines"). summary.json records it; the report says when a
    sweep mixes them."""
    capability, kind = torch.backends.cpu.get_cpu_capability().lower(), cpu_kind()
    return capability if kind == "none" else f"{capability}+{kind}"


CPU_BF16 = {"amx": "AMX", "avx512_bf16": "AVX-512 BF16"}  # cpu_kind -> the unit that computes bf16, in words


def on_gpu(trainer: dict) -> bool:
    acc = trainer.get("accelerator", "auto")
    return acc in ("gpu", "cuda") or (acc == "auto" and torch.cuda.is_available())


def native_bf16(trainer: dict) -> str | None:
    """What computes bf16 natively where this run trains, in words ('AMX', 'NVIDIA A100 ...'), or None."""
    if on_gpu(trainer):
        native = torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
        return torch.cuda.get_device_name() if native else None
    if trainer.get("accelerator") == "mps":  # no rows for Apple GPUs: float32
        return None
    return CPU_BF16.get(cpu_kind())


def resolve_precision(trainer: dict, resumed: str | None = None) -> str:
    """The precision Lightning gets: the config's, or for `auto` bf16-mixed where the hardware computes bf16
    natively and 32-true elsewhere. A resumed run keeps the precision its checkpoint trained in (`resumed`),
    so a run never changes precision halfway, whichever machine resumes it."""
    requested = trainer.get("precision", "32-true")
    if requested != AUTO:
        return requested
    if resumed is not None:
        return resumed
    return "bf16-mixed" if native_bf16(trainer) else "32-true"


def precision_choice(trainer: dict, resumed: str | None = None) -> dict:
    """What was asked, what runs and why, for the banner and summary.json:
    {"requested": "auto", "used": "bf16-mixed", "reason": "AMX computes bf16"}."""
    requested, used = trainer.get("precision", "32-true"), resolve_precision(trainer, resumed)
    if requested != AUTO:
        reason = "set in the config"
    elif resumed is not None:
        reason = "the checkpoint's: a resumed run keeps its precision"
    else:
        unit = native_bf16(trainer)
        reason = f"{unit} computes bf16" if unit else "no native bf16 here"
    return {"requested": requested, "used": used, "reason": reason}


# --- AdamW -------------------------------------------------------------------------------------------------


def fused_adamw_on_cpu(precision: str | int) -> bool:
    """Whether AdamW takes torch's fused kernel on CPU when optim.fused is null (adamw_implementation).

    The fused kernel is faster than torch's default per-tensor loop at both benchmark shapes, and foreach is not
    (docs/benchmarks.md, "Hardware choices (<CPU kind>)"), but it rounds differently in the last bit: float32
    runs keep torch's default, so their results stay what they were and equal on every machine; bf16 runs (whose
    numbers are new with auto anyway) take the fused kernel."""
    return str(precision).startswith("bf16")


def adamw_implementation(fused: bool | None, device: torch.device, precision: str | int = "32-true") -> dict:
    """AdamW's implementation for weights on `device`, as keyword arguments: optim.fused=true or false as set;
    null: the fused kernel (one launch for all parameters) on a CUDA GPU, on CPU where the rows say
    (bf16 only: float32 keeps torch's default and its results), else torch's default."""
    if fused is None:
        fused = device.type == "cuda" or (device.type == "cpu" and fused_adamw_on_cpu(precision))
    return {"fused": True} if fused else {}
