"""Value residual learning (model.value_residual; ResFormer, Zhou et al. 2024): each layer's values mixed with its
stack's first layer's, v_n = a * v_n + b * v_1, a = b = 0.5 at init. Against x-transformers' Decoder and Encoder
(add_value_residual, learned_value_residual_mix=False: v_1.lerp(v_n, 0.5)) with the weights copied, float64, 3
heads, 13 tokens, a padded row; cached decoding at offsets equals recomputation."""

import pytest
import torch
from x_transformers import Decoder, Encoder

from tests.catalogue import check_chunked_decoding, float64_softmax
from zoo import build_model, count_params
from zoo.build import resolve_config
from zoo.component import ConfigError

B, T, D, H, LAYERS = 2, 13, 12, 3, 3


def _cfg(lineage: str = "decoder_only", **over) -> dict:
    return {"name": lineage, "vocab_size": 37, "d_model": D, "n_heads": H, "n_layers": LAYERS, "max_seq_len": 16,
            "position": {"name": "none"}, "bias": False, "value_residual": True, "init_std": 0.3, **over}


def _pairs(stack, xt) -> list[tuple[torch.Tensor, slice, torch.Tensor]]:
    """(zoo's weight, its rows, x-transformers' weight): per block a norm and attention (q, k, v, out), a norm and
    FFN; the final norm. zoo's qkv is one fused projection: q, k and v are its row blocks."""
    pairs, every = [], slice(None)
    for i, block in enumerate(stack.blocks):
        attn, ffn = xt.layers[2 * i], xt.layers[2 * i + 1]
        qkv = block.attn.f.qkv.weight
        pairs += [(block.attn.norm.weight, every, attn[0][0].gamma), (block.ffn.norm.weight, every, ffn[0][0].gamma),
                  (qkv, slice(0, D), attn[1].to_q.weight), (qkv, slice(D, 2 * D), attn[1].to_k.weight),
                  (qkv, slice(2 * D, 3 * D), attn[1].to_v.weight),
                  (block.attn.f.out.weight, every, attn[1].to_out.weight),
                  (block.ffn.f.up.weight, every, ffn[1].ff[0][0].weight),
                  (block.ffn.f.down.weight, every, ffn[1].ff[2].weight)]
    return pairs + [(stack.final_norm.weight, every, xt.final_norm.gamma)]


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_only"])
def test_value_residual_equals_x_transformers(lineage):
    model = build_model(_cfg(lineage)).double()
    stack = model.decoder if lineage == "decoder_only" else model.encoder
    layers = Decoder if lineage == "decoder_only" else Encoder
    xt = layers(dim=D, depth=LAYERS, heads=H, attn_dim_head=D // H, ff_no_bias=True, add_value_residual=True,
                learned_value_residual_mix=False, norm_add_unit_offset=False).double()
    for layer in xt.layers:
        if hasattr(layer[1], "attend"):
            float64_softmax(layer[1])
    pairs = _pairs(stack, xt)
    with torch.no_grad():
        for ours, rows, theirs in pairs:
            theirs.copy_(ours[rows])
    tokens = torch.randint(0, 37, (B, T), generator=torch.Generator().manual_seed(1))
    padding = torch.ones(B, T, dtype=torch.bool)
    padding[1, T - 3:] = False
    out = stack(tokens, padding=padding)
    ref = xt(stack.embed(tokens), mask=padding)  # position none: the stack's input is its token embedding
    torch.testing.assert_close(out[padding], ref[padding], atol=1e-10, rtol=0)
    w = torch.randn_like(out)
    ours = dict(zip(map(id, stack.parameters()), torch.autograd.grad((out * w)[padding].sum(), stack.parameters(),
                                                                     allow_unused=True), strict=True))
    theirs = torch.autograd.grad((ref * w)[padding].sum(), [p for _, _, p in pairs])
    for (p, rows, _), b in zip(pairs, theirs, strict=True):
        torch.testing.assert_close(ours[id(p)][rows], b, atol=1e-10, rtol=0)
    # without the residual the outputs differ: the comparison sees the mix
    plain = build_model(_cfg(lineage, value_residual=False)).double()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "value_mix" not in k})
    other = plain.decoder if lineage == "decoder_only" else plain.encoder
    assert (other(tokens, padding=padding) - out)[padding].abs().max() > 1e-3


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
def test_value_residual_decodes_from_the_cache_as_full_recomputation(lineage):
    """Each layer mixes the first layer's values of the new tokens before caching its own: logits decoded a few
    tokens at a time at an offset equal the full forward's (float64)."""
    model = build_model(_cfg(lineage, position={"name": "rope"})).double().eval()
    check_chunked_decoding(model, torch.randint(0, 37, (B, T), generator=torch.Generator().manual_seed(2)))


def test_the_mix_is_counted_and_its_values_are_not_kept():
    """Each layer after the first adds two scalars (counted as attention); the first layer's values are taken by
    the stack in the forward, so no module holds them (nor their graph) afterwards."""
    plain, mixed = count_params(_cfg(value_residual=False)), count_params(_cfg())
    assert mixed["total"] - plain["total"] == 2 * (LAYERS - 1)
    model = build_model(_cfg())
    model(torch.randint(0, 37, (B, T)))
    assert all(getattr(m, "kept_values", None) is None for m in model.modules())


@pytest.mark.parametrize("over,error", [
    ({"value_embeddings": 1}, "model.value_residual: and value_embeddings both mix into a layer's values"),
    ({"attention": {"name": "mla"}}, "model.value_residual: attention 'mla' takes no value embeddings"),
    ({"value_residual": 1}, "model.value_residual: must be true or false, got 1"),
])
def test_impossible_value_residuals_are_refused_in_one_line(over, error):
    with pytest.raises(ConfigError, match="^" + error):
        build_model(resolve_config(_cfg(**over)))
