"""Compare the runs of a sweep: one table row per variant, curves, error bars and significance.

    python -m zoo.report multirun/2025-01-01/12-00-00                 # writes report.md, report.html, *.png
    python -m zoo.report DIR --metric val_loss --target 4.2 --baseline ffn=gelu --out reports/

Every run directory under DIR (one holding summary.json, metrics.csv or .hydra/overrides.yaml) is read.
Runs are grouped into variants by the Hydra overrides that differ between runs, the seed excepted, so
`python train.py -m ffn=relu,swiglu seed=0,1,2` gives two variants of three seeds each. A run without
summary.json (it crashed) counts as failed; failed, interrupted and diverged runs are counted in the table
but left out of the statistics.

Statistics, over the seeds of a variant: mean, sample standard deviation (n - 1), and a 95% confidence
interval mean +- t(0.975, n - 1) * std / sqrt(n) (Student t). Two variants are compared with Welch's
two-sided t-test (unequal variances, Welch-Satterthwaite degrees of freedom); a difference is called
larger than seed noise when p < 0.05. The Student t distribution is computed here from the regularized
incomplete beta function, so nothing beyond numpy and matplotlib is needed.
"""

from __future__ import annotations

import argparse
import base64
import csv
import html
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from hydra.experimental.callback import Callback

from zoo.io import atomic_write, atomic_write_text

EXIT_OK, EXIT_ERROR = 0, 2
LEVEL = 0.95  # confidence level of the intervals
ALPHA = 0.05  # significance threshold of the Welch test
FAILED = ("failed", "interrupted", "crashed")  # statuses counted in the table's `failed` column


class ReportError(ValueError):
    """Bad input to the report (no runs, unknown metric, unknown baseline), reported as one line."""


# ----------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------

def higher_is_better(metric: str) -> bool:
    """Accuracy and exact match go up; losses, perplexity and bits per character go down."""
    return "acc" in metric or "exact_match" in metric


def mean_std(values) -> tuple[float, float, int]:
    """(mean, sample standard deviation with n - 1, n); std is nan for n < 2, mean nan for n = 0."""
    x = [float(v) for v in values]
    n = len(x)
    if n == 0:
        return math.nan, math.nan, 0
    m = sum(x) / n
    if n < 2:
        return m, math.nan, 1
    return m, math.sqrt(sum((v - m) ** 2 for v in x) / (n - 1)), n


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for aa in (m * (b - m) * x / ((a - 1.0 + 2 * m) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1.0 + 2 * m))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf2(t: float, df: float) -> float:
    """Two-sided tail probability P(|T| >= |t|) of Student's t with df (possibly fractional) degrees of freedom."""
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_cdf(t: float, df: float) -> float:
    tail = 0.5 * t_sf2(t, df)
    return 1.0 - tail if t >= 0 else tail


def t_ppf(q: float, df: float) -> float:
    """The q-quantile of Student's t (0 < q < 1), by bisection on the CDF."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {q}")
    if q < 0.5:
        return -t_ppf(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def confidence_interval(values, level: float = LEVEL) -> tuple[float, float] | None:
    """Student-t interval for the mean, mean +- t((1 + level) / 2, n - 1) * std / sqrt(n); None when n < 2."""
    m, s, n = mean_std(values)
    if n < 2:
        return None
    half = t_ppf(0.5 + level / 2.0, n - 1) * s / math.sqrt(n)
    return m - half, m + half


@dataclass
class Welch:
    diff: float  # mean(a) - mean(b)
    t: float
    df: float
    p: float  # two-sided


def welch_test(a, b) -> Welch | None:
    """Welch's unequal-variance t-test of mean(a) == mean(b); None when a group has fewer than two values."""
    ma, sa, na = mean_std(a)
    mb, sb, nb = mean_std(b)
    if na < 2 or nb < 2:
        return None
    va, vb = sa * sa / na, sb * sb / nb
    diff = ma - mb
    if va + vb == 0.0:  # no spread at all: any difference is certain, none is none
        return Welch(diff, math.inf if diff else 0.0, na + nb - 2.0, 0.0 if diff else 1.0)
    t = diff / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va * va / (na - 1) + vb * vb / (nb - 1))
    return Welch(diff, t, df, t_sf2(t, df))


