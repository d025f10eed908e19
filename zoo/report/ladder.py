"""A ladder: the same variants trained at several sizes (the `size` factor a `ladder=` preset sweeps).

For each variant (the sweep's variants less their size, called arms here):
- a fit of the final metric against training compute C (train FLOPs per token x tokens seen), over every seed:
  a power law with an irreducible term, L = E + A * C^-alpha, where four or more sizes support it (each
  parameter estimated with a standard error smaller than itself), else the plain power law
  L = A * C^-alpha, a straight line in log-log (least squares), with 95% intervals;
- its rank at each size, with the 95% interval of its mean;
- against the baseline, a verdict on how the gap (arm - baseline) moves from the smallest size to the largest:
  flips (larger than seed noise at both ends, with opposite signs), grows or shrinks (the change of the gap is
  larger than seed noise), holds (the gap has the same sign at both ends, beyond noise, and its change is
  within noise), or inconclusive. Gaps are tested with Welch's t-test; the change of the gap with a t-test on
  the difference of the two gaps (four groups of seeds, Welch-Satterthwaite degrees of freedom).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize, stats

from zoo.report.runs import ReportError, Run, variant_label
from zoo.report.stats import ALPHA, LEVEL, confidence_interval, mean_std, welch_test

LADDER_FACTOR = "size"  # the override a ladder sweeps (conf/ladder/*.yaml, conf/size/)
VERDICTS = ("holds", "grows", "shrinks", "flips", "inconclusive")


def compute(run: Run) -> float | None:
    """Training FLOPs of a run: its train FLOPs per token times the tokens it saw."""
    flops, tokens = run.get("flops_per_token", "train"), run.get("tokens_seen")
    try:
        c = float(flops) * float(tokens)
    except (TypeError, ValueError):
        return None
    return c if math.isfinite(c) and c > 0 else None


@dataclass
class Fit:
    form: str  # "E + A·C^-α" or "A·C^-α"
    alpha: float
    alpha_ci: tuple[float, float] | None
    a: float  # A
    e: float = 0.0  # E, the irreducible term (0 for the plain power law)
    e_ci: tuple[float, float] | None = None
    n: int = 0  # points (runs) fitted

    def __call__(self, c: Any) -> Any:  # c: a float or an array of them
        return self.e + self.a * np.power(c, -self.alpha)


def fit_power_law(points: list[tuple[float, float]], sizes: int) -> Fit | None:
    """The fit described in the module docstring, over (compute, metric) points; None below two sizes."""
    pts = [(c, v) for c, v in points if c > 0 and v > 0]
    if sizes < 2 or len(pts) < 2:
        return None
    c, v = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    if sizes >= 4:
        fit = _saturating_fit(c, v)
        if fit is not None:
            return fit
    x, y = np.log(c), np.log(v)
    r = stats.linregress(x, y)
    ci = None
    if len(pts) > 2 and math.isfinite(r.stderr):
        half = float(stats.t.ppf(0.5 + LEVEL / 2, len(pts) - 2)) * r.stderr
        ci = (-r.slope - half, -r.slope + half)
    return Fit("A·C^-α", -float(r.slope), ci, float(math.exp(r.intercept)), n=len(pts))


def _saturating_fit(c: np.ndarray, v: np.ndarray) -> Fit | None:
    x = np.log(c / c.min())  # conditioned: the fit sees compute relative to the smallest run's
    model = lambda x, e, log_b, alpha: e + np.exp(log_b - alpha * x)
    try:
        p, cov = optimize.curve_fit(model, x, v, p0=(0.5 * v.min(), math.log(v.max() / 2), 0.2),
                                    bounds=([0.0, -20.0, 0.0], [v.min(), 20.0, 5.0]), maxfev=20000)
    except (RuntimeError, ValueError, optimize.OptimizeWarning):
        return None
    se = np.sqrt(np.diag(cov)) if np.all(np.isfinite(cov)) else None
    if se is None or len(v) <= 3 or not (se[0] < p[0] and se[2] < p[2]):
        return None  # the points do not pin the irreducible term down
    t = float(stats.t.ppf(0.5 + LEVEL / 2, len(v) - 3))
    a = math.exp(p[1]) * c.min() ** p[2]  # back to L = E + A * C^-alpha
    return Fit("E + A·C^-α", float(p[2]), (p[2] - t * se[2], p[2] + t * se[2]), a, float(p[0]),
               (p[0] - t * se[0], p[0] + t * se[0]), len(v))


@dataclass
class Gap:
    diff: float  # mean(arm) - mean(baseline)
    p: float | None  # Welch's two-sided p; None with fewer than two seeds on a side


@dataclass
class Verdict:
    arm: str
    small: Gap
    large: Gap
    change: Gap  # the gap at the largest size minus the gap at the smallest
    verdict: str
    why: str


def _change_of_gap(a_small: list[float], b_small: list[float], a_large: list[float], b_large: list[float]) -> Gap:
    """(gap_large - gap_small) and its two-sided p from a t-test over the four groups' variances."""
    groups = [mean_std(g) for g in (a_small, b_small, a_large, b_large)]
    diff = (groups[2][0] - groups[3][0]) - (groups[0][0] - groups[1][0])
    if any(n < 2 for _, _, n in groups):
        return Gap(diff, None)
    parts = [s * s / n for _, s, n in groups]
    var = sum(parts)
    if var == 0:
        return Gap(diff, 0.0 if diff else 1.0)
    df = var ** 2 / sum(q * q / (n - 1) for q, (_, _, n) in zip(parts, groups, strict=True))
    return Gap(diff, float(2 * stats.t.sf(abs(diff) / math.sqrt(var), df)))


