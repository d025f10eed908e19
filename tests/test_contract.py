"""The component contract (zoo/component.py's protocols), checked on every registered part, built on the meta
device: a part registered tomorrow is checked the day it lands, and docs/components.md shows the same contract."""

from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers import case_id, cases, lineages, make, tiny_cfg
from zoo.block import NO_POSITION
from zoo.build import count_params, on_meta, resolve_config
from zoo.component import (
    PROTOCOLS,
    ConfigError,
    Context,
    Options,
    build,
    declared,
    members,
    option_values,
    resized,
)
from zoo.registry import ATTENTION, FFN, NORM, POSITION, REGISTRIES
from zoo.spec import Part

D, H, T = 32, 4, 6  # the test's d_model, heads and sequence length


class _Sublayer(nn.Module):
    """Stands for an attention or FFN inside a placement: its input, unchanged, whatever keywords it gets."""

    def forward(self, x: torch.Tensor, **kw) -> torch.Tensor:
        return x


def contract_problems(kind: str, part) -> list[str]:
    """What `part` (an instance of a registered `kind`) misses or gets wrong of its kind's protocol."""
    problems = []
    for m in members(PROTOCOLS[kind]):
        if not hasattr(part, m.name):
            if m.left_out is None:
                problems.append(f"{m.name}: required, not declared")
        elif not m.fits(declared(part, m.name)):
            problems.append(f"{m.name}: {declared(part, m.name)!r} is not {m.type}")
    return problems


def _sizes_and_flops(part: nn.Module, params: int) -> list[str]:
    """A part's optional members where they are numbers: what they must be whatever the part."""
    problems = []
    for name in declared(part, "residual_outputs"):
        if not isinstance(getattr(getattr(part, name, None), "weight", None), torch.Tensor):
            problems.append(f"residual_outputs: {name!r} is no child with a weight")
    for name in declared(part, "constants"):
        if not isinstance(getattr(part, name, None), nn.Parameter):
            problems.append(f"constants: {name!r} is no parameter")
    flops, inactive = declared(part, "flops")(T), declared(part, "inactive_params")()
    if not (isinstance(flops, int) and flops >= 0):
        problems.append(f"flops({T}) = {flops!r}, not an integer >= 0")
    if not (isinstance(inactive, int) and 0 <= inactive <= params):
        problems.append(f"inactive_params() = {inactive!r}, not in [0, {params}]")
    return problems


def _meta(registry, case: dict, name_key: str = "name", device: str = "meta", **ctx):
    """The part a config node names, built as the stack builds it (a LayerNorm as the model's norm), on meta."""
    context = Context(d_model=D, n_heads=H, max_seq_len=16, norm=lambda dim=None: nn.LayerNorm(dim or D), **ctx)
    with torch.device(device):
        return build(registry, _part(registry, case, name_key), context)


def _part(registry, case: dict, name_key: str = "name") -> Part:
    """A config node ({"name": ..., options}) as the Part the stack builds from (zoo.spec)."""
    name = case[name_key]
    return Part(name, registry.options(name)(**{k: v for k, v in case.items() if k not in (name_key, "placement")}))


@pytest.mark.parametrize("case", cases("attention"), ids=case_id)
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_every_attention_keeps_the_contract(case, cross):
    attn = _meta(ATTENTION, case, cross=cross)
    params = sum(p.numel() for p in attn.parameters())
    assert contract_problems("attention", attn) + _sizes_and_flops(attn, params) == []
    assert attn.count_as == "attention" and attn.window == case.get("window")  # the stack masks by it
    assert H % attn.n_kv_heads == 0 and attn.cache_bytes_per_token(2) > 0
    x = torch.empty(2, T, D, device="meta")
    out = attn(x, NO_POSITION, context=x if cross else None)
    assert out.shape == x.shape


