"""Token shift (model.shift_tokens; x-transformers' shift_tokens, from RWKV): each sublayer reads channel groups of
neighbouring tokens. Against x-transformers' Decoder and Encoder (shift_tokens=n) with the weights copied, float64,
3 heads, 13 tokens, a padded row; cached decoding at offsets equals recomputation; bad values refused in one line."""

import pytest
import torch
from x_transformers import Decoder, Encoder

from tests.catalogue import check_chunked_decoding, float64_softmax
from tests.helpers import tiny_cfg
from zoo import build_model
from zoo.build import resolve_config
from zoo.component import ConfigError
from zoo.generate import generate

B, T, D, H, LAYERS = 2, 13, 12, 3, 2


def _cfg(lineage: str = "decoder_only", **over) -> dict:
    return {"name": lineage, "vocab_size": 37, "d_model": D, "n_heads": H, "n_layers": LAYERS, "max_seq_len": 16,
            "position": {"name": "none"}, "bias": False, "shift_tokens": 1, "init_std": 0.3, **over}


def _pairs(stack, xt) -> list[tuple[torch.Tensor, slice, torch.Tensor]]:
    """(zoo's weight, its rows, x-transformers' weight). Both wrap the sublayer in the shift: zoo's attention is
    block.attn.f.f, x-transformers' layer[1].fn."""
    pairs, every = [], slice(None)
    for i, block in enumerate(stack.blocks):
        attn, ffn = xt.layers[2 * i], xt.layers[2 * i + 1]
        qkv = block.attn.f.f.qkv.weight
        pairs += [(block.attn.norm.weight, every, attn[0][0].gamma), (block.ffn.norm.weight, every, ffn[0][0].gamma),
                  (qkv, slice(0, D), attn[1].fn.to_q.weight), (qkv, slice(D, 2 * D), attn[1].fn.to_k.weight),
                  (qkv, slice(2 * D, 3 * D), attn[1].fn.to_v.weight),
                  (block.attn.f.f.out.weight, every, attn[1].fn.to_out.weight),
                  (block.ffn.f.f.up.weight, every, ffn[1].fn.ff[0][0].weight),
                  (block.ffn.f.f.down.weight, every, ffn[1].fn.ff[2].weight)]
    return pairs + [(stack.final_norm.weight, every, xt.final_norm.gamma)]


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_only"])
def test_token_shift_equals_x_transformers(lineage, n):
    """Causal n: shifts 0..n (n = 1: half the channels from the previous token); bidirectional: -n..n (n = 2 at
    d_model 12: five groups of 2, 2 channels left unshifted). Outputs and gradients of every weight."""
    model = build_model(_cfg(lineage, shift_tokens=n)).double()
    stack = model.decoder if lineage == "decoder_only" else model.encoder
    xt = (Decoder if lineage == "decoder_only" else Encoder)(
        dim=D, depth=LAYERS, heads=H, attn_dim_head=D // H, ff_no_bias=True, shift_tokens=n,
        norm_add_unit_offset=False).double()
    for layer in xt.layers:
        if hasattr(layer[1].fn, "attend"):
            float64_softmax(layer[1].fn)
    pairs = _pairs(stack, xt)
    with torch.no_grad():
        for ours, rows, theirs in pairs:
            theirs.copy_(ours[rows])
    tokens = torch.randint(0, 37, (B, T), generator=torch.Generator().manual_seed(1))
    out, ref = stack(tokens), xt(stack.embed(tokens))  # position none: the stack's input is its token embedding
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    w = torch.randn_like(out)
    ours = dict(zip(map(id, stack.parameters()), torch.autograd.grad((out * w).sum(), stack.parameters()),
                    strict=True))
    theirs = torch.autograd.grad((ref * w).sum(), [p for _, _, p in pairs])
    for (p, rows, _), b in zip(pairs, theirs, strict=True):
        torch.testing.assert_close(ours[id(p)][rows], b, atol=1e-10, rtol=0)
    # a padded row: its real tokens get what they get alone (x-transformers on the row cut to its real tokens)
    padding = torch.ones(B, T, dtype=torch.bool)
    padding[1, T - 3:] = False
    padded = stack(tokens, padding=padding)
    torch.testing.assert_close(padded[1, :T - 3], xt(stack.embed(tokens[1:, :T - 3]))[0], atol=1e-10, rtol=0)
    torch.testing.assert_close(padded[0], out[0], atol=1e-10, rtol=0)
    # the shift is seen: with it off (the same weights) the outputs differ
    plain = build_model(_cfg(lineage, shift_tokens=0)).double()
    plain.load_state_dict({k.replace(".f.f.", ".f."): v for k, v in model.state_dict().items()})
    other = plain.decoder if lineage == "decoder_only" else plain.encoder
    assert (other(tokens) - out).abs().max() > 1e-3


@pytest.mark.parametrize("over", [{}, {"shift_tokens": 2}, {"sublayers": "hah"}, {"norm": {"placement": "parallel"}},
                                  {"share_blocks": "all"}, {"memory_tokens": 2}, {"position": {"name": "rope"}}])
@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
def test_cached_decoding_equals_recomputation(lineage, over):
    """Each step keeps its last n inputs in the layer's cache: logits decoded a few tokens at a time at an offset
    equal the full forward's (float64), the cross-attention's queries shifted too; generation agrees."""
    model = build_model(_cfg(lineage, **over)).double().eval()
    tokens = torch.randint(0, 37, (B, T), generator=torch.Generator().manual_seed(2))
    src = tokens[:, :7] if model.needs_source else None
    check_chunked_decoding(model, tokens)
    kw = {"src": src} if src is not None else {}
    assert torch.equal(generate(model, tokens[:, :4], 6, **kw), generate(model, tokens[:, :4], 6, use_cache=False,
                                                                         **kw))


def test_the_shift_adds_no_parameters_and_no_flops():
    from zoo import count_params, flops_per_token

    assert count_params(tiny_cfg(shift_tokens=1)) == count_params(tiny_cfg())
    assert flops_per_token(tiny_cfg(shift_tokens=1)) == flops_per_token(tiny_cfg())


@pytest.mark.parametrize("over,error", [
    ({"shift_tokens": -1}, "model.shift_tokens: must be an integer >= 0, got -1"),
    ({"shift_tokens": True}, "model.shift_tokens: must be an integer >= 0, got True"),
    ({"sublayers": ["af", "ff"]}, "model.shift_tokens: a decoder's block 'ff' has no attention"),
])
def test_bad_token_shifts_are_refused_in_one_line(over, error):
    with pytest.raises(ConfigError, match="^" + error):
        build_model(resolve_config(_cfg(**over)))