def steps_to_target(history, target: float, higher: bool = False) -> float | None:
    """The first step at which the metric reaches `target`, linearly interpolated between evaluations.

    history: (step, value) pairs. If the first evaluation already reaches the target, its step is
    returned (nothing is known before it); None when the target is never reached."""
    prev = None
    for step, value in sorted((float(s), float(v)) for s, v in history if v is not None and math.isfinite(v)):
        if (value >= target) if higher else (value <= target):
            if prev is None or value == prev[1]:
                return step
            s0, v0 = prev
            return s0 + (target - v0) / (value - v0) * (step - s0)
        prev = (step, value)
    return None


# ----------------------------------------------------------------------------------------------
# Reading runs
# ----------------------------------------------------------------------------------------------

@dataclass
class Run:
    path: Path
    status: str  # completed | diverged | interrupted | failed | crashed (no summary.json)
    overrides: dict[str, str]
    summary: dict | None = None
    csv_history: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    def history(self, metric: str) -> list[tuple[float, float]]:
        """(step, value) of every evaluation; from summary.json, else from metrics.csv."""
        rows = (self.summary or {}).get("history") or self.csv_history
        out = []
        for row in rows:
            value, step = row.get(metric), row.get("step")
            if value is not None and step is not None and math.isfinite(float(value)):
                out.append((float(step), float(value)))
        return out

    def final(self, metric: str) -> float | None:
        value = ((self.summary or {}).get("final") or {}).get(metric)
        if value is None:
            hist = self.history(metric)
            value = hist[-1][1] if hist else None
        return None if value is None or not math.isfinite(value) else float(value)

    def best(self, metric: str) -> float | None:
        entry = ((self.summary or {}).get("best") or {}).get(metric)
        if entry is not None:
            return float(entry["value"])
        values = [v for _, v in self.history(metric)]
        if not values:
            return None
        return max(values) if higher_is_better(metric) else min(values)

    def get(self, *keys):
        d = self.summary or {}
        for k in keys:
            if not isinstance(d, dict) or k not in d:
                return None
            d = d[k]
        return d


def _natural_key(path: Path) -> list:
    return [int(p) if p.isdigit() else p for part in path.parts for p in re.split(r"(\d+)", part) if p]


def find_run_dirs(root: Path) -> list[Path]:
    """Directories holding summary.json, metrics.csv or .hydra/overrides.yaml, outermost only."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if "summary.json" in filenames or "metrics.csv" in filenames:
            found.add(here)
        if here.name == ".hydra" and "overrides.yaml" in filenames:
            found.add(here.parent)
        dirnames[:] = [d for d in dirnames if d != "checkpoints"]
    found = sorted(found, key=lambda p: (len(p.parts), _natural_key(p)))
    outer: list[Path] = []
    for p in found:
        if not any(o in p.parents for o in outer):
            outer.append(p)
    return sorted(outer, key=_natural_key)


def parse_overrides(items) -> dict[str, str]:
    """['ffn=relu', '+x=1', '~y'] -> {'ffn': 'relu', 'x': '1', 'y': '(deleted)'}."""
    out = {}
    for item in items or []:
        item = str(item).strip()
        key, sep, value = item.partition("=")
        if key.startswith("~"):
            out[key[1:]] = "(deleted)" if not sep else f"(deleted {value})"
        elif sep:
            out[key.lstrip("+")] = value
    return out


def _read_overrides_yaml(path: Path) -> list[str]:
    """Hydra's .hydra/overrides.yaml: a YAML list of strings."""
    try:
        import yaml

        data = yaml.safe_load(path.read_text())
        return [str(x) for x in data] if isinstance(data, list) else []
    except Exception:  # a truncated file: read the '- item' lines by hand
        return [line[2:].strip() for line in path.read_text(errors="replace").splitlines() if line.startswith("- ")]


def _read_metrics_csv(path: Path) -> list[dict]:
    """Evaluation rows of metrics.csv as {metric: value, step}. Lightning logs an evaluation during
    fit at the 0-based index of the last batch, one less than summary.json's global step: add 1."""
    rows = []
    try:
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                values = {}
                for k, v in row.items():
                    if k in (None, "epoch", "step") or not v or not k.startswith(("val_", "exact_match")):
                        continue
                    try:
                        values[k] = float(v)
                    except ValueError:
                        pass
                if values and row.get("step"):
                    rows.append({**values, "step": int(float(row["step"])) + 1})
    except (OSError, csv.Error, ValueError):
        return []
    return rows


