"""One training run: config -> data -> model -> Lightning fit -> evaluation, sample, summary.json.

Every run directory ends up holding config.yaml (resolved), metrics.csv, checkpoints/{last,best}.ckpt
and summary.json, whatever happened: a diverged or failed run still writes its summary.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import sys
import time
import traceback
import warnings
from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from zoo.build import ConfigError, count_params, flatten_config, flops_per_token, resolve_config
from zoo.data.corpus import DataError
from zoo.io import atomic_write, atomic_write_json, atomic_write_text
from zoo.report import higher_is_better
from zoo.training.callbacks import BestMetrics, DivergenceGuard, GracefulStop, Throughput
from zoo.training.checkpoint import AtomicCheckpointIO, CheckpointError, read_checkpoint
from zoo.training.data import bits_per_char, build_data
from zoo.training.loggers import build_loggers, finish_loggers, log_config
from zoo.training.module import ZooModule


class _QuietLightning(logging.Filter):
    """Drop Lightning's start-up chatter (accelerator lines, tips); keep what matters (resuming, stopping)."""

    NOISE = ("GPU available", "TPU available", "Tip:", "HPU available", "LOCAL_RANK")

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(n in record.getMessage() for n in self.NOISE)


logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_QuietLightning())
warnings.filterwarnings("ignore", message=".*exists and is not empty.*")  # the run dir holds .hydra/ by design
warnings.filterwarnings("ignore", message=".*LeafSpec.*is deprecated.*")
warnings.filterwarnings("ignore", message=".*does not have many workers.*")  # batches are built in-process

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_DIVERGED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def run(cfg: DictConfig, run_dir: str | Path | None = None) -> int:
    """Train as `cfg` says, in `run_dir` (default: Hydra's output directory). Returns an exit code."""
    start = time.perf_counter()
    run_dir = Path(run_dir or _hydra_output_dir())
    run_dir.mkdir(parents=True, exist_ok=True)
    plain = OmegaConf.to_container(cfg, resolve=True)
    data = _prepare(plain)  # raises ConfigError / DataError before any training
    if plain.get("threads"):  # e.g. 1 per run when a joblib sweep runs one run per core
        torch.set_num_threads(plain["threads"])
    ckpt = _checkpoint_path(plain.get("ckpt_path"), run_dir, plain["model"])
    atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.create(plain)))

    L.seed_everything(plain["seed"], workers=True, verbose=False)
    module = ZooModule(plain)
    module.tokenizer_state = data.tokenizer.state_dict()
    data.objective = module.objective
    throughput, guard, best = Throughput(start), DivergenceGuard(), BestMetrics()
    stop = GracefulStop(str(run_dir / "checkpoints" / "last.ckpt"))
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=run_dir / "checkpoints", filename="best", monitor="val_loss", mode="min", save_last=True,
        save_top_k=1, auto_insert_metric_name=False, enable_version_counter=False)
    earlier_metrics = _metrics_before(run_dir / "metrics.csv", ckpt)  # the CSV logger starts a new file
    loggers = build_loggers(plain, run_dir)
    trainer_cfg = dict(plain["trainer"])
    trainer = L.Trainer(
        **trainer_cfg, logger=loggers or False,
        callbacks=[throughput, guard, best, stop, checkpoints, L.pytorch.callbacks.TQDMProgressBar(refresh_rate=10)],
        plugins=[AtomicCheckpointIO()],
        num_sanity_val_steps=0, enable_model_summary=False, default_root_dir=run_dir,
        check_val_every_n_epoch=None, use_distributed_sampler=False,  # StepLoader shards batches itself
    )
    log_config(loggers, plain)
    status = "completed"
    trainer.fit(module, datamodule=data, ckpt_path=ckpt)
    if trainer.interrupted or stop.signal is not None:
        status = "interrupted"
    if guard.step is not None:
        status = "diverged"
    elif status == "completed" and (not best.final or best.final["step"] != trainer.global_step):
        trainer.validate(module, datamodule=data, verbose=False)  # the final evaluation

    if earlier_metrics and (run_dir / "metrics.csv").is_file():
        _prepend_rows(run_dir / "metrics.csv", earlier_metrics)
    summary = _summary(plain, data, trainer, throughput, best, status, guard.step, start)
    if trainer.is_global_zero:
        atomic_write_json(run_dir / "summary.json", summary)
        finish_loggers(loggers, summary, run_dir)  # final metrics, artifacts; closes the runs
        _print_result(summary, run_dir)
        if status == "completed" and plain["sample"]["max_new_tokens"] > 0:
            _print_sample(module, data, plain)
    return {"completed": EXIT_OK, "diverged": EXIT_DIVERGED}.get(status, EXIT_INTERRUPTED)


