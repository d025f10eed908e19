"""model.sublayers, a block's sequence of sublayers (zoo/block.py): macaron's half-step FFNs (Lu et al. 2019) and the
sandwich's reorderings (Press et al. 2020), against their equations in float64, with cached decoding and refusals."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import tiny_cfg
from zoo import build_model, count_params
from zoo.component import ConfigError
from zoo.generate import generate

D, H, T = 24, 3, 13


def test_macaron_block_is_half_ffn_attention_half_ffn():
    """x1 = x + FFN(LN(x)) / 2, x2 = x1 + Attn(LN(x1)), x3 = x2 + FFN'(LN(x2)) / 2 (Lu et al. 2019, eq. 10, Pre-LN)."""
    model = build_model(tiny_cfg("encoder_only", d_model=D, n_heads=H, n_layers=1, sublayers="hah",
                                 position={"name": "none"})).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    block = model.encoder.blocks[0]
    assert block.kinds == "hah" and block.attn is None
    first, attn, last = block.steps
    ln = lambda x, n: F.layer_norm(x, (D,), n.weight, n.bias, n.eps)
    x = torch.randn(2, T, D, dtype=torch.float64)
    pad = torch.ones(2, 1, 1, T, dtype=torch.bool)
    pad[1, ..., 10:] = False
    x1 = x + 0.5 * first.f.f(ln(x, first.norm))
    x2 = x1 + attn.f(ln(x1, attn.norm), model.encoder.position, mask=pad)
    x3 = x2 + 0.5 * last.f.f(ln(x2, last.norm))
    torch.testing.assert_close(block(x, model.encoder.position, pad, False), x3, rtol=1e-10, atol=1e-10)


def test_sandwich_orders_the_stack_as_written_and_keeps_the_counts():
    """Press et al.'s sandwich with k = 1 of n = 2: 'ss' 'ff' (s^k (sf)^(n-k) f^k); the same parameters as 'af' 'af'."""
    sandwich = tiny_cfg(sublayers=["aa", "ff"])
    model = build_model(sandwich)
    assert [b.kinds for b in model.decoder.blocks] == ["aa", "ff"]
    assert count_params(sandwich) == count_params(tiny_cfg())
    assert count_params(sandwich)["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("order", [["ff", "aa"], ["ah", "ha"], "hah"])
@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
def test_cached_decoding_equals_recomputation(lineage, order):
    """Each self- and cross-attention step its own cache; a block with none ('ff' first) gives no offset: the
    next block's does. The logits of 5 tokens at once then one at a time (offsets 5..12) equal the full pass."""
    model = build_model(tiny_cfg(lineage, sublayers=order, position={"name": "rope"}, d_model=D, n_heads=H)).eval()
    seq, src = torch.randint(0, 37, (2, T)), torch.randint(0, 37, (2, 7))
    run = (lambda t, c=None: model(t, cache=c)) if not model.needs_source else \
        (lambda t, c=None: model.decode(t, model.encode(src), cache=c))
    with torch.no_grad():
        full, cache = run(seq), model.new_cache()
        steps = [run(seq[:, :5], cache)] + [run(seq[:, t:t + 1], cache) for t in range(5, T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    assert torch.equal(generate(model, seq[:, :4], 6, **({"src": src} if model.needs_source else {})),
                       generate(model, seq[:, :4], 6, use_cache=False, **({"src": src} if model.needs_source else {})))
    if lineage == "encoder_decoder":
        assert all("c" in b.kinds for b in model.decoder.blocks if "a" in b.kinds)  # a cross after each self


@pytest.mark.parametrize("over,message", [
    ({"sublayers": "axf"}, "model.sublayers: got 'axf'; valid: a string of the letters a, f, h"),
    ({"sublayers": ["af"]}, "model.sublayers: a list of 1 blocks' sublayers for a stack of 2"),
    ({"sublayers": "hah", "norm": {"placement": "parallel"}}, "model.sublayers: placement 'parallel' steps over"),
    ({"sublayers": "hah", "value_embeddings": 1}, "model.sublayers: not with model.value_embeddings"),
])
def test_bad_sublayers_fail_in_one_line(over, message):
    with pytest.raises(ConfigError) as e:
        build_model(tiny_cfg(**over))
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