def verdict(small: Gap, large: Gap, change: Gap, higher: bool) -> tuple[str, str]:
    """(verdict, the reason in words) for one arm against the baseline; see the module docstring."""
    if small.p is None or large.p is None or change.p is None:
        return "inconclusive", "fewer than two seeds at an end of the ladder: seed noise cannot be estimated"
    def sign(g: Gap) -> int:
        return (1 if g.diff > 0 else -1) if g.p is not None and g.p < ALPHA and g.diff else 0

    def word(g: Gap) -> str:
        return "better" if (g.diff > 0) == higher else "worse"

    s, l_ = sign(small), sign(large)
    if s and l_ and s != l_:
        return "flips", f"{word(small)} at the smallest size and {word(large)} at the largest, both beyond noise"
    if change.p < ALPHA:
        grows = abs(large.diff) > abs(small.diff)
        return ("grows" if grows else "shrinks"), f"the gap changes by {change.diff:+.4f} from the smallest " \
            f"size to the largest, beyond noise (p={change.p:.2g})"
    if s and s == l_:
        return "holds", f"{word(large)} at both ends, beyond noise; the gap's change is within noise " \
            f"(p={change.p:.2g})"
    return "inconclusive", "the gap is within noise at one end or both, and so is its change " \
        f"(p={change.p:.2g})"


@dataclass
class Ladder:
    metric: str
    higher: bool
    rungs: list[str]  # sizes, smallest first (by parameters)
    arms: list[str]
    cells: dict[tuple[str, str], list[Run]]  # (arm, rung) -> the completed runs with the metric
    params: dict[str, float]  # rung -> mean parameters (active)
    fits: dict[str, Fit | None]
    baseline: str | None
    verdicts: list[Verdict]

    def values(self, arm: str, rung: str) -> list[float]:
        return [v for r in self.cells.get((arm, rung), []) if (v := r.final(self.metric)) is not None]

    def ranking_table(self) -> pd.DataFrame:
        """One row per size: each arm's mean final metric, its 95% interval and its rank at that size."""
        body = []
        for rung in self.rungs:
            means = {a: mean_std(self.values(a, rung))[0] for a in self.arms}
            order = sorted((a for a in self.arms if math.isfinite(means[a])), key=means.__getitem__,
                           reverse=self.higher)
            cells = []
            for a in self.arms:
                ci = confidence_interval(self.values(a, rung))
                rank = f" (#{order.index(a) + 1})" if a in order else ""
                cell = "-" if a not in order else f"{means[a]:.4f}" + (
                    f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else " (1 seed)") + rank
                cells.append(cell)
            body.append([rung, _human(self.params.get(rung))] + cells)
        return pd.DataFrame(body, columns=["size", "params"] + self.arms)

    def fits_table(self) -> pd.DataFrame:
        body = []
        for a in self.arms:
            f = self.fits.get(a)
            if f is None:
                body.append([a, "-", "-", "-", "-", 0])
                continue
            ci = f"[{f.alpha_ci[0]:.3f}, {f.alpha_ci[1]:.3f}]" if f.alpha_ci else "-"
            e = "-" if f.form.startswith("A") else f"{f.e:.3f}" + (
                f" [{f.e_ci[0]:.3f}, {f.e_ci[1]:.3f}]" if f.e_ci else "")
            body.append([a, f.form, f"{f.alpha:.3f}", ci, e, f.n])
        return pd.DataFrame(body, columns=["variant", "fit", "α", "α 95% CI", "E (95% CI)", "runs"])

    def verdicts_table(self) -> pd.DataFrame:
        def cell(g: Gap) -> str:  # a gap with no runs on a side (a ladder still running) is no number
            return "-" if not math.isfinite(g.diff) else f"{g.diff:+.4f} (p={'-' if g.p is None else f'{g.p:.2g}'})"

        body = [[v.arm, cell(v.small), cell(v.large), cell(v.change), v.verdict, v.why] for v in self.verdicts]
        return pd.DataFrame(body, columns=["variant", f"gap at {self.rungs[0]}", f"gap at {self.rungs[-1]}",
                                           "change", "verdict", "why"])

    def sentences(self) -> list[str]:
        return [f"{v.arm} vs {self.baseline}: {v.verdict} ({v.why})." for v in self.verdicts]


