"""The parallel block (norm.placement=parallel): x + attn(norm(x)) + ffn(norm(x)), one norm (GPT-J, PaLM)."""

import pytest
import torch

from tests.helpers import make, tiny_cfg
from zoo import build_model, count_params
from zoo.block import NO_POSITION
from zoo.generate import generate
from zoo.registry import ATTENTION, FFN, NORM, POSITION

PARALLEL = {"placement": "parallel", "type": "rmsnorm"}


def _load(piece, module):
    piece.double().load_state_dict(module.state_dict())  # float64 first: loading into float32 would round
    return piece


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
def test_block_is_x_plus_each_branch_of_one_shared_norm(lineage):
    """Pieces built on their own, with the block's weights, give the block's output: x + attn(norm(x)) +
    ffn(norm(x)), and in an encoder-decoder's decoder + cross(norm(x), memory) too, all from the same norm."""
    cfg = tiny_cfg(lineage, norm=PARALLEL, ffn={"name": "swiglu"}, position={"name": "rope"}, init_std=0.2)
    model = build_model(cfg).double()
    stack = model.decoder
    block, pos = stack.blocks[1].eval(), stack.position
    with torch.no_grad():  # gains away from 1, so a norm applied twice or not at all shows
        block.parallel.norm.weight.uniform_(0.5, 1.5)
    branches = block.parallel.f
    assert [m for m in block.modules() if getattr(m, "count_as", None) == "norm"] == [block.parallel.norm]
    attn = _load(make(ATTENTION, "mha"), branches["attn"])
    ffn = _load(make(FFN, "swiglu"), branches["ffn"])
    norm = _load(make(NORM, "rmsnorm"), block.parallel.norm)
    x, memory = torch.randn(2, 9, 32, dtype=torch.float64), torch.randn(2, 5, 32, dtype=torch.float64)
    h = norm(x)
    expected = x + attn(h, pos, is_causal=True) + ffn(h)
    if lineage == "encoder_decoder":
        cross = _load(make(ATTENTION, "mha", cross=True), branches["cross"])
        expected = expected + cross(h, NO_POSITION, context=memory)
    got = block(x, pos, None, True, memory=memory if lineage == "encoder_decoder" else None)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_parameter_count_matches_the_formula(norm, bias):
    """decoder_only, parallel: per block 4d^2 attention + 2 * d * d_ff FFN + ONE norm (2d with a LayerNorm
    bias, else d), plus biases; embeddings V*d, learned positions T*d, a final norm, a tied head."""
    v, d, layers, t, d_ff = 37, 32, 3, 32, 128
    cfg = tiny_cfg(n_layers=layers, bias=bias, norm={"placement": "parallel", "type": norm}, ffn={"name": "gelu"})
    norm_params = 2 * d if norm == "layernorm" and bias else d
    attention = 4 * d * d + (4 * d if bias else 0)
    ffn = 2 * d * d_ff + (d_ff + d if bias else 0)
    expected = v * d + t * d + layers * (attention + ffn + norm_params) + norm_params
    counts = count_params(cfg)
    assert counts["total"] == expected == sum(p.numel() for p in build_model(cfg).parameters())
    assert counts["norm"] == (layers + 1) * norm_params  # one norm per block, where pre-norm has two
    pre = count_params({**cfg, "norm": {**cfg["norm"], "placement": "pre"}})
    assert pre["total"] - counts["total"] == layers * norm_params


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
def test_cached_generation_equals_uncached(lineage):
    model = build_model(tiny_cfg(lineage, norm=PARALLEL, position={"name": "rope"}, init_std=0.3))
    prompt = torch.randint(0, 37, (2, 4))
    src = torch.randint(0, 37, (2, 7)) if lineage == "encoder_decoder" else None
    a = generate(model, prompt, 20, src=src)
    assert torch.equal(a, generate(model, prompt, 20, src=src, use_cache=False))
    assert len(set(a[:, 4:].flatten().tolist())) > 1


def test_equals_hugging_face_phi():
    """Phi's decoder layer is the parallel block (one input_layernorm feeding attention and MLP); a Phi
    built from a config with random weights, its weights copied, gives the same hidden states."""
    transformers = pytest.importorskip("transformers")
    d, heads, layers, d_ff, v = 32, 4, 2, 96, 37
    config = transformers.PhiConfig(vocab_size=v, hidden_size=d, intermediate_size=d_ff, num_hidden_layers=layers,
                                    num_attention_heads=heads, max_position_embeddings=32, hidden_act="gelu_new",
                                    rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                                     "partial_rotary_factor": 1.0},
                                    attn_implementation="eager")
    ref = transformers.PhiModel(config).double().eval()
    model = build_model(tiny_cfg(d_model=d, n_heads=heads, n_layers=layers, position={"name": "rope", "theta": 500.0},
                                 norm={"placement": "parallel", "type": "layernorm"},
                                 ffn={"name": "gelu_tanh", "d_ff": d_ff})).double().eval()
    with torch.no_grad():
        for p in ref.parameters():  # norm gains and biases away from 1 and 0
            p.add_(torch.randn_like(p) * 0.1)
        model.embed.weight.copy_(ref.embed_tokens.weight)
        for blk, layer in zip(model.decoder.blocks, ref.layers, strict=True):
            attn, ffn, a = blk.parallel.f["attn"], blk.parallel.f["ffn"], layer.self_attn
            blk.parallel.norm.load_state_dict(layer.input_layernorm.state_dict())
            attn.qkv.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            attn.qkv.bias.copy_(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
            attn.out.load_state_dict(a.dense.state_dict())
            ffn.up.load_state_dict(layer.mlp.fc1.state_dict())
            ffn.down.load_state_dict(layer.mlp.fc2.state_dict())
        model.decoder.final_norm.load_state_dict(ref.final_layernorm.state_dict())
        model.decoder.position = make(POSITION, "rope", d, heads, theta=500.0)  # no learned table in Phi
        tokens = torch.randint(0, v, (2, 11))
        torch.testing.assert_close(model.decoder(tokens), ref(tokens).last_hidden_state, atol=1e-6, rtol=0)
