"""A run's directory: owned from before the run's first write until it returns (its marker says the directory is a
zoo run, its lock that this process runs there), an earlier run in it refused, replaced (overwrite=true) or, in a
sweep run again in its own directory, continued; what a finished run keeps of its checkpoints.

Every run directory ends up holding config.yaml (resolved), metrics.csv, checkpoints/{last,best}.ckpt and
summary.json, whatever happened: a diverged or failed run still writes its summary (zoo.training.summary).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig

from zoo.commands import command
from zoo.component import ConfigError
from zoo.io import (
    RunDirError,
    WriteError,
    atomic_write,
    busy_message,
    check_run_dir,
    is_secondary_rank,
    lock_run_dir,
    owned_path,
    read_json,
    read_yaml,
    remove_run_files,
    remove_temp_files,
    write_marker,
)
from zoo.training.callbacks import read_history
from zoo.training.checkpoint import CheckpointError, read_checkpoint
from zoo.training.resume import data_difference, settings_difference


class RunDirRefused(RunDirError):
    """The run directory is busy or holds another run: refused before anything is written there."""


@dataclass
class RunState:
    """What the run knows of its directory."""

    owner: bool  # this process owns it (the first rank; a DDP worker writes nothing there)
    held_run: list[str] = field(default_factory=list)  # what an earlier run left there, when this one took it
    training: bool = False  # training has started: a failure's summary may replace the earlier run's record


def own(run_dir: Path, body: Callable[[RunState], int], on_failure: Callable[[Exception], None]) -> int:
    """body(state) with run_dir owned: marked as a zoo run, locked, released afterwards. on_failure(e) records a
    failure (a sweep's report counts it), but never over an earlier run's record this process did not start
    replacing."""
    if is_secondary_rank():  # a DDP worker started by the first process, which owns the directory
        return body(RunState(owner=False))
    marker, _ = check_run_dir(run_dir)  # nothing is written into a directory zoo cannot tell is its own
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file in the way above it, a read-only parent
        raise WriteError(run_dir, e) from e
    if marker is None:
        write_marker(run_dir)  # the run's first write
    lock = lock_run_dir(run_dir)
    if lock is None:
        raise RunDirRefused(busy_message(run_dir))
    state = RunState(owner=True, held_run=check_run_dir(run_dir)[1])  # again, now it is ours
    try:
        return body(state)
    except RunDirRefused:
        raise
    except Exception as e:
        if not state.held_run or state.training:
            on_failure(e)
        raise
    finally:
        lock.close()  # releases the lock


def overwrite_choice(plain: dict[str, Any], run_dir: Path, state: RunState) -> tuple[bool, bool]:
    """(overwrite, continuing): whether the run replaces the one already there, and whether it is a sweep job run
    again in its own directory, which continues. Another run there is refused unless resumed or replaced."""
    overwrite = plain.get("overwrite", False)
    if not isinstance(overwrite, bool):
        raise ConfigError(f"overwrite: must be true or false, got {overwrite!r}")
    continuing = bool(state.held_run) and plain.get("ckpt_path") is None and not overwrite and in_sweep()
    if state.held_run and plain.get("ckpt_path") is None and not overwrite and not continuing:
        raise RunDirRefused(f"overwrite: '{run_dir}' already holds a run ({', '.join(state.held_run)}); "
                            "valid: ckpt_path=last to resume it, overwrite=true to replace it, or another "
                            "hydra.run.dir")
    return overwrite, continuing


def clear_for(run_dir: Path, overwrite: bool, replacing: bool, resuming: bool) -> None:
    """Ready the owned directory: temp files of writes cut short by a kill go; a replaced run's files go (only
    zoo's names, in a directory its marker says is a zoo run). A resume's history must be a CSV zoo can read
    (refused before anything is written); it keeps the rows it redoes until the resume has logged them again
    (zoo.training.callbacks.HistoryWriter)."""
    if resuming and (history := owned_path(run_dir, "metrics.csv")).is_file():
        read_history(history)
    for directory in (run_dir, run_dir / "checkpoints"):
        remove_temp_files(directory)
    if overwrite and replacing:
        remove_run_files(run_dir)
        write_marker(run_dir, replace=True)  # a new run, a new id


def in_sweep() -> bool:
    try:
        mode = HydraConfig.get().mode
        return mode is not None and mode.name == "MULTIRUN"
    except ValueError:  # not running under Hydra
        return False


def finished_earlier(plain: dict[str, Any], run_dir: Path, fingerprint: dict[str, str] | None = None) -> str | None:
    """A sweep job's earlier run that finished (its summary's status: completed or diverged) with this job's
    settings and data (`fingerprint`, zoo.training.data); None if it did not finish. Other settings or other data
    are refused: a sweep directory holds one sweep."""
    try:
        summary = read_json(run_dir / "summary.json")
        status: str | None = summary["status"] if summary.get("status") in ("completed", "diverged") else None
    except (OSError, ValueError, AttributeError, KeyError):  # damaged or too large (FileFormatError): not finished
        return None
    if status is None:
        return None
    try:
        saved = read_yaml(run_dir / "config.yaml")
    except (OSError, ValueError):  # a missing or broken config.yaml cannot show the run's settings
        saved = None
    difference = settings_difference(plain, saved, saved.get("trainer", {}).get("precision"), "earlier run") \
        if isinstance(saved, dict) else "config.yaml: unreadable"
    if difference:
        raise RunDirRefused(f"hydra.sweep.dir: '{run_dir}' holds a finished run with other settings ({difference}); "
                            "valid: the sweep's own command, another hydra.sweep.dir, or overwrite=true")
    if difference := data_difference(summary.get("data_fingerprint"), fingerprint):
        raise RunDirRefused(f"hydra.sweep.dir: '{run_dir}' holds a finished run trained on other data "
                            f"({difference}); valid: the data it trained on, another hydra.sweep.dir, or "
                            "overwrite=true")
    return status


def check_resume_keeps_history(run_dir: Path, ckpt_step: int) -> None:
    """A resume trims metrics.csv back to its checkpoint's step and trains on from there. A run whose summary.json
    says it finished (completed or diverged) at a later step than that checkpoint would lose its record of those
    steps, and until the resume passed them, its history: refused in one line instead."""
    try:
        summary = read_json(run_dir / "summary.json")  # bounded: a damaged one is FileFormatError, a ValueError
        status, steps = summary["status"], summary["steps"]
    except (OSError, ValueError, TypeError, KeyError):  # no record of a finished run: nothing to lose but rows redone
        return
    if status in ("completed", "diverged") and isinstance(steps, int) and steps > ckpt_step:
        raise RunDirRefused(f"ckpt_path: '{run_dir}' finished ({status}, summary.json) at step {steps}, after its "
                            f"last checkpoint (step {ckpt_step}); resuming would drop the history of the steps "
                            "between; valid: keep the run as it is, or overwrite=true to train it again")


# What checkpoints=last keeps of a finished run's checkpoint: enough to sample, evaluate or start another run from.
WEIGHTS_KEYS = ("state_dict", "hyper_parameters", "tokenizer", "data_fingerprint", "precision", "global_step", "epoch",
                "pytorch-lightning_version")


def finish_checkpoints(run_dir: Path, keep: str) -> str | None:
    """What a finished run keeps. The optimizer's state, two thirds of a checkpoint with AdamW, only serves a
    resume. checkpoints=best_weights, the default: best.ckpt becomes its weights alone (sampling, evaluating and
    init_from need no more) and last.ckpt stays whole, the one checkpoint a resume reads (`ckpt_path=last`); last:
    best.ckpt goes and last.ckpt becomes its weights alone; none: both go. Done once summary.json says the run
    finished, so no run is ever left needing a resume without its checkpoint. Returns a warning to show, if any."""
    best = owned_path(run_dir, "checkpoints/best.ckpt")
    if keep == "best_weights":
        if best.is_file():
            try:
                _weights_alone(best)
            except CheckpointError as e:  # damaged since an earlier run wrote it (a resume wrote no better one)
                return f"{e}: left as found; the run itself finished"
        return None
    best.unlink(missing_ok=True)
    last = owned_path(run_dir, "checkpoints/last.ckpt")
    if not last.is_file():
        return None
    if keep != "last":  # none
        last.unlink()
        return None
    _weights_alone(last)
    return None


def _weights_alone(path: Path) -> None:
    ckpt = read_checkpoint(path)
    weights = {k: v for k, v in ckpt.items() if k in WEIGHTS_KEYS}
    atomic_write(path, lambda f: torch.save(weights, f), mode="wb")


def hydra_output_dir() -> str:
    return HydraConfig.get().runtime.output_dir


def overrides() -> list[str]:
    """The command line's overrides (Hydra's task overrides); none outside Hydra."""
    try:
        return list(HydraConfig.get().overrides.task)
    except Exception:  # not running under Hydra
        return []


def resume_command(run_dir: Path) -> str:
    """The command that continues this run where it stopped: the same overrides, in the same directory."""
    import shlex

    keep = [o for o in overrides() if not o.lstrip("+~").startswith(("ckpt_path=", "hydra.run.dir="))]
    args = keep + ["ckpt_path=last", f"hydra.run.dir={run_dir}"]
    return f"{command('train')} " + " ".join(shlex.quote(a) for a in args)
