"""The launcher class Hydra's plugin scan registers; the work is in _core (not scanned, imported on use)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

log = logging.getLogger(__name__)


# forkserver: each job is forked from a server that imported `preload` once; spawn: a new interpreter per job;
# auto: forked from this process where that is what the server would give (_core.start_method), else forkserver.
START_METHODS = ("auto", "forkserver", "spawn")


def _refuse(key: str, what: str, valid: str) -> None:
    print(f"error: hydra.launcher.{key}: {what}; valid: {valid}", file=sys.stderr, flush=True)
    sys.exit(2)


class ParallelLauncher(Launcher):
    """Runs up to `n_jobs` jobs at a time, each in a fresh process; -1 means one per CPU.

    A job whose process dies without a result (killed by a signal, or a hard crash) is logged, its
    directory keeps what the job wrote, and the other jobs run to the end."""

    def __init__(self, n_jobs: int = -1, start_method: str = "auto", preload: Sequence[str] | None = None):
        # Checked before any job starts: the sweep directory holds nothing yet.
        if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or not (n_jobs >= 1 or n_jobs == -1):
            _refuse("n_jobs", f"{n_jobs!r} is not a number of parallel jobs",
                    "a positive integer, or -1 for one per CPU")
        if start_method not in START_METHODS:
            _refuse("start_method", f"unknown {start_method!r}", ", ".join(START_METHODS))
        preload = [] if preload is None else preload
        if isinstance(preload, str) or not all(isinstance(m, str) for m in preload):
            _refuse("preload", f"{preload!r} is not a list of module names", "a list such as [zoo.training.runner]")
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self.n_jobs = n_jobs if n_jobs > 0 else cpus
        self.start_method, self.preload = start_method, list(preload)
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.task_function, self.hydra_context = config, task_function, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra_plugins.zoo_launcher import _core

        return _core.launch(self, job_overrides, initial_job_idx)
