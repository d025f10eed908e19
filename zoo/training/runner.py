"""One training run: config -> data -> model -> Lightning fit -> evaluation, sample, summary.json.

This file wires the parts; each job has its own module: the run directory, its lock and overwrite
(zoo.training.run_dir), resuming (zoo.training.resume), the run's plan (zoo.config.plan: the config checked, the
data loaded, the model sized from it), the record (zoo.training.summary) and the console (zoo.training.console).
The config arrives as Hydra composed it and is made into a RunPlan once; everything after reads that by attribute.
Its plain form (run_plan.as_dict()) goes only where a run is stored or shown: config.yaml, checkpoints, the
loggers' hyperparameters, the comparison with a stored run.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from zoo.component import ConfigError
from zoo.config.plan import plan
from zoo.data.corpus import DataError
from zoo.hardware import precision_choice
from zoo.io import RunDirError, WriteError, atomic_write_text, is_write_failure, owned_path, write_failure
from zoo.training import pretrained
from zoo.training.callbacks import (
    BestMetrics,
    DivergenceGuard,
    EvaluateAtEnd,
    GracefulStop,
    HistoryWriter,
    KeepHistory,
    StepProgressBar,
    Throughput,
)
from zoo.training.checkpoint import (
    CheckpointError,
    check_best_metrics_state,
    check_throughput_state,
    model_checkpoint_state,
    sanitize_for_resume,
)
from zoo.training.checkpoint_io import AtomicCheckpointIO
from zoo.training.console import banner, quiet_lightning, say, say_sample, warn
from zoo.training.data import build_data
from zoo.training.kernels import KernelsUsed
from zoo.training.kernels import check_state as check_kernels_state
from zoo.training.loggers import build_loggers, finish_loggers, log_config
from zoo.training.module import ZooModule
from zoo.training.resume import checkpoint_path
from zoo.training.run_dir import (
    RunState,
    check_resume_keeps_history,
    clear_for,
    finish_checkpoints,
    finished_earlier,
    hydra_output_dir,
    overrides,
    overwrite_choice,
    own,
    resume_command,
)
from zoo.training.summary import final_metric, summarize
from zoo.training.summary import write_failure as write_failed_summary

__all__ = ["final_metric", "main", "run"]  # final_metric: train.py's, for search sweepers

quiet_lightning()

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_DIVERGED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def run(cfg: DictConfig, run_dir: str | Path | None = None) -> int:
    """Train as `cfg` says, in `run_dir` (default: Hydra's output directory). Returns an exit code.

    The run owns the directory from before its first write until it returns (zoo.training.run_dir.own). A write
    the environment refuses (full disk, read-only) ends the run with one line (RunDirError)."""
    start = time.perf_counter()
    run_dir = Path(run_dir or hydra_output_dir())
    try:
        return own(run_dir, lambda state: _run(cfg, run_dir, start, state),
                   lambda e: write_failed_summary(_error_message(e), run_dir))
    except OSError as e:
        if is_write_failure(e):
            raise RunDirError(write_failure(e, run_dir)) from e
        raise


def _run(composed: DictConfig, run_dir: Path, start: float, state: RunState) -> int:
    asked: dict[str, Any] = OmegaConf.to_container(composed, resolve=True)  # type: ignore[assignment]
    assert isinstance(asked, dict)  # a run config is a mapping (train.py composes one)
    overwrite, continuing = overwrite_choice(asked, run_dir, state)
    # checked and sized once, before any training (raises ConfigError / DataError): read by attribute from here on
    run_plan, data = plan(asked, build_data, pretrained, overrides())
    if continuing:
        kept = finished_earlier(run_plan.as_dict(), run_dir, getattr(data, "fingerprint", None))
        if kept is not None:
            say(f"kept: {run_dir} finished earlier ({kept}); not run again")
            return EXIT_DIVERGED if kept == "diverged" else EXIT_OK
        if (run_dir / "checkpoints" / "last.ckpt").is_file():
            run_plan = run_plan.resuming("last")  # interrupted or killed: resume from its last checkpoint
        else:
            overwrite = True  # stopped before its first checkpoint: start it again
    if run_plan.threads:  # e.g. 1 per run when a parallel sweep runs one run per core
        torch.set_num_threads(run_plan.threads)
    stored = run_plan.as_dict()  # what config.yaml, the checkpoints and the dashboards keep
    ckpt, ckpt_step, ckpt_precision = checkpoint_path(stored, run_dir, data)
    trainer_args = run_plan.trainer.arguments
    precision = precision_choice(dict(trainer_args), ckpt_precision)  # trainer.precision=auto, resolved once
    if state.owner and ckpt is not None:
        check_resume_keeps_history(run_dir, ckpt_step)
    if state.owner:
        clear_for(run_dir, overwrite, run_plan.ckpt_path is None and bool(state.held_run), ckpt is not None)
    atomic_write_text(owned_path(run_dir, "config.yaml"), OmegaConf.to_yaml(OmegaConf.create(stored)))

    L.seed_everything(run_plan.seed, workers=True, verbose=False)
    module = ZooModule(run_plan)
    if ckpt is None:  # a resume takes its weights from its checkpoint
        pretrained.init_weights(module.model, run_plan.init_from)
    module.tokenizer_state = data.tokenizer.state_dict()
    module.data_fingerprint = getattr(data, "fingerprint", None)
    data.objective = module.objective
    throughput, guard = Throughput(start), DivergenceGuard()
    best = BestMetrics(clock=lambda: throughput.wall_time)
    stop = GracefulStop(str(run_dir / "checkpoints" / "last.ckpt"))
    # best.ckpt and last.ckpt while training, whatever cfg.checkpoints says: Lightning writes last.ckpt only beside
    # a best one; finish_checkpoints leaves what it asks for once the run has finished
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=run_dir / "checkpoints", filename="best", monitor="val_loss", mode="min", save_last=True,
        save_top_k=1, auto_insert_metric_name=False, enable_version_counter=False)
    loggers = build_loggers(run_plan.logger, run_plan.seed, run_dir)
    history = _keep_history(loggers, ckpt_step if ckpt is not None else None)
    trainer_cfg = {**trainer_args, "precision": precision["used"]}
    trusted = {throughput.state_key: check_throughput_state, best.state_key: check_best_metrics_state,
               checkpoints.state_key: lambda saved: model_checkpoint_state(saved, checkpoints)}
    trainer = L.Trainer(
        **trainer_cfg, logger=loggers or False,
        callbacks=[throughput, guard, best, stop, history, EvaluateAtEnd(), StepProgressBar(refresh_rate=10)]
        + ([checkpoints] if trainer_cfg.get("enable_checkpointing", True) else []),  # debug=fast: none
        plugins=[AtomicCheckpointIO(run_dir / "checkpoints", lambda c, path: sanitize_for_resume(
            c, path, trusted, extra_keys=(type(data).__qualname__,)))],
        num_sanity_val_steps=0, enable_model_summary=False, default_root_dir=run_dir,
        check_val_every_n_epoch=None, use_distributed_sampler=False,  # StepLoader shards batches itself
    )
    # kernels (zoo.kernels, zoo/training/kernels.py): applied to the built model where the Trainer will run it,
    # before training's clock starts; named on the banner, in summary.json and in each checkpoint
    kernels = KernelsUsed(module.model, run_plan.kernels, trainer.strategy.root_device, precision["used"])
    trainer.callbacks.append(kernels)
    trusted[kernels.state_key] = check_kernels_state
    log_config(loggers, stored)
    say(banner(run_plan, data, trainer, run_dir, ckpt, ckpt_step, precision))
    say(kernels.banner)  # the banner's third line
    status = "completed"
    state.training = True
    stop.attach(trainer)
    # a signal from here to the summary only asks the run to stop: it stops at the end of a step (GracefulStop)
    with stop, tf32_matmuls(run_plan.tf32 and trainer.strategy.root_device.type == "cuda"):
        trainer.fit(module, datamodule=data, ckpt_path=ckpt, weights_only=True)
        if trainer.interrupted or stop.stopped_at is not None:
            status = "interrupted"
        if guard.step is not None:
            status = "diverged"
        elif status == "completed" and (not best.final or best.final["step"] != trainer.global_step):
            trainer.validate(module, datamodule=data, verbose=False)  # the final evaluation

        history.settle(trainer.global_step)  # a resume's rows of the steps it redid replace the earlier ones
        summary = summarize(run_plan, data, trainer, throughput, best, status, guard.step, precision,
                            kernels.record)
        if trainer.is_global_zero:
            summary.write(run_dir)
            if status in ("completed", "diverged") and run_plan.checkpoints != "all":
                if problem := finish_checkpoints(run_dir, run_plan.checkpoints):
                    warn(problem)
    if trainer.is_global_zero:
        if stop.signal is not None and status == "completed":
            say(f"stop asked ({signal.Signals(stop.signal).name}) after the last step: the run had finished, and "
                "is recorded as it ended")
        finish_loggers(loggers, summary.as_dict(), run_dir)  # final metrics, artifacts; closes the runs
        say(summary.result_line(run_dir))
        if status == "interrupted":
            say(f"resume with: {resume_command(run_dir)}")
        if status == "completed" and run_plan.sample.max_new_tokens > 0:
            say_sample(module.model, module.objective, data, run_plan.sample)
    return {"completed": EXIT_OK, "diverged": EXIT_DIVERGED}.get(status, EXIT_INTERRUPTED)


@contextlib.contextmanager
def tf32_matmuls(enabled: bool) -> Iterator[None]:
    """tf32=true on a CUDA GPU: float32 matrix products use TF32 tensor cores (10-bit mantissa inputs, float32
    sums), several times faster on Ampere and later. Only the CUDA flag is set: torch.set_float32_matmul_precision
    would also switch oneDNN's CPU matmuls, and CPU runs must keep their float32 results. (cuDNN convolutions
    use TF32 by default.) The previous setting comes back afterwards."""
    before = torch.backends.cuda.matmul.allow_tf32
    if enabled:
        torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def _keep_history(loggers: list[Any], resume_step: int | None) -> KeepHistory:
    """CSV loggers append to metrics.csv (Lightning's writer would delete it first) and flush before
    every checkpoint; a resume's writer keeps the rows after its checkpoint until it has logged them again."""
    writers = []
    for lg in loggers:
        if isinstance(lg, L.pytorch.loggers.CSVLogger):
            lg._experiment = HistoryWriter(lg.log_dir, resume_step)  # set before Lightning creates its own writer
            writers.append(lg._experiment)
    return KeepHistory(writers)


def main(cfg: DictConfig, run_dir: str | Path | None = None) -> int:
    """The body of train.py: run; bad input becomes one line and exit code 2, a crash a failed summary."""
    try:
        return run(cfg, run_dir)
    except (ConfigError, DataError, CheckpointError, KeyError, MissingMandatoryValue) as e:  # run() wrote the summary
        warn(f"error: {_error_message(e)}")
        return EXIT_CONFIG
    except Exception:
        traceback.print_exc(file=sys.stderr)
        return EXIT_FAILED


def _error_message(e: Exception) -> str:
    if isinstance(e, MissingMandatoryValue):  # a `???` key left unset (train.py reports it before this)
        return f"{e.full_key}: required, not set; valid: {e.full_key}=<value> on the command line"
    if isinstance(e, (ConfigError, DataError, CheckpointError, WriteError)):
        return str(e)
    if isinstance(e, KeyError):
        return str(e.args[0]) if e.args else str(e)
    return f"{type(e).__name__}: {e}"
