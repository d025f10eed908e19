"""ffn=moe: routing, auxiliary losses, counts and FLOPs, caching, training with the aux losses, budgets."""

import csv
import math

import pytest
import torch

from tests import zygote
from tests.helpers import TINY, compose_cfg, make, tiny_cfg
from zoo import ConfigError, build_model, count_params, flops_per_token, resolve_config
from zoo.component import aux_losses
from zoo.registry import FFN

MOE = {"name": "moe", "n_experts": 4, "top_k": 2, "d_ff": 24}


def _moe(**options):
    return make(FFN, "moe", 16, bias=False, **{"n_experts": 4, "top_k": 1, "d_ff": 8, **options})


@pytest.mark.parametrize("expert", ["gelu", "swiglu"])
def test_one_expert_with_top_1_is_the_plain_ffn(expert):
    moe = make(FFN, "moe", 16, n_experts=1, top_k=1, expert=expert, d_ff=24)
    dense = make(FFN, expert, 16, d_ff=24)
    dense.load_state_dict(moe.experts[0].state_dict())
    x = torch.randn(2, 5, 16)
    assert torch.equal(moe(x), dense(x))


def test_equals_hugging_face_mixtral_block():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func

    hf = MixtralSparseMoeBlock(MixtralConfig(hidden_size=32, intermediate_size=24, num_local_experts=4,
                                             num_experts_per_tok=2)).eval()
    moe = make(FFN, "moe", 32, bias=False, n_experts=4, top_k=2, expert="swiglu", d_ff=24)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.3)
        moe.router.weight.copy_(hf.gate.weight)
        for e, expert in enumerate(moe.experts):  # HF stores [gate; up] and down for all experts in 3D tensors
            gate, up = hf.experts.gate_up_proj[e].chunk(2, dim=0)
            expert.gate.weight.copy_(gate)
            expert.up.weight.copy_(up)
            expert.down.weight.copy_(hf.experts.down_proj[e])
    x = torch.randn(3, 5, 32)
    torch.testing.assert_close(moe(x), hf(x))
    # HF's balance loss counts top_k slots separately: top_k times zoo's (unweighted) value
    hf_balance = load_balancing_loss_func((moe.router(x.reshape(-1, 32)),), 4, 2)
    torch.testing.assert_close(moe.aux_losses["moe_balance"] / 0.01, hf_balance / 2)


def _route(moe, experts: list[int], confidence: float = 20.0) -> torch.Tensor:
    """Tokens that the router sends to the given experts: token j is a scaled basis vector j."""
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[:, : moe.n_experts] = torch.eye(moe.n_experts)
    return torch.eye(16)[experts] * confidence


def test_balance_loss_is_one_for_uniform_routing_and_grows_with_skew():
    moe = _moe(balance_weight=1.0)
    moe(_route(moe, [0, 1, 2, 3] * 3))
    uniform = moe.aux_losses["moe_balance"]
    torch.testing.assert_close(uniform, torch.tensor(1.0))  # N * sum_i (1/N) P_i, and the P_i sum to 1
    moe(_route(moe, [0, 0, 0, 1] * 3))
    skewed = moe.aux_losses["moe_balance"]
    moe(_route(moe, [0] * 12))
    collapsed = moe.aux_losses["moe_balance"]
    assert 1.0 < skewed < collapsed
    assert collapsed.item() == pytest.approx(4.0, rel=1e-3)  # every token to one expert, probability ~1: N
    # soft routing (f = P): N * sum_i P_i^2 >= 1 (Cauchy-Schwarz), equality only at uniform
    moe(torch.randn(64, 16))
    assert moe.aux_losses["moe_balance"].item() > 1.0


@pytest.mark.parametrize("loss", ["moe_balance", "moe_z"])
def test_aux_losses_reach_the_router(loss):
    moe = _moe(top_k=2)
    moe(torch.randn(3, 7, 16))
    moe.aux_losses[loss].backward()
    assert moe.router.weight.grad is not None and moe.router.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in moe.experts.parameters())  # the aux losses train the router only


def test_weights_scale_the_aux_losses_and_zero_turns_them_off():
    x = torch.randn(20, 16)
    base, heavy = _moe(), _moe(balance_weight=0.1, z_weight=0.0)
    heavy.load_state_dict(base.state_dict())
    base(x), heavy(x)
    torch.testing.assert_close(heavy.aux_losses["moe_balance"], 10 * base.aux_losses["moe_balance"])
    assert heavy.aux_losses["moe_z"] == 0


def test_z_loss_is_mean_squared_logsumexp():
    moe = _moe(z_weight=1.0)
    x = torch.randn(10, 16)
    moe(x)
    torch.testing.assert_close(moe.aux_losses["moe_z"], moe.router(x).logsumexp(-1).square().mean())