def _human(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x / 1e6:.2f}M" if x >= 1e5 else f"{x / 1e3:.0f}K"


def build_ladder(runs: list[Run], factors: list[str], metric: str, higher: bool,
                 baseline: dict[str, str] | None) -> Ladder | None:
    """The ladder of a sweep whose runs vary `size`; None for any other sweep. `baseline`: the overrides that
    name the baseline arm (the report's --baseline), else the arm best at the largest size."""
    if LADDER_FACTOR not in factors:
        return None
    others = [f for f in factors if f != LADDER_FACTOR]
    cells: dict[tuple[str, str], list[Run]] = {}
    params: dict[str, list[float]] = {}
    arms: list[str] = []
    for r in runs:
        rung, arm = r.overrides.get(LADDER_FACTOR, "(default)"), _arm_of(r, others)
        arms += [arm] if arm not in arms else []
        count = r.get("params", "active")
        if isinstance(count, (int, float)):
            params.setdefault(rung, []).append(float(count))
        if r.ok and r.final(metric) is not None:
            cells.setdefault((arm, rung), []).append(r)
    mean_params = {k: float(np.mean(v)) for k, v in params.items()}
    rungs = sorted({r.overrides.get(LADDER_FACTOR, "(default)") for r in runs},
                   key=lambda k: (mean_params.get(k, math.inf), k))
    fits = {}
    for a in arms:
        pts = [(c, v) for g in rungs for r in cells.get((a, g), [])
               if (c := compute(r)) and (v := r.final(metric)) is not None]
        fits[a] = fit_power_law(pts, len({g for g in rungs if cells.get((a, g))}))
    ladder = Ladder(metric, higher, rungs, arms, cells, mean_params, fits, None, [])
    base = _baseline_arm(ladder, runs, others, baseline)
    ladder.baseline = base
    if base is None or len(rungs) < 2:
        return ladder
    small, large = rungs[0], rungs[-1]
    for a in arms:
        if a == base:
            continue
        gaps = []
        for rung in (small, large):
            w = welch_test(ladder.values(a, rung), ladder.values(base, rung))
            d = mean_std(ladder.values(a, rung))[0] - mean_std(ladder.values(base, rung))[0]
            gaps.append(Gap(d, None if w is None else w.p))
        change = _change_of_gap(ladder.values(a, small), ladder.values(base, small),
                                ladder.values(a, large), ladder.values(base, large))
        ladder.verdicts.append(Verdict(a, gaps[0], gaps[1], change, *verdict(gaps[0], gaps[1], change, higher)))
    return ladder


def _baseline_arm(ladder: Ladder, runs: list[Run], others: list[str], want: dict[str, str] | None) -> str | None:
    """The arm a run matching `want` belongs to; without one (or no match), the arm best at the largest size."""
    if want:
        match = next((r for r in runs if all(r.overrides.get(k) == v for k, v in want.items())), None)
        if match is None:
            raise ReportError(f"--baseline: no variant matches {want}; variants: {'; '.join(ladder.arms)}")
        return _arm_of(match, others)
    top = ladder.rungs[-1]
    scored = [(mean_std(ladder.values(a, top))[0], a) for a in ladder.arms if ladder.values(a, top)]
    return (max if ladder.higher else min)(scored)[1] if scored else None


def _arm_of(run: Run, others: list[str]) -> str:
    """A run's arm: its variant's label without the size."""
    return variant_label(tuple((f, run.value(f)) for f in others))
