"""The Hydra callback that ends a study's multirun with its report."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.experimental.callback import Callback

from zoo.io import WriteError
from zoo.report.cli import build_report, console_summary, write_report
from zoo.report.runs import ReportError
from zoo.report.tables import Report
from zoo.sweep import check_callbacks as check_callbacks  # train.py's check, where it was
from zoo.sweep import report_arguments

if TYPE_CHECKING:
    from omegaconf import DictConfig


class ReportAfterSweep(Callback):
    """A Hydra callback (`hydra.callbacks`) that writes the sweep's report when a multirun ends.

    `skipped` maps each variant the study leaves out to why (study=narang's rows that do not apply to its
    application): every report lists them under "Not run here".

    The first metric's report goes into the sweep directory, any further one into report_<metric>/; `also`
    names more reports of the first metric, each against its own baseline, into <name>/: a baseline, or a mapping
    with `baseline` and `target` (study=speedrun's drop-one effects: {drop_one: {baseline: speedrun=full, target:
    1.85}}). `target` is the first metric's target for the steps and seconds to it (default: zoo.report's, the
    worst variant's mean). The study presets in conf/study/ use it, so `python train.py -m study=ffn` ends with its
    report."""

    def __init__(self, metrics: Sequence[str] = ("val_loss",), baseline: str | None = None,
                 also: Mapping[str, str | Mapping[str, Any]] | None = None, target: float | None = None,
                 skipped: Mapping[str, str] | None = None):
        # checked: one ReportError line; `skipped` is read back from the sweep's multirun.yaml, as a rerun of
        # zoo.report does
        args = report_arguments(metrics, baseline, also, target, skipped)
        self.metrics, self.baseline, self.target, self.also = args.metrics, args.baseline, args.target, args.also

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        root = Path(config.hydra.sweep.dir)
        for i, metric in enumerate(self.metrics):
            self._write(root, root if i == 0 else root / f"report_{metric}", metric, self.baseline, metric,
                        self.target if i == 0 else None)
        for name, v in self.also.items():  # a baseline the sweep left out: no such report, in one line
            self._write(root, root / name, self.metrics[0], v["baseline"], f"{name}, against {v['baseline']}",
                        v["target"], fallback=False)

    def _write(self, root: Path, out: Path, metric: str, baseline: str | None, label: str,
               target: float | None = None, fallback: bool = True) -> None:
        if out.is_symlink():  # a directory zoo names itself: never written through a link
            print(f"report ({label}): '{out}' is a symbolic link; remove it to get this report", file=sys.stderr)
            return
        try:
            report = self._build(root, metric, baseline, target, fallback)
            write_report(report, out)
        except (ReportError, WriteError) as e:
            print(f"report ({label}): {e}", file=sys.stderr)
            return
        head = metric if label == metric else f"{metric} ({label})"
        print(f"\n{head}:\n{console_summary(report)}\nreport: {out / 'report.md'}", flush=True)

    def _build(self, root: Path, metric: str, baseline: str | None, target: float | None, fallback: bool) -> Report:
        try:
            return build_report(root, metric, target, baseline)
        except ReportError as e:  # a sweep narrowed on the command line may leave the baseline out
            if not fallback or baseline is None or not str(e).startswith("--baseline"):
                raise
            return build_report(root, metric, target)
