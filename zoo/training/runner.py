"""One training run: config -> data -> model -> Lightning fit -> evaluation, sample, summary.json.

Every run directory ends up holding config.yaml (resolved), metrics.csv, checkpoints/{last,best}.ckpt
and summary.json, whatever happened: a diverged or failed run still writes its summary.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from zoo.build import ConfigError, count_params, flatten_config, flops_per_token, resolve_config
from zoo.component import option_fields, resized
from zoo.data.corpus import DataError
from zoo.hardware import precision_choice
from zoo.io import (
    RunDirError,
    WriteError,
    atomic_write,
    atomic_write_json,
    atomic_write_text,
    busy_message,
    check_run_dir,
    is_secondary_rank,
    is_write_failure,
    lock_run_dir,
    owned_path,
    remove_run_files,
    remove_temp_files,
    write_failure,
    write_marker,
)
from zoo.registry import ATTENTION, FFN, MODEL, POSITION
from zoo.schema import default_of
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
    read_header,
    read_rows,
)
from zoo.training.checkpoint import (
    CheckpointError,
    check_best_metrics_state,
    check_throughput_state,
    check_weights,
    model_checkpoint_state,
    read_checkpoint,
    sanitize_for_resume,
)
from zoo.training.checkpoint_io import AtomicCheckpointIO
from zoo.training.data import bits_per_char, build_data
from zoo.training.kernels import KernelsUsed
from zoo.training.kernels import check_state as check_kernels_state
from zoo.training.loggers import build_loggers, finish_loggers, log_config
from zoo.training.module import ZooModule
from zoo.training.objectives import higher_is_better
from zoo.training.validate import check_memory, check_run, check_trainer


class _QuietLightning(logging.Filter):
    """Drop Lightning's start-up chatter (accelerator lines, tips); keep what matters (resuming, stopping)."""

    # Resuming and stopping are said by zoo's own lines (the start banner, the result line).
    NOISE = ("GPU available", "TPU available", "Tip:", "HPU available", "LOCAL_RANK", "`Trainer.fit` stopped",
             "Restoring states from the checkpoint", "Restored all states from the checkpoint",
             "Initializing distributed", "distributed_backend=",  # the banner says how many devices
             "Automatic Mixed Precision")  # and the precision

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(n in record.getMessage() for n in self.NOISE)


for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
              "lightning.fabric.utilities.distributed", "lightning_utilities.core.rank_zero"):
    logging.getLogger(_name).addFilter(_QuietLightning())
warnings.filterwarnings("ignore", message=".*exists and is not empty.*")  # the run dir holds .hydra/ by design
warnings.filterwarnings("ignore", message=".*LeafSpec.*is deprecated.*")
warnings.filterwarnings("ignore", message=".*does not have many workers.*")  # batches are built in-process

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_DIVERGED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class RunDirRefused(RunDirError):
    """The run directory is busy or holds another run: refused before anything is written there."""


def run(cfg: DictConfig, run_dir: str | Path | None = None) -> int:
    """Train as `cfg` says, in `run_dir` (default: Hydra's output directory). Returns an exit code.

    The run owns the directory from before its first write until it returns: its marker (zoo.io.write_marker)
    says the directory is a zoo run, its lock (zoo.io.lock_run_dir) that this process runs there. A write the
    environment refuses (full disk, read-only) ends the run with one line (RunDirError)."""
    start = time.perf_counter()
    run_dir = Path(run_dir or _hydra_output_dir())
    try:
        return _own_and_run(cfg, run_dir, start)
    except OSError as e:
        if is_write_failure(e):
            raise RunDirError(write_failure(e, run_dir)) from e
        raise


def _own_and_run(cfg: DictConfig, run_dir: Path, start: float) -> int:
    if is_secondary_rank():  # a DDP worker started by the first process, which owns the directory
        return _run(cfg, run_dir, start, {"owner": False, "held_run": [], "training": False})
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
    state = {"owner": True, "held_run": check_run_dir(run_dir)[1], "training": False}  # again, now it is ours
    try:
        return _run(cfg, run_dir, start, state)
    except RunDirRefused:
        raise
    except Exception as e:
        # A failed run leaves a summary (a sweep's report counts it), but never over an earlier run's
        # record that this process did not start replacing.
        if not state["held_run"] or state["training"]:
            _write_failure(_error_message(e), run_dir)
        raise
    finally:
        lock.close()  # releases the lock


