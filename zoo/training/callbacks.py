"""Callbacks: throughput on the progress bar, a divergence guard, best-metric tracking, graceful stop,
an evaluation at the last step, and a progress bar in steps."""

from __future__ import annotations

import csv
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO, Any

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from zoo.io import RunDirError, WriteError, atomic_write, open_append, owned_path, read_csv
from zoo.training.objectives import metric_directions


class Throughput(L.Callback):  # type: ignore[misc]  # Lightning is read untyped (pyproject.toml)
    """Tokens per second on the progress bar; tokens seen, time to the first step and time spent evaluating
    for the summary."""

    def __init__(self, start_time: float) -> None:
        self.start_time = start_time
        self.tokens = 0
        self.first_step_at: float | None = None
        self.train_time = 0.0
        self.eval_time = 0.0  # validation passes, across resumes: their share of the wall time is reported
        self.earlier_wall_time = 0.0  # wall time of the processes before a resume, up to their checkpoint
        self.resumes = 0  # how many times the run was resumed from a checkpoint (the report lists them)
        self._t0 = 0.0
        self._window: list[tuple[float, int]] = []

    @property
    def wall_time(self) -> float:
        """Wall time of the whole run: this process plus the earlier ones up to the checkpoint resumed."""
        return self.earlier_wall_time + time.perf_counter() - self.start_time

    # saved in checkpoints: a resumed run's summary counts the whole run
    def state_dict(self) -> dict[str, float | int]:
        return {"tokens": self.tokens, "train_time": self.train_time, "wall_time": self.wall_time,
                "eval_time": self.eval_time, "resumes": self.resumes}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # checked by zoo.training.checkpoint first
        self.tokens, self.train_time = state["tokens"], state["train_time"]
        # absent in checkpoints of older zoo versions
        self.earlier_wall_time, self.eval_time = state.get("wall_time", 0.0), state.get("eval_time", 0.0)
        self.resumes = state.get("resumes", 0) + 1  # loading a state is resuming

    def on_validation_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self._v0 = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.eval_time += time.perf_counter() - self._v0

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: dict[str, Any],
                             batch_idx: int) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: dict[str, Any],
                           batch_idx: int) -> None:
        now = time.perf_counter()
        if self.first_step_at is None:
            self.first_step_at = now - self.start_time
        n = int(batch["input"].numel() + (batch["src"].numel() if "src" in batch else 0))
        self.tokens += n * trainer.world_size
        self.train_time += now - self._t0
        self._window = (self._window + [(now - self._t0, n)])[-20:]
        seconds = sum(t for t, _ in self._window)
        module.log("tok/s", sum(k for _, k in self._window) * trainer.world_size / max(seconds, 1e-9),
                   prog_bar=True, on_step=True, on_epoch=False)


class DivergenceGuard(L.Callback):  # type: ignore[misc]  # Lightning is read untyped (pyproject.toml)
    """Stops the run at the first non-finite training loss and remembers the step."""

    def __init__(self) -> None:
        self.step: int | None = None

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: dict[str, Any],
                           batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None and not torch.isfinite(loss).all():
            self.step = trainer.global_step
            trainer.should_stop = True


class BestMetrics(L.Callback):  # type: ignore[misc]  # Lightning is read untyped (pyproject.toml)
    """The final and best value of every validation metric, with the step it was reached at."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.final: dict[str, float] = {}
        self.best: dict[str, dict[str, Any]] = {}  # {name: {"value": float, "step": int}}
        self.history: list[dict[str, Any]] = []  # every evaluation's metrics, its step and (with a clock) wall_time_s
        self.clock = clock  # the run's wall time so far (Throughput.wall_time): when each evaluation ended
        self.directions = metric_directions()  # recorded in summary.json for the report

    def state_dict(self) -> dict[str, Any]:
        return {"final": self.final, "best": self.best, "history": self.history}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.final, self.best, self.history = state["final"], state["best"], state["history"]

    def on_validation_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        # on_validation_end, not _epoch_end: callbacks' epoch-end hooks run before the module's, which
        # logs the exact-match metrics; by now every metric of this evaluation is in callback_metrics.
        if trainer.sanity_checking:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                   if k.startswith(("val_", "exact_match")) and math.isfinite(float(v))}
        self.final = {**metrics, "step": trainer.global_step}
        self.history.append({**self.final, **({"wall_time_s": self.clock()} if self.clock else {})})
        for k, v in metrics.items():
            # a metric no objective declares is tracked as a loss (lower is better)
            better: Callable[[float, float], bool] = \
                (lambda a, b: a > b) if self.directions.get(k) == "max" else (lambda a, b: a < b)
            if k not in self.best or better(v, self.best[k]["value"]):
                self.best[k] = {"value": v, "step": trainer.global_step}


class GracefulStop(L.Callback):  # type: ignore[misc]  # Lightning is read untyped (pyproject.toml)
    """SIGINT or SIGTERM: finish the current step, save `last.ckpt`, stop cleanly (resume with
    ckpt_path=last). A second SIGINT interrupts at once.

    One record whatever the signal's timing: the runner holds the handlers (`with stop:`) from before the fit to
    after summary.json, and Lightning's own SIGTERM handling is switched off (`attach`), so a signal only ever sets
    `signal`, and the run stops at one place, the end of a training step before the last, where the checkpoint,
    metrics.csv and the summary all say that step (`stopped_at`). A signal during the last step, the final
    evaluation or checkpoint, or the summary's write lets the run finish: it is recorded completed, as it is."""

    def __init__(self, checkpoint_path: str) -> None:
        self.checkpoint_path = checkpoint_path
        self.signal: int | None = None
        self.stopped_at: int | None = None  # the step the run stopped at on a signal; None: it was not stopped
        self._previous: dict[int, object] = {}

    def _request(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signum
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C is not graceful

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():  # signals can only be set there
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._request)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    @staticmethod
    def attach(trainer: L.Trainer) -> None:
        """Lightning would put its SIGTERM handler in front of ours for each fit and validate, and then end the
        run from inside an evaluation (SIGTERMException) or finish it unstopped: the stop is ours alone."""
        connector = getattr(trainer, "_signal_connector", None)
        if connector is not None:
            connector.register_signal_handlers = lambda: None
            connector.teardown = lambda: None

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: dict[str, Any],
                           batch_idx: int) -> None:
        if self.signal is not None and not trainer.should_stop and trainer.global_step < trainer.max_steps:
            trainer.save_checkpoint(self.checkpoint_path, weights_only=False)  # the full state, said explicitly
            trainer.should_stop = True
            self.stopped_at = trainer.global_step


