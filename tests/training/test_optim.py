"""The optimizer group (zoo/optim/, conf/optim/): which parameters each optimizer takes, Muon's update against its
formula, the one-line errors, the command line, resume, every lineage, learning, and the memory estimate."""

import csv
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tests import zygote
from tests.helpers import FLOAT32, TINY, cases, compose_cfg, interrupt_at_batch, lineages, tiny_cfg
from zoo.build import ConfigError, build_model, meta_model
from zoo.optim import Combined, resolve, state_numbers
from zoo.registry import OPTIM
from zoo.training.runner import main

ROOT = Path(__file__).resolve().parents[2]


def _split(cfg: dict) -> dict[str, list[str]]:
    return {inner: [n for n, _ in params] for inner, params in OPTIM.get("muon").takes(build_model(cfg)).items()}


def _block(prefix: str, sublayers: dict[str, tuple[str, ...]]) -> list[str]:
    return [f"{prefix}.{sub}.f.{m}.weight" for sub, mats in sublayers.items() for m in mats]


MHA_GELU = {"attn": ("qkv", "out"), "ffn": ("up", "down")}
# Written out from the models' layout: Muon gets the projections (and the MLM head's dense transform), never an
# embedding, a position table or bias, a norm, a bias or the output head.
SPLITS = {
    "decoder_only": (tiny_cfg(n_layers=1), _block("decoder.blocks.0", MHA_GELU)),
    "encoder_only": (tiny_cfg("encoder_only", n_layers=1),
                     [*_block("encoder.blocks.0", MHA_GELU), "head_dense.weight"]),
    "encoder_decoder": (tiny_cfg("encoder_decoder", n_layers=1),
                        [*_block("encoder.blocks.0", MHA_GELU),
                         *_block("decoder.blocks.0", {"attn": ("qkv", "out"), "cross": ("q", "kv", "out"),
                                                      "ffn": ("up", "down")})]),
    "mla+moe, untied head, t5 bias": (
        tiny_cfg(n_layers=1, attention={"name": "mla"}, ffn={"name": "moe", "n_experts": 2, "top_k": 1},
                 position={"name": "t5"}, tie_embeddings=False),
        _block("decoder.blocks.0", {"attn": ("q", "kv_down", "k_up", "v_up", "out"), "ffn": (
            "router", *(f"experts.{e}.{m}" for e in range(2) for m in ("gate", "up", "down")))})),
    # The heads' layers out of the width (muP's readouts) go to AdamW; the mixture's latents, as wide as the
    # model, are hidden, and the factorized embedding's map up to the width is a linear layer's.
    "mixture of softmaxes, untied": (
        tiny_cfg(n_layers=1, softmaxes=2, tie_embeddings=False), [*_block("decoder.blocks.0", MHA_GELU),
                                                                   "head.latent.weight"]),
    "factorized, untied": (tiny_cfg(n_layers=1, embed_dim=8, tie_embeddings=False),
                           ["embed.proj.weight", *_block("decoder.blocks.0", MHA_GELU)]),
}


@pytest.mark.parametrize("case", SPLITS)
def test_muon_takes_the_hidden_matrices_and_adamw_the_rest(case):
    cfg, matrices = SPLITS[case]
    split = _split(cfg)
    names = [n for n, _ in build_model(cfg).named_parameters()]
    assert split["muon"] == matrices
    assert split["adamw"] == [n for n in names if n not in matrices]
    assert {"embed.weight", "embed.table.weight"} & set(split["adamw"])  # the token table
    if not cfg.get("tie_embeddings", True):  # the untied output head's table, and its layers out of the width
        assert {"head.weight", "head.out.weight"} & set(split["adamw"])
        assert not {"head.down.weight", "head.prior.weight"} & set(split["muon"])


def _every_part() -> list[dict]:
    return [tiny_cfg(lineage, n_layers=1, **{kind: case}) for lineage in lineages()
            for kind in ("attention", "position", "ffn") for case in cases(kind)]


