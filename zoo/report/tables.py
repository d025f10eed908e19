"""Variants, their table rows and comparison sentences, and report.md / report.html (pandas tables)."""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pandas as pd

from zoo.io import read_yaml
from zoo.report.ladder import Ladder
from zoo.report.runs import (
    FAILED,
    JOB_STATES,
    OPTIM,
    Plan,
    ReportError,
    Run,
    instruction_sets,
    variant_label,
)
from zoo.report.stats import ALPHA, confidence_interval, mean_std, steps_to_target, welch_test
from zoo.sweep import parse_overrides

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
        return [v for r in self.ok_runs(metric) if (v := r.final(metric)) is not None]

    def bests(self, metric: str, higher: bool) -> list[float]:
        return [b for r in self.ok_runs(metric) if (b := r.best(metric, higher)) is not None]

    def count(self, *statuses: str) -> int:
        return sum(r.status in statuses for r in self.runs)


def varying_factors(runs: list[Run]) -> list[str]:
    """Override keys whose value differs between runs (a key missing from a run counts as a value), seed excepted;
    and `optim` where the runs' summaries record different optimizers though no override says so."""
    keys = list(dict.fromkeys([k for r in runs for k in r.overrides] + [OPTIM]))
    return [k for k in keys if k != "seed" and len({r.value(k) for r in runs}) > 1]


def group_variants(runs: list[Run]) -> tuple[list[str], list[Variant]]:
    factors = varying_factors(runs)
    variants: dict[tuple[tuple[str, str], ...], Variant] = {}
    for r in runs:
        key = tuple((f, r.value(f)) for f in factors)
        variants.setdefault(key, Variant(key, [])).runs.append(r)
    for v in variants.values():
        v.label = variant_label(v.key)
    return factors, list(variants.values())


def parse_baseline(spec: str) -> dict[str, str]:
    """--baseline's overrides: 'ffn=gelu' or 'ffn=gelu, seed=0'."""
    want = parse_overrides(re.split(r"[\s,]+", spec.strip()))
    if not want:
        raise ReportError(f"--baseline: expected overrides like 'ffn=gelu', got '{spec}'")
    return want


def find_baseline(variants: list[Variant], spec: str) -> Variant:
    want = parse_baseline(spec)
    matches = [v for v in variants if all(dict(v.key).get(k) == val for k, val in want.items())]
    if len(matches) != 1:
        labels = "; ".join(v.label for v in variants)
        what = "no variant" if not matches else f"{len(matches)} variants"
        raise ReportError(f"--baseline: {what} match '{spec}'; variants: {labels}")
    return matches[0]


# ----------------------------------------------------------------------------------------------
# Rows and sentences
# ----------------------------------------------------------------------------------------------

def fmt(x: float | None, digits: int = 4) -> str:
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


T = TypeVar("T")


def _first(values: Iterable[T]) -> T | None:
    return next((v for v in values if v is not None), None)


@dataclass
class Row:
    variant: Variant
    params: float | None
    active: float | None  # parameters one token uses, where sparse parts (experts) make it less than params
    flops: float | None
    tok_s: float | None
    busy: int  # of the runs behind tok_s, how many ended on a machine busier than its core count
    final: tuple[float, float, int]
    final_ci: tuple[float, float] | None
    best: tuple[float, float, int]
    best_ci: tuple[float, float] | None
    steps: list[float | None]  # steps to target, per ok run
    seconds: list[float | None]  # seconds into the run to target (its wall clock, evaluations included), per ok run


def _params_from_config(run: Run) -> tuple[float | None, float | None]:
    """Parameters and train FLOPs per token of a run without a summary, from its resolved config.yaml."""
    path = run.path / "config.yaml"
    if not path.is_file():
        return None, None
    try:
        from zoo.build import count_params, flops_per_token  # lazy: torch (2.7 s), for old runs only

        cfg = read_yaml(path)
        model = cfg["model"]
        context = (cfg.get("data") or {}).get("context")
        return count_params(model)["total"], flops_per_token(model, context)["train"]
    except Exception:  # an unresolved or partial config: leave the cells empty
        return None, None