def load_run(path: Path) -> Run:
    summary = None
    if (path / "summary.json").is_file():
        try:
            summary = json.loads((path / "summary.json").read_text())
        except (OSError, ValueError):
            summary = None  # a half-written summary: the run crashed
    if summary is not None and summary.get("overrides") is not None:
        overrides = parse_overrides(summary["overrides"])
    elif (path / ".hydra" / "overrides.yaml").is_file():
        overrides = parse_overrides(_read_overrides_yaml(path / ".hydra" / "overrides.yaml"))
    else:
        overrides = {}
    status = "crashed" if summary is None else str(summary.get("status") or "failed")
    if summary is not None and summary.get("diverged"):
        status = "diverged"
    csv_path = path / "metrics.csv"
    return Run(path, status, overrides, summary, _read_metrics_csv(csv_path) if csv_path.is_file() else [])


def load_runs(root: Path) -> list[Run]:
    return [load_run(p) for p in find_run_dirs(root)]


# ----------------------------------------------------------------------------------------------
# Variants
# ----------------------------------------------------------------------------------------------

@dataclass
class Variant:
    key: tuple[tuple[str, str], ...]  # (factor, value) for the factors that vary
    runs: list[Run]
    label: str = ""

    def ok_runs(self, metric: str) -> list[Run]:
        return [r for r in self.runs if r.ok and r.final(metric) is not None]

    def finals(self, metric: str) -> list[float]:
        return [r.final(metric) for r in self.ok_runs(metric)]

    def bests(self, metric: str) -> list[float]:
        return [b for r in self.ok_runs(metric) if (b := r.best(metric)) is not None]

    def count(self, *statuses: str) -> int:
        return sum(r.status in statuses for r in self.runs)


def varying_factors(runs: list[Run]) -> list[str]:
    """Override keys whose value differs between runs (a key missing from a run counts as a value), seed excepted."""
    keys = list(dict.fromkeys(k for r in runs for k in r.overrides))
    return [k for k in keys if k != "seed" and len({r.overrides.get(k) for r in runs}) > 1]


def group_variants(runs: list[Run]) -> tuple[list[str], list[Variant]]:
    factors = varying_factors(runs)
    variants: dict[tuple, Variant] = {}
    for r in runs:
        key = tuple((f, r.overrides.get(f, "(default)")) for f in factors)
        variants.setdefault(key, Variant(key, [])).runs.append(r)
    for v in variants.values():
        if not v.key:
            v.label = "all runs"
        elif len(v.key) == 1 and "." not in v.key[0][0]:
            v.label = v.key[0][1]
        else:
            v.label = ", ".join(f"{f}={val}" for f, val in v.key)
    return factors, list(variants.values())


def find_baseline(variants: list[Variant], spec: str) -> Variant:
    want = parse_overrides(re.split(r"[\s,]+", spec.strip()))
    if not want:
        raise ReportError(f"--baseline: expected overrides like 'ffn=gelu', got '{spec}'")
    matches = [v for v in variants if all(dict(v.key).get(k) == val for k, val in want.items())]
    if len(matches) != 1:
        labels = "; ".join(v.label for v in variants)
        what = "no variant" if not matches else f"{len(matches)} variants"
        raise ReportError(f"--baseline: {what} match '{spec}'; variants: {labels}")
    return matches[0]


# ----------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------

def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}f}"


def _human(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.0f}"


def _first(values):
    return next((v for v in values if v is not None), None)


@dataclass
class Row:
    variant: Variant
    params: float | None
    flops: float | None
    tok_s: float | None
    final: tuple[float, float, int]
    final_ci: tuple[float, float] | None
    best: tuple[float, float, int]
    best_ci: tuple[float, float] | None
    steps: list[float | None]  # steps to target, per ok run


def _params_from_config(run: Run) -> tuple[float | None, float | None]:
    """Parameters and train FLOPs per token of a run without a summary, from its resolved config.yaml."""
    path = run.path / "config.yaml"
    if not path.is_file():
        return None, None
    try:
        import yaml

        from zoo.build import count_params, flops_per_token

        cfg = yaml.safe_load(path.read_text())
        model = cfg["model"]
        context = (cfg.get("data") or {}).get("context")
        return count_params(model)["total"], flops_per_token(model, context)["train"]
    except Exception:  # an unresolved or partial config: leave the cells empty
        return None, None


