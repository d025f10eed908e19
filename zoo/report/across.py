"""Does a row transfer across applications? Each row's verdict against one baseline in several sweeps, one column
per application (a sweep directory read with one metric), and whether it is better in every column:

    python -m zoo.report --across DIR DIR:exact_match ... --baseline narang=vanilla    # writes across.md, .png

Each column is what the sweep's own report says (build_report, then the verdict of its "Effects against" table:
the same runs, variants, direction of the metric and Welch test), so the two never disagree. Rows are matched by
their label (`gelu` for narang=gelu); a row the study leaves out says why (hydra.callbacks.report.skipped).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from zoo.report.plots import plot_across
from zoo.report.runs import ReportError
from zoo.report.tables import Effect, Report, Row, Variant, find_baseline, markdown_table

DEFAULT_METRIC = "val_loss"
METRIC = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")  # what may follow DIR's last ':'


def parse_application(spec: str) -> tuple[Path, str]:
    """DIR[:METRIC] -> (DIR, METRIC); METRIC is val_loss when none is given (or when DIR itself holds the ':')."""
    head, sep, tail = spec.rpartition(":")
    if not sep or Path(spec).is_dir():
        return Path(spec), DEFAULT_METRIC
    if not head or not METRIC.fullmatch(tail):
        raise ReportError(f"--across: expected DIR[:METRIC] (e.g. DIR:exact_match), got '{spec}'")
    return Path(head), tail


def study_name(root: Path) -> str:
    """How a column names its sweep: the study of multirun/study-<name>/..., else the directory's name."""
    return next((p[len("study-"):] for p in reversed(root.parts) if p.startswith("study-")), root.name or str(root))


@dataclass
class Application:
    """One column: a sweep's report for one metric, and its baseline variant."""

    root: Path
    metric: str
    report: Report
    baseline: Variant
    label: str = ""
    rows: dict[str, Row] = field(default_factory=dict)  # by variant label

    @classmethod
    def of(cls, root: Path, metric: str, report: Report, baseline: str) -> Application:
        if report.ladder is not None:
            raise ReportError(f"--across: '{root}' is a sweep over sizes (a ladder): give one size per application")
        base = find_baseline([r.variant for r in report.rows], baseline)
        return cls(root, metric, report, base, f"{study_name(root)} {metric}",
                   {r.variant.label: r for r in report.rows})

    def cell(self, label: str) -> tuple[str, str]:
        """(verdict, cell text) of one row: 'better' and 'better -0.031' (its mean minus the baseline's);
        '-' where a group has fewer than two completed seeds; 'not run' with the study's reason; 'missing'."""
        row = self.rows.get(label)
        if row is None:
            why = self.report.skipped.get(label)
            return ("not run", f"not run: {why}") if why is not None else ("missing", "missing: no run")
        e = self.effect(label)
        return (e.verdict, f"{e.verdict} {e.diff:+.4g}") if e is not None else ("-", "-")

    def effect(self, label: str) -> Effect | None:
        """The row's effect against the baseline; None where it did not run or has no verdict."""
        row = self.rows.get(label)
        if row is None:
            return None
        return Effect.of(row.variant.finals(self.metric), self.baseline.finals(self.metric), self.report.higher)


def across(verdicts: list[str]) -> str:
    """transfers: better in every application; does not transfer: worse or within noise in one (whatever the
    others say); incomplete: some application gives no verdict and none gives one against it."""
    if all(v == "better" for v in verdicts):
        return "transfers"
    if any(v in ("worse", "within noise") for v in verdicts):
        return "does not transfer"
    return "incomplete"


def applications(built: list[tuple[Path, str, Report]], baseline: str) -> list[Application]:
    """Each built report as a column; a (DIR, METRIC) given twice is refused, and two columns that would read
    the same are labelled by DIR:METRIC instead."""
    seen = set()
    for root, metric, _ in built:
        if (root.resolve(), metric) in seen:
            raise ReportError(f"--across: '{root}:{metric}' is given twice")
        seen.add((root.resolve(), metric))
    apps = [Application.of(root, metric, report, baseline) for root, metric, report in built]
    for app in apps:
        if sum(a.label == app.label for a in apps) > 1:
            app.label = f"{app.root}:{app.metric}"
    return apps


TEXT = ("Each cell: the row's mean final metric minus {baseline}'s, over their completed seeds, and the verdict of "
        "that sweep's report (its \"Effects against\" table): better or worse beyond seed noise (Welch's two-sided "
        "t-test, p < 0.05) in the metric's direction, else within noise; '-': a group has fewer than two completed "
        "seeds; 'not run': the study leaves the row out, with its reason; 'missing': no run of the row there. "
        "Across applications: **transfers** where every cell is better; **does not transfer** where one is worse or "
        "within noise; **incomplete** where one has no verdict and none is worse or within noise.")


def row_labels(apps: list[Application]) -> list[str]:
    """Every row that ran in any application, in order of first appearance, the baselines left out."""
    skip = {a.baseline.label for a in apps}
    return list(dict.fromkeys(label for a in apps for label in a.rows if label not in skip))


def across_markdown(apps: list[Application], baseline: str, plot: str) -> str:
    """The table: one line per row that ran in any application (the baselines left out), one column each; `plot`
    names the figure beside it (plot_applications)."""
    body = []
    for label in row_labels(apps):
        cells = [a.cell(label) for a in apps]
        body.append([label, *(text for _, text in cells), across([v for v, _ in cells])])
    table = pd.DataFrame(body, columns=["variant", *(a.label for a in apps), "across applications"])
    columns = [f"- {a.label}: `{a.root}`, final `{a.metric}` ({'higher' if a.report.higher else 'lower'} is "
               f"better); {a.baseline.label}: {len(a.baseline.finals(a.metric))} completed seeds" for a in apps]
    return "\n".join([f"# Across applications: each row against {baseline}", "", markdown_table(table), "",
                      *columns, "", TEXT.format(baseline=baseline), "", f"![{PLOT_TEXT}]({plot})"]) + "\n"


PLOT_TEXT = "each row's effect in each application: difference of means and its 95% interval"


def plot_applications(apps: list[Application], baseline: str, path: Path) -> None:
    """across.png: the table's effects drawn one panel per application, one line per row."""
    labels = row_labels(apps)
    plot_across(labels, [(a.label, [a.effect(label) for label in labels]) for a in apps], baseline, path)