def make_rows(variants: list[Variant], metric: str, target: float, higher: bool) -> list[Row]:
    rows = []
    for v in variants:
        ok = v.ok_runs(metric)
        params = _first(r.get("params", "total") for r in v.runs)
        active = _first(r.get("params", "active") for r in v.runs)
        flops = _first(r.get("flops_per_token", "train") for r in v.runs)
        if params is None:
            params, flops = _first(pf for r in v.runs if (pf := _params_from_config(r))[0] is not None) or (None, None)
        timed = [r for r in ok if r.get("tokens_per_second") is not None]
        speeds = [r.get("tokens_per_second") for r in timed]
        finals, bests = v.finals(metric), v.bests(metric, higher)
        rows.append(Row(v, params, active if active != params else None, flops,
                        sum(speeds) / len(speeds) if speeds else None, sum(r.busy for r in timed),
                        mean_std(finals), confidence_interval(finals), mean_std(bests), confidence_interval(bests),
                        [steps_to_target(r.history(metric), target, higher) for r in ok],
                        [steps_to_target(r.history(metric, "wall_time_s"), target, higher) for r in ok]))
    return rows


def _ms(stat: tuple[float, float, int]) -> str:
    m, s, n = stat
    if n == 0:
        return "-"
    return f"{fmt(m)} ± {fmt(s)}" if n > 1 else f"{fmt(m)} (1 seed)"


def _ci(ci: tuple[float, float] | None, n: int) -> str:
    if ci is None:
        return "n/a (1 seed)" if n == 1 else "-"
    return f"[{fmt(ci[0])}, {fmt(ci[1])}]"


def _reached(values: list[float | None]) -> str:
    hit = [s for s in values if s is not None]
    if not hit:
        return "-"
    text = f"{sum(hit) / len(hit):.1f}"
    return text if len(hit) == len(values) else f"{text} ({len(hit)}/{len(values)} seeds)"


def table(rows: list[Row], factors: list[str], metric: str, target: float, higher: bool) -> pd.DataFrame:
    op = "≥" if higher else "≤"
    running = any(r.variant.count("running") for r in rows)  # a column only while a sweep is still going
    head = (factors or ["variant"]) + ["params", "FLOPs/token (train)", "tok/s", f"final {metric} (mean ± std)",
                                       "final 95% CI", f"best {metric} (mean ± std)", "best 95% CI", "seeds",
                                       f"steps to {metric} {op} {fmt(target)}", "seconds to target", "diverged",
                                       "failed"]
    head += ["running"] if running else []
    body = []
    for r in rows:
        n = r.final[2]
        cells = [val for _, val in r.variant.key] or [r.variant.label]
        speed = _human(r.tok_s) + (" (busy)" if r.busy else "")
        params = _human(r.params) + (f" ({_human(r.active)} active)" if r.active is not None else "")
        cells += [params, _human(r.flops), speed, _ms(r.final), _ci(r.final_ci, n),
                  _ms(r.best), _ci(r.best_ci, r.best[2]), str(n), _reached(r.steps), _reached(r.seconds),
                  str(r.variant.count("diverged")), str(r.variant.count(*FAILED))]
        cells += [str(r.variant.count("running"))] if running else []
        body.append(cells)
    return pd.DataFrame(body, columns=head)


def reference(rows: list[Row], baseline: Variant | None, higher: bool) -> Row | None:
    """The row every other is compared with: the baseline's, else the best by mean final value (None: there is
    no baseline row with a completed run, or fewer than two variants have one)."""
    if baseline is not None:
        ref = next((r for r in rows if r.variant is baseline), None)
        return ref if ref is not None and ref.final[2] > 0 else None
    scored = [r for r in rows if r.final[2] > 0]
    return (max if higher else min)(scored, key=lambda r: r.final[0]) if len(scored) >= 2 else None


def comparisons(rows: list[Row], metric: str, baseline: Variant | None, ref: Row | None,
                higher: bool) -> tuple[str, list[str]]:
    """(what the sentences compare against, one sentence per other variant); ref: reference(rows, baseline, ...)."""
    if baseline is not None:
        if ref is None:
            return f"baseline {baseline.label}", [f"The baseline {baseline.label} has no completed run with "
                                                   f"{metric}; nothing to compare against."]
        intro = f"each variant against the baseline {ref.variant.label}"
    else:
        if ref is None:
            return "", []
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
        size = f"{fmt(abs(diff))} {'higher' if diff > 0 else 'lower'} {metric} ({'better' if better else 'worse'})"
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