def make_rows(variants: list[Variant], metric: str, target: float) -> list[Row]:
    higher = higher_is_better(metric)
    rows = []
    for v in variants:
        ok = v.ok_runs(metric)
        params = _first(r.get("params", "total") for r in v.runs)
        flops = _first(r.get("flops_per_token", "train") for r in v.runs)
        if params is None:
            params, flops = _first(pf for r in v.runs if (pf := _params_from_config(r))[0] is not None) or (None, None)
        speeds = [r.get("tokens_per_second") for r in ok if r.get("tokens_per_second") is not None]
        finals, bests = v.finals(metric), v.bests(metric)
        rows.append(Row(v, params, flops, sum(speeds) / len(speeds) if speeds else None,
                        mean_std(finals), confidence_interval(finals), mean_std(bests), confidence_interval(bests),
                        [steps_to_target(r.history(metric), target, higher) for r in ok]))
    return rows


def _ms(stat: tuple[float, float, int]) -> str:
    m, s, n = stat
    if n == 0:
        return "-"
    return f"{_fmt(m)} ± {_fmt(s)}" if n > 1 else f"{_fmt(m)} (1 seed)"


def _ci(ci: tuple[float, float] | None, n: int) -> str:
    if ci is None:
        return "n/a (1 seed)" if n == 1 else "-"
    return f"[{_fmt(ci[0])}, {_fmt(ci[1])}]"


def _steps(values: list[float | None]) -> str:
    hit = [s for s in values if s is not None]
    if not hit:
        return "-"
    text = f"{sum(hit) / len(hit):.1f}"
    return text if len(hit) == len(values) else f"{text} ({len(hit)}/{len(values)} seeds)"


def table(rows: list[Row], factors: list[str], metric: str, target: float) -> tuple[list[str], list[list[str]]]:
    op = "≥" if higher_is_better(metric) else "≤"
    head = (factors or ["variant"]) + ["params", "FLOPs/token (train)", "tok/s", f"final {metric} (mean ± std)",
                                       "final 95% CI", f"best {metric} (mean ± std)", "best 95% CI", "seeds",
                                       f"steps to {metric} {op} {_fmt(target)}", "diverged", "failed"]
    body = []
    for r in rows:
        n = r.final[2]
        cells = [val for _, val in r.variant.key] or [r.variant.label]
        cells += [_human(r.params), _human(r.flops), _human(r.tok_s), _ms(r.final), _ci(r.final_ci, n),
                  _ms(r.best), _ci(r.best_ci, r.best[2]), str(n), _steps(r.steps),
                  str(r.variant.count("diverged")), str(r.variant.count(*FAILED))]
        body.append(cells)
    return head, body


def comparisons(rows: list[Row], metric: str, baseline: Variant | None) -> tuple[str, list[str]]:
    """(what the sentences compare against, one sentence per other variant)."""
    higher = higher_is_better(metric)
    scored = [r for r in rows if r.final[2] > 0]
    if baseline is not None:
        ref = next((r for r in rows if r.variant is baseline), None)
        if ref is None or ref.final[2] == 0:
            return f"baseline {baseline.label}", [f"The baseline {baseline.label} has no completed run with "
                                                   f"{metric}; nothing to compare against."]
        intro = f"each variant against the baseline {ref.variant.label}"
    else:
        if len(scored) < 2:
            return "", []
        ref = (max if higher else min)(scored, key=lambda r: r.final[0])
        intro = f"the best variant ({ref.variant.label}, by mean final {metric}) against each other variant"
    out = []
    for r in rows:
        if r is ref:
            continue
        if r.final[2] == 0:
            out.append(f"{r.variant.label}: no completed run with {metric}; not compared.")
            continue
        # with a baseline: "variant vs baseline"; with the best: "best vs variant"
        a, b = (r, ref) if baseline is not None else (ref, r)
        diff = a.final[0] - b.final[0]
        better = (diff > 0) == higher
        size = f"{_fmt(abs(diff))} {'higher' if diff > 0 else 'lower'} {metric} ({'better' if better else 'worse'})"
        if diff == 0:
            size = f"the same mean {metric}"
        head = f"{a.variant.label} vs {b.variant.label}: {size}"
        n = f"n={a.final[2]} vs {b.final[2]}"
        w = welch_test(a.variant.finals(metric), b.variant.finals(metric))
        if w is None:
            out.append(f"{head}; seed noise cannot be estimated with one seed ({n}).")
        elif w.p < ALPHA:
            out.append(f"{head}, larger than seed noise (Welch t, p={w.p:.2g}, {n}).")
        else:
            out.append(f"{head}, within seed noise (Welch t, p={w.p:.2g}, {n}).")
    return intro, out