@pytest.mark.parametrize("case", cases("position"), ids=case_id)
def test_every_position_keeps_the_contract(case):
    pos = _meta(POSITION, case)
    params = sum(p.numel() for p in pos.parameters())
    assert contract_problems("position", pos) + _sizes_and_flops(pos, params) == []
    assert pos.count_as == "position" and (pos.max_len is not None) == pos.hard_limit
    x, q = torch.empty(2, T, D, device="meta"), torch.empty(2, H, T, D // H, device="meta")
    assert pos.embed(x).shape == x.shape
    assert [t.shape for t in pos.rotate(q, q)] == [q.shape, q.shape]
    bias = pos.score_bias(T, T)
    assert bias is None or bias.shape == (H, T, T)


@pytest.mark.parametrize("case", cases("norm"), ids=case_id)
def test_every_norm_keeps_the_contract(case):
    norm = _meta(NORM, case, name_key="type")
    params = sum(p.numel() for p in norm.parameters())
    assert contract_problems("norm", norm) + _sizes_and_flops(norm, params) == []
    assert norm.count_as == "norm"
    x = torch.empty(2, T, D, device="meta", dtype=torch.float64)
    assert norm(x).shape == x.shape and norm.to(torch.float64)(x).dtype == torch.float64
    with torch.device("meta"):  # built for another width: a norm over each head (qk_norm)
        node = dict(case)
        per_head = NORM.get(node.pop("type"))(Context(d_model=D, n_heads=H, max_seq_len=16),
                                               NORM.options(case["type"])(**node), D // H)
    assert per_head(torch.empty(2, H, T, D // H, device="meta")).shape == (2, H, T, D // H)


@pytest.mark.parametrize("case", cases("ffn"), ids=case_id)
def test_every_ffn_keeps_the_contract_and_resizes_itself(case):
    ffn = _meta(FFN, case)
    params = sum(p.numel() for p in ffn.parameters())
    assert contract_problems("ffn", ffn) + _sizes_and_flops(ffn, params) == []
    assert ffn.count_as == "ffn"
    x = torch.randn(2, T, D)  # on the CPU: routing (ffn=moe) depends on values, which meta tensors lack
    assert _meta(FFN, case, device="cpu")(x).shape == x.shape
    # resize: the options of a part whose parameters grow linearly with the size, as the budget assumes
    counts = [count_params(tiny_cfg(ffn=resized(FFN, case, size)))["total"] for size in (8, 16, 24)]
    assert counts[0] < counts[1] and counts[2] - counts[1] == counts[1] - counts[0]


@pytest.mark.parametrize("case", cases("placement"), ids=case_id)
def test_every_placement_keeps_the_contract(case):
    factory = REGISTRIES["residual"].get(case["placement"])
    f = {"attn": _Sublayer(), "ffn": _Sublayer()} if factory.parallel else _Sublayer()
    placement = factory(f, lambda: nn.LayerNorm(D))
    assert contract_problems("residual", placement) == []
    x = torch.randn(2, T, D)
    kw = {"attn": {}, "ffn": {}} if placement.parallel else {}
    assert placement(x, **kw).shape == x.shape


@pytest.mark.parametrize("lineage", lineages())
def test_every_lineage_keeps_the_contract(lineage):
    model = on_meta(resolve_config(tiny_cfg(lineage)))
    assert contract_problems("model", model) == []
    assert callable(getattr(model, "new_cache", None)) == model.generates
    tokens = torch.zeros(2, T, dtype=torch.long, device="meta")
    logits = model(tokens, tokens) if model.needs_source else model(tokens)
    assert logits.shape == (2, T, model.cfg.vocab_size)


def test_the_contract_check_finds_what_a_part_gets_wrong():
    """A part that leaves out a required member, or declares one of the wrong type, fails the checks above."""

    class Broken(nn.Module):
        window = "all"  # not an integer or null
        n_kv_heads, head_dim, record = 1, 8, False

        def forward(self, x, *a, **kw):
            return x

    assert contract_problems("attention", Broken()) == [
        "count_as: required, not declared", "window: 'all' is not int | None",
        "cache_bytes_per_token: required, not declared"]
    assert _sizes_and_flops(Broken(), 0) == []  # the defaults apply: no residual outputs, no FLOPs
    Broken.residual_outputs, Broken.constants = ("out",), {"weight": 1.0}
    assert _sizes_and_flops(Broken(), 0) == ["residual_outputs: 'out' is no child with a weight",
                                             "constants: 'weight' is no parameter"]


def test_docs_show_the_contract_of_the_code():
    """docs/components.md's contract tables are what zoo/component.py's protocols say (regenerate them with
    `python -c "from zoo.component import contract_markdown; print(contract_markdown())"`)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "components.md").read_text()
    start, end = "<!-- contract: generated by zoo.component.contract_markdown() -->\n", "<!-- end contract -->"
    assert start in text and end in text
    shown = text.split(start, 1)[1].split(end, 1)[0]
    from zoo.component import contract_markdown

    assert shown.strip() == contract_markdown().strip()


# ---- budget=params asks the part how to resize itself


@dataclass(kw_only=True)
class _HiddenOptions(Options):
    hidden: int = 64  # not called d_ff: the budget must not assume the name


class _Hidden(nn.Module):
    count_as, residual_outputs = "ffn", ("down",)

    def __init__(self, ctx: Context, opts: _HiddenOptions):
        super().__init__()
        self.up, self.down = nn.Linear(ctx.d_model, opts.hidden), nn.Linear(opts.hidden, ctx.d_model)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class _HiddenResizable(_Hidden):
    @classmethod
    def resize(cls, opts: _HiddenOptions, size: int) -> _HiddenOptions:
        return replace(opts, hidden=size)


@pytest.fixture
def scratch_ffns(monkeypatch):
    """Two FFNs registered for one test only: one that resizes itself, one that declares no resize."""
    for name, part in (("hidden_resizable", _HiddenResizable), ("hidden_fixed", _Hidden)):
        monkeypatch.setitem(FFN._entries, name, part)
        monkeypatch.setitem(FFN._options, name, _HiddenOptions)
        monkeypatch.setitem(FFN._examples, name, [{}])


def test_budget_resizes_a_part_by_its_own_option(scratch_ffns):
    from zoo.config.budget import match_params

    cfg = resolve_config(tiny_cfg(ffn={"name": "hidden_resizable"}))
    model, record = match_params(cfg)
    baseline = count_params(tiny_cfg(ffn={"name": "gelu"}))["total"]
    assert model.as_dict()["ffn"] == {"name": "hidden_resizable", "hidden": record["d_ff"]}
    assert record["params"] == count_params(model)["total"] and abs(record["params"] - baseline) <= 0.01 * baseline


def test_budget_refuses_in_one_line_a_part_that_cannot_resize(scratch_ffns):
    from zoo.config.budget import match_params

    with pytest.raises(ConfigError) as e:
        match_params(resolve_config(tiny_cfg(ffn={"name": "hidden_fixed"})))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("budget: ffn 'hidden_fixed' declares no resize(opts, size)")
    assert "hidden_resizable" in msg.split("valid: ")[1] and "hidden_fixed" not in msg.split("valid: ")[1]


def test_resized_keeps_the_other_options():
    node = {"name": "moe", **option_values(FFN.options("moe")(n_experts=4, top_k=1))}
    assert resized(FFN, node, 40) == {**node, "d_ff": 40}


# ---- the contract's exact claims


def test_rmsnorm_keeps_float64():
    """A float64 RMSNorm computes in float64 (bf16 and float32 are normalised in float32): torch's own agrees."""
    x = torch.randn(3, 5, 16, dtype=torch.float64) * 1e3 + 7
    zoo_norm = make(NORM, "rmsnorm", d_model=16, eps=1e-5).double()
    ref = torch.nn.RMSNorm(16, eps=1e-5, dtype=torch.float64)
    out = zoo_norm(x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ref(x), atol=1e-13, rtol=1e-13)


def test_qk_norm_projection_is_olmo2s_attention():
    """attention.qk_norm=projection normalises the whole query and key projections, as OLMo 2 does: zoo's gqa with
    copied weights computes what Hugging Face's Olmo2Attention (random weights, nothing downloaded) computes."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.olmo2 import modeling_olmo2 as olmo2

    from zoo.layers.norm import NormOptions

    config = transformers.Olmo2Config(hidden_size=D, num_attention_heads=H, num_key_value_heads=2, vocab_size=50,
                                      intermediate_size=64, max_position_embeddings=64, rms_norm_eps=1e-6,
                                      eos_token_id=None, pad_token_id=None, bos_token_id=None)
    config._attn_implementation = "sdpa"  # no mask: causal
    hf = olmo2.Olmo2Attention(config, layer_idx=0).eval()
    with torch.no_grad():
        for p in hf.parameters():  # norm gains too: a gain per projection channel, not per head dimension
            p.normal_(0, 0.3)
    ctx = Context(d_model=D, n_heads=H, max_seq_len=64, causal=True, bias=False, rotary=True)
    ctx = replace(ctx, norm=lambda dim=None: NORM.get("rmsnorm")(ctx, NormOptions(eps=1e-6), dim))
    attn = build(ATTENTION, _part(ATTENTION, {"name": "gqa", "n_kv_heads": 2, "qk_norm": "projection"}), ctx).eval()
    rope = build(POSITION, _part(POSITION, {"name": "rope", "theta": config.rope_parameters["rope_theta"]}), ctx)
    with torch.no_grad():
        attn.qkv.weight.copy_(torch.cat([hf.q_proj.weight, hf.k_proj.weight, hf.v_proj.weight]))
        attn.out.weight.copy_(hf.o_proj.weight)
        attn.q_norm.weight.copy_(hf.q_norm.weight)
        attn.k_norm.weight.copy_(hf.k_norm.weight)
    x = torch.randn(2, 7, D)
    cos_sin = olmo2.Olmo2RotaryEmbedding(config)(x, torch.arange(7)[None].expand(2, -1))
    with torch.no_grad():
        expected, _ = hf(x, cos_sin, None)
        torch.testing.assert_close(attn(x, rope, is_causal=True), expected, atol=1e-5, rtol=1e-5)
        per_head = build(ATTENTION, _part(ATTENTION, {"name": "gqa", "n_kv_heads": 2, "qk_norm": "head"}), ctx).eval()
        per_head.load_state_dict({k: v for k, v in attn.state_dict().items() if "_norm" not in k}, strict=False)
        assert (per_head(x, rope, is_causal=True) - expected).abs().max() > 1e-3  # the forms differ


def test_mla_refuses_qk_norm_over_the_projection():
    with pytest.raises(ConfigError, match=r"^model.attention.qk_norm: mla normalises each query head"):
        resolve_config(tiny_cfg(attention={"name": "mla", "qk_norm": "projection"}))
