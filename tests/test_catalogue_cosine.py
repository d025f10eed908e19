"""Cosine-similarity attention (zoo/layers/cosine.py) against x-transformers' Attention(qk_norm=True,
qk_norm_scale=g) with the weights copied, float64, at odd shapes; the paper's equation for the temperature."""

import math

import pytest
import torch
from x_transformers.x_transformers import Attention as XAttention

from tests.catalogue import check_cached_decoding, compare, projection_pairs, run_zoo, zoo_attention
from zoo import build_model


@pytest.mark.parametrize("heads,kv_heads", [(3, None), (6, 2)])
@pytest.mark.parametrize("lineage", ["encoder", "decoder", "cross"])
def test_cosine_attention_equals_x_transformers(lineage, heads, kv_heads):
    d, cross, causal = 4 * heads, lineage == "cross", lineage == "decoder"
    attn = zoo_attention("cosine", d, heads, cross=cross, n_kv_heads=kv_heads)
    with torch.no_grad():
        attn.temperature.fill_(7.5)
    xt = XAttention(d, dim_head=4, heads=heads, kv_heads=kv_heads, causal=causal, qk_norm=True,
                    qk_norm_scale=7.5).double()
    compare(attn, xt, projection_pairs(attn, xt), cross=cross, causal=causal)
    if causal:
        check_cached_decoding(attn)


def test_cosine_scores_are_g_times_cosines_and_g_learns():
    """The paper's equation in float64: weights = softmax(g cos(q_h, k_h)), g starting at log2(L^2 - L)."""
    attn = zoo_attention("cosine", 12, 3, max_seq_len=40, backend="math")
    model = build_model({"name": "decoder_only", "vocab_size": 37, "d_model": 12, "n_heads": 3, "n_layers": 1,
                         "max_seq_len": 40, "attention": {"name": "cosine"}})
    assert model.decoder.blocks[0].attn.f.temperature.item() == pytest.approx(math.log2(40 * 40 - 40))
    with torch.no_grad():
        attn.temperature.fill_(3.25)
    attn.record = True
    x = torch.randn(2, 13, 12, dtype=torch.float64)
    out = run_zoo(attn, x)
    q, k, _ = attn.qkv(x).unflatten(-1, (3, 3, 4)).permute(2, 0, 3, 1, 4)  # (B, H, T, hd) each
    cos = torch.nn.functional.cosine_similarity(q[..., :, None, :], k[..., None, :, :], dim=-1)  # (B, H, T, T)
    torch.testing.assert_close(attn.weights, (3.25 * cos).softmax(-1), atol=1e-12, rtol=0)
    out.sum().backward()
    assert attn.temperature.grad is not None and attn.temperature.grad.abs() > 0