# ----------------------------------------------------------------------------------------------
# Plots
# ----------------------------------------------------------------------------------------------

def _figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def plot_curves(rows: list[Row], metric: str, target: float, path: Path) -> None:
    # Many or long variant names: the legend goes beside the axes, where it hides no curve.
    outside = len(rows) > 4 or max((len(r.variant.label) for r in rows), default=0) > 24
    fig = _figure(11 if outside else 7.5, 4.5)
    ax = fig.add_subplot()
    colors = [f"C{i % 10}" for i in range(len(rows))]
    for row, color in zip(rows, colors, strict=True):
        histories = [h for r in row.variant.ok_runs(metric) if (h := r.history(metric))]
        if not histories:
            continue
        grid = np.array(sorted({s for h in histories for s, _ in h}))
        ys = np.array([np.interp(grid, [s for s, _ in h], [v for _, v in h], left=np.nan, right=np.nan)
                       for h in histories])
        counts = np.sum(~np.isnan(ys), axis=0)
        ys_safe = np.where(np.isnan(ys), 0.0, ys)
        mean = ys_safe.sum(axis=0) / np.maximum(counts, 1)
        lo = np.where(np.isnan(ys), np.inf, ys).min(axis=0)
        hi = np.where(np.isnan(ys), -np.inf, ys).max(axis=0)
        keep = counts > 0
        ax.plot(grid[keep], mean[keep], "-o", color=color, ms=3, label=f"{row.variant.label} (n={len(histories)})")
        if len(histories) > 1:
            ax.fill_between(grid[keep], lo[keep], hi[keep], color=color, alpha=0.2, lw=0)
    ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {_fmt(target)}")
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title(f"validation {metric}: mean over seeds, band = min-max over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, **({"loc": "upper left", "bbox_to_anchor": (1.01, 1)} if outside else {}))
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png"), mode="wb")


def plot_final(rows: list[Row], metric: str, path: Path) -> None:
    fig = _figure(max(5.0, 1.2 * len(rows) + 2), 4.8)
    ax = fig.add_subplot()
    x = np.arange(len(rows))
    means = np.array([r.final[0] if r.final[2] else np.nan for r in rows])
    err = np.array([(r.final_ci[1] - r.final_ci[0]) / 2 if r.final_ci else 0.0 for r in rows])
    ax.bar(x, np.nan_to_num(means), color=[f"C{i % 10}" for i in range(len(rows))], alpha=0.7,
           yerr=err, capsize=6, error_kw={"lw": 1.5})
    points = [(i, v) for i, r in enumerate(rows) for v in r.variant.finals(metric)]
    if points:
        ax.scatter([p[0] for p in points], [p[1] for p in points], color="black", s=12, zorder=3, label="seeds")
        ax.legend(fontsize=8)
    lo = np.nanmin([np.nanmin(means - err)] + [p[1] for p in points]) if points else 0.0
    hi = np.nanmax([np.nanmax(means + err)] + [p[1] for p in points]) if points else 1.0
    zoom = ""
    if points and lo > 0 and hi > lo:
        pad = 0.15 * (hi - lo) if hi > lo else 0.05 * abs(hi)
        if lo - pad > 0.5 * hi:  # the bars would look equal from zero: zoom in
            ax.set_ylim(lo - pad, hi + pad)
            zoom = "\n(the y axis does not start at 0)"
    ax.set_xticks(x)
    ax.set_xticklabels([r.variant.label for r in rows], rotation=20 if len(rows) > 4 else 0, ha="right"
                       if len(rows) > 4 else "center", fontsize=8)
    ax.set_ylabel(f"final {metric}")
    ax.set_title(f"final {metric}\nmean and 95% CI (Student t) over seeds{zoom}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png"), mode="wb")


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------

