"""What a run says on the console, said once: `say` (stdout) and `warn` (stderr) through the `zoo` logger, on the
first process only; Lightning's start-up chatter filtered out; the start banner and the closing sample.

Under DDP every process runs the same code; only rank zero speaks, so a line is never printed once per device.
Errors are the exception: each process reports its own (`warn` passes on every rank).
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from lightning_utilities.core.rank_zero import rank_zero_only

from zoo.build import count_params, flops_per_token
from zoo.config.plan import RunPlan
from zoo.config.schema import SampleConfig
from zoo.generate import generate, position_limit
from zoo.io import is_secondary_rank
from zoo.registry import MODEL


class _Console(logging.Handler):
    """Info to stdout, warnings and errors to stderr, flushed: the streams are looked up at each line, so a
    test capturing them (capsys) sees what the run says."""

    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stderr if record.levelno >= logging.WARNING else sys.stdout
        print(self.format(record), file=stream, flush=True)


class _RankZero(logging.Filter):
    """Info lines only from the first process (Lightning sets rank_zero_only.rank once the strategy knows it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        first = getattr(rank_zero_only, "rank", 0) == 0 and not is_secondary_rank()
        return first or record.levelno >= logging.WARNING


log = logging.getLogger("zoo")
if not log.handlers:  # once per process, however often this module is reloaded
    log.addHandler(_Console())
    log.addFilter(_RankZero())
    log.setLevel(logging.INFO)
    log.propagate = False  # Hydra's root handlers would print every line a second time


def say(message: str) -> None:
    """One line (or a few) for the user, from the first process only."""
    log.info(message)


def warn(message: str) -> None:
    """A warning or an error, on stderr, from every process."""
    log.warning(message)


class _QuietLightning(logging.Filter):
    """Drop Lightning's start-up chatter (accelerator lines, tips); keep what matters (resuming, stopping)."""

    # Resuming and stopping are said by zoo's own lines (the start banner, the result line).
    NOISE = ("GPU available", "TPU available", "Tip:", "HPU available", "LOCAL_RANK", "`Trainer.fit` stopped",
             "Restoring states from the checkpoint", "Restored all states from the checkpoint",
             "Initializing distributed", "distributed_backend=",  # the banner says how many devices
             "Automatic Mixed Precision")  # and the precision

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(n in record.getMessage() for n in self.NOISE)


def quiet_lightning() -> None:
    """Filter Lightning's loggers and the warnings a zoo run triggers by design."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
                 "lightning.fabric.utilities.distributed", "lightning_utilities.core.rank_zero"):
        logging.getLogger(name).addFilter(_QuietLightning())
    warnings.filterwarnings("ignore", message=".*exists and is not empty.*")  # the run dir holds .hydra/ by design
    warnings.filterwarnings("ignore", message=".*LeafSpec.*is deprecated.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")  # batches are built in-process


def banner(plan: RunPlan, data: Any, trainer: Any, run_dir: Path, ckpt: str | None, ckpt_step: int,
           precision: dict[str, Any]) -> str:
    """What is about to run, in two lines: the model, its cost per token, and where it runs and writes."""

    spec = plan.model
    counts = count_params(spec)
    params = counts["total"]
    active = f" ({counts['active'] / 1e6:.2f}M active)" if counts["active"] != params else ""  # sparse: ffn=moe
    flops = flops_per_token(spec, plan.context or data.required_len())["train"]
    parts = "/".join((spec.attention.name, spec.position.name, f"{spec.norm.placement}-{spec.norm.name}",
                      spec.ffn.name))
    kind = trainer.strategy.root_device.type
    device = f"{trainer.num_devices}x {kind}"
    n = torch.get_num_threads()
    threads = f", {n} thread{'s' * (n > 1)}" if kind == "cpu" else ""
    if kind == "cuda" and plan.tf32:
        threads = ", TF32 matmuls"
    resumed = f"; resuming from {ckpt} at step {ckpt_step}" if ckpt else ""  # step read once, when checked
    how = f" ({precision['requested']}: {precision['reason']})" if precision["requested"] != precision["used"] else ""
    return (f"{spec.name} ({parts}): {params / 1e6:.2f}M parameters{active}, {flops / 1e6:.1f} MFLOPs per token "
            f"(training), {plan.trainer.max_steps} steps\nprecision {precision['used']}{how} on "
            f"{device}{threads}; run directory: {run_dir}{resumed}")


def shares_sweep_console() -> bool:
    """Whether this is a multirun's job printing on the sweep's own console (not on a console.log of its own)."""
    import os

    try:
        multirun = str(HydraConfig.get().mode) == "RunMode.MULTIRUN"
    except (ImportError, ValueError):  # not under Hydra
        return False
    return multirun and "ZOO_JOB_CONSOLE" not in os.environ  # hydra_plugins/zoo_launcher sets it


@torch.no_grad()  # type: ignore[untyped-decorator]  # torch is read untyped (pyproject.toml)
def say_sample(model: Any, objective: Any, data: Any, s: SampleConfig) -> None:
    """What the trained model makes of the prompt (a task: its first validation examples), as sample.* asks. Not
    in a sweep's job that shares the sweep's console (jobs run one after another): a sample per job would bury the
    sweep's lines, as the parallel launcher's jobs keep theirs in their own console.log."""
    if shares_sweep_console():
        return
    model, tok = model.eval(), data.tokenizer
    if data.is_task:
        for src, tgt in data.splits["val"][:3]:
            pred = objective.predict(model, torch.tensor([src]), len(tgt))[0]
            say(f"{tok.decode(src)} -> {tok.decode(pred)} (expected {tok.decode(tgt)})")
        return
    if not MODEL.get(model.cfg.name).next_token_lm:
        return  # masked LM and denoising models do not continue text
    prompt = torch.tensor([tok.encode(s.prompt, errors="replace") or [tok.bos_id]])
    limit = position_limit(model)
    note = f" (past {limit} tokens, a sliding window of the last {limit})" \
        if limit is not None and prompt.shape[1] + s.max_new_tokens > limit else ""
    out = generate(model, prompt, s.max_new_tokens, s.temperature, s.top_k, slide=True)
    say(f"--- sample{note} ---\n" + tok.decode(out[0].tolist(), skip_special=True) + "\n--------------")