@pytest.mark.parametrize("cfg", _every_part(), ids=lambda c: f"{c['name']}-{next(iter(c.values()))}")
def test_every_registered_part_splits_into_2d_matrices_and_the_rest(cfg):
    """Registry-driven: a part registered tomorrow is split by the same rule (no embedding, readout, norm gain,
    bias or vector goes to Muon; every parameter goes to exactly one optimizer)."""
    model = build_model(cfg)
    split = OPTIM.get("muon").takes(model)
    ids = [id(p) for params in split.values() for _, p in params]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())  # each parameter once
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    head = {id(m.weight) for m in model.modules() if getattr(m, "readout", False)}
    assert split["muon"] and all(p.dim() == 2 and id(p) not in embeddings | head for _, p in split["muon"])
    assert not any(n.endswith("bias") or "norm" in n.split(".")[-2] for n, _ in split["muon"])
    assert OPTIM.get("adamw").takes(model)["adamw"] == list(model.named_parameters())


@pytest.mark.parametrize("name", OPTIM.names())
def test_every_optimizer_keeps_the_contract(name):
    """Registry-driven (zoo/optim/__init__.py): its options extend OptimOptions; it takes every parameter once; it
    says what state each of its torch optimizers keeps; what it builds is one torch optimizer that moves them all."""
    from zoo.optim import OptimOptions, check

    assert issubclass(OPTIM.options(name), OptimOptions)
    check({"name": name}, {"model": {}, "trainer": {}})  # its defaults are valid
    model = build_model(tiny_cfg(n_layers=1))
    part = OPTIM.get(name)
    taken = part.takes(model)
    assert sorted(id(p) for ps in taken.values() for _, p in ps) == sorted(id(p) for p in model.parameters())
    assert set(part.state_per_param) == set(taken)
    optimizer = part.build(model, resolve({"name": name}).options, torch.device("cpu"), "32-true")
    assert isinstance(optimizer, torch.optim.Optimizer)
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def _muon_reference(w0: torch.Tensor, grads: list[torch.Tensor], lr: float, weight_decay: float, momentum: float,
                    nesterov: bool, ns_steps: int, adjust_lr_fn: str) -> torch.Tensor:
    """torch.optim.Muon's docstring, in float64: B = mu B + g; nesterov: g + mu B; O = NS_k(.) with the quintic
    X <- aX + b(XX^T)X + c(XX^T)^2 X on the normalised (wide) matrix; decay; then the adjusted step."""
    a, b, c = 3.4445, -4.775, 2.0315
    w, buf = w0.double().clone(), torch.zeros_like(w0, dtype=torch.float64)
    for g in (g.double() for g in grads):
        buf = momentum * buf + g
        u = g + momentum * buf if nesterov else buf
        tall = u.shape[0] > u.shape[1]
        x = u.T if tall else u
        x = x / x.norm()
        for _ in range(ns_steps):
            gram = x @ x.T
            x = a * x + (b * gram + c * gram @ gram) @ x
        o = x.T if tall else x
        w = w - lr * weight_decay * w
        rows, cols = w.shape
        scale = math.sqrt(max(1, rows / cols)) if adjust_lr_fn == "original" else 0.2 * math.sqrt(max(rows, cols))
        w = w - lr * scale * o
    return w


def _muon_steps(opts: dict, which: str, steps: int = 4) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """Step zoo's optim=muon `steps` times on random gradients: (the matrix before, its gradients, after)."""
    model = build_model(tiny_cfg(n_layers=1))
    optimizer = OPTIM.get("muon").build(model, resolve({"name": "muon", **opts}).options, torch.device("cpu"),
                                        "32-true")
    p = dict(model.named_parameters())[which]
    before, gen, grads = p.detach().clone(), torch.Generator().manual_seed(1), []
    for _ in range(steps):
        for q in model.parameters():
            q.grad = torch.randn(q.shape, generator=gen)
        grads.append(p.grad.clone())
        optimizer.step()
    return before, grads, p.detach().clone()