METHOD = ("Each cell is over the seeds of a variant that completed: mean ± sample standard deviation (n-1); "
          "95% CI = mean ± t(0.975, n-1)·std/√n (Student t); with one seed there is no interval. "
          "Comparisons use Welch's two-sided t-test on the final {metric} (unequal variances, Welch–Satterthwaite "
          "degrees of freedom, p from the Student t distribution): a difference is larger than seed noise when "
          "p < 0.05. With one seed in a group the noise cannot be estimated.")


@dataclass
class Report:
    root: Path
    metric: str
    target: float
    target_note: str
    factors: list[str]
    rows: list[Row]
    head: list[str]
    body: list[list[str]]
    intro: str
    sentences: list[str]
    n_runs: int
    plots: list[tuple[str, str]]  # (file name, caption)

    def markdown(self) -> str:
        lines = [f"# Sweep report: {self.root}", "",
                 f"{self.n_runs} runs in {len(self.rows)} variants; metric `{self.metric}` "
                 f"({'higher' if higher_is_better(self.metric) else 'lower'} is better). "
                 + (f"Varying: {', '.join(f'`{f}`' for f in self.factors)}." if self.factors
                    else "No override varies except the seed."), "",
                 "| " + " | ".join(self.head) + " |", "|" + "|".join("---" for _ in self.head) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in self.body]
        lines += ["", f"Target: {self.metric} {'≥' if higher_is_better(self.metric) else '≤'} {_fmt(self.target)} "
                  f"({self.target_note}); steps are the mean over seeds of the first step reaching it, linearly "
                  "interpolated between evaluations ('-': never reached; (k/n): reached by k of n seeds). "
                  "Diverged and failed runs (failed, interrupted, or no summary.json) are counted, not averaged.",
                  "", "## Method", "", METHOD.format(metric=self.metric), "", "## Comparisons", ""]
        if self.sentences:
            lines += [f"Comparing {self.intro}:", ""] + [f"- {s}" for s in self.sentences]
        else:
            lines += ["Only one variant with completed runs: nothing to compare."]
        if self.plots:
            lines += ["", "## Plots", ""] + [f"![{cap}]({name})\n\n{cap}\n" for name, cap in self.plots]
        return "\n".join(lines).rstrip() + "\n"

    def html(self, out_dir: Path) -> str:
        e = html.escape
        parts = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>", f"<title>Sweep report: {e(str(self.root))}"
                 "</title>", "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
                 "table{border-collapse:collapse;font-size:0.9em}td,th{border:1px solid #ccc;padding:4px 8px;"
                 "text-align:right}th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}"
                 "img{max-width:100%}</style></head><body>",
                 f"<h1>Sweep report</h1><p><code>{e(str(self.root))}</code></p>",
                 f"<p>{self.n_runs} runs in {len(self.rows)} variants; metric <code>{e(self.metric)}</code> "
                 f"({'higher' if higher_is_better(self.metric) else 'lower'} is better).</p>",
                 "<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in self.head) + "</tr>"]
        parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in self.body]
        parts += ["</table>", f"<p>Target: {e(self.metric)} {'≥' if higher_is_better(self.metric) else '≤'} "
                  f"{e(_fmt(self.target))} ({e(self.target_note)}); steps interpolated between evaluations.</p>",
                  "<h2>Method</h2>", f"<p>{e(METHOD.format(metric=self.metric))}</p>", "<h2>Comparisons</h2>"]
        if self.sentences:
            parts += [f"<p>Comparing {e(self.intro)}:</p><ul>"] + [f"<li>{e(s)}</li>" for s in self.sentences]
            parts += ["</ul>"]
        else:
            parts += ["<p>Only one variant with completed runs: nothing to compare.</p>"]
        if self.plots:
            parts += ["<h2>Plots</h2>"]
        for name, cap in self.plots:
            data = base64.b64encode((out_dir / name).read_bytes()).decode("ascii")
            parts += [f"<figure><img alt='{e(cap)}' src='data:image/png;base64,{data}'>"
                      f"<figcaption>{e(cap)}</figcaption></figure>"]
        parts += ["</body></html>"]
        return "\n".join(parts) + "\n"