def test_gates_top_k_renormalised_and_switch_for_top_1():
    x = torch.randn(6, 16)
    for k in (1, 2):
        moe = _moe(top_k=k)
        probs = moe.router(x).softmax(-1)
        top_p, top_i = probs.topk(k, -1)
        gates = top_p if k == 1 else top_p / top_p.sum(-1, keepdim=True)
        expect = sum(gates[:, s, None] * torch.stack([moe.experts[e](x[t]) for t, e in enumerate(top_i[:, s])])
                     for s in range(k))
        torch.testing.assert_close(moe(x), expect)


def test_counts_equal_the_real_parameters():
    cfg = tiny_cfg(ffn=MOE)
    model = build_model(cfg)
    counts = count_params(cfg)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    experts = [b.ffn.f.experts for b in model.decoder.blocks]
    per_expert = sum(p.numel() for p in experts[0][0].parameters())
    assert per_expert == 3 * 32 * 24 + 2 * 24 + 32  # swiglu with biases
    assert counts["total"] - counts["active"] == len(experts) * (4 - 2) * per_expert
    ffn = sum(p.numel() for b in model.decoder.blocks for p in b.ffn.f.parameters())
    assert counts["ffn"] == ffn


def test_flops_count_the_router_and_active_experts_only():
    dense = tiny_cfg(ffn={"name": "swiglu", "d_ff": 24})
    for k in (1, 2, 4):
        moe = tiny_cfg(ffn={**MOE, "top_k": k})
        extra = flops_per_token(moe)["forward"] - flops_per_token(dense)["forward"]
        router, expert = 2 * 32 * 4, 2 * 3 * 32 * 24
        assert extra == 2 * (router + (k - 1) * expert)  # two layers


