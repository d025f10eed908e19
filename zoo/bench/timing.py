"""Shared timing: every contender warmed up, then round-robin rounds with the starting contender rotating, and
medians with their interquartile range. Slow drifts of a shared, noisy machine hit all contenders alike."""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from zoo.bench.settings import Settings


@dataclass
class Stats:
    times: list[float]  # seconds

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def iqr(self) -> float:
        if len(self.times) < 2:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.times, n=4, method="inclusive")
        return q3 - q1


def time_call(fn: Callable[[], object]) -> float:
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t0


def _sync() -> None:
    """Wait for the GPU's queued work, so a time covers it (nothing to do where CUDA was never used)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def interleave(fns: dict[str, Callable[[], object]], s: Settings) -> dict[str, Stats]:
    """Warm each function up, then run them round-robin; per-call times in seconds. The number of rounds
    gives the slowest function about s.target_s seconds, within [s.min_rounds, s.max_rounds]."""
    est = {}
    for name, fn in fns.items():
        for _ in range(max(1, s.warmup)):
            est[name] = time_call(fn)
    rounds = s.min_rounds
    if s.target_s > 0 and est:
        rounds = min(s.max_rounds, max(s.min_rounds, math.ceil(s.target_s / max(max(est.values()), 1e-6))))
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    gc.collect()
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(time_call(fns[name]))
    return {n: Stats(t) for n, t in times.items()}


def matmul_peak(dtype: torch.dtype, n: int, repeats: int, device: str = "cpu") -> float:
    """Best FLOP/s of an n x n matrix product over `repeats` tries."""
    a, b = torch.randn(n, n).to(device, dtype), torch.randn(n, n).to(device, dtype)
    torch.mm(a, b)
    best = min(time_call(lambda: torch.mm(a, b)) for _ in range(repeats))
    return 2 * n**3 / best