class EvaluateAtEnd(L.Callback):  # type: ignore[misc]  # Lightning is read untyped (pyproject.toml)
    """Makes the last step an evaluation step, so every completed run ends with an evaluation that
    ModelCheckpoint sees: best.ckpt and last.ckpt exist even when max_steps < val_check_interval.
    (Lightning validates after a step that sets should_stop; the fit then ends as it would at max_steps.)"""

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: dict[str, Any],
                           batch_idx: int) -> None:
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True


class StepProgressBar(TQDMProgressBar):  # type: ignore[misc]  # Lightning is read untyped (pyproject.toml)
    """The progress bar counts optimizer steps of trainer.max_steps ("step 120/2000", not "Epoch 0" and
    batches), starts at the restored step on a resume, and shows no bar for the short evaluations
    (their metrics appear on the training bar). One notion of speed: the recent one. The bar shows tok/s over
    the last steps (Throughput) and no it/s of its own, and its time left follows the recent steps too
    (tqdm's moving average), not the average since the start."""

    BAR = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"

    def __init__(self, refresh_rate: int = 10):
        super().__init__(refresh_rate=refresh_rate)

    def on_train_start(self, trainer: L.Trainer, *_: Any) -> None:
        self.train_progress_bar = Tqdm(desc="step", total=trainer.max_steps, initial=trainer.global_step,
                                       disable=self.is_disabled, leave=True, dynamic_ncols=True, file=sys.stdout,
                                       smoothing=0.3, bar_format=self.BAR)

    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        pass  # one bar for the whole run: steps, not epochs

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: dict[str, Any],
                           batch_idx: int) -> None:
        n = trainer.global_step
        if self.train_progress_bar is not None and self._should_update(n, self.train_progress_bar.total):
            self.train_progress_bar.update(n - self.train_progress_bar.n)  # update: the moving average sees it
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, module))

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.n = trainer.global_step
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, module))

    def init_validation_tqdm(self) -> Tqdm:
        return Tqdm(disable=True)