def _run(cfg: DictConfig, run_dir: Path, start: float, state: dict) -> int:
    plain = OmegaConf.to_container(cfg, resolve=True)
    overwrite = plain.get("overwrite", False)
    if not isinstance(overwrite, bool):
        raise ConfigError(f"overwrite: must be true or false, got {overwrite!r}")
    # A sweep run again in its own directory continues: each job's directory holds the run to go on with.
    continuing = bool(state["held_run"]) and plain.get("ckpt_path") is None and not overwrite and _in_sweep()
    if state["held_run"] and plain.get("ckpt_path") is None and not overwrite and not continuing:
        raise RunDirRefused(f"overwrite: '{run_dir}' already holds a run ({', '.join(state['held_run'])}); "
                            "valid: ckpt_path=last to resume it, overwrite=true to replace it, or another "
                            "hydra.run.dir")
    data = _prepare(plain)  # raises ConfigError / DataError before any training
    if continuing:
        kept = _finished_earlier(plain, run_dir)
        if kept is not None:
            print(f"kept: {run_dir} finished earlier ({kept}); not run again", flush=True)
            return EXIT_DIVERGED if kept == "diverged" else EXIT_OK
        if (run_dir / "checkpoints" / "last.ckpt").is_file():
            plain["ckpt_path"] = "last"  # interrupted or killed: resume from its last checkpoint
        else:
            overwrite = True  # stopped before its first checkpoint: start it again
    if plain.get("threads"):  # e.g. 1 per run when a parallel sweep runs one run per core
        torch.set_num_threads(plain["threads"])
    ckpt, ckpt_step, ckpt_precision = _checkpoint_path(plain, run_dir, data)
    precision = precision_choice(plain["trainer"], ckpt_precision)  # trainer.precision=auto, resolved once
    if state["owner"]:
        for directory in (run_dir, run_dir / "checkpoints"):  # temp files of writes cut short by a kill
            remove_temp_files(directory)
        if overwrite and plain.get("ckpt_path") is None and state["held_run"]:
            remove_run_files(run_dir)  # only zoo's names, in a directory its marker says is a zoo run
            write_marker(run_dir, replace=True)  # a new run, a new id
        if ckpt is not None:  # the rows after the checkpoint's step are redone; the earlier ones stay on disk
            _trim_history(owned_path(run_dir, "metrics.csv"), ckpt_step)
    atomic_write_text(owned_path(run_dir, "config.yaml"), OmegaConf.to_yaml(OmegaConf.create(plain)))

    L.seed_everything(plain["seed"], workers=True, verbose=False)
    module = ZooModule(plain)
    if ckpt is None:  # a resume takes its weights from its checkpoint
        pretrained.init_weights(module.model, plain)
    module.tokenizer_state = data.tokenizer.state_dict()
    data.objective = module.objective
    throughput, guard = Throughput(start), DivergenceGuard()
    best = BestMetrics(clock=lambda: throughput.wall_time)
    stop = GracefulStop(str(run_dir / "checkpoints" / "last.ckpt"))
    keep = plain.get("checkpoints", "all")
    # best.ckpt and last.ckpt while training, whatever `keep` says: Lightning writes last.ckpt only beside a
    # best one; finish_checkpoints leaves what `keep` asks for once the run has finished
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=run_dir / "checkpoints", filename="best", monitor="val_loss", mode="min", save_last=True,
        save_top_k=1, auto_insert_metric_name=False, enable_version_counter=False)
    loggers = build_loggers(plain, run_dir)
    history = _keep_history(loggers)
    trainer_cfg = {**plain["trainer"], "precision": precision["used"]}
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
    kernels = KernelsUsed(module.model, plain.get("kernels", "auto"), trainer.strategy.root_device, precision["used"])
    trainer.callbacks.append(kernels)
    trusted[kernels.state_key] = check_kernels_state
    log_config(loggers, plain)
    if trainer.is_global_zero:
        _print_banner(plain, data, trainer, run_dir, ckpt, ckpt_step, precision)
        print(kernels.banner, flush=True)  # kernels: the banner's third line
    status = "completed"
    state["training"] = True
    with tf32_matmuls(plain.get("tf32", True) and trainer.strategy.root_device.type == "cuda"):
        trainer.fit(module, datamodule=data, ckpt_path=ckpt, weights_only=True)
        if trainer.interrupted or stop.signal is not None:
            status = "interrupted"
        if guard.step is not None:
            status = "diverged"
        elif status == "completed" and (not best.final or best.final["step"] != trainer.global_step):
            trainer.validate(module, datamodule=data, verbose=False)  # the final evaluation

    summary = _summary(plain, data, trainer, throughput, best, status, guard.step, precision)
    summary.update(kernels.record)  # kernels: cpu_kind, kernels_policy, kernels
    if trainer.is_global_zero:
        atomic_write_json(owned_path(run_dir, "summary.json"), summary)
        if status in ("completed", "diverged") and keep != "all":
            finish_checkpoints(run_dir, keep)
        finish_loggers(loggers, summary, run_dir)  # final metrics, artifacts; closes the runs
        _print_result(summary, run_dir)
        if status == "interrupted":
            print(f"resume with: {resume_command(run_dir)}", flush=True)
        if status == "completed" and plain["sample"]["max_new_tokens"] > 0:
            _print_sample(module, data, plain)
    return {"completed": EXIT_OK, "diverged": EXIT_DIVERGED}.get(status, EXIT_INTERRUPTED)