def _hydra_output_dir() -> str:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.output_dir


def _prepare(plain: dict):
    """Validate the architecture, load data, then size the model from it (vocab, context)."""
    model_cfg = plain["model"]
    resolve_config({**model_cfg, "vocab_size": model_cfg.get("vocab_size") or 1,
                    "max_seq_len": model_cfg.get("max_seq_len") or 1})  # names and shapes, before any data
    trainer = plain["trainer"]
    if not isinstance(trainer.get("max_steps"), int) or trainer["max_steps"] <= 0:
        raise ConfigError(f"trainer.max_steps: must be a positive integer, got {trainer.get('max_steps')!r}")
    threads = plain.get("threads")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads <= 0):
        raise ConfigError(f"threads: must be a positive integer or null (torch's default), got {threads!r}")
    data = build_data(plain["data"], plain["seed"], trainer["max_steps"] * trainer.get("accumulate_grad_batches", 1))
    if data.is_task and model_cfg["name"] == "encoder_only" and data.task.name == "addition":
        raise ConfigError("data.task: encoder_only fills the target positions in one pass and needs the target "
                          "length, which addition does not fix; use data=copy, reverse or sort, or "
                          "model=decoder_only / encoder_decoder")
    need = data.required_len()
    if model_cfg.get("max_seq_len") is None:
        model_cfg["max_seq_len"] = need
    elif model_cfg["max_seq_len"] < need and model_cfg["position"]["name"] == "learned":
        raise ConfigError(f"model.max_seq_len: {model_cfg['max_seq_len']} learned positions cannot cover sequences "
                          f"of {need} tokens (data.context or the task's longest test example); raise it or "
                          "leave it null")
    model_cfg["vocab_size"] = data.tokenizer.vocab_size
    plain["model"] = resolve_config(model_cfg)
    budget = plain.get("budget")
    if budget not in (None, "params"):
        raise ConfigError(f"budget: unknown '{budget}'; valid: params, null")
    if budget == "params":
        plain["model"], plain["budget"] = match_params(plain["model"])
    return data


def match_params(model_cfg: dict, tolerance: float = 0.01) -> tuple[dict, dict]:
    """Resize d_ff so the model has the parameters of the baseline (MHA, 4x GELU FFN) within 1%.

    Used with budget=params, so a sweep over FFN or attention types compares them at equal size."""
    baseline = {**model_cfg, "attention": {**model_cfg["attention"], "name": "mha"},
                "ffn": {"name": "gelu", "d_ff": None}}
    baseline["attention"].pop("n_kv_heads", None)
    target = count_params(baseline)["total"]
    at = lambda d_ff: count_params({**model_cfg, "ffn": {**model_cfg["ffn"], "d_ff": d_ff}})["total"]
    per_unit = (at(16) - at(8)) / 8  # the count is linear in d_ff
    exact = 8 + (target - at(8)) / per_unit
    d_ff = max(8, 8 * round(exact / 8))  # a multiple of 8, as the defaults are, unless that misses by > 1%
    if abs(at(d_ff) - target) > tolerance * target:
        d_ff = max(1, round(exact))
    params = at(d_ff)
    if abs(params - target) > tolerance * target:
        raise ConfigError(f"budget: no d_ff brings {model_cfg['ffn']['name']} with {model_cfg['attention']['name']} "
                          f"within {tolerance:.0%} of the baseline's {target} parameters")
    resized = {**model_cfg, "ffn": {**model_cfg["ffn"], "d_ff": d_ff}}
    return resized, {"kind": "params", "baseline": "mha + gelu", "target_params": target, "d_ff": d_ff,
                     "params": params, "deviation": (params - target) / target}


def _checkpoint_path(ckpt: str | None, run_dir: Path, model_cfg: dict) -> str | None:
    """The checkpoint to resume from, checked: it loads safely and holds this run's architecture."""
    if ckpt is None:
        return None
    path = run_dir / "checkpoints" / "last.ckpt" if ckpt == "last" else Path(ckpt)
    if not path.is_file():
        hint = " (ckpt_path=last looks in <run dir>/checkpoints; pass hydra.run.dir=<the run's dir>)" \
            if ckpt == "last" else ""
        raise ConfigError(f"ckpt_path: no checkpoint at '{path}'{hint}")
    saved = read_checkpoint(path).get("hyper_parameters", {}).get("cfg", {}).get("model")
    if saved != model_cfg:
        ours, theirs = flatten_config(model_cfg), flatten_config(saved or {})
        diff = next((k for k in ours if theirs.get(k) != ours[k]), "name")
        raise ConfigError(f"ckpt_path: '{path}' holds a different architecture (model.{diff}: checkpoint "
                          f"{theirs.get(diff)!r}, this run {ours.get(diff)!r})")
    return str(path)


