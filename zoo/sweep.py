"""A sweep as Hydra planned it: the overrides of its jobs, from its multirun.yaml expanded as Hydra's basic sweeper
does, and the arguments of the report that ends it (zoo.report.ReportAfterSweep). Below training and the report,
which both read it: a run names itself by what its sweep varies (zoo.training.loggers) and train.py checks the
report's arguments before the sweep runs (zoo.training.safety); the report matches the planned jobs to the runs on
disk (zoo.report.runs) and takes its arguments from here."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from zoo.io import MAX_SWEEP_JOBS, read_yaml, sweep_size

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


class ReportError(ValueError):
    """Bad input to the report (no runs, unknown metric, unknown baseline), reported as one line."""


def parse_overrides(items: Iterable[Any] | None) -> dict[str, str]:
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


def not_a_file(path: Path) -> str | None:
    """Why the report will not read `path` (a link, a directory, not a regular file), or None (a file or absent)."""
    if path.is_symlink():
        return f"{path.name} is a symbolic link"
    if os.path.lexists(path) and not path.is_file():
        return f"{path.name} is {'a directory' if path.is_dir() else 'not a regular file'}"
    return None


def planned_jobs(root: Path) -> tuple[list[list[str]] | None, str]:
    """The sweep's job list from its multirun.yaml, expanded as Hydra's BasicSweeper does (its own
    override parser and split_arguments); (None, why) when there is no plan to read."""
    path = root / "multirun.yaml"
    if problem := not_a_file(path):
        return None, f"{problem}, not read: the jobs found on disk"
    if not path.is_file():
        return None, "no multirun.yaml: the jobs found on disk"
    try:
        cfg = OmegaConf.create(read_yaml(path))
        sweeper = OmegaConf.select(cfg, "hydra.sweeper._target_", default=None)
        if sweeper != BASIC_SWEEPER:  # Optuna and other searches decide their jobs as they go
            return None, f"sweeper {sweeper}: the jobs found on disk"
        params = OmegaConf.to_container(cfg.hydra.sweeper.get("params") or OmegaConf.create({}), resolve=False)
        task = OmegaConf.to_container(cfg.hydra.overrides.task, resolve=False)
        if not isinstance(params, dict) or not isinstance(task, list):
            raise ValueError("hydra.sweeper.params is not a mapping, or hydra.overrides.task not a list")
        task = [str(o) for o in task]
        # as BasicSweeper.sweep: the config's sweeper params first, then the command line's overrides
        arguments = [str(k) + "=" + str(v) for k, v in params.items()] + task
        overrides = OverridesParser.create().parse_overrides(arguments)
        if sweep_size(overrides) > MAX_SWEEP_JOBS:
            return None, f"'{path}' plans more than {MAX_SWEEP_JOBS} jobs, not expanded: the jobs found on disk"
        batches = BasicSweeper.split_arguments(overrides, None)
    except Exception as e:  # an unreadable plan is no reason to withhold the report
        return None, f"multirun.yaml unreadable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return [list(job) for batch in batches for job in batch], "multirun.yaml"


def skipped_variants(root: Path) -> dict[str, str]:
    """The variants the sweep's study leaves out, each with its reason: hydra.callbacks.report.skipped in its
    multirun.yaml (study=narang's rows that do not apply to its application); {} where there is none."""
    path = root / "multirun.yaml"
    if not_a_file(path) or not path.is_file():
        return {}
    try:
        found = OmegaConf.select(OmegaConf.create(read_yaml(path)), "hydra.callbacks.report.skipped", default=None)
        skipped = OmegaConf.to_container(found) if found is not None else {}
        return {str(k): str(v) for k, v in skipped.items()} if isinstance(skipped, dict) else {}
    except Exception:  # an unreadable plan is no reason to withhold the report
        return {}


# Checked when Hydra creates the callback, before the first run: a typo would otherwise surface after the sweep.
# A metric and an `also` name each name a directory inside the sweep's (report_<metric>/, <name>/): a plain name.
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


def _plain(where: str, value: object, what: str) -> str:
    if not isinstance(value, str) or not PLAIN_NAME.fullmatch(value) or set(value) == {"."}:
        raise ReportError(f"hydra.callbacks.report.{where}: expected {what} (letters, digits, _ . -; no '/' or "
                          f"'..'), got {value!r}")
    return value


def _metrics(value: object) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise ReportError(f"hydra.callbacks.report.metrics: expected a non-empty list of metric names "
                          f"([val_loss]), got {value!r}")
    return [_plain(f"metrics[{i}]", m, "a metric's name (val_loss)") for i, m in enumerate(value)]


def _name(value: object) -> str:
    return _plain(f"also.{value}", value, "a report's name, a directory inside the sweep's")


def _baseline(where: str, value: object) -> str | None:
    if value is None or (isinstance(value, str) and value.strip()):
        return value
    raise ReportError(f"hydra.callbacks.report.{where}: expected a variant ('ffn=gelu') or null, got {value!r}")


def _target(where: str, value: object) -> float | None:
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    raise ReportError(f"hydra.callbacks.report.{where}: expected a number or null, got {value!r}")


def _also(name: str, value: object) -> dict[str, Any]:
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


def _skipped(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) and v.strip()
                                          for k, v in value.items()):
        return dict(value)
    got = dict(value) if isinstance(value, Mapping) else value
    raise ReportError(f"hydra.callbacks.report.skipped: expected a mapping of variants to the reason each is not run "
                      f"(funnel: decoder-only), got {got!r}")


@dataclass(frozen=True)
class ReportArguments:
    """zoo.report.ReportAfterSweep's arguments, checked (its docstring says what each is)."""

    metrics: list[str]
    baseline: str | None
    target: float | None
    also: dict[str, dict[str, Any]]  # name -> {baseline, target}
    skipped: dict[str, str]  # variant -> why the study does not run it (the reports read it from multirun.yaml)


def report_arguments(metrics: Sequence[str] = ("val_loss",), baseline: str | None = None,
                     also: Mapping[str, str | Mapping[str, Any]] | None = None,
                     target: float | None = None, skipped: Mapping[str, str] | None = None) -> ReportArguments:
    """The report callback's arguments, or ReportError in one line naming the bad one."""
    checked = _metrics(metrics), _baseline("baseline", baseline), _target("target", target)
    if also is not None and not isinstance(also, Mapping):
        raise ReportError(f"hydra.callbacks.report.also: expected a mapping of report names to baselines, got "
                          f"{also!r}")
    return ReportArguments(*checked, {_name(name): _also(name, v) for name, v in (also or {}).items()},
                           _skipped(skipped))


_NAMES = ("zoo.report.ReportAfterSweep", "zoo.report.callback.ReportAfterSweep")  # as the configs name it, and in full


def check_callbacks(callbacks: Mapping[str, Any]) -> None:
    """Raise ReportError for the first ReportAfterSweep in `hydra.callbacks` whose arguments are bad: train.py's
    check before Hydra creates the callbacks (which would fail with its own traceback)."""
    for spec in callbacks.values():
        if isinstance(spec, Mapping) and spec.get("_target_") in _NAMES:
            report_arguments(**{k: v for k, v in spec.items() if k != "_target_"})