TORCH_DEFAULTS = {"lr": 1e-3, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True, "ns_steps": 5,
                  "adjust_lr_fn": "original"}
TOLERANCE = 0.02  # of the update's norm: torch computes Newton-Schulz in bfloat16, the reference in float64


@pytest.mark.parametrize("opts", [{}, {"lr": 0.05, "momentum": 0.8, "nesterov": False, "ns_steps": 3,
                                       "adjust_lr_fn": "match_rms_adamw"}], ids=["defaults", "every option set"])
@pytest.mark.parametrize("which", ["decoder.blocks.0.ffn.f.up.weight", "decoder.blocks.0.ffn.f.down.weight"],
                         ids=["tall", "wide"])
def test_a_muon_step_is_its_formula(opts, which):
    """zoo hands torch.optim.Muon the options it was given: its steps equal the docstring's formula written out
    here, and not the formula with any option left at torch's default instead."""
    chosen = {**{k: v for k, v in resolve({"name": "muon"}).options.__dict__.items() if k in TORCH_DEFAULTS},
              **opts}
    before, grads, after = _muon_steps(opts, which)
    update = after.double() - before.double()

    def distance(settings: dict) -> float:
        return ((_muon_reference(before, grads, **settings) - before.double() - update).norm() / update.norm()).item()

    assert distance(chosen) < TOLERANCE
    for key, default in TORCH_DEFAULTS.items():
        if default != chosen[key] and key != "weight_decay":  # decay is too small a term here: the next test
            assert distance({**chosen, key: default}) > 2 * TOLERANCE, key


def test_muon_decays_its_matrices_decoupled_from_the_update():
    """With a zero gradient the orthogonalised update is zero and the step is the decay alone: W (1 - lr wd)."""
    model = build_model(tiny_cfg(n_layers=1))
    opts = resolve({"name": "muon", "lr": 0.05, "weight_decay": 0.3}).options
    optimizer = OPTIM.get("muon").build(model, opts, torch.device("cpu"), "32-true")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for name, _ in OPTIM.get("muon").takes(model)["muon"]:
        torch.testing.assert_close(dict(model.named_parameters())[name].detach(), before[name] * (1 - 0.05 * 0.3),
                                   rtol=1e-6, atol=0)


def test_combined_is_one_optimizer_over_the_parts_groups():
    model = build_model(tiny_cfg(n_layers=1))
    optimizer = OPTIM.get("muon").build(model, resolve({"name": "muon"}).options, torch.device("cpu"), "32-true")
    assert isinstance(optimizer, Combined) and set(optimizer.parts) == {"muon", "adamw"}
    groups = optimizer.param_groups

    def the_parts_own() -> bool:  # the schedule scales these dicts: they must be the parts' own
        return [id(g) for g in optimizer.param_groups] == [id(g) for o in optimizer.parts.values()
                                                           for g in o.param_groups]

    assert the_parts_own()
    optimizer.load_state_dict(optimizer.state_dict())  # as a resume does: torch makes the parts new group dicts
    assert the_parts_own() and optimizer.param_groups is groups  # the same list, which Lightning's wrapper holds
    from lightning.pytorch.plugins.precision import Precision

    clipped = {id(p) for p in Precision().main_params(optimizer)}  # what trainer.gradient_clip_val clips
    assert clipped == {id(p) for p in model.parameters()}
    assert [g["lr"] for g in optimizer.parts["muon"].param_groups] == [0.02]
    assert {g["lr"] for g in optimizer.parts["adamw"].param_groups} == {1e-3}


