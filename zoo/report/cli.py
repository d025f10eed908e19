"""Building and writing a report, and the command line: python -m zoo.report DIR, or --across DIR[:METRIC] ..."""

from __future__ import annotations

import math
import sys
from argparse import Namespace
from pathlib import Path

from zoo.commands import EXIT_ERROR, EXIT_OK, OneLineParser
from zoo.io import WriteError, atomic_write_text
from zoo.report.across import (
    DEFAULT_METRIC,
    Application,
    across_markdown,
    applications,
    parse_application,
    plot_applications,
)
from zoo.report.ladder import build_ladder
from zoo.report.plots import plot_curves, plot_effects, plot_final, plot_ladder
from zoo.report.runs import ReportError, Run, load_runs, match_jobs, metric_direction
from zoo.report.stats import mean_std
from zoo.report.tables import (
    Report,
    comparisons,
    find_baseline,
    group_variants,
    make_rows,
    parse_baseline,
    reference,
    table,
)
from zoo.sweep import skipped_variants


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
        if metric in have:  # recorded, but as nan or inf by every run: say that, not that it is missing
            raise ReportError(f"--metric: every run's final '{metric}' is NaN or infinite ({_non_finite(runs, metric)}"
                              "): no run to compare; see each run's status in its summary.json")
        raise ReportError(f"--metric: no run has '{metric}'; available: {', '.join(have) or 'none'}")
    higher = metric_direction(runs, metric)
    ladder = build_ladder(runs, factors, metric, higher, parse_baseline(baseline) if baseline else None)
    base = find_baseline(variants, baseline) if baseline and ladder is None else None
    means = [m for v in variants if math.isfinite(m := mean_std(v.finals(metric))[0])]
    if target is not None:
        note = "given"
    elif means:
        target, note = (min if higher else max)(means), f"default: the worst variant's mean final {metric}"
    else:
        target, note = math.nan, "no completed run"
    rows = make_rows(variants, metric, target, higher)
    ref = None if ladder is not None else reference(rows, base, higher)
    if ladder is None:
        intro, sentences = comparisons(rows, metric, base, ref, higher)
    else:  # a ladder compares each variant with the baseline across sizes: its verdicts
        intro, sentences = f"each variant against {ladder.baseline} across sizes", ladder.sentences()
    return Report(root, metric, higher, target, note, factors, rows, table(rows, factors, metric, target, higher),
                  intro, sentences, len(runs), match_jobs(root, runs), ladder=ladder, ref=ref,
                  skipped=skipped_variants(root))


def _non_finite(runs: list[Run], metric: str) -> str:
    """How the runs' final values of `metric` read, counted: '3 nan, 1 inf'."""
    from collections import Counter

    values = [((r.summary or {}).get("final") or {}).get(metric) for r in runs]
    counts = Counter(str(v).lower() for v in values if isinstance(v, float) and not math.isfinite(v))
    return ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))


def write_report(report: Report, out_dir: Path) -> list[Path]:
    """Write the report's files into out_dir, each atomically (a link there is replaced, never written through);
    WriteError when one cannot be written."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WriteError(out_dir, e) from e
    written = []
    if any(r.final[2] for r in report.rows):
        report.plots = [("curves.png", plot_curves(report.rows, report.metric, report.target, out_dir / "curves.png")),
                        ("final.png", plot_final(report.rows, report.metric, out_dir / "final.png"))]
        written += [out_dir / "curves.png", out_dir / "final.png"]
        if report.ref is not None and sum(r.final[2] >= 2 for r in report.rows if r is not report.ref) and \
                report.ref.final[2] >= 2:  # the effects with their intervals: one line per variant
            report.plots.append(("effects.png", plot_effects(report.rows, report.ref, report.metric, report.higher,
                                                             out_dir / "effects.png")))
            written.append(out_dir / "effects.png")
        if report.ladder is not None:
            report.plots.insert(0, ("ladder.png", plot_ladder(report.ladder, out_dir / "ladder.png")))
            written.insert(0, out_dir / "ladder.png")
    atomic_write_text(out_dir / "report.md", report.markdown())
    atomic_write_text(out_dir / "report.html", report.html(out_dir))
    return [out_dir / "report.md", out_dir / "report.html"] + written


def console_summary(report: Report) -> str:
    """The table, the jobs' states and the comparison sentences, as printed on the terminal."""
    md = report.markdown()
    start = md.index("| ")
    text = md[start:md.index("\n\n", start)] + "\n\n" + report.jobs_line()
    return text + ("\n\n" + "\n".join(report.sentences) if report.sentences else "")


