"""What this machine computes fast, and the choices that follow from it, each backed by benchmark rows.

- `trainer.precision=auto` (the default): bf16-mixed where the hardware computes bf16 natively (AMX or
  AVX-512 BF16 on CPU, a GPU with native bf16), float32 otherwise (`resolve_precision`).
- Low-precision attention on CPU: the fused kernel or the written-out form (`fused_attention_backward_from`,
  used by zoo/layers/attention.py).
- AdamW's kernel (`adamw_implementation`: train.py's optimizer, zoo/training/module.py, and the benchmark's).

The rows are in docs/benchmarks.md (`python -m zoo.bench --only choices`, one section per CPU kind); a rule
changes with them, not with one machine's impression. The CPU is read once per process.
"""

from __future__ import annotations

import contextlib
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
        import torch

        amx, avx = torch.cpu._is_amx_tile_supported(), torch.cpu._is_avx512_bf16_supported()
    return "amx" if amx else "avx512_bf16" if avx else "none"


CPU_BF16 = {"amx": "AMX", "avx512_bf16": "AVX-512 BF16"}  # cpu_kind -> the unit that computes bf16, in words


def on_gpu(trainer: dict) -> bool:
    import torch

    acc = trainer.get("accelerator", "auto")
    return acc in ("gpu", "cuda") or (acc == "auto" and torch.cuda.is_available())


def native_bf16(trainer: dict) -> str | None:
    """What computes bf16 natively where this run trains, in words ('AMX', 'NVIDIA A100 ...'), or None."""
    if on_gpu(trainer):
        import torch

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


# --- low-precision attention on CPU ------------------------------------------------------------------------
# The fused kernel (F.scaled_dot_product_attention) against the written-out product form, bf16 autocast, forward +
# backward (docs/benchmarks.md, "Hardware choices (<CPU kind>)"). The written-out form's softmax is either zoo's
# kernel (zoo/layers/softmax.cpp: bf16, where it builds) or torch ops (no C++ compiler, ZOO_NATIVE=0, fp16, masks
# other than causal, torch.compile below COMPILED_SOFTMAX_KERNEL_FROM), so each has its own table.
# - AMX, softmax in torch ops (one thread): attention alone, the written-out form is 2.9x faster at key length 64,
#   2.3x at 128, 1.1x at 192; the kernel 1.02-1.05x faster at 256 and 1.7-2.5x at 512. Whole models: written-out
#   1.3-1.6x faster at context 64, the kernel 1.05-1.2x faster at 256 (under torch.compile the two are within 1%
#   there). On two threads attention alone is 1.2x faster written out at 256, but whole models are still faster on
#   the kernel there (1.01x and 1.13x): 256 stays.
# - AMX, zoo's softmax (two threads): attention alone, the written-out form is 3.5x faster at 64, 2.1x at 256, 1.7x
#   at 512; the kernel 1.5x faster at 768 and 1.7x at 1024. Whole models, six runs: written-out 1.36-1.64x faster
#   at 64, 0.96-1.23x at 256 (faster, or within 5%, in every run).
# - AVX-512 BF16 without AMX (AMD EPYC), softmax in torch ops: the written-out form is faster at 64 and at 256 (the
#   compile section: nanoGPT's bf16 step, on the kernel, 1.40x and 1.06x slower than zoo's on the written-out
#   form); no row yet says where the kernel takes over, so it never does (`--only choices` on such a CPU would say),
#   and none yet with zoo's softmax, which the same rule (never) serves there.
# cpu_kind -> the shortest key length where the kernel's backward is faster
FUSED_FROM = {"amx": 256}  # the written-out form in torch ops
FUSED_FROM_SOFTMAX_KERNEL = {"amx": 768}  # the written-out form on zoo's softmax kernel

# Under torch.compile the written-out form's softmax is zoo's kernel or inductor's own fusion of the torch ops (one
# pass each way too), and the kernel is the faster only on longer rows. AMX, two threads, compiled, five runs:
# attention alone (48 heads), the fusion 1.06-1.14x faster at key length 64 and 1.01-1.04x at 128, the kernel
# 1.12-1.16x faster at 192, 1.34-1.48x at 256, 1.6-2.5x at 512-1024; whole bf16 models, the fusion 2-10% faster at
# context 64 and within 2% at 128, the kernel 5-9% faster at 256 and 18% at 512 (and 1.15-1.25x faster than the
# fused attention kernel at both). No row yet from other kinds: they keep inductor's fusion.
# cpu_kind -> the shortest key length from which compiled models take zoo's softmax kernel
COMPILED_SOFTMAX_KERNEL_FROM = {"amx": 192}


def fused_attention_backward_from(softmax_kernel: bool = False) -> int | None:
    """The shortest key length from which low-precision attention training on this CPU takes the fused kernel,
    against the written-out form with zoo's softmax kernel or without it; None: never (the written-out form at
    every length)."""
    return (FUSED_FROM_SOFTMAX_KERNEL if softmax_kernel else FUSED_FROM).get(cpu_kind())


def compiled_softmax_kernel_from() -> int | None:
    """The shortest key length from which compiled models' written-out attention takes zoo's softmax kernel over
    inductor's fusion of the torch ops on this CPU; None: never."""
    return COMPILED_SOFTMAX_KERNEL_FROM.get(cpu_kind())


# --- AdamW -------------------------------------------------------------------------------------------------


def fused_adamw_on_cpu(precision: str | int) -> bool:
    """Whether AdamW takes torch's fused kernel on CPU when optim.fused is null (adamw_implementation).

    The fused kernel is 3x faster than torch's default per-tensor loop on an AMX CPU at both benchmark shapes
    (foreach: no faster; docs/benchmarks.md, "Hardware choices"), but rounds differently in the last bit: float32
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