def _effect(a: Sequence[float | None], b: Sequence[float | None]) -> str:
    """The difference of a's mean from b's, its 95% interval (Welch) and p; what is missing where a seed of either
    never reached the value (a time to a target) or a group has one seed."""
    missing = [f"{sum(x is not None for x in g)}/{len(g)}" for g in (a, b) if None in g]
    if missing:
        return f"- (reached by {' and '.join(missing)} seeds)"
    a_, b_ = [x for x in a if x is not None], [x for x in b if x is not None]  # all of them, as said above
    w = welch_test(a_, b_)
    if w is None:
        return f"{sum(a_) / len(a_) - sum(b_) / len(b_):+.4g} (1 seed: no interval)" if a_ and b_ else "-"
    lo, hi = w.interval()
    return f"{w.diff:+.4g} [{lo:+.4g}, {hi:+.4g}], p={w.p:.2g}"


def verdict(a: list[float], b: list[float], higher: bool) -> str:
    """better / worse: a's mean differs from b's beyond seed noise (Welch, p < 0.05), in that direction; else within
    noise, or '-' where a group has one seed."""
    w = welch_test(a, b)
    if w is None:
        return "-"
    if w.p >= ALPHA:
        return "within noise"
    return "better" if (w.diff > 0) == higher else "worse"


@dataclass(frozen=True)
class Effect:
    """A row's mean final metric minus the baseline's, the difference's 95% interval (Welch) and the verdict."""

    diff: float
    lo: float
    hi: float
    verdict: str  # better / worse / within noise, in the metric's direction

    @classmethod
    def of(cls, a: list[float], b: list[float], higher: bool) -> Effect | None:
        """None where a group has fewer than two values (no noise to test against)."""
        w = welch_test(a, b)
        return None if w is None else cls(w.diff, *w.interval(), verdict(a, b, higher))


def _size(x: float | None, ref: float | None, what: str) -> str:
    """A count beside the reference's: '1.12M (+41% params)' where it differs by more than 1%, else the count."""
    if x is None or ref is None or not ref or abs(x - ref) <= 0.01 * abs(ref):
        return _human(x)
    return f"{_human(x)} ({(x - ref) / ref:+.0%} {what})"


def effects_table(rows: list[Row], ref: Row, metric: str, higher: bool = False) -> pd.DataFrame:
    """Each variant's effect against ref: the difference of the means of its final value, of its steps to the
    target and of its seconds to it, each with its 95% interval and Welch's p; the verdict on the final value; and
    the variant's parameters and train FLOPs per token, marked where they differ from ref's (an effect bought with
    size, as Narang et al.'s Table 1 reports beside each row)."""
    body = [[r.variant.label, _effect(r.variant.finals(metric), ref.variant.finals(metric)),
             _effect(r.steps, ref.steps), _effect(r.seconds, ref.seconds),
             verdict(r.variant.finals(metric), ref.variant.finals(metric), higher),
             _size(r.params, ref.params, "params") + (f", {_human(r.active)} active" if r.active is not None else ""),
             _size(r.flops, ref.flops, "FLOPs")]
            for r in rows if r is not ref and r.final[2] > 0]
    return pd.DataFrame(body, columns=["variant", f"Δ final {metric}", "Δ steps to target", "Δ seconds to target",
                                       "verdict", "params", "FLOPs/token (train)"])


def jobs_table(plan: Plan, root: Path) -> pd.DataFrame:
    """One row per job: its directory, the overrides that tell it apart, its state and why."""
    keys = list(dict.fromkeys(k for j in plan.jobs for k in parse_overrides(j.overrides)))
    values = [parse_overrides(j.overrides) for j in plan.jobs]
    varying = [k for k in keys if len({v.get(k) for v in values}) > 1] or keys
    body = []
    for job, over in zip(plan.jobs, values, strict=True):
        where = "-" if job.run is None else (str(job.run.path.relative_to(root)) if job.run.path != root else ".")
        body.append([where, " ".join(f"{k}={over[k]}" for k in varying if k in over), job.state, job.detail])
    return pd.DataFrame(body, columns=["job", "overrides", "status", "detail"])


# ----------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------