def build_report(root: Path, metric: str = "val_loss", target: float | None = None,
                 baseline: str | None = None) -> Report:
    root = Path(root)
    if not root.is_dir():
        raise ReportError(f"no such directory: '{root}'")
    runs = load_runs(root)
    if not runs:
        raise ReportError(f"no runs under '{root}' (looked for summary.json, metrics.csv, .hydra/overrides.yaml)")
    factors, variants = group_variants(runs)
    have = sorted({k for r in runs for k in ((r.summary or {}).get("final") or {})})
    if not any(r.final(metric) is not None for r in runs) and any(r.summary for r in runs):
        raise ReportError(f"--metric: no run has '{metric}'; available: {', '.join(have) or 'none'}")
    higher = higher_is_better(metric)
    base = find_baseline(variants, baseline) if baseline else None
    means = [m for v in variants if (m := mean_std(v.finals(metric))[0]) is not None and math.isfinite(m)]
    if target is not None:
        note = "given with --target"
    elif means:
        target, note = (min if higher else max)(means), f"default: the worst variant's mean final {metric}"
    else:
        target, note = math.nan, "no completed run"
    rows = make_rows(variants, metric, target)
    head, body = table(rows, factors, metric, target)
    intro, sentences = comparisons(rows, metric, base)
    return Report(root, metric, target, note, factors, rows, head, body, intro, sentences, len(runs), [])


def write_report(report: Report, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    if any(r.final[2] for r in report.rows):
        plot_curves(report.rows, report.metric, report.target, out_dir / "curves.png")
        plot_final(report.rows, report.metric, out_dir / "final.png")
        report.plots = [("curves.png", f"Validation {report.metric} per variant: mean over seeds, band = min-max."),
                        ("final.png", f"Final {report.metric}: mean per variant, error bars = 95% CI (Student t), "
                                      "dots = seeds.")]
        written += [out_dir / "curves.png", out_dir / "final.png"]
    atomic_write_text(out_dir / "report.md", report.markdown())
    atomic_write_text(out_dir / "report.html", report.html(out_dir))
    return [out_dir / "report.md", out_dir / "report.html"] + written


def console_summary(report: Report) -> str:
    """The table and the comparison sentences, as printed on the terminal."""
    md = report.markdown()
    text = md[md.index("| "):md.index("## Method")].rstrip()
    return text + ("\n\n" + "\n".join(report.sentences) if report.sentences else "")


class ReportAfterSweep(Callback):
    """A Hydra callback (`hydra.callbacks`) that writes the sweep's report when a multirun ends.

    The first metric's report goes into the sweep directory, any further one into report_<metric>/.
    The study presets in conf/study/ use it, so `python train.py -m study=ffn` ends with its report."""

    def __init__(self, metrics: Sequence[str] = ("val_loss",), baseline: str | None = None):
        self.metrics, self.baseline = list(metrics), baseline

    def on_multirun_end(self, config, **kwargs) -> None:
        root = Path(config.hydra.sweep.dir)
        for i, metric in enumerate(self.metrics):
            out = root if i == 0 else root / f"report_{metric}"
            try:
                report = self._build(root, metric)
                write_report(report, out)
            except ReportError as e:
                print(f"report ({metric}): {e}", file=sys.stderr)
                continue
            print(f"\n{metric}:\n{console_summary(report)}\nreport: {out / 'report.md'}", flush=True)

    def _build(self, root: Path, metric: str) -> Report:
        try:
            return build_report(root, metric, baseline=self.baseline)
        except ReportError as e:  # a sweep narrowed on the command line may leave the baseline out
            if self.baseline is None or not str(e).startswith("--baseline"):
                raise
            return build_report(root, metric)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zoo.report", description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path, help="a multirun directory (or any directory holding runs)")
    p.add_argument("--metric", default="val_loss", help="validation metric to compare (default: val_loss)")
    p.add_argument("--target", type=float, default=None,
                   help="metric value for the steps-to-target column (default: the worst variant's final mean)")
    p.add_argument("--baseline", default=None, help="compare every variant against this one, e.g. 'ffn=gelu' "
                   "(default: against the best variant)")
    p.add_argument("--out", type=Path, default=None, help="where to write the report (default: DIR)")
    args = p.parse_args(argv)
    try:
        report = build_report(args.dir, args.metric, args.target, args.baseline)
        written = write_report(report, args.out or args.dir)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    print(console_summary(report))
    print("\nwrote " + ", ".join(str(w) for w in written))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