class HistoryWriter(ExperimentWriter):  # type: ignore[misc]  # Lightning is read untyped (pyproject.toml)
    """CSVLogger's writer, made to keep a run's history: it appends to metrics.csv instead of deleting it
    (Lightning's writer deletes the file when it starts), and rewrites it only atomically (when a new
    column appears), as it writes hparams.yaml; never through a link (zoo.io.owned_path). The runner trims the
    rows a resume will redo before training starts."""

    def __init__(self, log_dir: str, redo_from: int | None = None) -> None:
        self.hparams: dict[str, Any] = {}
        self.metrics: list[dict[str, Any]] = []
        self.log_dir = log_dir
        self.metrics_file_path = os.path.join(log_dir, self.NAME_METRICS_FILE)
        os.makedirs(log_dir, exist_ok=True)
        path = owned_path(log_dir, self.NAME_METRICS_FILE)
        self.metrics_keys = read_header(path)
        # A resume from step `redo_from` logs the rows of the steps after it again. The rows an earlier process
        # logged for them (`_tail`) stay in the file until this run's own rows pass them: the file is then
        # rewritten as the rows before (`_kept`), this run's (`_new`) and the tail not yet passed.
        self._kept: list[dict[str, Any]] | None = None
        self._new: list[dict[str, Any]] = []
        self._tail: list[dict[str, Any]] = []
        if redo_from is not None and path.is_file():
            rows, text = read_history(path), path.read_text()
            redone = [(s := _step(r)) is not None and s >= redo_from for r in rows]
            if any(redone) or (text and not text.endswith("\n")):  # a last line cut by a kill goes at once
                self._kept = [r for r, later in zip(rows, redone, strict=True) if not later]
                self._tail = [r for r, later in zip(rows, redone, strict=True) if later]
                self._rewrite()

    def log_hparams(self, params: dict[str, Any]) -> None:
        from omegaconf import OmegaConf

        self.hparams.update(params)  # plain values (the flat config, the module's cfg): as Lightning saves them
        atomic_write(owned_path(self.log_dir, self.NAME_HPARAMS_FILE), lambda f: OmegaConf.save(self.hparams, f))

    def save(self, sync: bool = False) -> None:
        if not self.metrics:
            return
        if self._kept is not None:  # a resume's tail is still on disk: rewritten, without the rows passed
            self._new, self.metrics = self._new + self.metrics, []
            newest = max((s for r in self._new if (s := _step(r)) is not None), default=None)
            if newest is not None:  # a step's rows are complete once a later step's arrive: the newest's are kept
                self._tail = [r for r in self._tail if _step(r) >= newest]  # type: ignore[operator]
            self._rewrite()
            return
        path = owned_path(self.log_dir, self.NAME_METRICS_FILE)
        keys = set().union(*self.metrics)
        if not path.is_file() or not keys <= set(self.metrics_keys):
            self.metrics_keys = sorted(set(self.metrics_keys) | keys)  # sorted, as Lightning's writer does
            old = read_rows(path)

            def write(f: IO[str]) -> None:
                w = csv.DictWriter(f, fieldnames=self.metrics_keys)
                w.writeheader()
                w.writerows(old + self.metrics)

            atomic_write(path, write)
        else:
            try:
                with open_append(path, newline="", encoding="utf-8") as f:
                    csv.DictWriter(f, fieldnames=self.metrics_keys).writerows(self.metrics)
                    if sync:
                        f.flush()
                        os.fsync(f.fileno())
            except OSError as e:
                raise WriteError(path, e) from e
        self.metrics = []

    def settle(self, done: int) -> None:
        """This run has logged every step before `done` (a checkpoint's step, the run's end): an earlier
        process's rows of those steps go."""
        if self._kept is not None:
            self._tail = [r for r in self._tail if _step(r) >= done]  # type: ignore[operator]
            self._rewrite()

    def _rewrite(self) -> None:
        assert self._kept is not None
        rows = self._kept + self._new + self._tail
        self.metrics_keys = sorted(set(self.metrics_keys).union(*rows)) if rows else self.metrics_keys

        def write(f: IO[str]) -> None:
            w = csv.DictWriter(f, fieldnames=self.metrics_keys)
            w.writeheader()
            w.writerows(rows)

        atomic_write(owned_path(self.log_dir, self.NAME_METRICS_FILE), write)
        if not self._tail:  # every earlier row is passed: the file is this run's history in order, appended to
            self._kept, self._new = None, []


def _step(row: dict[str, Any]) -> int | None:
    step = row.get("step")
    return int(step) if isinstance(step, str) and step.isdigit() else step if isinstance(step, int) else None


def read_history(path: Path) -> list[dict[str, Any]]:
    """metrics.csv's complete rows, or one line (RunDirError) when it is not a CSV history zoo can read."""
    try:
        read_header(path)
        return read_rows(path)
    except (ValueError, csv.Error) as e:  # not what zoo writes (FileFormatError): the history is the user's
        raise RunDirError(f"'{path}' is not a CSV history zoo can read ({e}); move it aside to resume without "
                          "it") from e


def read_header(path: Path) -> list[str]:
    """metrics.csv's columns ([] for no file); read bounded (zoo.io.read_csv): FileFormatError in one line."""
    return read_csv(path)[0] if path.is_file() else []


def read_rows(path: Path) -> list[dict[str, Any]]:
    """metrics.csv's complete rows: a last line cut by a kill (no newline at the end) is left out."""
    return read_csv(path)[1] if path.is_file() else []


class KeepHistory(L.Callback):  # type: ignore[misc]  # Lightning is read untyped (pyproject.toml)
    """Puts the metrics logged so far on disk before each checkpoint is written, so the rows up to a
    checkpoint's step are never only in memory when the process is killed."""

    def __init__(self, writers: list[HistoryWriter]) -> None:
        self.writers = writers

    def on_save_checkpoint(self, trainer: L.Trainer, module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        for w in self.writers:
            w.save(sync=True)
            w.settle(trainer.global_step)

    def settle(self, done: int) -> None:
        """The run has logged every step before `done`: a resumed run's last rewrite (HistoryWriter.settle)."""
        for w in self.writers:
            w.save(sync=True)
            w.settle(done)
