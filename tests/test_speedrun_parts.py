"""The NanoGPT speedrun's parts (issue 28), each checked against its formula as the speedrun or its paper states
it, computed here with plain torch ops on the model's own weights: ffn=relu2, model.logit_softcap,
model.value_embeddings, model.residual_init=zero and model.embed_skip. At the edges: 3 heads, 13 tokens, float64,
GQA with 2 key/value heads; and cached greedy generation equals uncached for each part that touches attention or
the residual stream."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import case_id, cases, lineages, make, run, tiny_cfg
from zoo import build_model, count_params
from zoo.build import resolve_config
from zoo.component import ConfigError
from zoo.generate import generate
from zoo.models.stack import value_tables
from zoo.registry import FFN

T = 13  # an odd length


def _tokens(batch: int = 2, t: int = T) -> torch.Tensor:
    return torch.randint(0, 37, (batch, t), generator=torch.Generator().manual_seed(1))


def _f64(cfg: dict, seed: int = 0) -> torch.nn.Module:
    return build_model(cfg, seed=seed).double().eval()


# ---- ffn=relu2: down(relu(up(x))^2) (So et al. 2021, Primer)

def test_relu2_is_down_of_squared_relu_of_up():
    ffn = make(FFN, "relu2", 24, bias=True, d_ff=40).double()
    x = torch.randn(3, T, 24, dtype=torch.float64)
    hidden = x @ ffn.up.weight.T + ffn.up.bias
    expect = torch.where(hidden > 0, hidden * hidden, torch.zeros_like(hidden)) @ ffn.down.weight.T + ffn.down.bias
    torch.testing.assert_close(ffn(x), expect, rtol=0, atol=1e-12)
    assert ffn.up.out_features == 40 and make(FFN, "relu2", 24).up.out_features == 96  # 4 * d_model by default


@pytest.mark.parametrize("budget", ["params", "active_params"])
def test_the_budget_resizes_relu2_to_the_baseline(budget):
    from zoo.config.budget import BUDGETS, match_params

    spec, record = match_params(resolve_config(tiny_cfg(ffn={"name": "relu2"})), count=BUDGETS[budget])
    baseline = count_params(tiny_cfg(ffn={"name": "gelu"}))["total"]
    assert spec.ffn.name == "relu2" and spec.ffn.options.d_ff == record["d_ff"]
    assert abs(count_params(spec)["total"] - baseline) <= 0.01 * baseline


# ---- model.logit_softcap: logits = c * tanh(z / c) (Gemma 2; the speedrun's 30, later 15)

@pytest.mark.parametrize("lineage", lineages())
def test_softcapped_logits_are_c_tanh_of_the_uncapped_models(lineage):
    cfg = tiny_cfg(lineage, n_heads=3, d_model=24, init_std=0.5)
    plain, capped = _f64(cfg), _f64({**cfg, "logit_softcap": 2.0})
    z = run(plain, _tokens())
    assert z.abs().max() > 2.0  # the cap bites
    torch.testing.assert_close(run(capped, _tokens()), 2.0 * torch.tanh(z / 2.0), rtol=0, atol=1e-12)


@pytest.mark.parametrize("lineage", lineages("generates"))
def test_generation_samples_from_softcapped_logits(lineage, monkeypatch):
    import zoo.generate

    seen, real = [], zoo.generate.sample_next
    monkeypatch.setattr(zoo.generate, "sample_next",
                        lambda logits, *a, **kw: seen.append(logits) or real(logits, *a, **kw))
    cfg = tiny_cfg(lineage, init_std=0.5)
    model = build_model({**cfg, "logit_softcap": 1.0})
    src = _tokens(2, 5) if model.needs_source else None
    generate(model, _tokens(2, 3), 5, src=src, temperature=1.0)
    assert len(seen) == 5 and all(s.abs().max() <= 1.0 for s in seen)  # float32's tanh reaches 1
    seen.clear()
    generate(build_model(cfg), _tokens(2, 3), 5, src=src, temperature=1.0)
    assert max(s.abs().max() for s in seen) > 2.0  # what the cap bounds


@pytest.mark.parametrize("cap", [0, -1.0, float("inf"), "30"])
def test_a_bad_softcap_is_refused_in_one_line(cap):
    with pytest.raises(ConfigError, match=r"^model\.logit_softcap: must be positive or null, got .*valid: "):
        resolve_config(tiny_cfg(logit_softcap=cap))


# ---- model.value_embeddings: v = a * v + b * ve on the first and last layers (ResFormer; the speedrun's 3 tables)

def test_value_tables_are_the_first_and_last_layers():
    assert value_tables(3, 12) == [0, 1, 2] + [None] * 6 + [0, 1, 2]
    assert value_tables(2, 4) == [0, 1, 0, 1] and value_tables(0, 3) == [None] * 3
    assert value_tables(1, 1) == [0] and value_tables(3, 3) == [0, 1, 2]  # a table per layer


@pytest.mark.parametrize("attention", [{"name": "mha"}, {"name": "gqa", "n_kv_heads": 2}], ids=case_id)
@pytest.mark.parametrize("lineage", lineages())
def test_value_embeddings_mixed_as_1_0_leave_the_model_unchanged(lineage, attention):
    cfg = tiny_cfg(lineage, attention=attention, n_layers=4)
    with_tables = _f64({**cfg, "value_embeddings": 2})
    mixes = [m for m in with_tables.modules() if type(m).__name__ == "ScalarMix"]
    assert mixes and all(m.a.item() == 0.5 and m.b.item() == 0.5 for m in mixes)  # the speedrun's start
    with torch.no_grad():
        for m in mixes:
            m.a.fill_(1.0), m.b.fill_(0.0)
    torch.testing.assert_close(run(with_tables, _tokens()), run(_f64(cfg), _tokens()), rtol=0, atol=0)


@pytest.mark.parametrize("heads,kv", [(3, None), (4, 2)], ids=["mha-3-heads", "gqa-2-kv"])
def test_value_embeddings_mixed_as_0_1_give_the_attention_the_tables_vectors(heads, kv):
    """Layer 0's attention, mixed (0, 1), averages table 0's vectors of the tokens: computed here by hand."""
    attention = {"name": "mha"} if kv is None else {"name": "gqa", "n_kv_heads": kv}
    model = _f64(tiny_cfg(d_model=24, n_heads=heads, n_layers=2, value_embeddings=1, attention=attention,
                          position={"name": "none"}, bias=False))
    table, attn = model.decoder.value_embeds[0].weight, model.decoder.blocks[0].attn.f
    hd, n_kv = 24 // heads, kv or heads
    assert table.shape == (37, n_kv * hd)  # as wide as the values: n_kv_heads * head_dim
    with torch.no_grad():
        attn.value_mix.a.fill_(0.0), attn.value_mix.b.fill_(1.0)
    seen = {}
    attn.register_forward_hook(lambda m, args, out: seen.update(x=args[0], out=out))
    tokens = _tokens()
    model(tokens)
    q, k, _ = (seen["x"] @ attn.qkv.weight.T).split([heads * hd, n_kv * hd, n_kv * hd], dim=-1)
    q, k = q.view(2, T, heads, hd).transpose(1, 2), k.view(2, T, n_kv, hd).transpose(1, 2)
    v = table[tokens].view(2, T, n_kv, hd).transpose(1, 2)
    k, v = k.repeat_interleave(heads // n_kv, 1), v.repeat_interleave(heads // n_kv, 1)
    scores = (q @ k.transpose(-2, -1)) / hd ** 0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, T, heads * hd)
    torch.testing.assert_close(seen["out"], y @ attn.out.weight.T, rtol=0, atol=1e-12)


@pytest.mark.parametrize("cfg,error", [
    (tiny_cfg(n_layers=4, value_embeddings=3), "model.value_embeddings: 3 tables, read by the first 3 and the last 3 "
                                               "of 4 layers, would give a layer two; valid: 0 to 2, or 4 (a table "
                                               "per layer)"),
    (tiny_cfg(n_layers=2, value_embeddings=3), "model.value_embeddings: 3 tables, read by the first 3 and the last 3 "
                                               "of 2 layers"),
    (tiny_cfg(value_embeddings=-1), "model.value_embeddings: must be an integer >= 0, got -1 (0: none)"),
    (tiny_cfg(value_embeddings=1, attention={"name": "mla"}), "model.value_embeddings: attention 'mla' takes no value "
                                                              "embeddings"),
], ids=["overlapping", "too-many", "negative", "mla"])
def test_impossible_value_embeddings_are_refused_in_one_line(cfg, error):
    with pytest.raises(ConfigError) as e:
        resolve_config(cfg)
    assert str(e.value).startswith(error) and "\n" not in str(e.value)


def test_value_embeddings_are_counted_as_embeddings():
    plain, tables = count_params(tiny_cfg(n_layers=4)), count_params(tiny_cfg(n_layers=4, value_embeddings=2))
    assert tables["embedding"] - plain["embedding"] == 2 * 37 * 32
    assert tables["attention"] - plain["attention"] == 4 * 2  # the mixing scalars of the 4 layers that read one


# ---- model.residual_init=zero: the attention and FFN output projections start at zero (the speedrun; muP)

def test_zero_init_zeroes_the_output_projections_and_leaves_the_embedding_path():
    model = _f64(tiny_cfg(residual_init="zero", n_heads=3, d_model=24, init_std=0.3))
    outs = [w for b in model.decoder.blocks for w in (b.attn.f.out.weight, b.ffn.f.down.weight)]
    assert outs and all(torch.equal(w, torch.zeros_like(w)) for w in outs)
    assert all(b.attn.f.qkv.weight.abs().sum() > 0 for b in model.decoder.blocks)  # only those
    tokens = _tokens()
    h = model.embed.weight[tokens] + model.decoder.position.weight[:T]  # the embedding path, by hand
    norm = model.decoder.final_norm
    expect = F.layer_norm(h, (24,), norm.weight, norm.bias, norm.eps) @ model.embed.weight.T
    torch.testing.assert_close(model(tokens), expect, rtol=0, atol=1e-12)


def test_training_moves_zero_initialised_projections():
    torch.manual_seed(0)
    model = build_model(tiny_cfg(residual_init="zero"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = _tokens(8, 16)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        if not losses:  # the first step: the gradient reaches the zero matrices through their nonzero inputs
            block = model.decoder.blocks[0]
            assert block.attn.f.out.weight.grad.abs().sum() > 0 and block.ffn.f.down.weight.grad.abs().sum() > 0
        opt.step()
        losses.append(loss.item())
    assert all(b.attn.f.out.weight.abs().sum() > 0 and b.attn.f.qkv.weight.grad.abs().sum() > 0
               for b in model.decoder.blocks)
    assert losses[-1] < 0.5 * losses[0]


def test_an_unknown_residual_init_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^model\.residual_init: unknown 'zeros'; valid: scaled, zero$"):
        resolve_config(tiny_cfg(residual_init="zeros"))


# ---- model.embed_skip: each block's input x = a * x + b * x0, (a, b) learned from (1, 0) (the speedrun)

@pytest.mark.parametrize("placement", cases("placement"), ids=case_id)
@pytest.mark.parametrize("lineage", lineages())
def test_embed_skip_at_1_0_is_the_plain_model(lineage, placement):
    cfg = tiny_cfg(lineage, norm=placement, n_heads=3, d_model=24)
    torch.testing.assert_close(run(_f64({**cfg, "embed_skip": True}), _tokens()), run(_f64(cfg), _tokens()),
                               rtol=0, atol=0)


@pytest.mark.parametrize("placement", cases("placement"), ids=case_id)
def test_embed_skip_feeds_each_block_a_x_plus_b_x0(placement):
    model = _f64(tiny_cfg(embed_skip=True, norm=placement, n_layers=3, init_std=0.3))
    seen: dict = {}
    blocks = model.decoder.blocks
    for i, block in enumerate(blocks):
        with torch.no_grad():
            block.embed_skip.a.fill_(0.5 + i), block.embed_skip.b.fill_(2.0 - i)
        block.register_forward_hook(lambda m, args, out, i=i: seen.update({f"out{i}": out}))
        step = block.parallel if block.parallel is not None else block.attn  # what the block runs first
        step.register_forward_pre_hook(lambda m, args, i=i: seen.update({f"in{i}": args[0]}))
    tokens = _tokens()
    model(tokens)
    x0 = model.embed.weight[tokens] + model.decoder.position.weight[:T]
    for i in range(3):
        before = x0 if i == 0 else seen[f"out{i - 1}"]
        torch.testing.assert_close(seen[f"in{i}"], (0.5 + i) * before + (2.0 - i) * x0, rtol=0, atol=1e-12)


# ---- cached generation: every part that touches attention or the residual stream

SPEEDRUN = {"value_embeddings": {"value_embeddings": 1}, "embed_skip": {"embed_skip": True},
            "residual_init": {"residual_init": "zero"}, "logit_softcap": {"logit_softcap": 3.0},
            "all": {"value_embeddings": 1, "embed_skip": True, "residual_init": "zero", "logit_softcap": 3.0,
                    "ffn": {"name": "relu2"}}}


def _move_the_mixes(model: torch.nn.Module) -> None:
    """Mixing scalars and zero projections away from their init, so each part changes what is generated."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".a", ".b")) or p.abs().sum() == 0:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if name.endswith(".a") else 0.0))


@pytest.mark.parametrize("attention", [{"name": "mha"}, {"name": "gqa", "n_kv_heads": 2}], ids=case_id)
@pytest.mark.parametrize("part", SPEEDRUN)
@pytest.mark.parametrize("lineage", lineages("generates"))
def test_cached_greedy_generation_equals_uncached(lineage, part, attention):
    cfg = tiny_cfg(lineage, position={"name": "rope"}, attention=attention, init_std=0.3, **SPEEDRUN[part])
    model = build_model(cfg)
    _move_the_mixes(model)
    prompt, src = _tokens(3, 4), _tokens(3, 7) if model.needs_source else None
    a = generate(model, prompt, 21, src=src)
    b = generate(model, prompt, 21, src=src, use_cache=False)
    assert a.shape == (3, 25) and torch.equal(a, b)
    assert len(set(a[:, 4:].flatten().tolist())) > 1  # not a constant output
