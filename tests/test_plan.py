"""The run's plan (zoo.config.plan): made once from the composed config, typed, sized and frozen, its plain form
kept for where a run is stored. A run resolves its model once: zoo.build.resolve_config makes the ModelSpec from
the composed config, and everything after (the data's vocabulary and context, budget=params, muP's reference
widths, the module the run trains) works on that spec, changed with dataclasses.replace, never resolved again."""

import dataclasses
import sys

import pytest
from omegaconf import OmegaConf

import zoo.build
from tests.helpers import TINY, TINY_TASK, compose_cfg
from zoo.config.data import TaskOptions, TextOptions
from zoo.config.plan import RunPlan, plan
from zoo.spec import ModelSpec
from zoo.training.data import build_data
from zoo.training.module import ZooModule


def composed(overrides: list[str]) -> dict:
    return OmegaConf.to_container(compose_cfg(overrides), resolve=True)


@pytest.fixture
def resolutions(monkeypatch):
    """Every resolution of a model config (a call of resolve_config with anything but a spec), counted wherever
    a module holds the function."""
    original, calls = zoo.build.resolve_config, []

    def counted(model_cfg):
        if not isinstance(model_cfg, ModelSpec):
            calls.append(model_cfg)
        return original(model_cfg)

    for module in list(sys.modules.values()):
        if module is not None and module.__name__.startswith(("zoo", "tests")) and \
                getattr(module, "resolve_config", None) is original:
            monkeypatch.setattr(module, "resolve_config", counted)
    return calls


@pytest.mark.parametrize("overrides", [
    ["budget=params", "ffn=swiglu"],
    ["model.parametrization=mup", "model.mup_base_d_model=16"],
    ["budget=params", "model.parametrization=mup", "model.mup_base_d_model=16", "attention=gqa",
     "model.attention.n_kv_heads=1"],
], ids=["budget", "mup", "budget+mup"])
def test_a_run_resolves_its_model_once(resolutions, overrides):
    run_plan, data = plan(composed([*TINY, *overrides]), build_data)  # as zoo.training.runner makes it
    module = ZooModule(run_plan)
    assert len(resolutions) == 1
    spec = run_plan.model
    assert module.model.cfg is spec and spec.vocab_size == data.tokenizer.vocab_size
    assert spec.max_seq_len == data.required_len() and run_plan.as_dict()["model"] == spec.as_dict()
    if "budget=params" in overrides:
        assert run_plan.budget is not None and run_plan.budget["kind"] == "params"
        assert run_plan.budget["d_ff"] == spec.ffn.options.d_ff


def test_the_plan_is_typed_sized_and_frozen_and_keeps_its_plain_form():
    asked = composed([*TINY, "tokens_per_param=2", "evals_per_run=2", "optim.lr=0.01"])
    before = OmegaConf.to_container(OmegaConf.create(asked))
    run_plan, data = plan(asked, build_data)
    assert asked == before  # the composed config is left as it was: the plan works on its own copy
    assert isinstance(run_plan.data, TextOptions) and run_plan.data.context == 16 and run_plan.context == 16
    assert run_plan.optim.name == "adamw" and run_plan.optim.options.lr == 0.01
    assert run_plan.optim.options.warmup_steps == 100  # left out: its default
    # tokens_per_param sized the steps, and evals_per_run the evaluations, in the typed and the plain form alike
    steps = run_plan.trainer.max_steps
    params = zoo.build.count_params(run_plan.model)["active"]
    assert steps == -(-2 * params // (data.batch_size * 16)) and data.steps == steps
    stored = run_plan.as_dict()
    assert stored["trainer"]["max_steps"] == steps == run_plan.trainer.arguments["max_steps"]
    assert run_plan.trainer.val_check_interval == stored["trainer"]["val_check_interval"] == steps // 2
    assert stored["data"] == asked["data"] and stored["model"] == run_plan.model.as_dict()
    with pytest.raises(dataclasses.FrozenInstanceError):
        run_plan.seed = 1  # type: ignore[misc]
    stored["seed"] = 1  # as_dict is a copy
    assert run_plan.as_dict()["seed"] == 0
    resumed = run_plan.resuming("last")
    assert resumed.ckpt_path == "last" == resumed.as_dict()["ckpt_path"] and run_plan.ckpt_path is None


def test_the_plan_has_a_typed_field_for_every_key_of_the_schema():
    """RunPlan (the typed record) and ZooConfig (what Hydra composes, each key's default) name the same keys."""
    from zoo.config.schema import ZooConfig

    schema = [f.name for f in dataclasses.fields(ZooConfig)]
    assert sorted(schema) == sorted(f.name for f in dataclasses.fields(RunPlan) if f.name != "stored")


def test_a_task_plan_reads_its_kinds_options():
    run_plan, data = plan(composed([*TINY_TASK, "data=copy"]), build_data)
    assert isinstance(run_plan.data, TaskOptions) and run_plan.data.task == "copy" and run_plan.context is None
    assert run_plan.data.eval_examples == 16 and data.is_task
    assert isinstance(run_plan, RunPlan) and run_plan.model.max_seq_len == data.required_len()


@pytest.mark.parametrize("overrides, refusal", [
    (["budget=flops"], "budget: unknown 'flops'; valid: params, active_params, null"),
    (["model.n_heads=3"], "model.d_model: 32 is not divisible by n_heads=3"),
    (["trainer.max_steps=0"], "trainer.max_steps: must be a positive integer, got 0"),
    (["ffn=pkm", "budget=params"], "budget: no size of ffn 'pkm' fits with mha: at size 1 the model still has "),
    (["ffn=swiglu", "budget=params"], None),
], ids=["budget-name", "heads", "steps", "pkm-over-budget", "accepted"])
def test_preflight_refuses_as_the_run_does(overrides, refusal):
    """What a sweep's launcher checks of each job before starting any (zoo.config.sizing.preflight): the refusals the
    plan makes before its data loads, and a budget no size of the FFN can meet, in the plan's words; a run the plan
    accepts passes. The composed config is left as it was."""
    from zoo.component import ConfigError
    from zoo.config.sizing import preflight

    asked = composed([*TINY, *overrides])
    before = OmegaConf.to_container(OmegaConf.create(asked))
    if refusal is None:
        preflight(asked)
        plan(asked, build_data)
    else:
        with pytest.raises(ConfigError) as early:
            preflight(asked)
        with pytest.raises(ConfigError) as late:
            plan(asked, build_data)
        assert str(early.value).startswith(refusal) and str(late.value).startswith(refusal)
    assert asked == before


@pytest.mark.parametrize("vocab_size, max_seq_len", [(1, 1), (65, 16), (50_000, 1024)])
def test_a_budget_no_size_meets_is_refused_whatever_the_data(vocab_size, max_seq_len):
    """pkm's values (n_keys^2 * d_model) outweigh the baseline's FFN at d_model=32: no key width meets the budget. The
    embeddings and positions count alike in the baseline and the variant, so the verdict cannot depend on the data,
    and the launcher may give it before any loads; a pkm with fewer keys fits."""
    from zoo.config.budget import OverBudget, match_params

    model = composed(TINY)["model"]
    pkm = {**model, "ffn": {"name": "pkm"}, "vocab_size": vocab_size, "max_seq_len": max_seq_len}
    with pytest.raises(OverBudget):
        match_params(zoo.build.resolve_config(pkm))
    smaller, record = match_params(zoo.build.resolve_config({**pkm, "ffn": {"name": "pkm", "n_keys": 8}}))
    assert abs(record["deviation"]) <= 0.01 and smaller.ffn.options.k_dim == record["d_ff"]