@contextlib.contextmanager
def tf32_matmuls(enabled: bool):
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


def finish_checkpoints(run_dir: Path, keep: str) -> None:
    """checkpoints=last: the finished run's best.ckpt goes and its last.ckpt becomes its weights alone (the
    optimizer's state, two thirds of it, only serves a resume); checkpoints=none: both go. Done once
    summary.json says the run finished, so no run is ever left needing a resume without its checkpoint."""
    owned_path(run_dir, "checkpoints/best.ckpt").unlink(missing_ok=True)
    last = owned_path(run_dir, "checkpoints/last.ckpt")
    if not last.is_file():
        return
    if keep != "last":  # none
        last.unlink()
        return
    ckpt = read_checkpoint(last)
    weights = {k: v for k, v in ckpt.items() if k in WEIGHTS_KEYS}
    atomic_write(last, lambda f: torch.save(weights, f), mode="wb")


# What checkpoints=last keeps of a finished run's checkpoint: enough to sample, evaluate or start another run from.
WEIGHTS_KEYS = ("state_dict", "hyper_parameters", "tokenizer", "precision", "global_step", "epoch",
                "pytorch-lightning_version")


def _in_sweep() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().mode.name == "MULTIRUN"
    except ValueError:  # not running under Hydra
        return False


def _finished_earlier(plain: dict, run_dir: Path) -> str | None:
    """A sweep job's earlier run that finished (its summary's status: completed or diverged) with this job's
    settings; None if it did not finish. Other settings are refused: a sweep directory holds one sweep."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        status = summary["status"] if summary.get("status") in ("completed", "diverged") else None
    except (OSError, ValueError, AttributeError, KeyError):
        return None
    if status is None:
        return None
    try:
        saved = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=False)
    except Exception:  # a missing or broken config.yaml cannot show the run's settings
        saved = None
    difference = _settings_difference(plain, saved, saved.get("trainer", {}).get("precision"), "earlier run") \
        if isinstance(saved, dict) else "config.yaml: unreadable"
    if difference:
        raise RunDirRefused(f"hydra.sweep.dir: '{run_dir}' holds a finished run with other settings ({difference}); "
                            "valid: the sweep's own command, another hydra.sweep.dir, or overwrite=true")
    return status


def _keep_history(loggers: list) -> KeepHistory:
    """CSV loggers append to metrics.csv (Lightning's writer would delete it first) and flush before
    every checkpoint."""
    writers = []
    for lg in loggers:
        if isinstance(lg, L.pytorch.loggers.CSVLogger):
            lg._experiment = HistoryWriter(lg.log_dir)  # set before Lightning creates its own writer
            writers.append(lg._experiment)
    return KeepHistory(writers)


def _hydra_output_dir() -> str:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.output_dir


def _prepare(plain: dict):
    """Validate the architecture, load data, then size the model from it (vocab, context)."""
    check_run(plain)
    init = pretrained.apply(plain, _overrides())  # init_from: the checkpoint's architecture and tokenizer
    model_cfg = plain["model"]
    early = resolve_config({**model_cfg, "vocab_size": model_cfg.get("vocab_size") or 1,
                            "max_seq_len": model_cfg.get("max_seq_len") or 1})  # names and shapes, before any data
    check_memory(early, plain["trainer"])  # a lower bound (the vocabulary is not known yet), before any data
    trainer = plain["trainer"]
    if not isinstance(trainer.get("max_steps"), int) or trainer["max_steps"] <= 0:
        raise ConfigError(f"trainer.max_steps: must be a positive integer, got {trainer.get('max_steps')!r}")
    threads = plain.get("threads")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads <= 0):
        raise ConfigError(f"threads: must be a positive integer or null (torch's default), got {threads!r}")
    data = build_data(plain["data"], plain["seed"], trainer["max_steps"] * trainer.get("accumulate_grad_batches", 1))
    if data.is_task and not MODEL.get(model_cfg["name"]).generates and data.task.name == "addition":
        raise ConfigError("data.task: encoder_only fills the target positions in one pass and needs the target "
                          "length, which addition does not fix; use data=copy, reverse or sort, or "
                          "model=decoder_only / encoder_decoder")
    need = data.required_len()
    if model_cfg.get("max_seq_len") is None:
        model_cfg["max_seq_len"] = need
    elif model_cfg["max_seq_len"] < need and POSITION.get(model_cfg["position"]["name"]).hard_limit:
        raise ConfigError(f"model.max_seq_len: {model_cfg['max_seq_len']} learned positions cannot cover sequences "
                          f"of {need} tokens (data.context or the task's longest test example); raise it or "
                          "leave it null")
    model_cfg["vocab_size"] = data.tokenizer.vocab_size if init is None else \
        pretrained.vocab_size(init, data.tokenizer.vocab_size)
    plain["model"] = resolve_config(model_cfg)
    if init is not None and plain["model"]["parametrization"] != "standard":
        raise ConfigError(f"model.parametrization: {plain['model']['parametrization']} rescales the outputs and "
                          "learning rates of weights trained in the standard parametrization; valid: standard "
                          "with init_from")
    budget = plain.get("budget")
    if budget is not None and not (isinstance(budget, str) and budget in BUDGETS):  # a list is not hashable
        raise ConfigError(f"budget: unknown '{budget}'; valid: {', '.join(BUDGETS)}, null")
    if budget is not None:
        plain["model"], plain["budget"] = match_params(plain["model"], count=BUDGETS[budget])
    if plain.get("tokens_per_param") is not None:
        apply_token_rule(plain, data)
    check_memory(plain["model"], trainer)
    return data


def apply_token_rule(plain: dict, data) -> None:
    """tokens_per_param: trainer.max_steps from the model's size, so every rung of a ladder trains on the same
    number of tokens per parameter (and evals_per_run spaces the evaluations alike). Parameters are counted as
    the budget counts them: the active ones, where experts make them fewer than all."""
    trainer, accumulate = plain["trainer"], plain["trainer"].get("accumulate_grad_batches", 1)
    tokens_per_step = data.batch_size * data.required_len() * accumulate
    params = count_params(plain["model"])["active"]
    trainer["max_steps"] = max(1, math.ceil(plain["tokens_per_param"] * params / tokens_per_step))
    if plain.get("evals_per_run"):
        trainer["val_check_interval"] = max(1, trainer["max_steps"] * accumulate // plain["evals_per_run"])  # batches
    data.steps = trainer["max_steps"] * accumulate


# budget=<key> -> the count_params entry match_params equalises: all parameters, or those a token uses
BUDGETS = {"params": "total", "active_params": "active"}


def match_params(model_cfg: dict, tolerance: float = 0.01, count: str = "total") -> tuple[dict, dict]:
    """Resize the FFN so the model has the parameters of the baseline (MHA, 4x GELU FFN) within 1%: the FFN says
    how (its `resize(opts, size)`, zoo.component.FFNPart); `d_ff` in the record is the size it was given.

    count: "total" (budget=params) or "active" (budget=active_params: the parameters one token uses,
    fewer than total for sparse FFNs such as ffn=moe; the dense baseline's are all active).
    Used so that a sweep over FFN or attention types compares them at equal size."""
    # The baseline keeps the options every attention has (window, backend, ...), not a variant's own (n_kv_heads).
    shared = option_fields(ATTENTION.options("mha"))
    baseline = {**model_cfg, "attention": {"name": "mha", **{k: v for k, v in model_cfg["attention"].items()
                                                             if k in shared}},
                "ffn": {"name": "gelu", "d_ff": None}}
    target = count_params(baseline)[count]
    with_size = lambda size: {**model_cfg, "ffn": resized(FFN, model_cfg["ffn"], size)}
    at = lambda size: count_params(with_size(size))[count]
    per_unit = (at(16) - at(8)) / 8  # the count is linear in the size (FFNPart.resize)
    if per_unit <= 0:
        raise ConfigError(f"budget: ffn '{model_cfg['ffn']['name']}' keeps its {count} parameters whatever size its "
                          "resize(opts, size) is given; valid: an FFN whose parameters grow with its size")
    exact = 8 + (target - at(8)) / per_unit
    d_ff = max(8, 8 * round(exact / 8))  # a multiple of 8, as the defaults are, unless that misses by > 1%
    if abs(at(d_ff) - target) > tolerance * target:
        d_ff = max(1, round(exact))
    params = at(d_ff)
    if abs(params - target) > tolerance * target:
        raise ConfigError(f"budget: no d_ff brings {model_cfg['ffn']['name']} with {model_cfg['attention']['name']} "
                          f"within {tolerance:.0%} of the baseline's {target} {count} parameters")
    kind = next(k for k, v in BUDGETS.items() if v == count)
    return with_size(d_ff), {"kind": kind, "baseline": "mha + gelu", "target_params": target, "d_ff": d_ff,
                             "params": params, "deviation": (params - target) / target}


# Keys a resume may change: where output goes and how it is shown, or how it is computed within rounding
# (threads, kernels: a resume says what changed); never what is computed.
RESUME_MAY_CHANGE = ("ckpt_path", "overwrite", "threads", "kernels", "logger", "sample", "optimized_metric",
                     "trainer.enable_progress_bar", "data.verify", "checkpoints")


def _checkpoint_path(plain: dict, run_dir: Path, data) -> tuple[str | None, int, str | None]:
    """The checkpoint to resume from, its step and the precision it trained in, checked: it loads safely, holds
    this run's architecture and was trained with this run's settings (all but RESUME_MAY_CHANGE; precision
    auto takes the checkpoint's)."""
    ckpt = plain.get("ckpt_path")
    if ckpt is None:
        return None, 0, None
    path = run_dir / "checkpoints" / "last.ckpt" if ckpt == "last" else Path(ckpt)
    if not path.is_file():
        hint = " (ckpt_path=last looks in <run dir>/checkpoints; pass hydra.run.dir=<the run's dir>)" \
            if ckpt == "last" else ""
        raise ConfigError(f"ckpt_path: no checkpoint at '{path}'{hint}")
    saved_ckpt = read_checkpoint(path)
    if "optimizer_states" not in saved_ckpt:
        raise ConfigError(f"ckpt_path: '{path}' holds a finished run's weights alone (checkpoints=last), nothing "
                          "to resume; valid: the last.ckpt of a run that was cut short, or sample and evaluate "
                          "from this one (python -m zoo.sample, python -m zoo.eval)")
    saved_cfg = (saved_ckpt.get("hyper_parameters") or {}).get("cfg") or {}
    # what it trained in: recorded by ZooModule since precision auto, else the config's (then always explicit)
    used = saved_ckpt.get("precision") or _result_settings(saved_cfg).get("trainer.precision", "32-true")
    if difference := _settings_difference(plain, saved_cfg, used):
        if difference.startswith("model."):
            raise ConfigError(f"ckpt_path: '{path}' holds a different architecture ({difference})")
        raise ConfigError(f"ckpt_path: '{path}' was trained with other settings ({difference}); a resume may "
                          f"change only {', '.join(RESUME_MAY_CHANGE)}")
    saved = saved_cfg.get("model")
    check_weights(saved_ckpt.get("state_dict"), saved, path)  # weights that fit the architecture it names
    if saved_ckpt.get("tokenizer") not in (None, data.tokenizer.state_dict()):
        raise ConfigError(f"ckpt_path: '{path}' was trained with another tokenizer (data: the text or its "
                          "tokenizer changed since the checkpoint)")
    if plain["trainer"].get("precision") == "auto":  # the checkpoint's precision runs: judged as a config's would be
        check_trainer({**plain["trainer"], "precision": used})  # a known one; float16 only on a GPU
    step = saved_ckpt.get("global_step", 0)
    return str(path), step if isinstance(step, int) else 0, used


def _settings_difference(plain: dict, saved_cfg: dict, saved_precision: str | None = None,
                         saved_as: str = "checkpoint") -> str | None:
    """The first setting that changes the result (all but RESUME_MAY_CHANGE, the architecture included) where
    a saved run's config differs from this run's, as 'key: <saved_as> <v>, this run <v>'; None if none does.
    saved_precision: what the saved run trained in, which `trainer.precision: auto` accepts."""
    ours, theirs = _result_settings(plain), _result_settings(saved_cfg)
    for key in sorted(set(ours) | set(theirs)):
        if key == "trainer.precision" and ours.get(key) in ("auto", saved_precision):
            continue  # auto resumes in the checkpoint's precision; an explicit one must be the same
        # a key the schema gained after the run was saved (optim.eps) counts as its default there
        if ours.get(key, _MISSING) != theirs.get(key, default_of(key, _MISSING)):
            key = key if key in ours and key in theirs else _first_difference(key, plain, saved_cfg)
            return f"{key}: {saved_as} {_lookup(saved_cfg, key)!r}, this run {_lookup(plain, key)!r}"
    saved, model_cfg = _with_defaults(saved_cfg.get("model")), plain["model"]
    if saved != model_cfg:
        ours, theirs = flatten_config(model_cfg), flatten_config(saved or {})
        diff = next((k for k in ours if theirs.get(k) != ours[k]), "name")
        return f"model.{diff}: {saved_as} {theirs.get(diff)!r}, this run {ours.get(diff)!r}"
    return None


def _with_defaults(model_cfg):
    """A saved architecture with the options added since it was saved at their defaults (the parametrization,
    say), so an older run's architecture compares equal to the same one written out today."""
    try:
        return resolve_config(model_cfg)
    except Exception:  # not a config this zoo can resolve: compared as it is, and refused below
        return model_cfg


class _Missing:
    def __repr__(self) -> str:
        return "(not set)"


_MISSING = _Missing()


def _lookup(cfg: dict, key: str):
    for part in key.split("."):
        if not isinstance(cfg, dict) or part not in cfg:
            return _MISSING
        cfg = cfg[part]
    return cfg


def _first_difference(key: str, a: dict, b: dict) -> str:
    """The shortest prefix of `key` where a and b part (budget: None vs budget: {...} -> budget)."""
    parts = key.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        x, y = _lookup(a, prefix), _lookup(b, prefix)
        if not (isinstance(x, dict) and isinstance(y, dict)):
            return prefix
    return key


def _result_settings(cfg: dict) -> dict:
    flat = flatten_config({k: v for k, v in cfg.items() if k != "model"})
    return {k: v for k, v in flat.items() if not any(k == a or k.startswith(a + ".") for a in RESUME_MAY_CHANGE)}


def _trim_history(path: Path, step: int) -> None:
    """Keep metrics.csv's rows before the checkpoint's step (a resume logs the later ones again), rewritten
    atomically: at every moment the file holds at least every row up to the checkpoint."""
    if not path.is_file():
        return
    try:
        rows, header = read_rows(path), read_header(path)
    except (UnicodeDecodeError, csv.Error) as e:  # not what zoo writes: the history is the user's to keep
        raise RunDirError(f"'{path}' is not a CSV history zoo can read ({e}); move it aside to resume without "
                          "it") from e
    if not header:  # an empty file: nothing to keep
        path.unlink()
        return
    kept = [r for r in rows if r.get("step") and r["step"].isdigit() and int(r["step"]) < step]
    if len(kept) == len(rows) and path.read_text().endswith("\n"):
        return  # nothing to redo: leave the file as it is

    def write(f):
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows(kept)

    atomic_write(path, write)


def _summary(plain, data, trainer, throughput, best, status, diverged_step, precision) -> dict:
    m = plain["model"]
    final = {k: v for k, v in best.final.items() if k != "step"}
    if "val_loss" in final and not data.is_task and MODEL.get(m["name"]).next_token_lm:  # per-token LM loss only
        final["val_ppl"] = math.exp(final["val_loss"])
        final["val_bpc"] = bits_per_char(final["val_loss"], data.tokens_per_char)
    return {
        "status": status,
        "diverged": status == "diverged",
        "diverged_step": diverged_step,
        "architecture": {"lineage": m["name"], "attention": m["attention"]["name"],
                         "position": m["position"]["name"], "norm": m["norm"]["type"],
                         "placement": m["norm"]["placement"], "ffn": m["ffn"]["name"],
                         "window": m["attention"].get("window")},
        "model": m,
        "data": {k: v for k, v in plain["data"].items()},
        "seed": plain["seed"],
        "precision": precision,  # trainer.precision as asked (auto) and as run
        "params": count_params(m),
        "flops_per_token": flops_per_token(m, plain["data"].get("context") or data.required_len()),
        "steps": trainer.global_step,
        "tokens_seen": throughput.tokens,
        "wall_time_s": throughput.wall_time,  # the whole run's, across resumes
        "train_time_s": throughput.train_time,
        "eval_time_s": throughput.eval_time,  # validation passes; history[i].wall_time_s: when each one ended
        "time_to_first_step_s": throughput.first_step_at,
        "resumes": throughput.resumes,  # times this run was resumed from a checkpoint
        "tokens_per_second": throughput.tokens / max(throughput.train_time, 1e-9),
        "final": final,
        "best": best.best,
        "directions": {k: d for k, d in best.directions.items() if k in final or k in best.best},
        "history": best.history,
        "budget": plain.get("budget"),
        "overrides": _overrides(),
        "torch": torch.__version__,
        "load": {"loadavg": list(os.getloadavg()), "cpu_count": os.cpu_count()},  # tok/s on a busy machine?
    }


def _overrides() -> list[str]:
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except Exception:  # not running under Hydra
        return []


def _print_banner(plain: dict, data, trainer, run_dir: Path, ckpt: str | None, ckpt_step: int,
                  precision: dict) -> None:
    """What is about to run, in two lines: the model, its cost per token, and where it runs and writes."""
    m = plain["model"]
    counts = count_params(m)
    params = counts["total"]
    active = f" ({counts['active'] / 1e6:.2f}M active)" if counts["active"] != params else ""  # sparse: ffn=moe
    flops = flops_per_token(m, plain["data"].get("context") or data.required_len())["train"]
    parts = "/".join(str(p) for p in (m["attention"]["name"], m["position"]["name"],
                                      f"{m['norm']['placement']}-{m['norm']['type']}", m["ffn"]["name"]))
    device = f"{trainer.num_devices}x {trainer.strategy.root_device.type}"
    n = torch.get_num_threads()
    threads = f", {n} thread{'s' * (n > 1)}" if trainer.strategy.root_device.type == "cpu" else ""
    if trainer.strategy.root_device.type == "cuda" and plain.get("tf32", True):
        threads = ", TF32 matmuls"
    resumed = f"; resuming from {ckpt} at step {ckpt_step}" if ckpt else ""  # step read once, when checked
    how = f" ({precision['requested']}: {precision['reason']})" if precision["requested"] != precision["used"] else ""
    print(f"{m['name']} ({parts}): {params / 1e6:.2f}M parameters{active}, {flops / 1e6:.1f} MFLOPs per token "
          f"(training), {plain['trainer']['max_steps']} steps\nprecision {precision['used']}{how} on "
          f"{device}{threads}; run directory: {run_dir}{resumed}",
          flush=True)


def resume_command(run_dir: Path) -> str:
    """The command that continues this run where it stopped: the same overrides, in the same directory."""
    import shlex

    keep = [o for o in _overrides() if not o.lstrip("+~").startswith(("ckpt_path=", "hydra.run.dir="))]
    args = keep + ["ckpt_path=last", f"hydra.run.dir={run_dir}"]
    return "python train.py " + " ".join(shlex.quote(a) for a in args)


def _print_result(summary: dict, run_dir: Path) -> None:
    final = ", ".join(f"{k} {v:.4f}" for k, v in summary["final"].items())
    print(f"\n{summary['status']}: {summary['steps']} steps in {summary['wall_time_s']:.1f}s "
          f"({summary['tokens_per_second']:.0f} tok/s); {final}\nrun directory: {run_dir}", flush=True)


@torch.no_grad()
def _print_sample(module: ZooModule, data, plain: dict) -> None:
    from zoo.generate import generate, position_limit

    model, tok, s = module.model.eval(), data.tokenizer, plain["sample"]
    if data.is_task:
        pairs = data.splits["val"][:3]
        for src, tgt in pairs:
            pred = module.objective.predict(model, torch.tensor([src]), len(tgt))[0]
            print(f"{tok.decode(src)} -> {tok.decode(pred)} (expected {tok.decode(tgt)})")
        return
    if not MODEL.get(plain["model"]["name"]).next_token_lm:
        return  # masked LM and denoising models do not continue text
    prompt = torch.tensor([tok.encode(s["prompt"], errors="replace") or [tok.bos_id]])
    limit = position_limit(model)
    note = f" (past {limit} tokens, a sliding window of the last {limit})" \
        if limit is not None and prompt.shape[1] + s["max_new_tokens"] > limit else ""
    out = generate(model, prompt, s["max_new_tokens"], s["temperature"], s["top_k"], slide=True)
    print(f"--- sample{note} ---\n" + tok.decode(out[0].tolist(), skip_special=True) + "\n--------------", flush=True)


def main(cfg: DictConfig, run_dir: str | Path | None = None) -> int:
    """The body of train.py: run; bad input becomes one line and exit code 2, a crash a failed summary."""
    try:
        return run(cfg, run_dir)
    except (ConfigError, DataError, CheckpointError, KeyError, MissingMandatoryValue) as e:  # run() wrote the summary
        print(f"error: {_error_message(e)}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except Exception:
        traceback.print_exc()
        return EXIT_FAILED


def _error_message(e: Exception) -> str:
    if isinstance(e, MissingMandatoryValue):  # a `???` key left unset (train.py reports it before this)
        return f"{e.full_key}: required, not set; valid: {e.full_key}=<value> on the command line"
    if isinstance(e, (ConfigError, DataError, CheckpointError, WriteError)):
        return str(e)
    if isinstance(e, KeyError):
        return str(e.args[0]) if e.args else str(e)
    return f"{type(e).__name__}: {e}"


def final_metric(run_dir: str | Path, metric: str) -> float:
    """A run's final `metric` from its summary.json, for search sweepers. A failed or diverged run, or
    one that never logged the metric, scores the worst possible value (inf for losses, -inf for
    accuracies): a finished trial that the search ranks last, where nan would stop the Optuna sweeper.
    The direction is the one the summary records, else the one the objectives declare."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    summary = summary if isinstance(summary, dict) else {}
    direction = (summary.get("directions") or {}).get(metric)
    higher = direction == "max" if direction in ("min", "max") else higher_is_better(metric)
    worst = -math.inf if higher else math.inf
    if not summary:
        return worst
    value = summary.get("final", {}).get(metric) if summary.get("status") == "completed" else None
    return worst if value is None or not math.isfinite(value) else float(value)


def _write_failure(error: str, run_dir: str | Path | None) -> None:
    """A failed run still leaves a summary, so a sweep's report counts it instead of missing it."""
    try:
        run_dir = Path(run_dir or _hydra_output_dir())
    except ValueError:  # not under Hydra and no directory given: the caller has the error
        return
    with contextlib.suppress(RunDirError, OSError):  # best effort: a full disk must not hide the first error
        path = owned_path(run_dir, "summary.json")
        if not path.exists():
            atomic_write_json(path, {"status": "failed", "diverged": False, "error": error, "overrides": _overrides()})
