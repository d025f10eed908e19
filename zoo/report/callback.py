"""The Hydra callback that ends a study's multirun with its report."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from hydra.experimental.callback import Callback

from zoo.io import WriteError
from zoo.report.cli import build_report, console_summary, write_report
from zoo.report.runs import ReportError
from zoo.report.tables import Report


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
            if out.is_symlink():  # a directory zoo names itself: never written through a link
                print(f"report ({metric}): '{out}' is a symbolic link; remove it to get this report", file=sys.stderr)
                continue
            try:
                report = self._build(root, metric)
                write_report(report, out)
            except (ReportError, WriteError) as e:
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