METHOD = ("Each cell is over the seeds of a variant that completed: mean ± sample standard deviation (n-1); "
          "95% CI = mean ± t(0.975, n-1)·std/√n (Student t); with one seed there is no interval. "
          "Comparisons use Welch's two-sided t-test on the final {metric} (unequal variances, Welch–Satterthwaite "
          "degrees of freedom, p from the Student t distribution): a difference is larger than seed noise when "
          "p < 0.05. With one seed in a group the noise cannot be estimated.")
FITS = ("Final {metric} of every seed against its training compute C (train FLOPs per token x tokens seen): "
        "E + A·C^-α (E: the irreducible part) where four or more sizes pin every parameter down, else A·C^-α, "
        "a straight line in log-log by least squares. Intervals: 95%, Student t.")
VERDICT_TEXT = ("Each variant's gap to {baseline} (mean final {metric} of the variant minus the baseline's) at the "
                "smallest size ({small}) and the largest ({large}), each tested with Welch's t-test, and the change of "
                "the gap between them, tested with a t-test over the four groups of seeds (Welch-Satterthwaite). "
                "flips: beyond seed noise at both ends, with opposite signs; grows / shrinks: the change is beyond "
                "noise; holds: the same sign beyond noise at both ends and a change within noise; else "
                "inconclusive. Beyond noise: p < 0.05.")
EFFECTS = ("Each variant's mean minus {ref}'s: of the final {metric}, of the steps to the target and of the seconds to "
           "it (negative: lower, or sooner), with the difference's 95% interval (Student t, Welch-Satterthwaite "
           "degrees of freedom) and Welch's p. A time is compared only where every seed of both reached the target. "
           "verdict: better or worse than {ref} in final {metric} beyond seed noise (p < 0.05), else within noise. "
           "params and FLOPs/token: the variant's, with the change from {ref}'s where it exceeds 1%.")
SKIPPED = ("The study's variants that this sweep does not run, each with the study's reason "
           "(hydra.callbacks.report.skipped in its config).")
MIXED_CPUS = ("Mixed CPU instruction sets: {counts}. In float32 a run repeats to every digit on the same instruction "
              "set only; across these, results differ within seed noise (docs/reliability.md, \"Reproducibility "
              "across machines\"), so a difference between variants smaller than that noise may be the machines'.")
BUSY = ("tok/s marked (busy): at least one of the runs averaged ended while the machine's 1-minute load average "
        "exceeded its core count, so its speed was shared with other work.")


def markdown_table(df: pd.DataFrame) -> str:
    cells = df.map(lambda c: str(c).replace("|", "\\|"))
    return str(cells.to_markdown(index=False, disable_numparse=True))  # numparse would reformat "1.1000" as 1.1


