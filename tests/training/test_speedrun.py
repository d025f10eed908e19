"""study=speedrun's named variants (conf/speedrun/) and experiment=speedrun_gpt2, through the real config tree.

The ingredient muon is optim=muon, a choice of the `optim` group (conf/optim/)."""

import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.helpers import compose_cfg
from zoo.build import flatten_config
from zoo.commands import config_dir

CONF = config_dir()
VARIANTS = sorted(p.stem for p in (CONF / "speedrun").glob("*.yaml"))
# Each ingredient and the config keys it changes, as the speedrun states it (its README's list).
INGREDIENTS = {
    "rope": {"model.position.name": "rope", "model.position.theta": 10000.0, "model.position.fraction": 1.0},
    "qk_norm": {"model.attention.qk_norm": True},
    "relu2": {"model.ffn.name": "relu2"}, "muon": {"optim (group)": "muon"}, "softcap": {"model.logit_softcap": 15.0},
    "zero_init": {"model.residual_init": "zero"}, "embed_skip": {"model.embed_skip": True},
    "value_embeddings": {"model.value_embeddings": 1}, "window": {"model.attention.window": 32},
}


def _holds_muon(variant: str) -> bool:
    return variant == "add_muon" or variant == "full" or variant.startswith("drop_")


def _flat(variant: str) -> dict:
    """The variant's model and optimizer settings, as dotted keys; "optim (group)": its optim choice, if any."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["study=speedrun", f"speedrun={variant}"], return_hydra_config=True)
    flat = flatten_config(OmegaConf.to_container(cfg.model, resolve=True), "model.")
    flat |= flatten_config(OmegaConf.to_container(cfg.optim, resolve=True), "optim.")
    return flat | {"optim (group)": cfg.hydra.runtime.choices.get("optim", "adamw")}


def _diff(a: dict, b: dict) -> dict:
    return {k: b.get(k) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}


def test_the_study_sweeps_every_variant_once_and_each_ingredient_both_ways():
    study = OmegaConf.load(CONF / "study" / "speedrun.yaml")
    swept = study.hydra.sweeper.params.speedrun.split(",")
    assert sorted(swept) == VARIANTS and len(swept) == len(set(swept)) == 3 + 2 * len(INGREDIENTS)
    assert set(VARIANTS) == {"nanogpt", "full", "core"} | {f"{way}_{x}" for x in INGREDIENTS for way in ("add", "drop")}
    assert study.hydra.sweeper.params.seed == "0,1,2"
    report = study.hydra.callbacks.report  # add-one effects against nanogpt, drop-one effects against full
    assert report.baseline == "speedrun=nanogpt" and report.also.drop_one.baseline == "speedrun=full"


@pytest.mark.parametrize("ingredient", [x for x in INGREDIENTS if x != "muon"])
def test_add_one_changes_nanogpt_in_that_ingredient_alone(ingredient):
    assert _diff(_flat("nanogpt"), _flat(f"add_{ingredient}")) == INGREDIENTS[ingredient]


def test_muon_variants_keep_muons_learning_rates_and_the_others_the_studies_adamw():
    """The study's shared setup pins no learning rate: AdamW keeps the studies' 1e-3 -> 1e-4 (its defaults), Muon
    its own peak for the matrices and AdamW's for the rest, so adding Muon does not run it at AdamW's rate."""
    nanogpt, muon = _flat("nanogpt"), _flat("add_muon")
    assert (nanogpt["optim.lr"], nanogpt["optim.min_lr"], nanogpt["optim.betas"], nanogpt["optim.warmup_steps"]) == \
        (1e-3, 1e-4, [0.9, 0.99], 50)
    assert (muon["optim.lr"], muon["optim.min_lr"], muon["optim.adamw_lr"], muon["optim.warmup_steps"]) == \
        (0.02, 0.002, 1e-3, 50)
    assert all(k.startswith("optim") for k in _diff(nanogpt, muon))


def test_the_full_recipe_holds_every_ingredient():
    changed = _diff(_flat("nanogpt"), _flat("full"))
    assert all(changed.get(k) == v for x in INGREDIENTS.values() for k, v in x.items())
    assert all(k.startswith("optim") or k in {k for x in INGREDIENTS.values() for k in x} for k in changed)


@pytest.mark.parametrize("ingredient", INGREDIENTS)
def test_full_less_one_changes_the_full_recipe_in_that_ingredient_alone(ingredient):
    full, nanogpt = _flat("full"), _flat("nanogpt")
    changed = _diff(full, _flat(f"drop_{ingredient}"))
    assert all(full[k] == v for k, v in INGREDIENTS[ingredient].items())
    if ingredient == "muon":  # optim=muon's own settings come with it, and go with it
        assert changed["optim (group)"] == "adamw" and all(k.startswith("optim") for k in changed)
        assert _diff(nanogpt, _flat("add_muon")) == {k: full[k] for k in changed}
    else:
        assert changed == {k: nanogpt.get(k) for k in INGREDIENTS[ingredient]}


def test_core_is_the_full_recipe_less_the_four_within_noise_together():
    """speedrun=core: full less soft-capping, zero-init, embedding skips and value embeddings, each as in nanogpt."""
    four = ("softcap", "zero_init", "embed_skip", "value_embeddings")
    nanogpt = _flat("nanogpt")
    assert _diff(_flat("full"), _flat("core")) == {k: nanogpt.get(k) for x in four for k in INGREDIENTS[x]}


@pytest.mark.parametrize("ingredient", INGREDIENTS)
def test_each_variant_trains(train, ingredient):
    """The study's ingredients through the config tree, a few steps each (TINY: one layer, so one value table
    is read by the only layer, first and last)."""
    code, run_dir = train(["study=speedrun", f"speedrun=add_{ingredient}"])
    assert code == 0 and (run_dir / "summary.json").is_file()


def test_a_time_budget_stops_a_run_where_it_runs_out(train):
    """Equal wall time: Lightning's max_time (trainer.max_time) ends the run, which is then evaluated and completed."""
    code, run_dir = train(["+trainer.max_time={seconds: 0}", "trainer.max_steps=1000"])
    s = json.loads((run_dir / "summary.json").read_text())
    assert code == 0 and s["status"] == "completed" and s["steps"] < 1000 and "val_loss" in s["final"]


