"""A run's config checked, its data loaded and its model sized from them, before any training: the vocabulary and
context from the data, d_ff from the budget (zoo.config.budget), trainer.max_steps from tokens_per_param. Works on
zoo.config.plan's own copy of the config as composed (any value may be wrong here: each is checked, in one line),
which becomes the run's stored form; the plan then reads it typed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from zoo.build import checked, count_params, resolve_config
from zoo.component import ConfigError
from zoo.config.budget import BUDGETS, OverBudget, match_params
from zoo.config.checks import check_memory, check_run
from zoo.config.data import DataOptions, data_options
from zoo.config.schema import json_copy
from zoo.registry import MODEL, POSITION
from zoo.spec import ModelSpec

# What loads the data a run trains on: its typed data section, the seed, the steps -> the data (a Lightning data
# module: zoo.training.data.build_data, which the runner hands over; the config does not import training)
LoadData = Callable[[DataOptions, int, int], Any]


class Pretrained(Protocol):
    """init_from's config side (zoo.training.pretrained, which the runner hands over)."""

    def apply(self, plain: dict[str, Any], overrides: list[str]) -> Any: ...

    def vocab_size(self, init: Any, tokenizer_vocab: int) -> int: ...


def size_run(plain: dict[str, Any], load_data: LoadData, pretrained: Pretrained | None = None,
             overrides: Sequence[str] = ()) -> tuple[Any, ModelSpec, dict[str, Any] | None]:
    """Validate the config, load data, then size the model from it (vocab, context) and the budget: (the data, the
    model's spec, the budget's record or None). plain is the plan's copy of the run config as composed; it becomes
    the stored form (its model the resolved one, plain). The model is resolved once, before the data loads; what
    the data and the budget size is set on that spec (dataclasses.replace), never resolved again."""
    check_run(plain)
    # init_from: the checkpoint's architecture and tokenizer
    init = pretrained.apply(plain, list(overrides)) if pretrained is not None else None
    early = _before_data(plain)
    model_cfg, trainer = plain["model"], plain["trainer"]
    steps = trainer["max_steps"] * trainer.get("accumulate_grad_batches", 1)
    data: Any = load_data(data_options(plain["data"]), plain["seed"], steps)
    if data.is_task and not MODEL.get(model_cfg["name"]).generates and data.task.name == "addition":
        raise ConfigError("data.task: encoder_only fills the target positions in one pass and needs the target "
                          "length, which addition does not fix; use data=copy, reverse or sort, or "
                          "model=decoder_only / encoder_decoder")
    need = data.required_len()
    max_seq_len = model_cfg.get("max_seq_len")
    if max_seq_len is None:
        max_seq_len = need
    elif max_seq_len < need and POSITION.get(early.position.name).hard_limit:
        raise ConfigError(f"model.max_seq_len: {max_seq_len} learned positions cannot cover sequences "
                          f"of {need} tokens (data.context or the task's longest test example); raise it or "
                          "leave it null")
    vocab_size = data.tokenizer.vocab_size if init is None or pretrained is None else \
        pretrained.vocab_size(init, data.tokenizer.vocab_size)
    spec = checked(dataclasses.replace(early, vocab_size=vocab_size, max_seq_len=max_seq_len))
    if init is not None and spec.parametrization != "standard":
        raise ConfigError(f"model.parametrization: {spec.parametrization} rescales the outputs and "
                          "learning rates of weights trained in the standard parametrization; valid: standard "
                          "with init_from")
    budget = plain.get("budget")
    record = None
    if budget is not None:  # config.yaml keeps the record in budget's place: a resume compares it
        spec, record = match_params(spec, count=BUDGETS[budget])
        plain["budget"] = record
    plain["model"] = spec.as_dict()
    if plain.get("tokens_per_param") is not None:
        apply_token_rule(plain, spec, data)
    check_memory(spec, trainer, optim=plain["optim"])
    return data, spec, record


def _before_data(plain: dict[str, Any]) -> ModelSpec:
    """size_run's checks that need no data (after check_run and init_from): the model resolved with what the data
    will set left at a placeholder, the trainer's steps and threads, and the budget's name."""
    model_cfg = plain["model"]
    vocab = model_cfg.get("vocab_size") or 1 + max(model_cfg.get("adaptive_cutoffs") or [0])  # the cutoffs fit
    early = resolve_config({**model_cfg, "vocab_size": vocab,
                            "max_seq_len": model_cfg.get("max_seq_len") or 1})  # names and shapes, before any data
    # a lower bound (the vocabulary is not known yet), before any data
    check_memory(early, plain["trainer"], optim=plain["optim"])
    trainer = plain["trainer"]
    if not isinstance(trainer.get("max_steps"), int) or trainer["max_steps"] <= 0:
        raise ConfigError(f"trainer.max_steps: must be a positive integer, got {trainer.get('max_steps')!r}")
    threads = plain.get("threads")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads <= 0):
        raise ConfigError(f"threads: must be a positive integer or null (torch's default), got {threads!r}")
    budget = plain.get("budget")
    if budget is not None and not (isinstance(budget, str) and budget in BUDGETS):  # a list is not hashable
        raise ConfigError(f"budget: unknown '{budget}'; valid: {', '.join(BUDGETS)}, null")
    return early


def preflight(plain: dict[str, Any]) -> None:
    """Raise the ConfigError that size_run would raise before it loads any data, or for a budget that no size of
    the FFN can meet (OverBudget, whatever the data): what a launcher can know of each job of a sweep before it
    starts any (hydra_plugins/zoo_launcher). plain: the run config as composed and resolved; left as it is. A run
    from init_from takes its architecture from the checkpoint: only check_run here."""
    plain = json_copy(plain)
    check_run(plain)
    if plain.get("init_from") is not None:
        return
    early = _before_data(plain)
    if plain.get("budget") is not None:
        try:
            match_params(early, count=BUDGETS[plain["budget"]])
        except OverBudget:
            raise
        except ConfigError:  # within 1% or not depends on the vocabulary: the run says, once its data has loaded
            pass


def apply_token_rule(plain: dict[str, Any], spec: ModelSpec, data: Any) -> None:
    """tokens_per_param: trainer.max_steps from the model's size, so every rung of a ladder trains on the same
    number of tokens per parameter (and evals_per_run spaces the evaluations alike). Parameters are counted as
    the budget counts them: the active ones, where experts make them fewer than all."""
    trainer, accumulate = plain["trainer"], plain["trainer"].get("accumulate_grad_batches", 1)
    tokens_per_step = data.batch_size * data.required_len() * accumulate
    params = count_params(spec)["active"]
    trainer["max_steps"] = max(1, math.ceil(plain["tokens_per_param"] * params / tokens_per_step))
    if plain.get("evals_per_run"):
        trainer["val_check_interval"] = max(1, trainer["max_steps"] * accumulate // plain["evals_per_run"])  # batches
    data.steps = trainer["max_steps"] * accumulate
