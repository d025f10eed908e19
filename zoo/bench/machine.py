"""What a report says about the machine it ran on: the processor kind its timings belong to, the CPU, library
versions, and the load average (other processes competing for the cores)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import re
import subprocess
import time
from pathlib import Path

import torch

from zoo import hardware
from zoo.bench.settings import Settings


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def kind_label(s: Settings) -> str:
    """The kind of processor a run belongs to (its block of the report, its sections' headings): the GPU with
    --device cuda, else what computes bf16 on this CPU (zoo.hardware.cpu_kind: 'AMX', 'AVX-512 BF16', or 'no native
    bf16')."""
    if s.device != "cpu":
        return torch.cuda.get_device_name(torch.device(s.device))
    return hardware.CPU_BF16.get(hardware.cpu_kind(), "no native bf16")


def machine_info(s: Settings) -> list[tuple[str, str]]:
    cpu, flags = platform.processor() or "unknown", ""
    with contextlib.suppress(OSError):
        info = Path("/proc/cpuinfo").read_text()
        m = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
        cpu = m.group(1).strip() if m else cpu
        m = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
        flags = m.group(1) if m else ""
    bf16 = [f for f in ("avx512_bf16", "amx_bf16") if f in flags.split()]
    nano = "-"
    if s.nanogpt is not None:
        nano = str(s.nanogpt)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            commit = subprocess.run(["git", "-C", str(s.nanogpt), "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True, timeout=10).stdout.strip()
            nano += f" ({commit})" if commit else ""
    return [
        ("CPU", f"{cpu}, {os.cpu_count()} logical cores, torch threads {torch.get_num_threads()}, "
                f"capability {torch.backends.cpu.get_cpu_capability()}, bf16 flags: {', '.join(bf16) or 'none'}"),
        *([("GPU", f"{torch.cuda.get_device_name(torch.device(s.device))}, CUDA {torch.version.cuda}")]
          if s.device != "cpu" else []),
        ("OS", platform.platform()), ("Python", platform.python_version()), ("torch", torch.__version__),
        ("transformers", _version("transformers")), ("x-transformers", _version("x-transformers")),
        ("nanoGPT", nano), ("date", time.strftime("%Y-%m-%d %H:%M %Z")), ("load average at start", load_average()),
    ]


def load_average(short: bool = False) -> str:
    """The 1-minute load average; above the core count, processes were competing for the cores."""
    with contextlib.suppress(OSError, AttributeError):
        return f"{os.getloadavg()[0]:.2f}" + ("" if short else f" on {os.cpu_count()} cores")
    return "unknown"


def load_value(text: str | None = None) -> float:
    """The 1-minute load average as a number (0 where unknown)."""
    try:
        return float((text or load_average(short=True)).split()[0])
    except ValueError:
        return 0.0