def test_the_schedule_decays_by_the_larger_of_the_steps_and_the_time_spent():
    from zoo.training.module import lr_lambda

    clock = {"spent": 0.0}
    factor = lr_lambda(10, 110, 0.1, lambda: clock["spent"])
    assert factor(4) == 5 / 11  # warm-up: by the steps alone
    assert factor(60) == 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))  # half the steps, no time spent
    clock["spent"] = 0.75  # three quarters of the time budget, but only half the steps
    assert factor(60) == 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.75))
    clock["spent"] = 1.0
    assert factor(11) == pytest.approx(0.1) and factor(110) == pytest.approx(0.1)
    assert lr_lambda(10, 110, 0.1)(60) == 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))  # no clock: steps alone


def test_a_time_budget_decays_the_learning_rate_by_the_clock(train):
    """Equal wall time: with trainer.max_time the cosine ends when the time does, not at a trainer.max_steps the
    run never reaches, so every variant ends its schedule whatever its speed."""
    code, run_dir = train(["+trainer.max_time={seconds: 3}", "trainer.max_steps=100000", "checkpoints=all",
                           "trainer.val_check_interval=50", "optim.warmup_steps=0"])
    s = json.loads((run_dir / "summary.json").read_text())
    assert code == 0 and s["status"] == "completed" and 0 < s["steps"] < 100000
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    groups = state["optimizer_states"][0]["param_groups"]
    # The cosine's progress at the last step, read back from its rate; the steps alone would give under 0.001.
    # Not 1: that rate is set when the step starts, before the step's own time (and a validation) has passed
    min_ratio = 1e-4 / groups[0]["initial_lr"]  # AdamW's min_lr over its peak
    cosines = [2 * (g["lr"] / g["initial_lr"] - min_ratio) / (1 - min_ratio) - 1 for g in groups]
    progress = [math.acos(max(-1.0, min(1.0, c))) / math.pi for c in cosines]  # clamped: rounding at the floor
    assert groups and all(0.5 < p <= 1 for p in progress), progress


def test_the_gpu_preset_composes_and_learns_at_toy_size_on_cpu(train):
    toy = ["experiment=speedrun_gpt2", "data=shakespeare", "trainer=cpu", "compile=false", "model.d_model=48",
           "model.n_heads=2", "model.n_layers=6", "data.context=32", "model.attention.window=16", "data.batch_size=8",
           "trainer.accumulate_grad_batches=1", "trainer.max_steps=40", "trainer.val_check_interval=20",
           "data.eval_batches=4", "trainer.precision=32-true"]
    cfg = compose_cfg(["experiment=speedrun_gpt2", "data.path=x"])
    m = cfg.model
    assert (m.n_layers, m.d_model, m.n_heads, m.value_embeddings, m.logit_softcap) == (12, 768, 6, 3, 15.0)
    assert m.embed_skip and m.residual_init == "zero" and m.attention.qk_norm and m.ffn.name == "relu2"
    assert m.position.name == "rope" and cfg.trainer.precision == "bf16-mixed" and cfg.data.kind == "tokens"
    code, run_dir = train(toy, tiny=False)
    s = json.loads((Path(run_dir) / "summary.json").read_text())
    assert code == 0 and s["final"]["val_loss"] < math.log(65) - 0.5  # it learns: below a uniform guess



@pytest.mark.parametrize("variant", ["add_muon", "full", "drop_rope"])
def test_a_ladder_of_the_study_passes_its_checks_with_muon(variant, tmp_path, monkeypatch, capsys):
    """The ladders train under muP (conf/ladder/cpu3.yaml); study=speedrun's Muon variants (add_muon, full and every
    drop_<x> but drop_muon) climb them too, not refused: the run gets past every check of its config to its data."""
    import zoo.training.runner as runner
    from zoo.build import ConfigError
    from zoo.training.runner import main

    def reached(*args, **kwargs):
        raise ConfigError("the data, past every check")

    monkeypatch.setattr(runner, "build_data", reached)
    cfg = compose_cfg(["study=speedrun", "ladder=cpu3", "size=cpu_s", f"speedrun={variant}"])
    assert cfg.model.parametrization == "mup" and cfg.optim.name == "muon"
    assert main(cfg, tmp_path) == 2
    assert capsys.readouterr().err.strip() == "error: the data, past every check"
