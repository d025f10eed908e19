"""A sweep as Hydra planned it: the overrides of its jobs, from its multirun.yaml expanded as Hydra's basic sweeper
does. Below training and the report, which both read it: a run names itself by what its sweep varies
(zoo.training.loggers), the report matches the planned jobs to the runs on disk (zoo.report.runs)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from zoo.io import MAX_SWEEP_JOBS, read_yaml, sweep_size

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


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
