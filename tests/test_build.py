"""build_model: configs, validation errors, initialisation, analytic counts."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.helpers import tiny_cfg
from zoo import ConfigError, build_model, count_params, flops_per_token, resolve_config
from zoo.layers.ffn import FFNOptions
from zoo.layers.norm import NormOptions
from zoo.registry import ATTENTION, RESIDUAL
from zoo.spec import Part


def test_chapter_rule_attention_4d2_ffn_8d2_per_layer():
    d, layers = 128, 6
    cfg = dict(name="decoder_only", vocab_size=100, d_model=d, n_layers=layers, n_heads=8, bias=False,
               attention={"name": "mha"}, ffn={"name": "gelu"}, position={"name": "rope"})
    counts = count_params(cfg)
    assert counts["attention"] == layers * 4 * d * d
    assert counts["ffn"] == layers * 8 * d * d
    assert counts["ffn"] / (counts["ffn"] + counts["attention"]) == pytest.approx(2 / 3)
    model = build_model(cfg)
    assert sum(p.numel() for p in model.decoder.blocks[0].attn.f.parameters()) == 4 * d * d
    assert sum(p.numel() for p in model.decoder.blocks[0].ffn.f.parameters()) == 8 * d * d


def test_counts_by_component_match_the_model():
    cfg = tiny_cfg("encoder_decoder", tie_embeddings=False)
    counts, model = count_params(cfg), build_model(cfg)
    attention = sum(p.numel() for n, p in model.named_parameters() if ".attn.f." in n or ".cross.f." in n)
    ffn = sum(p.numel() for n, p in model.named_parameters() if ".ffn.f." in n)
    assert (counts["attention"], counts["ffn"]) == (attention, ffn)
    assert counts["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("placement", [n for n in RESIDUAL.names() if not RESIDUAL.get(n).parallel])
@pytest.mark.parametrize("final_norm", [None, True, False])
def test_final_norm_option_overrides_the_placement_rule_and_counts_follow(placement, final_norm):
    cfg = tiny_cfg("encoder_decoder", norm={"placement": placement}, final_norm=final_norm)
    model = build_model(cfg)
    expected = RESIDUAL.get(placement).final_norm if final_norm is None else final_norm  # post, rezero: none
    for stack in (model.encoder, model.decoder):
        assert isinstance(stack.final_norm, torch.nn.LayerNorm) == expected
    assert count_params(cfg)["total"] == sum(p.numel() for p in model.parameters())


def test_flops_per_token_follows_6n_plus_12ltd():
    cfg = dict(name="decoder_only", vocab_size=65, d_model=128, n_layers=4, n_heads=4, max_seq_len=64, bias=False)
    n = count_params(cfg)
    non_embedding = n["attention"] + n["ffn"] + 65 * 128  # the tied head is still a matrix product
    assert flops_per_token(cfg)["train"] == 6 * non_embedding + 12 * 4 * 64 * 128
    assert flops_per_token(cfg, seq_len=32)["forward"] == 2 * non_embedding + 4 * 4 * 32 * 128


def test_defaults_fill_in_and_dictconfig_works():
    from omegaconf import OmegaConf

    cfg = resolve_config(OmegaConf.create({"vocab_size": 10, "ffn": {"name": "swiglu"}}))
    assert cfg.name == "decoder_only" and cfg.ffn.name == "swiglu" and cfg.ffn.options == FFNOptions(d_ff=None)
    assert cfg.norm == Part(name="layernorm", placement="pre", options=NormOptions(eps=1e-5))
    assert cfg.as_dict()["norm"] == {"placement": "pre", "type": "layernorm", "eps": 1e-5}  # the plain form


@pytest.mark.parametrize("over,key", [
    ({"name": "gpt"}, "model.name: unknown model 'gpt'; valid: decoder_only, encoder_decoder, encoder_only"),
    ({"d_model": 30}, "model.d_model: 30 is not divisible by n_heads=4"),
    ({"attention": {"name": "gqa", "n_kv_heads": 3}}, "model.attention.n_kv_heads: n_heads=4 is not divisible"),
    ({"attention": {"name": "gqa"}}, "model.attention.n_kv_heads: required by 'gqa' (an integer)"),
    ({"attention": {"name": "gqa", "n_kv_heads": 0}}, "model.attention.n_kv_heads: must be a positive integer"),
    ({"attention": {"name": "gqa", "n_kv_heads": "two"}}, "model.attention.n_kv_heads: expected an integer, got 'two'"),
    ({"attention": {"name": "gqa", "n_kv_heads": True}}, "model.attention.n_kv_heads: expected an integer, got True"),
    ({"position": {"name": "rope", "theta": "big"}}, "model.position.theta: expected a number, got 'big'"),
    ({"norm": {"eps": 0}}, "model.norm.eps: must be positive"),
    ({"attention": {"name": "mha", "n_kv_heads": 2}}, "model.attention.n_kv_heads: not an option of 'mha'"),
    ({"attention": {"name": "mha", "window": 0}}, "model.attention.window: must be a positive integer"),
    ({"attention": {"name": "mha", "backend": "flash"}}, "model.attention.backend: unknown 'flash'"),
    ({"attention": {"name": "flash"}}, "model.attention.name: unknown attention 'flash'; valid: "
     + ", ".join(ATTENTION.names())),
    ({"position": {"name": "rotary"}}, "model.position.name: unknown position 'rotary'"),
    ({"position": {"name": "rope"}, "d_model": 36, "n_heads": 4}, "model.position.name: rope needs an even head"),
    ({"position": {"name": "learned", "theta": 5.0}}, "model.position.theta: not an option of 'learned'; valid: none"),
    ({"norm": {"type": "batchnorm"}}, "model.norm.type: unknown norm 'batchnorm'; valid: layernorm, rmsnorm"),
    ({"norm": {"placement": "middle"}}, "model.norm.placement: unknown residual 'middle'"),
    ({"norm": {"name": "post_ln"}}, "model.norm.name: unknown key (the presets pre_ln, post_ln, ... are chosen "
     "with norm=post_ln and set placement and type); valid: eps, placement, type"),
    ({"ffn": {"name": "swish"}}, "model.ffn.name: unknown ffn 'swish'"),
    ({"ffn": {"name": "gelu", "d_ff": -1}}, "model.ffn.d_ff: must be a positive integer or null"),
    ({"dropout": 1.0}, "model.dropout: must be in [0, 1)"),
    ({"n_layers": 0}, "model.n_layers: must be a positive integer"),
    ({"vocab_size": None}, "model.vocab_size: must be a positive integer"),
    ({"d_modle": 64}, "model.d_modle: unknown key"),
    ({"final_norm": "yes"}, "model.final_norm: must be true, false or null, got 'yes'; valid: true, false, null"),
])
def test_bad_configs_fail_with_one_line_naming_the_key(over, key):
    cfg = {**tiny_cfg(), **over}
    with pytest.raises(ConfigError) as e:
        build_model(cfg)
    assert str(e.value).startswith(key) and "\n" not in str(e.value)


def test_same_seed_same_weights():
    """(That a swap keeps every other component's weights is tests/test_properties.py, for every registered part.)"""
    base = tiny_cfg()
    a, b = build_model(base, seed=3).state_dict(), build_model(base, seed=3).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = build_model(base, seed=4).state_dict()
    assert not torch.equal(a["embed.weight"], c["embed.weight"])


def test_initialisation_is_as_documented():
    model = build_model(tiny_cfg(n_layers=8, d_model=64, init_std=0.02))
    blk = model.decoder.blocks[3]
    assert blk.attn.f.qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert blk.ffn.f.down.weight.std().item() == pytest.approx(0.02 / 4, rel=0.1)  # / sqrt(2 * 8)
    assert (blk.attn.f.qkv.bias == 0).all() and (blk.attn.norm.weight == 1).all()
    assert model.head.weight is model.embed.weight  # tied by default


@pytest.mark.parametrize("over", [
    {"name": "decoder_only", "attention": {"name": "gqa", "n_kv_heads": 2}, "ffn": {"name": "swiglu"}},
    {"name": "encoder_only", "bias": False, "position": {"name": "rope"}},
    {"name": "encoder_decoder", "attention": {"name": "mqa"}, "n_decoder_layers": 1, "tie_embeddings": False},
], ids=lambda o: o["name"])
def test_flops_per_token_matches_torch_flop_counter(over):
    """The components' own FLOP counts against torch.utils.flop_counter on a real forward pass."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = tiny_cfg(**{**over, "attention": {**over.get("attention", {"name": "mha"}), "backend": "math"}})
    model, t = build_model(cfg).eval(), 16
    tokens = torch.randint(0, 37, (1, t))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(tokens, tokens) if model.needs_source else model(tokens)
    assert flops_per_token(cfg, seq_len=t)["forward"] == counter.get_total_flops() / t


LLAMA_2_7B = dict(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, max_seq_len=4096, bias=False,
                  tie_embeddings=False, position={"name": "rope"}, norm={"placement": "pre", "type": "rmsnorm"},
                  ffn={"name": "swiglu", "d_ff": 11008})


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads and resets Linux's peak RSS")
def test_count_params_of_llama_2_7b_is_exact_and_allocates_nothing():
    """Counted on the meta device: Meta's published 6,738,415,616, and the process grows by a few MB at most
    (a real float32 build would need 27 GB). Run in a fresh process, its peak RSS (VmHWM) reset just before the
    count: ru_maxrss would not do, as Linux keeps it across fork and exec (it can hold the test session's RSS)."""
    code = textwrap.dedent(f"""
        import pathlib, re, zoo
        # imports and registries loaded before the measurement (RoPE's table on meta imports torch's symbolic shapes)
        zoo.count_params(dict(vocab_size=8, position=dict(name="rope"), ffn=dict(name="swiglu")))
        peak = lambda: int(re.search(r"VmHWM:\\s+(\\d+)", pathlib.Path("/proc/self/status").read_text()).group(1))
        pathlib.Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the current RSS
        before = peak()
        print(zoo.count_params({LLAMA_2_7B!r})["total"], peak() - before)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    total, growth_kb = int(out[0]), int(out[1])
    assert total == 6_738_415_616
    assert growth_kb < 20 * 1024


@pytest.mark.parametrize("over", [{}, {"parametrization": "mup", "mup_base_d_model": 16}], ids=["standard", "mup"])
def test_build_model_builds_a_config_once_and_still_refuses_what_building_finds(monkeypatch, over):
    """A config not yet resolved is checked by its own build, not built on the meta device first as well (muP's
    reference widths are built there either way); a constraint only building finds is still refused."""
    import zoo.block

    built, original = [], zoo.block.TransformerBlock.__init__

    def counted(self, *args, **kwargs):
        built.append(torch.empty(0).device.type)  # where blocks are built: "meta" for a check's build
        original(self, *args, **kwargs)

    monkeypatch.setattr(zoo.block.TransformerBlock, "__init__", counted)
    build_model(tiny_cfg(**over))
    assert built.count("cpu") == 2  # the model's two blocks, once
    assert ("meta" in built) == bool(over)  # only muP's reference widths
    with pytest.raises(ConfigError, match="n_heads"):
        build_model(tiny_cfg(d_model=30, **over))  # 30 is not a multiple of 4 heads
