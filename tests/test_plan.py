"""A run resolves its model once: zoo.build.resolve_config makes the ModelSpec from the composed config, and
everything after (the data's vocabulary and context, budget=params, muP's reference widths, the module the run
trains) works on that spec, changed with dataclasses.replace, never resolved from a dict again."""

import sys

import pytest
from omegaconf import OmegaConf

import zoo.build
from tests.helpers import TINY, compose_cfg
from zoo.config.sizing import prepare_run
from zoo.spec import ModelSpec
from zoo.training.module import ZooModule


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
    plain = OmegaConf.to_container(compose_cfg([*TINY, *overrides]), resolve=True)
    data, spec, _ = prepare_run(plain)  # what zoo.training.runner does before training
    module = ZooModule(plain, spec)
    assert len(resolutions) == 1
    assert module.model.cfg is spec and spec.vocab_size == data.tokenizer.vocab_size
    assert spec.max_seq_len == data.required_len() and plain["model"] == spec.as_dict()
    if "budget=params" in overrides:
        assert plain["budget"]["d_ff"] == spec.ffn.options.d_ff and plain["budget"]["kind"] == "params"