def _metrics_before(path: Path, ckpt: str | None) -> list[dict]:
    """On resume, the metrics rows logged before the checkpoint's step (later ones are redone)."""
    if ckpt is None or not path.is_file():
        return []
    step = read_checkpoint(ckpt).get("global_step", 0)
    with path.open(newline="") as f:
        return [row for row in csv.DictReader(f) if row.get("step") and int(row["step"]) < step]


def _prepend_rows(path: Path, rows: list[dict]) -> None:
    with path.open(newline="") as f:
        new = list(csv.DictReader(f))
    fields = list(dict.fromkeys([k for row in rows + new for k in row]))

    def write(f):
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows + new)

    atomic_write(path, write)


def _summary(plain, data, trainer, throughput, best, status, diverged_step, start) -> dict:
    m = plain["model"]
    final = {k: v for k, v in best.final.items() if k != "step"}
    if "val_loss" in final and not data.is_task and m["name"] == "decoder_only":  # per-token LM loss only
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
        "params": count_params(m),
        "flops_per_token": flops_per_token(m, plain["data"].get("context") or data.required_len()),
        "steps": trainer.global_step,
        "tokens_seen": throughput.tokens,
        "wall_time_s": time.perf_counter() - start,
        "train_time_s": throughput.train_time,
        "time_to_first_step_s": throughput.first_step_at,
        "tokens_per_second": throughput.tokens / max(throughput.train_time, 1e-9),
        "final": final,
        "best": best.best,
        "history": best.history,
        "budget": plain.get("budget"),
        "overrides": _overrides(),
        "torch": torch.__version__,
    }


def _overrides() -> list[str]:
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except Exception:  # not running under Hydra
        return []


def _print_result(summary: dict, run_dir: Path) -> None:
    final = ", ".join(f"{k} {v:.4f}" for k, v in summary["final"].items())
    print(f"\n{summary['status']}: {summary['steps']} steps in {summary['wall_time_s']:.1f}s "
          f"({summary['tokens_per_second']:.0f} tok/s); {final}\nrun directory: {run_dir}", flush=True)


@torch.no_grad()
def _print_sample(module: ZooModule, data, plain: dict) -> None:
    from zoo.generate import generate

    model, tok, s = module.model.eval(), data.tokenizer, plain["sample"]
    if data.is_task:
        pairs = data.splits["val"][:3]
        for src, tgt in pairs:
            pred = module.objective.predict(model, torch.tensor([src]), len(tgt))[0]
            print(f"{tok.decode(src)} -> {tok.decode(pred)} (expected {tok.decode(tgt)})")
        return
    if plain["model"]["name"] != "decoder_only":
        return  # masked LM and denoising models do not continue text
    prompt = torch.tensor([tok.encode(s["prompt"], errors="replace") or [tok.bos_id]])
    room = (model.decoder.position.max_len or 10**9) - prompt.shape[1]
    out = generate(model, prompt, min(s["max_new_tokens"], room), s["temperature"], s["top_k"])
    print("--- sample ---\n" + tok.decode(out[0].tolist(), skip_special=True) + "\n--------------", flush=True)


def main(cfg: DictConfig, run_dir: str | Path | None = None) -> int:
    """The body of train.py: run; bad input becomes one line and exit code 2, a crash a failed summary."""
    try:
        return run(cfg, run_dir)
    except (ConfigError, DataError, CheckpointError, KeyError) as e:
        msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        print(f"error: {msg}", file=sys.stderr, flush=True)
        _write_failure(msg, run_dir)
        return EXIT_CONFIG
    except Exception as e:
        traceback.print_exc()
        _write_failure(f"{type(e).__name__}: {e}", run_dir)
        return EXIT_FAILED


def final_metric(run_dir: str | Path, metric: str) -> float:
    """A run's final `metric` from its summary.json, for search sweepers. A failed or diverged run, or
    one that never logged the metric, scores the worst possible value (inf for losses, -inf for
    accuracies): a finished trial that the search ranks last, where nan would stop the Optuna sweeper."""
    worst = -math.inf if higher_is_better(metric) else math.inf
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return worst
    value = summary.get("final", {}).get(metric) if summary.get("status") == "completed" else None
    return worst if value is None or not math.isfinite(value) else float(value)


def _write_failure(error: str, run_dir: str | Path | None) -> None:
    """A failed run still leaves a summary, so a sweep's report counts it instead of missing it."""
    try:
        run_dir = Path(run_dir or _hydra_output_dir())
    except ValueError:  # not under Hydra and no directory given: the caller has the error
        return
    if not (run_dir / "summary.json").exists():
        atomic_write_json(run_dir / "summary.json", {"status": "failed", "diverged": False, "error": error,
                                                     "overrides": _overrides()})