def build_across(specs: list[str], baseline: str) -> list[Application]:
    """The applications of `--across DIR[:METRIC] ...` (zoo.report.across), its columns: every report is built
    first, so a bad directory, metric or baseline is refused before anything is written."""
    built = []
    for spec in specs:
        root, metric = parse_application(spec)
        built.append((root, metric, build_report(root, metric, None, baseline)))
    return applications(built, baseline)


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser("report", description="Compare the runs of a sweep: one table row per variant. With --across, "
                      "compare several sweeps (one per application): each row's verdict against --baseline in each.")
    p.add_argument("dir", type=Path, nargs="?", help="a multirun directory (or any directory holding runs)")
    p.add_argument("--metric", default=None, help="validation metric to compare (default: val_loss)")
    p.add_argument("--target", type=float, default=None,
                   help="metric value for the steps-to-target column (default: the worst variant's final mean)")
    p.add_argument("--baseline", default=None, help="compare every variant against this one, e.g. 'ffn=gelu' "
                   "(default: against the best variant)")
    p.add_argument("--across", nargs="+", metavar="DIR[:METRIC]", default=None,
                   help="several sweeps instead of DIR, each with its metric (default: val_loss), e.g. "
                   "multirun/study-narang_seq2seq/budget-None:exact_match: one line per variant with its verdict "
                   "against --baseline in each, and whether it transfers (better in every one); writes --out")
    p.add_argument("--out", type=Path, default=None,
                   help="where to write the report (default: DIR); with --across, the file (default: across.md), "
                   "its figure beside it as .png")
    args = p.parse_args(argv)
    if args.across is not None:
        return _main_across(p, args.across, args)
    if args.dir is None:
        p.error("the following arguments are required: dir (or several: --across DIR[:METRIC] ...)")
    try:
        report = build_report(args.dir, args.metric or DEFAULT_METRIC, args.target, args.baseline)
        written = write_report(report, args.out or args.dir)
    except (ReportError, WriteError) as e:  # WriteError: a full disk, a read-only directory, a directory in the way
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    print(console_summary(report))
    print("\nwrote " + ", ".join(str(w) for w in written))
    return EXIT_OK


def _main_across(p: OneLineParser, specs: list[str], args: Namespace) -> int:
    for given, what in ((args.dir, f"DIR '{args.dir}'"), (args.metric, "--metric"), (args.target, "--target")):
        if given is not None:
            p.error(f"{what} and --across together: --across takes its directories, each with its metric as "
                    "DIR[:METRIC], and compares final values only")
    if len(specs) < 2:
        p.error("--across: give two or more applications, DIR[:METRIC] each")
    if args.baseline is None:
        p.error("--across needs --baseline, the variant every application compares against (e.g. narang=vanilla)")
    out = args.out or Path("across.md")
    out = out / "across.md" if out.is_dir() else out
    try:
        apps = build_across(specs, args.baseline)
        plot = out.with_suffix(".png")
        text = across_markdown(apps, args.baseline, plot.name)
        plot_applications(apps, args.baseline, plot)  # first: across.md never names a figure that is not there
        atomic_write_text(out, text)
    except (ReportError, WriteError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    print(text + f"\nwrote {out}, {plot}")
    return EXIT_OK