@dataclass
class Report:
    root: Path
    metric: str
    higher: bool
    target: float
    target_note: str
    factors: list[str]
    rows: list[Row]
    table: pd.DataFrame
    intro: str
    sentences: list[str]
    n_runs: int
    plan: Plan
    plots: list[tuple[str, str]] = field(default_factory=list)  # (file name, caption)
    ladder: Ladder | None = None  # a sweep over sizes (zoo.report.ladder)
    ref: Row | None = None  # the row the effects are measured against (reference); None: no effects table
    skipped: dict[str, str] = field(default_factory=dict)  # variants the study does not run here -> why

    def sections(self) -> list[tuple[str, str, pd.DataFrame]]:
        """(heading, what it shows, table) for the effects against the reference, and a ladder's ranking, fits
        and verdicts."""
        out = []
        if self.ref is not None and len(effects := effects_table(self.rows, self.ref, self.metric, self.higher)):
            label = self.ref.variant.label
            out.append((f"Effects against {label}", EFFECTS.format(metric=self.metric, ref=label), effects))
        if self.skipped:
            out.append(("Not run here", SKIPPED, pd.DataFrame(list(self.skipped.items()), columns=["variant", "why"])))
        lad = self.ladder
        if lad is None:
            return out
        return out + [("Ranking at each size", f"Mean final {self.metric} over seeds, its 95% interval (Student t) and "
                 "its rank at that size; ranks whose intervals overlap are not told apart by these seeds.",
                 lad.ranking_table()),
                ("Fits against compute", FITS.format(metric=self.metric), lad.fits_table()),
                ("Does it transfer?", VERDICT_TEXT.format(metric=self.metric, baseline=lad.baseline,
                                                         small=lad.rungs[0], large=lad.rungs[-1]),
                 lad.verdicts_table())]

    @property
    def busy(self) -> bool:
        return any(r.busy for r in self.rows)

    def mixed_cpus(self) -> str | None:
        """The line saying that the runs trained on more than one CPU instruction set, or None."""
        counts = instruction_sets([r for row in self.rows for r in row.variant.runs])
        if len(counts) < 2:
            return None
        return MIXED_CPUS.format(counts=", ".join(f"{k} ({n} run{'s' * (n > 1)})" for k, n in sorted(counts.items())))

    def jobs_line(self) -> str:
        counts = ", ".join(f"{self.plan.count(s)} {s}" for s in JOB_STATES)
        return f"{len(self.plan.jobs)} jobs ({self.plan.source}): {counts}."

    def markdown(self) -> str:
        op = "≥" if self.higher else "≤"
        lines = [f"# Sweep report: {self.root}", "",
                 f"{self.n_runs} runs in {len(self.rows)} variants; metric `{self.metric}` "
                 f"({'higher' if self.higher else 'lower'} is better). "
                 + (f"Varying: {', '.join(f'`{f}`' for f in self.factors)}." if self.factors
                    else "No override varies except the seed."), "", markdown_table(self.table)]
        lines += ["", f"Target: {self.metric} {op} {fmt(self.target)} "
                  f"({self.target_note}); steps are the mean over seeds of the first step reaching it, linearly "
                  "interpolated between evaluations ('-': never reached; (k/n): reached by k of n seeds), and "
                  "seconds the same on each run's wall clock (its evaluations' time included). "
                  "Diverged and failed runs (failed, interrupted, killed, or an unreadable summary.json) are "
                  "counted, not averaged; running ones are neither."]
        lines += ["", BUSY] if self.busy else []
        lines += ["", mixed] if (mixed := self.mixed_cpus()) else []
        for head, text, df in self.sections():
            lines += ["", f"## {head}", "", text, "", markdown_table(df)]
        lines += ["", "## Jobs", "", self.jobs_line(), "", markdown_table(jobs_table(self.plan, self.root))]
        lines += ["", "## Method", "", METHOD.format(metric=self.metric), "", "## Comparisons", ""]
        if self.sentences:
            lines += [f"Comparing {self.intro}:", ""] + [f"- {s}" for s in self.sentences]
        else:
            lines += ["Only one variant with completed runs: nothing to compare."]
        if self.plots:
            lines += ["", "## Plots", ""] + [f"![{cap}]({name})\n\n{cap}\n" for name, cap in self.plots]
        return "\n".join(lines).rstrip() + "\n"

    def html(self, out_dir: Path) -> str:
        e = html.escape
        op = "≥" if self.higher else "≤"
        parts = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>", f"<title>Sweep report: {e(str(self.root))}"
                 "</title>", "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
                 "table{border-collapse:collapse;font-size:0.9em}td,th{border:1px solid #ccc;padding:4px 8px;"
                 "text-align:right}th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}"
                 "table.jobs td{text-align:left}img{max-width:100%}</style></head><body>",
                 f"<h1>Sweep report</h1><p><code>{e(str(self.root))}</code></p>",
                 f"<p>{self.n_runs} runs in {len(self.rows)} variants; metric <code>{e(self.metric)}</code> "
                 f"({'higher' if self.higher else 'lower'} is better).</p>",
                 self.table.to_html(index=False, border=0, classes="variants"),
                 f"<p>Target: {e(self.metric)} {op} {e(fmt(self.target))} ({e(self.target_note)}); steps "
                 "interpolated between evaluations.</p>"]
        parts += [f"<p>{e(BUSY)}</p>"] if self.busy else []
        parts += [f"<p>{e(mixed)}</p>"] if (mixed := self.mixed_cpus()) else []
        for head, text, df in self.sections():
            parts += [f"<h2>{e(head)}</h2>", f"<p>{e(text)}</p>", df.to_html(index=False, border=0, classes="ladder")]
        parts += ["<h2>Jobs</h2>", f"<p>{e(self.jobs_line())}</p>",
                  jobs_table(self.plan, self.root).to_html(index=False, border=0, classes="jobs"),
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
