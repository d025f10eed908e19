"""summary.json: what a run did, as a typed record (`Summary`), written whatever happened: a diverged or
interrupted run writes its record, a failed one a short record with its error (`write_failure`). The report,
the ladder and search sweepers (`final_metric`) read these files; the keys are theirs, so they stay as they are."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from zoo.build import count_params, flops_per_token
from zoo.config.plan import RunPlan
from zoo.hardware import instruction_set
from zoo.io import RunDirError, atomic_write_json, owned_path, read_json
from zoo.registry import MODEL
from zoo.training.data import bits_per_char
from zoo.training.objectives import higher_is_better
from zoo.training.run_dir import hydra_output_dir, overrides


@dataclass
class Summary:
    """A finished, diverged or interrupted run. Add a field here and it is in summary.json."""

    status: str  # completed, diverged or interrupted
    diverged: bool
    diverged_step: int | None
    architecture: dict[str, Any]  # the component names, flat, for the report's columns
    model: dict[str, Any]  # the resolved model config, plain
    optim: dict[str, Any]  # the optimizer (optim=, zoo/optim/): its name and options, plain
    data: dict[str, Any]
    data_fingerprint: dict[str, str] | None  # what it trained on: source and sha256 (zoo.training.data)
    seed: int
    precision: dict[str, Any]  # trainer.precision as asked (auto) and as run
    params: dict[str, int]
    flops_per_token: dict[str, int]
    steps: int
    tokens_seen: int
    wall_time_s: float  # the whole run's, across resumes
    train_time_s: float
    eval_time_s: float  # validation passes; history[i].wall_time_s: when each one ended
    time_to_first_step_s: float | None
    resumes: int  # times this run was resumed from a checkpoint
    tokens_per_second: float
    final: dict[str, float]
    best: dict[str, Any]
    directions: dict[str, str]
    history: list[dict[str, Any]]
    budget: dict[str, Any] | str | None
    overrides: list[str]
    torch: str
    load: dict[str, Any]  # tok/s on a busy machine?
    cpu_kind: str  # zoo.hardware.cpu_kind(): what the kernels' rules were chosen for
    cpu_isa: str  # zoo.hardware.instruction_set(): float32 digits repeat only on the same one
    kernels_policy: str | list[str]  # kernels=auto, none or a list
    kernels: list[str]  # the kernels applied (zoo.kernels)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def write(self, run_dir: Path) -> None:
        atomic_write_json(owned_path(run_dir, "summary.json"), self.as_dict())

    def result_line(self, run_dir: Path) -> str:
        final = ", ".join(f"{k} {v:.4f}" for k, v in self.final.items())
        return (f"\n{self.status}: {self.steps} steps in {self.wall_time_s:.1f}s ({self.tokens_per_second:.0f} "
                f"tok/s); {final}\nrun directory: {run_dir}")


def summarize(plan: RunPlan, data: Any, trainer: Any, throughput: Any, best: Any, status: str,
              diverged_step: int | None, precision: dict[str, Any], kernels: dict[str, Any]) -> Summary:
    """The record of a run that trained: plan its config (the budget's record: what budget=... resized,
    zoo.config.budget.match_params), kernels what zoo.kernels applied (zoo.kernels.kernel_record)."""
    spec = plan.model
    final = {k: v for k, v in best.final.items() if k != "step"}
    if "val_loss" in final and not data.is_task and MODEL.get(spec.name).next_token_lm:  # per-token LM loss only
        final["val_ppl"] = math.exp(final["val_loss"])
        final["val_bpc"] = bits_per_char(final["val_loss"], data.tokens_per_char)
    return Summary(
        status=status,
        diverged=status == "diverged",
        diverged_step=diverged_step,
        architecture={"lineage": spec.name, "attention": spec.attention.name, "position": spec.position.name,
                      "norm": spec.norm.name, "placement": spec.norm.placement, "ffn": spec.ffn.name,
                      "window": getattr(spec.attention.options, "window", None)},  # none: a convolution
        model=spec.as_dict(),
        optim=plan.optim.as_dict(),
        data=plan.as_dict()["data"],
        data_fingerprint=getattr(data, "fingerprint", None),
        seed=plan.seed,
        precision=precision,
        params=count_params(spec),
        flops_per_token=flops_per_token(spec, plan.context or data.required_len()),
        steps=trainer.global_step,
        tokens_seen=throughput.tokens,
        wall_time_s=throughput.wall_time,
        train_time_s=throughput.train_time,
        eval_time_s=throughput.eval_time,
        time_to_first_step_s=throughput.first_step_at,
        resumes=throughput.resumes,
        tokens_per_second=throughput.tokens / max(throughput.train_time, 1e-9),
        final=final,
        best=best.best,
        directions={k: d for k, d in best.directions.items() if k in final or k in best.best},
        history=best.history,
        budget=dict(plan.budget) if plan.budget is not None else None,
        overrides=overrides(),
        torch=torch.__version__,
        load={"loadavg": list(os.getloadavg()), "cpu_count": os.cpu_count()},
        cpu_isa=instruction_set(),
        **kernels,
    )


def write_failure(error: str, run_dir: str | Path | None) -> None:
    """A failed run still leaves a summary, so a sweep's report counts it instead of missing it."""
    try:
        run_dir = Path(run_dir or hydra_output_dir())
    except ValueError:  # not under Hydra and no directory given: the caller has the error
        return
    with contextlib.suppress(RunDirError, OSError):  # best effort: a full disk must not hide the first error
        path = owned_path(run_dir, "summary.json")
        if not path.exists():
            atomic_write_json(path, {"status": "failed", "diverged": False, "error": error, "overrides": overrides()})


def final_metric(run_dir: str | Path, metric: str) -> float:
    """A run's final `metric` from its summary.json, for search sweepers. A failed or diverged run, or
    one that never logged the metric, scores the worst possible value (inf for losses, -inf for
    accuracies): a finished trial that the search ranks last, where nan would stop the Optuna sweeper.
    The direction is the one the summary records, else the one the objectives declare."""
    try:
        summary = read_json(Path(run_dir) / "summary.json")
    except (OSError, ValueError):  # damaged or too large (zoo.io.FileFormatError): the trial scores worst
        summary = {}
    summary = summary if isinstance(summary, dict) else {}
    direction = (summary.get("directions") or {}).get(metric)
    higher = direction == "max" if direction in ("min", "max") else higher_is_better(metric)
    worst = -math.inf if higher else math.inf
    if not summary:
        return worst
    value = summary.get("final", {}).get(metric) if summary.get("status") == "completed" else None
    return worst if value is None or not math.isfinite(value) else float(value)
