"""Attention on attention (Huang et al. 2019) against x-transformers' attention with on_attn (weights copied; its GLU
reads v_hat alone, zoo's query=false) and the paper's equations, which read the query too, in float64."""

from functools import partial

import pytest
import torch

from tests.helpers import tiny_cfg
from zoo.block import NO_POSITION
from zoo.component import Context
from zoo.layers.attention import KVCache, attention_bias
from zoo.registry import ATTENTION

xt = pytest.importorskip("x_transformers.x_transformers")


def _aoa(query: bool, causal: bool = True, cross: bool = False, bias: bool = False):
    ctx = Context(d_model=48, n_heads=3, max_seq_len=32, causal=causal, cross=cross, bias=bias)
    layer = ATTENTION.get("attention_on_attention")(ctx, ATTENTION.options("attention_on_attention")(query=query))
    return layer.double()


@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_attention_on_attention_matches_x_transformers(cross):
    """query=false, 3 heads, 13 tokens, with padding (of the keys, or of the source when cross-attending): outputs and
    gradients, the GLU's included; self-attention then decodes the last 4 tokens at offset 9 with the cache as it
    recomputes, and as x-transformers' full pass."""
    torch.manual_seed(0)
    theirs = xt.Attention(dim=48, heads=3, dim_head=16, causal=not cross, on_attn=True).double()
    theirs.attend.attn_fn = partial(torch.softmax, dim=-1)  # its softmax runs in float32; float64 here, as zoo's
    ours = _aoa(query=False, causal=not cross, cross=cross)
    with torch.no_grad():
        if cross:
            ours.q.weight.copy_(theirs.to_q.weight), ours.kv.weight.copy_(torch.cat([theirs.to_k.weight,
                                                                                     theirs.to_v.weight]))
        else:
            ours.qkv.weight.copy_(torch.cat([theirs.to_q.weight, theirs.to_k.weight, theirs.to_v.weight]))
        ours.aoa.weight.copy_(theirs.to_out[0].weight)  # GLU: the first half the information, the second the gate
    x, source = torch.randn(2, 13, 48, dtype=torch.float64), torch.randn(2, 7, 48, dtype=torch.float64)
    padding = torch.ones(2, 7 if cross else 13, dtype=torch.bool)
    padding[1, 4:6] = False

    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    if cross:
        out = ours(x_ours, NO_POSITION, padding[:, None, None, :], context=source)
        ref = theirs(x_theirs, context=source, context_mask=padding)
        real = torch.ones(2, 13, 1, dtype=torch.bool)
    else:
        out = ours(x_ours, NO_POSITION, *attention_bias(13, 13, True, None, NO_POSITION, padding, x.device, x.dtype))
        ref = theirs(x_theirs, mask=padding)
        real = padding[:, :, None]  # a padded query's row differs by convention (zoo: it sees itself)
    torch.testing.assert_close(out * real, ref * real, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(out) * real
    out.backward(g), ref.backward(g)
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours.aoa.weight.grad, theirs.to_out[0].weight.grad, rtol=1e-10, atol=1e-10)

    if not cross:
        with torch.no_grad():
            cache = KVCache()
            ours(x[:, :9], NO_POSITION, *attention_bias(9, 9, True, None, NO_POSITION, None, x.device, x.dtype),
                 cache=cache)
            step = ours(x[:, 9:], NO_POSITION, *attention_bias(4, 13, True, None, NO_POSITION, None, x.device,
                                                               x.dtype), cache=cache, offset=9)
            full = ours(x, NO_POSITION, *attention_bias(13, 13, True, None, NO_POSITION, None, x.device, x.dtype))
            torch.testing.assert_close(step, full[:, 9:], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(step, theirs(x)[:, 9:], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_on_attention_follows_the_paper(causal):
    """The paper's equations, written out in float64 with biases: v_hat = the heads' softmax(q k^T / sqrt(d)) v
    joined, i = W_i^v v_hat + W_i^q x + b_i, g = sigmoid(W_g^v v_hat + W_g^q x + b_g), out = g * i."""
    torch.manual_seed(0)
    ours = _aoa(query=True, causal=causal, bias=True)
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0, 0.3)
    x = torch.randn(2, 11, 48, dtype=torch.float64)
    out = ours(x, NO_POSITION, *attention_bias(11, 11, causal, None, NO_POSITION, None, x.device, x.dtype))

    q, k, v = (t.unflatten(-1, (3, 16)).transpose(1, 2) for t in ours.qkv(x).split(48, dim=-1))
    scores = q @ k.transpose(-2, -1) / 4.0
    if causal:
        scores = scores.masked_fill(torch.ones(11, 11).triu(1).bool(), float("-inf"))
    v_hat = (scores.softmax(-1) @ v).transpose(1, 2).flatten(2)  # (B, T, 48)
    W, b = ours.aoa.weight, ours.aoa.bias  # rows: information then gate; columns: v_hat then the query
    W_iv, W_iq, W_gv, W_gq = W[:48, :48], W[:48, 48:], W[48:, :48], W[48:, 48:]
    info = v_hat @ W_iv.T + x @ W_iq.T + b[:48]
    gate = torch.sigmoid(v_hat @ W_gv.T + x @ W_gq.T + b[48:])
    torch.testing.assert_close(out, gate * info, rtol=1e-12, atol=1e-12)


def test_attention_on_attention_decoder_decodes_as_it_recomputes():
    """A whole decoder (3 heads, 13 tokens): a 9-token prompt, then one token at a time with the cache, equals the
    full recomputation; greedy generation runs with the cache."""
    from zoo import build_model
    from zoo.generate import generate

    torch.manual_seed(0)
    model = build_model(tiny_cfg(attention={"name": "attention_on_attention"}, n_heads=3, d_model=48,
                                 init_std=0.3)).double().eval()
    seq = torch.randint(0, 37, (2, 13))
    with torch.no_grad():
        full, cache = model(seq), model.new_cache()
        steps = [model(seq[:, :9], cache=cache)] + [model(seq[:, t:t + 1], cache=cache) for t in range(9, 13)]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)
    assert generate(model, seq[:, :5], max_new_tokens=6).shape == (2, 11)


@pytest.mark.parametrize("option", [{}, {"sparse_topk": 4}], ids=["softmax", "sparse_topk"])
@pytest.mark.parametrize("heads,kv_heads", [(3, None), (6, 2)])
@pytest.mark.parametrize("lineage", ["encoder", "decoder", "cross"])
def test_attention_on_attention_with_shared_heads_equals_x_transformers(lineage, heads, kv_heads, option):
    """n_kv_heads (GQA) and an option of every attention under the GLU, query=false, against x-transformers
    (tests/catalogue.py: 13 tokens, padding, outputs and gradients, the GLU's included; decoder: cached decoding)."""
    from tests.catalogue import check_cached_decoding, compare, head_columns, qkv_pairs, zoo_attention

    d, cross, causal = 4 * heads, lineage == "cross", lineage == "decoder"
    attn = zoo_attention("attention_on_attention", d, heads, cross=cross, causal=causal, n_kv_heads=kv_heads,
                         query=False, **option)
    theirs = xt.Attention(d, dim_head=4, heads=heads, kv_heads=kv_heads, causal=causal, on_attn=True,
                          **option).double()
    glu = (attn.aoa.weight, head_columns(attn), theirs.to_out[0].weight, 0.0)  # its columns read the heads
    compare(attn, theirs, qkv_pairs(attn, theirs) + [glu], cross=cross, causal=causal)
    if causal:
        check_cached_decoding(attn)
