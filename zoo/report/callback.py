"""The Hydra callback that ends a study's multirun with its report."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from hydra.experimental.callback import Callback

from zoo.io import WriteError
from zoo.report.cli import build_report, console_summary, write_report
from zoo.report.runs import ReportError
from zoo.report.tables import Report


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
                 also: Mapping[str, str | Mapping] | None = None, target: float | None = None,
                 skipped: Mapping[str, str] | None = None):
        self.metrics, self.baseline, self.target = _metrics(metrics), _baseline("baseline", baseline), \
            _target("target", target)
        _skipped(skipped)  # the reports read it from the sweep's multirun.yaml, as a rerun of zoo.report does
        if also is not None and not isinstance(also, Mapping):
            raise ReportError(f"hydra.callbacks.report.also: expected a mapping of report names to baselines, got "
                              f"{also!r}")
        self.also = {_name(name): _also(name, v) for name, v in (also or {}).items()}

    def on_multirun_end(self, config, **kwargs) -> None:
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


# Checked when Hydra creates the callback, before the first run: a typo would otherwise surface after the sweep.
# A metric and an `also` name each name a directory inside the sweep's (report_<metric>/, <name>/): a plain name.
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


def _plain(where: str, value, what: str) -> str:
    if not isinstance(value, str) or not PLAIN_NAME.fullmatch(value) or set(value) == {"."}:
        raise ReportError(f"hydra.callbacks.report.{where}: expected {what} (letters, digits, _ . -; no '/' or "
                          f"'..'), got {value!r}")
    return value


def _metrics(value) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise ReportError(f"hydra.callbacks.report.metrics: expected a non-empty list of metric names "
                          f"([val_loss]), got {value!r}")
    return [_plain(f"metrics[{i}]", m, "a metric's name (val_loss)") for i, m in enumerate(value)]


def _name(value) -> str:
    return _plain(f"also.{value}", value, "a report's name, a directory inside the sweep's")


def _baseline(where: str, value) -> str | None:
    if value is None or (isinstance(value, str) and value.strip()):
        return value
    raise ReportError(f"hydra.callbacks.report.{where}: expected a variant ('ffn=gelu') or null, got {value!r}")


def _target(where: str, value) -> float | None:
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    raise ReportError(f"hydra.callbacks.report.{where}: expected a number or null, got {value!r}")


def _skipped(value) -> None:
    if value is None or (isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) and v.strip()
                                                            for k, v in value.items())):
        return
    got = dict(value) if isinstance(value, Mapping) else value
    raise ReportError(f"hydra.callbacks.report.skipped: expected a mapping of variants to the reason each is not run "
                      f"(funnel: decoder-only), got {got!r}")


def _also(name: str, value) -> dict:
    """An `also` entry as {baseline, target}: a baseline alone, or a mapping of those two keys."""
    where = f"also.{name}"
    if isinstance(value, str):
        return {"baseline": _baseline(where, value), "target": None}
    if not isinstance(value, Mapping) or not isinstance(value.get("baseline"), str) \
            or set(value) - {"baseline", "target"}:
        got = dict(value) if isinstance(value, Mapping) else value
        raise ReportError(f"hydra.callbacks.report.{where}: expected a baseline ('ffn=gelu') or a mapping with "
                          f"baseline and, optionally, target; got {got!r}")
    return {"baseline": _baseline(f"{where}.baseline", value["baseline"]),
            "target": _target(f"{where}.target", value.get("target"))}


_NAMES = ("zoo.report.ReportAfterSweep", f"{__name__}.ReportAfterSweep")  # as the configs name it, and in full


def check_callbacks(callbacks: Mapping) -> None:
    """Raise ReportError for the first ReportAfterSweep in `hydra.callbacks` whose arguments are bad: train.py's
    check before Hydra creates the callbacks (which would fail with its own traceback)."""
    for spec in callbacks.values():
        if isinstance(spec, Mapping) and spec.get("_target_") in _NAMES:
            ReportAfterSweep(**{k: v for k, v in spec.items() if k != "_target_"})
