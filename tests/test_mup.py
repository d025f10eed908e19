"""model.parametrization=mup (zoo/mup.py): the rules, equality with standard at the base width, the coordinate
check (activation updates flat across widths) and learning-rate transfer (slow). docs/scaling.md quotes them."""

import json
import math
from functools import cache

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import TINY, case_id, cases, compose_cfg, interrupt_at_batch, lineages, model_cfg, run, tiny_cfg
from zoo import ConfigError, build_model, resolve_config
from zoo.mup import FIXED, HIDDEN, VECTOR, param_groups, roles

LR, WD = 1e-3, 0.1


def ladder_cfg(parametrization: str, d_model: int, vocab_size: int, context: int, **over) -> dict:
    """The ladders' shape: 4 layers, heads of 32, width d_model, char vocabulary; `over`: other model options."""
    return dict(vocab_size=vocab_size, d_model=d_model, n_heads=d_model // 32, n_layers=4, max_seq_len=context,
                bias=False, parametrization=parametrization, **over)


def adamw_steps(model, tokens: torch.Tensor, steps: int, lr: float = LR) -> None:
    """A few plain AdamW steps on one batch, with zoo's parameter groups."""
    opt = torch.optim.AdamW(param_groups(model, lr, WD), lr=lr)
    for _ in range(steps):
        loss = F.cross_entropy(run(model, tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()


# ---- the rules


HEADS = {"factorized": {"embed_dim": 8, "tie_embeddings": False}, "factorized_tied": {"embed_dim": 8},
         "mixture": {"softmaxes": 3}, "mixture_untied": {"softmaxes": 3, "tie_embeddings": False},
         "mixture_factorized": {"softmaxes": 3, "embed_dim": 8}}  # zoo/models/vocab.py's heads with muP roles


@pytest.mark.parametrize("name, over", [(n, {}) for n in lineages()] + [("decoder_only", o) for o in HEADS.values()]
                         + [("encoder_decoder", HEADS["mixture_factorized"])],
                         ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={x}" for k, x in v.items()))
def test_mup_at_the_base_width_is_the_standard_model_bit_for_bit(name, over):
    tokens = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(0))
    models = []
    for p in ("standard", "mup"):
        model = build_model(tiny_cfg(name, parametrization=p, mup_base_d_model=32, **over), seed=3)
        adamw_steps(model, tokens, steps=3)
        models.append(model)
    sp, mup = (m.state_dict() for m in models)
    assert sp.keys() == mup.keys() and all(torch.equal(sp[k], mup[k]) for k in sp)


def test_roles_come_from_shapes():
    cfg = resolve_config(dict(ladder_cfg("mup", 256, 65, 64), bias=True, tie_embeddings=False,
                              attention={"name": "mla"}, position={"name": "rope"}, ffn={"name": "moe", "d_ff": 96}))
    role = roles(cfg)
    block = "decoder.blocks.0."
    assert {k: role[block + k] for k in ("attn.f.q.weight", "attn.f.out.weight", "ffn.f.experts.0.up.weight",
                                         "ffn.f.experts.0.down.weight")} == dict.fromkeys(
        ("attn.f.q.weight", "attn.f.out.weight", "ffn.f.experts.0.up.weight", "ffn.f.experts.0.down.weight"), HIDDEN)
    # Input grows, output fixed: hidden by the fan-in rule, unless it is the readout (which has its multiplier).
    assert role[block + "attn.f.kv_down.weight"] == role[block + "ffn.f.router.weight"] == HIDDEN
    assert role["head.weight"] == role["embed.weight"] == role[block + "attn.norm.weight"] == VECTOR
    assert role[block + "attn.f.k_up.weight"] == role[block + "ffn.f.experts.0.up.bias"] == VECTOR  # fan-in fixed
    assert role[block + "attn.f.kv_norm.weight"] == FIXED  # the latent's size (4 x head size) does not grow


def test_the_heads_out_of_the_width_into_a_fixed_size_are_readouts():
    """zoo/models/vocab.py: factorized embeddings (embed_dim does not grow) and the mixture of softmaxes (K does
    not): each layer from d_model into a fixed size is a readout, behind muP's output multiplier (1/2 here)."""
    def model_and_roles(**over):
        cfg = ladder_cfg("mup", 256, 65, 64, **over)
        return build_model(cfg), roles(resolve_config(cfg))

    model, role = model_and_roles(embed_dim=32, tie_embeddings=False)
    assert (role["embed.table.weight"], role["embed.proj.weight"]) == (FIXED, VECTOR)  # (vocab, E), E -> width
    assert (role["head.down.weight"], role["head.out.weight"], model.head.down.scale) == (VECTOR, FIXED, 0.5)
    model, role = model_and_roles(embed_dim=32)  # tied: the embedding's projection behind the multiplier
    h = torch.randn(3, 256)
    assert torch.equal(model.head(h), h * 0.5 @ model.embed.proj.weight @ model.embed.table.weight.T)
    model, role = model_and_roles(softmaxes=4, tie_embeddings=False)
    assert (role["head.prior.weight"], role["head.latent.weight"], role["head.out.weight"]) == (VECTOR, HIDDEN, VECTOR)
    assert (model.head.prior.scale, model.head.out.scale) == (0.5, 0.5)  # the latents grow: W is a readout
    model, role = model_and_roles(softmaxes=4, embed_dim=32)
    assert (role["head.prior.weight"], role["head.latent.weight"]) == (VECTOR, VECTOR)
    assert (model.head.latent.scale, model.head.out.scale) == (0.5, 1.0)  # the latents are E wide: P_k are


def test_mup_init_learning_rates_and_output_multiplier_at_twice_the_base():
    sp, mup = (build_model(ladder_cfg(p, 256, 65, 64), seed=0) for p in ("standard", "mup"))
    blocks = "decoder.blocks.0."
    w = lambda m, k: dict(m.named_parameters())[k]
    for k in ("attn.f.qkv.weight", "attn.f.out.weight", "ffn.f.up.weight", "ffn.f.down.weight"):  # hidden
        torch.testing.assert_close(w(mup, blocks + k), w(sp, blocks + k) / math.sqrt(2), rtol=1e-6, atol=0)
    for k in ("embed.weight", "decoder.position.weight", blocks + "attn.norm.weight"):  # vector-like: as standard
        assert torch.equal(w(mup, k), w(sp, k))
    assert (sp.head.scale, mup.head.scale) == (1.0, 0.5)
    h = torch.randn(3, 256)
    assert torch.equal(mup.head(h), h * 0.5 @ mup.embed.weight.T)  # tied: the embedding, behind the multiplier
    groups = {(g["lr"], g["weight_decay"]): {id(p) for p in g["params"]} for g in param_groups(mup, LR, WD)}
    assert set(groups) == {(LR / 2, WD * 2), (LR, 0.0)}  # hidden: lr / 2, decay * 2 (lr * decay kept); the rest
    assert id(w(mup, blocks + "ffn.f.down.weight")) in groups[LR / 2, WD * 2]
    assert [(g["lr"], g["weight_decay"]) for g in param_groups(sp, LR, WD)] == [(LR, WD), (LR, 0.0)]


PARTS = [{kind: case} for kind in ("attention", "position", "norm", "placement", "ffn") for case in cases(kind)]


@pytest.mark.parametrize("name, part", [("decoder_only", part) for part in PARTS] + [(n, {}) for n in lineages()],
                         ids=lambda v: v if isinstance(v, str) else "-".join(map(case_id, v.values())) or "defaults")
def test_every_registered_part_and_lineage_gets_a_role_and_trains_under_mup(name, part):
    cfg = model_cfg({"name": name, **part}, parametrization="mup", mup_base_d_model=16)  # twice the base
    model = build_model(cfg)
    assert set(roles(resolve_config(cfg))) == {n for n, _ in model.named_parameters()}
    assert any(g["lr"] == LR / 2 for g in param_groups(model, LR, WD))
    adamw_steps(model, torch.randint(0, 37, (2, 9)), steps=1)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("over, message", [
    ({"parametrization": "mu"}, "model.parametrization: unknown 'mu'; valid: standard, mup"),
    ({"mup_base_d_model": 0}, "model.mup_base_d_model: must be an integer from 1 to 65536, got 0"),
    # absurd sizes: refused before the base models are built (10^12 overflowed a tensor's size; 2^20 a float)
    ({"parametrization": "mup", "mup_base_d_model": 10**12},
     "model.mup_base_d_model: must be an integer from 1 to 65536, got 1000000000000"),
    ({"parametrization": "mup", "mup_base_d_model": 2**20},
     "model.mup_base_d_model: must be an integer from 1 to 65536, got 1048576"),
    ({"parametrization": "mup", "d_model": 48, "n_heads": 4},  # heads of 12 cannot make a width of 128
     "model.parametrization: mup keeps the head size (12) at the base width mup_base_d_model=128, which needs "
     "10.6667 heads; valid: a d_model and n_heads whose head size divides mup_base_d_model"),
    ({"parametrization": "mup", "d_model": 256, "n_heads": 8, "attention": {"name": "gqa", "n_kv_heads": 8}},
     "model.parametrization: mup's reference model at d_model=128 (n_heads=4) cannot be built: "
     "model.attention.n_kv_heads: n_heads=4 is not divisible by n_kv_heads=8"),
])
def test_bad_parametrization_is_one_line(over, message):
    with pytest.raises(ConfigError) as e:
        resolve_config(tiny_cfg(**over))
    assert str(e.value) == message


def test_an_interrupted_mup_run_with_a_parameter_budget_resumes_exactly(tmp_path, monkeypatch):
    """Twice the base width, ffn=swiglu resized by budget=params: interrupted at step 4 and resumed, the run's
    validation losses equal an uninterrupted run's (the optimizer's muP groups come back as they were saved)."""
    from zoo.training import data as data_module
    from zoo.training import run as train

    over = ["model.parametrization=mup", "model.mup_base_d_model=16", "ffn=swiglu", "budget=params",
            "trainer.max_steps=8"]
    full = tmp_path / "full"
    assert train(compose_cfg(TINY + over), run_dir=full) == 0
    interrupt_at_batch(monkeypatch, data_module.TextData)
    part = tmp_path / "part"
    assert train(compose_cfg(TINY + over), run_dir=part) == 130
    monkeypatch.undo()
    assert train(compose_cfg(TINY + over + ["ckpt_path=last"]), run_dir=part) == 0
    a, b = (json.loads((d / "summary.json").read_text()) for d in (full, part))
    assert a["budget"]["d_ff"] == b["budget"]["d_ff"] and a["steps"] == b["steps"] == 8
    assert b["final"]["val_loss"] == pytest.approx(a["final"]["val_loss"], abs=1e-6)


# ---- the coordinate check: how far each layer's output moves in a few steps, across widths


@cache
def shakespeare() -> tuple[torch.Tensor, int]:
    """The embedded corpus's first million characters as char ids, and the vocabulary size."""
    from zoo.data.corpus import load_default_corpus
    from zoo.data.tokenizers import CharTokenizer

    text = load_default_corpus()[:1_000_000]
    tokenizer = CharTokenizer().fit(text)
    return torch.tensor(tokenizer.encode(text)), tokenizer.vocab_size


def batch(n: int, context: int, seed: int) -> torch.Tensor:
    """n windows of context + 1 tokens at random places in the text (inputs and their next tokens)."""
    ids, _ = shakespeare()
    starts = torch.randint(0, len(ids) - context - 1, (n,), generator=torch.Generator().manual_seed(seed))
    return torch.stack([ids[s: s + context + 1] for s in starts])


def muon_steps(model, tokens: torch.Tensor, steps: int) -> None:
    """A few steps of zoo's optim=muon at its default peak learning rates (Muon 0.02, AdamW 1e-3) on one batch."""
    from zoo.optim import resolve
    from zoo.registry import OPTIM

    opt = OPTIM.get("muon").build(model, resolve({"name": "muon"}).options, torch.device("cpu"), "32-true")
    for _ in range(steps):
        loss = F.cross_entropy(run(model, tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()


def coordinate_changes(parametrization: str, d_model: int, steps: int = 10, train=adamw_steps,
                       **over) -> dict[str, float]:
    """mean |output after `steps` AdamW steps (or `train`'s) - output at init| of the embedding, each block and
    the logits, on one fixed batch (the `mup` package's coord check looks at the same); `over`: model options."""
    tokens = batch(4, 32, seed=0)
    model = build_model(ladder_cfg(parametrization, d_model, shakespeare()[1], 32, **over), seed=0)
    layers = {"embedding": model.embed, **{f"block {i}": b for i, b in enumerate(model.decoder.blocks)},
              "logits": model.head}
    outputs = {}
    for name, layer in layers.items():
        layer.register_forward_hook(lambda _, inputs, out, name=name: outputs.__setitem__(name, out.detach()))
    with torch.no_grad():
        model(tokens[:, :-1])
    at_init = dict(outputs)
    train(model, tokens, steps)
    with torch.no_grad():
        model(tokens[:, :-1])
    return {name: (outputs[name] - at_init[name]).abs().mean().item() for name in layers}


def log_slope(widths: list[int], values: list[float]) -> float:
    """The least-squares slope of log2(value) against log2(width): 0 flat, 1 proportional to width."""
    x = torch.tensor([math.log2(w) for w in widths], dtype=torch.float64)
    y = torch.tensor([math.log2(v) for v in values], dtype=torch.float64)
    x = x - x.mean()
    return float((x * (y - y.mean())).sum() / (x * x).sum())


WIDTHS = [64, 128, 256, 512]


def test_coordinate_check_mup_flat_across_widths_standard_grows():
    slopes = {}
    for p in ("standard", "mup"):
        changes = [coordinate_changes(p, d) for d in WIDTHS]
        slopes[p] = {layer: log_slope(WIDTHS, [c[layer] for c in changes]) for layer in changes[0]}
    # muP: every layer's update the same size at every width (measured: |slope| <= 0.15; docs/scaling.md).
    assert all(abs(s) < 0.25 for s in slopes["mup"].values()), slopes["mup"]
    # standard: the blocks' updates grow faster than the width (measured 1.4-1.6), the logits' about as its
    # square root (0.62): the same learning rate is a bigger step for a wider model.
    blocks = [s for layer, s in slopes["standard"].items() if layer.startswith("block")]
    assert min(blocks) > 1.0 and slopes["standard"]["logits"] > 0.4, slopes["standard"]


def test_coordinate_check_muon_under_mup_is_flat_across_widths():
    """optim=muon with model.parametrization=mup (the ladders' muP, study=speedrun's Muon variants): Muon takes every
    matrix whose learning rate muP would scale and sets its step from the matrix's shape (adjust_lr_fn=original),
    AdamW the rest at muP's unscaled rates, and muP's init and output multiplier stay. Every layer's update is then
    the same size at every width, as with AdamW (under the standard parametrization the blocks' grow with it)."""
    changes = [coordinate_changes("mup", d, train=muon_steps) for d in WIDTHS]
    slopes = {layer: log_slope(WIDTHS, [c[layer] for c in changes]) for layer in changes[0]}
    assert all(abs(s) < 0.25 for s in slopes.values()), slopes


@pytest.mark.parametrize("head", ["factorized", "factorized_tied", "mixture", "mixture_untied", "mixture_factorized"])
def test_coordinate_check_of_factorized_embeddings_and_the_mixture_of_softmaxes_under_mup(head):
    """The heads' muP roles keep every layer's update flat across widths (measured: |slope| <= 0.16). With their
    layers plain linear layers and no multiplier (the fan-in rule alone), four of the five are not (measured: the
    logits' slope 0.50 factorized_tied, 0.93 mixture, 1.06 mixture_untied; the blocks' -0.28 mixture_factorized);
    untied factorized is flat either way (-0.22 at most)."""
    over = {k: 32 if k == "embed_dim" else v for k, v in HEADS[head].items()}
    changes = [coordinate_changes("mup", d, steps=20, **over) for d in WIDTHS]
    slopes = {layer: log_slope(WIDTHS, [c[layer] for c in changes]) for layer in changes[0]}
    assert all(abs(s) < 0.25 for s in slopes.values()), slopes


# ---- learning-rate transfer: the best learning rate of the narrow model is the wide model's


LRS = [2.0**e for e in range(-11, -5)]  # 2^-11 .. 2^-6, a factor 2 apart


def final_loss(parametrization: str, d_model: int, lr: float, steps: int = 200, context: int = 32,
               batch_size: int = 12) -> float:
    """Validation loss after `steps` AdamW steps (warm-up then cosine, as zoo trains) on the embedded text:
    training windows from its first 90%, a fixed 256 windows from the rest."""
    from zoo.training.module import lr_lambda

    ids, vocab = shakespeare()
    split = len(ids) * 9 // 10
    torch.manual_seed(0)
    model = build_model(ladder_cfg(parametrization, d_model, vocab, context), seed=0)
    opt = torch.optim.AdamW(param_groups(model, lr, WD), lr=lr, betas=(0.9, 0.99))
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(steps // 10, steps, 0.1))
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        starts = torch.randint(0, split - context - 1, (batch_size,), generator=g)
        tokens = torch.stack([ids[s: s + context + 1] for s in starts])
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    starts = torch.arange(256) * ((len(ids) - split - context - 1) // 256) + split
    val = torch.stack([ids[s: s + context + 1] for s in starts])
    with torch.no_grad():
        loss = F.cross_entropy(model(val[:, :-1]).flatten(0, 1), val[:, 1:].flatten()).item()
    return loss if math.isfinite(loss) else float("inf")


@pytest.mark.slow
@pytest.mark.parametrize("parametrization", ["mup", "standard"])
def test_best_learning_rate_of_the_narrow_model_is_best_for_the_wide_one(parametrization, capsys):
    """Widths 64 and 256 (0.2M and 3.2M parameters) on the learning-rate grid; the table is docs/scaling.md's.
    muP: the best learning rate moves by at most one grid step. Standard: the move is printed, not asserted (it
    moved one step down over this 4x range, no more: docs/scaling.md)."""
    losses = {d: [final_loss(parametrization, d, lr) for lr in LRS] for d in (64, 256)}
    best = {d: min(range(len(LRS)), key=row.__getitem__) for d, row in losses.items()}
    with capsys.disabled():
        print(f"\n{parametrization}: lr " + " ".join(f"2^{round(math.log2(lr))}" for lr in LRS))
        for d, row in losses.items():
            print(f"  d_model {d}: " + " ".join(f"{v:.3f}" for v in row) + f"  best 2^{round(math.log2(LRS[best[d]]))}")
    assert all(min(row) < 2.7 for row in losses.values()), losses  # both learned (the unigram loss is about 3.3)
    if parametrization == "mup":
        assert abs(best[256] - best[64]) <= 1, losses
