"""The report's figures: curves per variant, final values with intervals and seeds, and a ladder's final values
against compute."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from zoo.io import atomic_write
from zoo.report.ladder import Ladder, compute
from zoo.report.stats import confidence_interval
from zoo.report.tables import Effect, Row, fmt

MIN_EVALS = 3  # fewer evaluations than this make no curve: plot the training loss instead


def _figure(w: float, h: float) -> Any:  # a matplotlib Figure
    # lazy: matplotlib (1.0 s): zoo report --help and the tables answer without it
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png"), mode="wb")


LEGEND_ROW_IN = 0.19  # the height of one legend entry at fontsize 8, inches
LEGEND_CHAR_IN = 0.062  # the width of one character of a label at fontsize 8, inches


def _legend_columns(labels: list[str], height: float) -> tuple[int, float]:
    """(0, 0.0) where the legend fits inside the axes; else its columns beside the axes, where it hides no curve,
    as many as keep every entry on a figure this high (a ladder of 28 variants, its curves' 84), and their width in
    inches, which the figure adds to its own."""
    longest = max((len(s) for s in labels), default=0)
    if len(labels) <= 4 and longest <= 24:
        return 0, 0.0
    columns = math.ceil(len(labels) / max(1, int((height - 0.5) / LEGEND_ROW_IN)))
    return columns, columns * (0.6 + LEGEND_CHAR_IN * longest)


def _legend(ax: Any, columns: int) -> None:
    ax.legend(fontsize=8, **({"loc": "upper left", "bbox_to_anchor": (1.01, 1), "ncol": columns} if columns else {}))


def _band(ax: Any, histories: list[list[tuple[float, float]]], color: str, label: str) -> None:
    """Mean over runs on the union of their steps, and a min-max band when there are several."""
    grid = np.array(sorted({s for h in histories for s, _ in h}))
    ys = np.array([np.interp(grid, [s for s, _ in h], [v for _, v in h], left=np.nan, right=np.nan)
                   for h in histories])
    counts = np.sum(~np.isnan(ys), axis=0)
    mean = np.where(np.isnan(ys), 0.0, ys).sum(axis=0) / np.maximum(counts, 1)
    lo = np.where(np.isnan(ys), np.inf, ys).min(axis=0)
    hi = np.where(np.isnan(ys), -np.inf, ys).max(axis=0)
    keep = counts > 0
    ax.plot(grid[keep], mean[keep], "-o", color=color, ms=3, label=f"{label} (n={len(histories)})")
    if len(histories) > 1:
        ax.fill_between(grid[keep], lo[keep], hi[keep], color=color, alpha=0.2, lw=0)


def plot_curves(rows: list[Row], metric: str, target: float, path: Path) -> str:
    """Validation curves per variant; the training loss from metrics.csv when the runs were evaluated fewer
    than MIN_EVALS times (a short sweep's validation curve is one dot). Returns the figure's caption."""
    evals = max((len(r.history(metric)) for row in rows for r in row.variant.ok_runs(metric)), default=0)
    train = evals < MIN_EVALS and any(r.train_history for row in rows for r in row.variant.ok_runs(metric))
    # the labels as _band writes them, and the target's line
    columns, width = _legend_columns([f"{r.variant.label} (n=10)" for r in rows] + ["target"], 4.5)
    fig = _figure(7.5 + width, 4.5)
    ax = fig.add_subplot()
    for i, row in enumerate(rows):
        runs = row.variant.ok_runs(metric)
        histories = [h for r in runs if (h := (r.train_history if train else r.history(metric)))]
        if histories:
            _band(ax, histories, f"C{i % 10}", row.variant.label)
    if train:
        ax.set_ylabel("train_loss")
        ax.set_title(f"training loss (metrics.csv): {evals} evaluation(s) of {metric} make no curve", fontsize=10)
        caption = (f"Training loss per variant (fewer than {MIN_EVALS} evaluations of {metric}): mean over seeds, "
                   "band = min-max.")
    else:
        ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {fmt(target)}")
        ax.set_ylabel(metric)
        ax.set_title(f"validation {metric}: mean over seeds, band = min-max over seeds")
        caption = f"Validation {metric} per variant: mean over seeds, band = min-max."
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    _legend(ax, columns)
    _save(fig, path)
    return caption


def plot_final(rows: list[Row], metric: str, path: Path) -> str:
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
    _save(fig, path)
    return f"Final {metric}: mean per variant, error bars = 95% CI (Student t), dots = seeds."


def arm_style(i: int) -> tuple[str, str, Any]:
    """The i-th variant's color, marker and fit's dash: matplotlib's ten colors, then the same ten with another
    marker and dash, so that no two of up to 40 variants look alike (a study's ladder climbs more than ten)."""
    return f"C{i % 10}", "os^D"[i // 10 % 4], ("--", ":", "-.", (0, (6, 2, 1, 2, 1, 2)))[i // 10 % 4]


def plot_ladder(ladder: Ladder, path: Path) -> str:
    """Final metric against training compute, log-log: per variant the mean at each size with its 95% interval,
    the seeds as dots, and the fitted power law."""
    from matplotlib.ticker import FormatStrFormatter  # lazy: matplotlib (1.0 s), as _figure

    columns, width = _legend_columns(ladder.arms, 4.8)
    fig = _figure(7.5 + width, 4.8)
    ax = fig.add_subplot()
    for i, arm in enumerate(ladder.arms):
        (color, marker, dash), xs, ys, errs = arm_style(i), [], [], []
        for rung in ladder.rungs:
            runs = ladder.cells.get((arm, rung), [])
            pts = [(c, v) for r in runs if (c := compute(r)) and (v := r.final(ladder.metric)) is not None]
            if not pts:
                continue
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], color=color, marker=marker, s=10, alpha=0.5)
            ci = confidence_interval([p[1] for p in pts])
            xs.append(float(np.mean([p[0] for p in pts])))
            ys.append(float(np.mean([p[1] for p in pts])))
            errs.append((ci[1] - ci[0]) / 2 if ci else 0.0)
        if not xs:
            continue
        ax.errorbar(xs, ys, yerr=errs, color=color, fmt=marker, capsize=5, label=arm)
        fit = ladder.fits.get(arm)
        if fit is not None and len(xs) > 1:
            grid = np.geomspace(min(xs), max(xs), 50)
            ax.plot(grid, fit(grid), color=color, lw=1, ls=dash)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = FormatStrFormatter("%.2f")  # losses read as numbers, not as powers of ten
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set_xlabel("training compute (FLOPs)")
    ax.set_ylabel(f"final {ladder.metric}")
    ax.set_title(f"final {ladder.metric} against compute: mean and 95% CI per size, lines: fitted power law",
                 fontsize=9)
    ax.grid(alpha=0.3, which="both")
    _legend(ax, columns)
    _save(fig, path)
    return (f"Final {ladder.metric} against training compute (log-log) per variant: mean over seeds at each size "
            "with its 95% CI (Student t), seeds as dots, the fitted power law as a line.")


EFFECT_COLORS = {"better": "C2", "worse": "C3"}  # within noise: grey
EFFECT_TITLE = ("difference of means, 95% interval (Welch)\n"
                "green: better beyond seed noise, red: worse, grey: within noise")


def _effects_panel(ax: Any, effects: list[Effect | None], xlabel: str) -> None:
    """One line per row, the first on top; a row with no effect (None) leaves its line empty."""
    for y, e in enumerate(reversed(effects)):
        if e is not None:
            color = EFFECT_COLORS.get(e.verdict, "0.45")
            ax.plot([e.lo, e.hi], [y, y], color=color, lw=2)
            ax.plot([e.diff], [y], "o", color=color, ms=4)
    ax.axvline(0.0, color="black", lw=1)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.grid(axis="x", alpha=0.3)


def plot_effects(rows: list[Row], ref: Row, metric: str, higher: bool, path: Path) -> str:
    """One line per variant: its difference from ref in mean final metric with the difference's 95% interval
    (Welch), a vertical line at no effect; green where it is better beyond noise, red where worse (study=narang's
    many rows read at a glance)."""
    shown = [(r, e) for r in rows if r is not ref and (e := Effect.of(r.variant.finals(metric),
                                                                      ref.variant.finals(metric), higher))]
    fig = _figure(7.5, max(2.5, 0.28 * len(shown) + 1.4))
    ax = fig.add_subplot()
    _effects_panel(ax, [e for _, e in shown], f"Δ final {metric} against {ref.variant.label}")
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels([r.variant.label for r, _ in reversed(shown)], fontsize=8)
    ax.set_title(f"effect on final {metric}: {EFFECT_TITLE}", fontsize=9)
    _save(fig, path)
    return (f"Each variant's effect on the final {metric} against {ref.variant.label}: the difference of the means "
            "and its 95% interval (Welch); green better and red worse beyond seed noise (p < 0.05), grey within it.")


def plot_across(labels: list[str], columns: list[tuple[str, list[Effect | None]]], baseline: str, path: Path) -> None:
    """The rows' effects side by side, one panel per application (zoo report --across): `columns` holds each
    application's name and its effect for every label, in order (None: not run there, or no verdict)."""
    fig = _figure(2.2 + 2.6 * len(columns), max(2.5, 0.26 * len(labels) + 1.6))
    axes = fig.subplots(1, len(columns), sharey=True, squeeze=False)[0]
    for ax, (name, effects) in zip(axes, columns, strict=True):
        _effects_panel(ax, effects, f"Δ {name}")
    axes[0].set_yticks(range(len(labels)))
    axes[0].set_yticklabels(list(reversed(labels)), fontsize=8)
    axes[0].set_ylim(-0.7, len(labels) - 0.3)
    fig.suptitle(f"each row against {baseline}: {EFFECT_TITLE}", fontsize=9)
    _save(fig, path)
