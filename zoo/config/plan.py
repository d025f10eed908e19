"""plan(composed) -> RunPlan: the whole run, checked, sized and frozen once, read by attribute from then on.

    composed (Hydra's config, as plain data)
      -> zoo.config.checks.check_run        every value, one line per bad one, before any data
      -> zoo.config.sizing.size_run          the model resolved once; data loaded; vocabulary, context, budget,
                                             tokens_per_param set on the spec (dataclasses.replace)
      -> RunPlan                             typed sections: model (zoo.spec.ModelSpec), optim (a Part), data (its
                                             kind's options, zoo.config.data), trainer, sample, loggers, the rest

The plain form is kept beside the typed one, for where a run is stored or shown only: config.yaml, the
checkpoints' hyper_parameters, the dashboards' parameters, and the resume's comparison with a stored run
(`as_dict()`, a copy). A run resumed from its own last checkpoint is the one change a plan gets after it is made
(`resuming`), and that comes as a new plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zoo.config.data import DataOptions, WindowOptions, data_options
from zoo.config.schema import SampleConfig, json_copy
from zoo.config.sizing import LoadData, Pretrained, size_run
from zoo.optim import OptimOptions, resolve
from zoo.spec import ModelSpec, Part


@dataclass(frozen=True, kw_only=True)
class TrainerOptions:
    """The trainer section (conf/trainer/: Lightning Trainer arguments): the ones zoo reads, typed, and every
    argument as it goes to Lightning's Trainer."""

    max_steps: int  # sized: tokens_per_param sets it from the model's size
    accumulate_grad_batches: int = 1
    val_check_interval: int | str | None = None  # steps between evaluations (or Lightning's time string)
    precision: str | int | None = "32-true"  # as configured; auto is resolved by the run (zoo.hardware)
    arguments: Mapping[str, Any] = field(default_factory=dict)  # all of them, sized, for L.Trainer(**arguments)

    @classmethod
    def from_plain(cls, node: Mapping[str, Any]) -> TrainerOptions:
        return cls(max_steps=node["max_steps"], accumulate_grad_batches=node.get("accumulate_grad_batches", 1),
                   val_check_interval=node.get("val_check_interval"), precision=node.get("precision", "32-true"),
                   arguments=dict(node))


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """One run, checked and sized (zoo/config/schema.py ZooConfig documents each key and its default)."""

    model: ModelSpec
    optim: Part[OptimOptions]
    data: DataOptions
    trainer: TrainerOptions
    sample: SampleConfig
    logger: Mapping[str, Mapping[str, Any]]  # name -> the Lightning logger's `_target_` node (conf/logger/)
    seed: int
    threads: int | None
    compile: bool
    kernels: Any  # auto, none, or a list of kernel names (zoo.kernels.check_policy)
    init_from: str | None
    tf32: bool
    ckpt_path: str | None
    overwrite: bool
    budget: Mapping[str, Any] | None  # budget=params: the record of the resize (zoo.config.budget.match_params)
    tokens_per_param: float | None
    evals_per_run: int | None
    checkpoints: str
    optimized_metric: str | None
    stored: Mapping[str, Any] = field(repr=False)  # the plain form; read it through as_dict()

    @property
    def context(self) -> int | None:
        """data.context: the tokens of a training window; None for a task, whose examples fix their lengths."""
        return self.data.context if isinstance(self.data, WindowOptions) else None

    def as_dict(self) -> dict[str, Any]:
        """The plain form (a copy): what config.yaml, checkpoints and dashboards hold."""
        plain: dict[str, Any] = json_copy(self.stored)
        return plain

    def resuming(self, ckpt_path: str) -> RunPlan:
        """This plan, resuming from ckpt_path (a sweep's run continued from its own last checkpoint)."""
        return dataclasses.replace(self, ckpt_path=ckpt_path, stored={**self.stored, "ckpt_path": ckpt_path})


def plan(composed: Mapping[str, Any], load_data: LoadData, pretrained: Pretrained | None = None,
         overrides: Sequence[str] = ()) -> tuple[RunPlan, Any]:
    """The run `composed` asks for (Hydra's config as plain data, left as it is) as a RunPlan, and its data.
    load_data and pretrained are training's (zoo.training.data.build_data, zoo.training.pretrained); overrides: the
    command line's, which init_from needs (what it sets explicitly goes on top of the checkpoint's architecture)."""
    stored: dict[str, Any] = json_copy(dict(composed))
    data, spec, record = size_run(stored, load_data, pretrained, overrides)
    sample = stored.get("sample") or {}
    names = {f.name for f in dataclasses.fields(SampleConfig)}
    return RunPlan(
        model=spec, optim=resolve(stored.get("optim")), data=data_options(stored["data"]),
        trainer=TrainerOptions.from_plain(stored["trainer"]),
        sample=SampleConfig(**{k: v for k, v in sample.items() if k in names}),
        logger={name: dict(node) for name, node in (stored.get("logger") or {}).items()},
        seed=stored["seed"], threads=stored.get("threads"), compile=stored.get("compile", False),
        kernels=stored.get("kernels", "auto"), init_from=stored.get("init_from"), tf32=stored.get("tf32", True),
        ckpt_path=stored.get("ckpt_path"), overwrite=stored.get("overwrite", False), budget=record,
        tokens_per_param=stored.get("tokens_per_param"), evals_per_run=stored.get("evals_per_run"),
        checkpoints=stored.get("checkpoints", "best_weights"), optimized_metric=stored.get("optimized_metric"),
        stored=stored), data