def test_every_experts_down_projection_is_depth_scaled():
    model = build_model(tiny_cfg(n_layers=8, d_model=64, ffn={**MOE, "d_ff": 256}))
    for expert in model.decoder.blocks[0].ffn.f.experts:
        assert expert.down.weight.std().item() == pytest.approx(0.02 / 4, rel=0.1)  # / sqrt(2 * 8)
        assert expert.up.weight.std().item() == pytest.approx(0.02, rel=0.1)
    a, b = model.decoder.blocks[0].ffn.f.experts[:2]
    assert not torch.equal(a.up.weight, b.up.weight)  # each expert its own draw


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
def test_cached_decoding_equals_recomputation(lineage):
    model = build_model(tiny_cfg(lineage, ffn=MOE, position={"name": "rope"})).eval()
    seq = torch.randint(0, 37, (2, 14))
    src = torch.randint(0, 37, (2, 9)) if lineage == "encoder_decoder" else None
    run = (lambda t, c=None: model(t, cache=c)) if src is None else \
        (lambda t, c=None: model.decode(t, model.encode(src), cache=c))
    with torch.no_grad():
        full = run(seq)
        cache = model.new_cache()
        steps = [run(seq[:, :5], cache)] + [run(seq[:, t:t + 1], cache) for t in range(5, 14)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("options,message", [
    ({"expert": "swish"}, "model.ffn.expert: unknown expert 'swish'; valid: elu, geglu, "),
    ({"expert": "moe"}, "model.ffn.expert: unknown expert 'moe'; valid: elu, geglu, "),
    ({"top_k": 3, "n_experts": 2}, "model.ffn.top_k: must be between 1 and n_experts=2, got 3"),
    ({"top_k": 0}, "model.ffn.top_k: must be between 1 and n_experts=8, got 0"),
    ({"n_experts": 0}, "model.ffn.n_experts: must be a positive integer, got 0"),
    ({"balance_weight": -1}, "model.ffn.balance_weight: must be >= 0"),
    ({"d_ff": 0}, "model.ffn.d_ff: must be a positive integer or null"),
    ({"n_experts": "many"}, "model.ffn.n_experts: expected an integer, got 'many'"),
    ({"capacity": 1.25}, "model.ffn.capacity: not an option of 'moe'; valid: balance_weight, d_ff, expert,"),
])
def test_bad_options_fail_in_one_line(options, message):
    with pytest.raises(ConfigError) as err:
        resolve_config(tiny_cfg(ffn={"name": "moe", **options}))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    if "expert" in options:  # every FFN but moe itself
        valid = str(err.value).split("valid: ")[1].split(", ")
        assert valid == [n for n in FFN.names() if n != "moe"]


def test_aux_losses_sum_by_name_and_clear():
    model = build_model(tiny_cfg(ffn=MOE))
    model(torch.randint(0, 37, (2, 8)))
    blocks = [b.ffn.f for b in model.decoder.blocks]
    expect = {k: blocks[0].aux_losses[k] + blocks[1].aux_losses[k] for k in ("moe_balance", "moe_z")}
    got = aux_losses(model)
    assert got.keys() == expect.keys() and all(torch.equal(got[k], expect[k]) for k in got)
    assert aux_losses(model) == {}  # collected once: never added twice


def _module():
    from omegaconf import OmegaConf

    from zoo.config.plan import plan
    from zoo.training.data import build_data
    from zoo.training.module import ZooModule

    over = ["ffn=moe", *(f"model.ffn.{k}={v}" for k, v in MOE.items() if k != "name"), "model.n_layers=2"]
    return ZooModule(plan(OmegaConf.to_container(compose_cfg(TINY + over), resolve=True), build_data)[0])


@pytest.mark.filterwarnings("ignore:You are trying to `self.log")  # a step called without a Trainer
def test_training_step_adds_this_forwards_aux_losses_only():
    module = _module()
    batch = module.objective.text_batch(torch.randint(0, 37, (2, 9)), torch.Generator())
    module.model.head.aux_losses = {"moe_balance": torch.tensor(100.0)}  # stale: left by an earlier forward
    total = module.training_step(batch, 0)
    lm, _ = module.objective.loss(module.model, batch)
    aux = aux_losses(module.model)
    assert set(aux) == {"moe_balance", "moe_z"}
    torch.testing.assert_close(total, lm + aux["moe_balance"] + aux["moe_z"])
    assert 0 < (total - lm).item() < 1  # two layers of ~0.01 balance and a small z-loss, not the stale 100


def test_training_logs_the_aux_losses(tmp_path, capsys):
    from zoo.training import run

    run_dir = tmp_path / "run"
    over = ["ffn=moe", "model.ffn.n_experts=4", "model.ffn.d_ff=16", "sample.max_new_tokens=0"]
    assert run(compose_cfg(TINY + over), run_dir=run_dir) == 0
    banner = capsys.readouterr().out.splitlines()[0]
    assert "(mha/learned/pre-layernorm/moe): " in banner and "M active), " in banner  # sparse: both counts
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    logged = [r for r in rows if r.get("train_moe_balance")]
    assert len(logged) == 4 and all(r["train_moe_z"] for r in logged)
    # one layer: the balance loss is balance_weight * (about 1 when routing is even, n_experts at most)
    assert all(0.005 < float(r["train_moe_balance"]) <= 0.04 for r in logged)
    assert all(math.isfinite(float(r["train_loss"])) for r in logged)


@pytest.mark.parametrize("budget,count", [("params", "total"), ("active_params", "active")])
def test_budget_matches_total_or_active_parameters(budget, count):
    from zoo.config.budget import BUDGETS, match_params

    cfg = resolve_config(tiny_cfg(ffn={"name": "moe"}))
    baseline = count_params({**cfg.as_dict(), "ffn": {"name": "gelu"}})["total"]
    resized, summary = match_params(cfg, count=BUDGETS[budget])
    counts = count_params(resized)
    assert abs(counts[count] - baseline) <= 0.01 * baseline
    assert summary["kind"] == budget and summary["params"] == counts[count]
    other = "active" if count == "total" else "total"
    assert abs(counts[other] - baseline) > 0.1 * baseline  # the other count is far off: the knob matters


@pytest.mark.slow  # two processes each start Lightning: over 10 s
def test_ddp_two_processes_with_experts_that_get_no_tokens(tmp_path):
    """DDP (gloo, 2 CPU processes) needs a gradient for every parameter on every rank: with 32 experts and 64
    tokens per rank some expert gets none, and still takes part (zero gradient), so no rank waits for it."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "train.py", "trainer=ddp", *TINY, "ffn=moe", "model.ffn.n_experts=32",
           "model.ffn.top_k=1", "model.ffn.d_ff=8", "logger=csv", "threads=1", f"hydra.run.dir={tmp_path}"]
    proc = zygote.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "completed" and s["steps"] == 4
    rows = [r for r in csv.DictReader((tmp_path / "metrics.csv").open()) if r.get("train_moe_balance")]
    assert len(rows) == 4 and all(math.isfinite(float(r["train_moe_balance"])) for r in rows)


@pytest.mark.slow  # a minute or a few on 2 CPU cores
def test_moe_learns_the_corpus_with_balanced_routing(tmp_path):
    """Below the unigram entropy (3.34 nats, the best loss without context) as the dense decoder in
    tests/training/test_learning.py, with the balance loss near its value for even routing (1 per layer)."""
    from zoo.training import run

    over = ["ffn=moe", "model.ffn.n_experts=4", "model.d_model=64", "model.n_layers=2", "model.n_heads=4",
            "data.eval_batches=8", "trainer.max_steps=600", "trainer.val_check_interval=200", "data.context=64",
            "data.batch_size=16", "sample.max_new_tokens=0", "threads=1"]
    assert run(compose_cfg(over), run_dir=tmp_path) == 0
    import json

    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["final"]["val_loss"] < 2.6, s["history"]
    balance = [float(r["train_moe_balance"]) for r in csv.DictReader((tmp_path / "metrics.csv").open())
               if r.get("train_moe_balance")]
    last = balance[-10:]
    assert sum(last) / len(last) < 2 * 0.01 * 1.2  # two layers, routing within 20% of even: no collapse
