"""Statistics over the seeds of a variant: mean, std, Student-t intervals, Welch's t-test (scipy.stats)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy import stats

LEVEL = 0.95  # confidence level of the intervals
ALPHA = 0.05  # significance threshold of the Welch test


def higher_is_better(metric: str, directions: dict[str, str] | None = None) -> bool:
    """The direction summary.json records for the metric ("min"/"max"); for summaries written before
    runs recorded it, the name rule: accuracy and exact match go up, losses, perplexity and bpc down."""
    direction = (directions or {}).get(metric)
    if direction in ("min", "max"):
        return direction == "max"
    return "acc" in metric or "exact_match" in metric


def mean_std(values: Iterable[float]) -> tuple[float, float, int]:
    """(mean, sample standard deviation with n - 1, n); std is nan for n < 2, mean nan for n = 0."""
    x = np.asarray([float(v) for v in values], dtype=float)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, 0
    return float(x.mean()), float(x.std(ddof=1)) if n > 1 else math.nan, n


def confidence_interval(values: Iterable[float], level: float = LEVEL) -> tuple[float, float] | None:
    """Student-t interval for the mean, mean +- t((1 + level) / 2, n - 1) * std / sqrt(n); None when n < 2."""
    m, s, n = mean_std(values)
    if n < 2:
        return None
    half = float(stats.t.ppf(0.5 + level / 2.0, n - 1)) * s / math.sqrt(n)
    return m - half, m + half


@dataclass
class Welch:
    diff: float  # mean(a) - mean(b)
    t: float
    df: float
    p: float  # two-sided
    se: float  # the difference's standard error, sqrt(var(a)/n_a + var(b)/n_b)

    def interval(self, level: float = LEVEL) -> tuple[float, float]:
        """The difference's interval, diff +- t((1 + level) / 2, df) * se (Welch-Satterthwaite df)."""
        half = float(stats.t.ppf(0.5 + level / 2.0, self.df)) * self.se if self.se else 0.0
        return self.diff - half, self.diff + half


def welch_test(a: Iterable[float], b: Iterable[float]) -> Welch | None:
    """Welch's unequal-variance t-test of mean(a) == mean(b); None when a group has fewer than two values."""
    ma, sa, na = mean_std(a)
    mb, sb, nb = mean_std(b)
    if na < 2 or nb < 2:
        return None
    va, vb = sa * sa / na, sb * sb / nb
    diff = ma - mb
    if va + vb == 0.0:  # no spread at all: any difference is certain, none is none (scipy says nan)
        return Welch(diff, math.inf if diff else 0.0, na + nb - 2.0, 0.0 if diff else 1.0, 0.0)
    r = stats.ttest_ind([float(v) for v in a], [float(v) for v in b], equal_var=False)
    return Welch(diff, float(r.statistic), float(r.df), float(r.pvalue), math.sqrt(va + vb))


def steps_to_target(history: Iterable[tuple[float, float | None]], target: float, higher: bool = False) -> float | None:
    """The first step at which the metric reaches `target`, linearly interpolated between evaluations.

    history: (step, value) pairs; (seconds, value) pairs give the time to the target the same way. If the first
    evaluation already reaches the target, its step is returned (nothing is known before it); None when the target
    is never reached."""
    prev = None
    for step, value in sorted((float(s), float(v)) for s, v in history if v is not None and math.isfinite(v)):
        if (value >= target) if higher else (value <= target):
            if prev is None or value == prev[1]:
                return step
            s0, v0 = prev
            return s0 + (target - v0) / (value - v0) * (step - s0)
        prev = (step, value)
    return None