BAD = [  # (overrides, the one-line error after "error: ")
    (["optim=muon", "optim.momentum=1.5"], "optim.momentum: got 1.5; valid: a number in [0, 1)"),
    (["optim=muon", "optim.ns_steps=0"], "optim.ns_steps: got 0; valid: an integer in [1, 99]"),
    (["optim=muon", "optim.adamw_lr=0"], "optim.adamw_lr: got 0.0; valid: a finite number > 0"),
    (["optim=muon", "optim.lr=-1"], "optim.lr: got -1.0; valid: a finite number > 0"),
    (["optim=muon", "optim.min_lr=0.5"], "optim.min_lr: got 0.5; valid: a number in [0, optim.lr=0.02]"),
    (["optim=muon", "optim.adjust_lr_fn=keller"],
     "optim.adjust_lr_fn: unknown 'keller'; valid: original, match_rms_adamw"),
    (["optim=muon", "model.parametrization=mup", "optim.adjust_lr_fn=match_rms_adamw"],
     "optim.adjust_lr_fn: 'match_rms_adamw' with model.parametrization=mup gives each matrix AdamW's step size"),
    (["optim.name=lion"], "optim.name: unknown optimizer 'lion'; valid: adamw, muon"),
]


@pytest.mark.parametrize("overrides,error", BAD, ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_a_bad_option_is_one_line_before_data(overrides, error, tmp_path, capsys, monkeypatch):
    import zoo.training.runner as runner

    monkeypatch.setattr(runner, "build_data", lambda *a, **k: pytest.fail("data was loaded before the refusal"))
    assert main(compose_cfg(TINY + overrides), tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {error}") and "\n" not in err, err


@pytest.mark.parametrize("strategy,why", [
    ("fsdp", "FSDP shards each weight matrix across processes"),
    ("fsdp_cpu_offload", "FSDP shards each weight matrix across processes"),
    ("deepspeed", "DeepSpeed's ZeRO hands the optimizer flat shards of the parameters"),
    ("deepspeed_stage_3_offload", "DeepSpeed's ZeRO hands the optimizer flat shards of the parameters"),
])
def test_muon_refuses_a_sharding_strategy_in_one_line(strategy, why):
    """Muon orthogonalises whole 2-D matrices; a strategy that hands the optimizer shards (lightning's fsdp and
    deepspeed names, all valid trainer.strategy values) would fail at the first step, after the data loaded."""
    from zoo.optim import check

    with pytest.raises(ConfigError, match=rf"^optim: muon with trainer.strategy={strategy}: {why}.*; valid: "):
        check({"name": "muon"}, {"model": {}, "trainer": {"strategy": strategy}})
    check({"name": "adamw"}, {"model": {}, "trainer": {"strategy": strategy}})


SMALL = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "trainer.max_steps=3",
         "trainer.val_check_interval=3", "data.context=16", "data.batch_size=4", "data.eval_batches=1",
         "sample.max_new_tokens=0", "logger=none", "checkpoints=none"]


def test_train_py_optim_muon_runs_and_bad_values_are_one_line(tmp_path):
    proc = zygote.run([sys.executable, "train.py", "optim=muon", *SMALL, f"hydra.run.dir={tmp_path}"], cwd=ROOT,
                      capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "completed" and s["optim"]["name"] == "muon" and math.isfinite(s["final"]["val_loss"])
    for arg, error in (("optim=lion", "error: optim: unknown option 'lion'; valid: adamw, muon"),
                       ("optim.nesterov=5", "error: optim.nesterov: got 5; valid: true or false")):
        proc = zygote.run([sys.executable, "train.py", "optim=muon", arg], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
        assert proc.returncode == 2 and proc.stderr.strip() == error, proc.stderr[-2000:]


def _weights_and_state(run_dir: Path) -> tuple[dict, dict]:
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    return ckpt["state_dict"], ckpt["optimizer_states"][0]


def test_a_resumed_muon_run_equals_an_uninterrupted_one(train, monkeypatch):
    over = ["optim=muon", "optim.warmup_steps=2", "trainer.max_steps=8", "trainer.deterministic=true",
            "model.dropout=0.1"]
    code, full = train(over, name="full")
    assert code == 0
    from zoo.training import data as data_module

    interrupt_at_batch(monkeypatch, data_module.TextData)
    code, part = train(over, name="part")
    assert code == 130 and json.loads((part / "summary.json").read_text())["steps"] < 8
    monkeypatch.undo()
    code, part = train(over + ["ckpt_path=last"], name="part")
    assert code == 0
    (a_weights, a_state), (b_weights, b_state) = _weights_and_state(full), _weights_and_state(part)
    assert a_weights.keys() == b_weights.keys() and all(torch.equal(a_weights[k], b_weights[k]) for k in a_weights)
    assert set(a_state) == {"muon", "adamw"}  # Combined's state: each part's, by name
    for part_name in ("muon", "adamw"):
        a, b = a_state[part_name]["state"], b_state[part_name]["state"]
        assert a.keys() == b.keys() and all(torch.equal(a[i][k], b[i][k]) for i in a for k in a[i])
    a_sum, b_sum = (json.loads((d / "summary.json").read_text()) for d in (full, part))
    assert b_sum["steps"] == a_sum["steps"] == 8 and b_sum["final"]["val_loss"] == a_sum["final"]["val_loss"]

    def val_by_step(run_dir: Path) -> dict[int, float]:
        with (run_dir / "metrics.csv").open() as f:
            return {int(r["step"]): float(r["val_loss"]) for r in csv.DictReader(f) if r.get("val_loss")}

    assert val_by_step(part) == val_by_step(full)


def test_a_resume_keeps_the_optimizer(train):
    code, _ = train(["optim=muon"], name="run")
    assert code == 0
    with pytest.raises(ConfigError, match=r"other settings \(optim.adamw_lr: checkpoint 0.001, this run"):
        train(["ckpt_path=last"], name="run")


@pytest.mark.parametrize("lineage", lineages())
def test_every_lineage_trains_with_muon_and_moves_its_matrices(train, lineage):
    code, run_dir = train([f"model={lineage}", "optim=muon", "trainer.max_steps=2", "logger=none"])
    s = json.loads((run_dir / "summary.json").read_text())
    assert code == 0 and s["status"] == "completed" and math.isfinite(s["final"]["val_loss"])
    assert s["optim"]["name"] == "muon"
    initial = build_model(s["model"], seed=0)  # the run's seed: its weights before the first step
    trained, _ = _weights_and_state(run_dir)
    for name, p in OPTIM.get("muon").takes(initial)["muon"]:
        assert not torch.equal(trained[f"model.{name}"], p.detach()), name


def test_muon_with_the_budget_and_moe(train):
    code, run_dir = train(["optim=muon", "ffn=moe", "budget=params", "trainer.max_steps=2", "logger=none"])
    s = json.loads((run_dir / "summary.json").read_text())
    assert code == 0 and s["budget"]["kind"] == "params" and math.isfinite(s["final"]["val_loss"])


def test_muon_learns_what_frozen_matrices_cannot(train):
    """150 steps of a 2-layer model on the embedded corpus: with Muon's matrices frozen (optim.lr tiny, AdamW alone
    training the embeddings, norms and biases) the validation loss stays well above this bound."""
    over = [*FLOAT32, "optim=muon", "model.d_model=64", "model.n_layers=2", "model.n_heads=2", "data.context=32",
            "data.batch_size=8", "data.eval_batches=4", "trainer.max_steps=150", "trainer.val_check_interval=150",
            "optim.warmup_steps=10", "sample.max_new_tokens=0", "logger=none", "checkpoints=none"]
    code, run_dir = train(over, tiny=False)
    s = json.loads((run_dir / "summary.json").read_text())
    assert code == 0 and s["final"]["val_loss"] < 2.95, s["final"]


def test_the_memory_estimate_follows_the_optimizer(tmp_path, capsys, monkeypatch):
    cfg = tiny_cfg(n_layers=2, tie_embeddings=False)
    model, params = meta_model(cfg), sum(p.numel() for p in build_model(cfg).parameters())
    muon = sum(p.numel() for _, p in OPTIM.get("muon").takes(model)["muon"])
    assert state_numbers(model, resolve({"name": "adamw"})) == 2 * params  # two moments
    assert state_numbers(model, resolve({"name": "muon"})) == muon + 2 * (params - muon)  # one momentum buffer
    import zoo.config.checks as validate

    big = TINY + ["model.d_model=1024", "model.n_heads=8", "model.n_layers=8"]  # ~100M parameters
    monkeypatch.setattr(validate, "available_memory", lambda trainer=None: (1, "available RAM"))
    need = {}
    for name in ("adamw", "muon"):
        assert main(compose_cfg(big + [f"optim={name}"]), tmp_path / name) == 2
        err = capsys.readouterr().err
        need[name] = float(err.split(" need ")[1].split(" GiB")[0])
        assert f"GiB for weights, gradients and {OPTIM.get(name).__name__} state" in err
    assert need["muon"] < need["adamw"]


def test_the_report_names_each_runs_optimizer_where_runs_differ(tmp_path):
    from tests.test_report import fake_run
    from zoo.report import group_variants, load_runs

    def runs(root: Path, plan: list[tuple[list[str], str | None]]) -> list[str]:
        for job, (overrides, optim) in enumerate(plan):
            fake_run(root / str(job), overrides, [2.0, 1.5])
            path = root / str(job) / "summary.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), "optim": {"name": optim, "lr": 0.02}}))
        return [v.label for v in group_variants(load_runs(root))[1]]

    # a preset chose the optimizer: no override names it, the summaries do
    assert runs(tmp_path / "a", [(["experiment=x"], "adamw"), (["experiment=y"], "muon")]) == \
        ["experiment=x, optim=adamw", "experiment=y, optim=muon"]
    # the default's runs are named by the optimizer they used, not "(default)"
    assert runs(tmp_path / "b", [([], "adamw"), (["optim=muon"], "muon")]) == ["adamw", "muon"]
    assert runs(tmp_path / "c", [(["ffn=relu"], "adamw"), (["ffn=gelu"], "adamw")]) == ["relu", "gelu"]  # one optim
    # a run killed before its summary: the config Hydra saved at its start names the optimizer
    killed = tmp_path / "d" / "9"
    fake_run(killed, [], None, summary=False)
    (killed / ".hydra" / "config.yaml").write_text("optim:\n  name: adamw\n  lr: 0.001\n")
    assert runs(tmp_path / "d", [([], "adamw"), (["optim=muon"], "muon")]) == ["adamw", "muon"]
    assert [len(v.runs) for v in group_variants(load_runs(tmp_path / "d"))[1]] == [2, 1]


@pytest.mark.slow  # two processes: half a minute, most of it starting them
def test_muon_trains_under_ddp_on_cpu(tmp_path):
    proc = zygote.run([sys.executable, "train.py", "trainer=ddp", "optim=muon", *SMALL, "trainer.max_steps=4",
                       f"hydra.run.dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "completed" and s["steps"] == 4 and s["optim"]["name"] == "muon"
    assert s["tokens_seen"] == 2 * 4 * 4 * 16  # two processes, each with its own batches


def test_muon_on_a_torch_without_it_is_one_line(monkeypatch):
    """pyproject allows torch>=2.5, older than torch.optim.Muon: the run is refused before anything is built."""
    from zoo.optim import check

    monkeypatch.delattr(torch.optim, "Muon")
    with pytest.raises(ConfigError, match=r"^optim: muon needs torch.optim.Muon \(torch 2.9 or newer\)"):
        check({"name": "muon"}, {})
    check({"name": "adamw"}, {})  # AdamW trains on any torch zoo supports
