"""Differential attention (zoo/layers/differential.py) against the paper's equations (Ye et al. 2024) written out in
float64: x-transformers 2.31 has no differential attention. Odd shapes (tests/catalogue.py): 3 heads of 4 (halves
of 2), 13 tokens, a padded row, GQA, cross-attention, cached decoding at an offset."""

import math
import re
from dataclasses import replace
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from tests.catalogue import B, T, check_cached_decoding, run_zoo
from tests.helpers import tiny_cfg
from zoo import build_model
from zoo.component import ConfigError, Context, build
from zoo.registry import ATTENTION, NORM
from zoo.spec import Part


def differential(d_model: int, n_heads: int, norm: str = "rmsnorm", layer: int = 0, cross: bool = False,
                 **options) -> torch.nn.Module:
    """The zoo layer alone at block index `layer`, float64, no biases, every weight (lambda's vectors and the head
    norm's gain and bias included) ~ N(0, 0.3) around its start."""
    ctx = Context(d_model=d_model, n_heads=n_heads, max_seq_len=64, bias=False, cross=cross, layer=layer)
    ctx = replace(ctx, norm=partial(NORM.get(norm), ctx, NORM.options(norm)()))
    attn = build(ATTENTION, Part("differential", ATTENTION.options("differential")(**options)), ctx).double()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return attn


def paper(attn, x, visible, context=None, norm: str = "rmsnorm", layer: int = 1):
    """The paper's multi-head differential attention at layer l = `layer` (from 1), from attn's weights:
    head_h = (softmax(Q1 K1^T / sqrt(d)) - lambda softmax(Q2 K2^T / sqrt(d))) V, then (1 - lambda_init) norm(head_h),
    the heads joined and projected. visible (B, T, S): which keys each query sees. Returns (output, the maps)."""
    H, hd, d = attn.n_heads, attn.head_dim, attn.head_dim // 2
    group = H // attn.n_kv_heads
    if context is None:
        Q, K, V = attn.qkv(x).split([H * hd, attn.n_kv_heads * hd, attn.n_kv_heads * hd], dim=-1)
    else:
        Q, (K, V) = attn.q(x), attn.kv(context).chunk(2, dim=-1)
    lambda_init = 0.8 - 0.6 * math.exp(-0.3 * (layer - 1))
    lam = (torch.exp(attn.lambda_q1 @ attn.lambda_k1) - torch.exp(attn.lambda_q2 @ attn.lambda_k2) + lambda_init)

    def softmax(q, k):
        return (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~visible, float("-inf")).softmax(-1)

    heads, maps = [], []
    for h in range(H):
        g = h // group  # the key/value head query head h shares
        q, k, v = Q[..., h * hd:(h + 1) * hd], K[..., g * hd:(g + 1) * hd], V[..., g * hd:(g + 1) * hd]
        maps.append(softmax(q[..., :d], k[..., :d]) - lam * softmax(q[..., d:], k[..., d:]))
        heads.append(maps[-1] @ v)  # (B, T, hd)
    y = torch.stack(heads, dim=2)  # (B, T, H, hd)
    gain = attn.head_norm.weight
    if norm == "rmsnorm":  # the paper's code: RMSNorm over each head, one gain shared by the heads
        y = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + attn.head_norm.eps) * gain
    else:  # the paper's text: GroupNorm, a group per head (torch's, its affine per channel)
        flat = y.flatten(0, 1).flatten(1)
        bias = attn.head_norm.bias  # None: the layer is built without biases
        bias = None if bias is None else bias.repeat(H)
        y = F.group_norm(flat, H, gain.repeat(H), bias, attn.head_norm.eps).view(y.shape)
    y = (1 - lambda_init) * y
    return y.flatten(2) @ attn.out.weight.T, torch.stack(maps, dim=1)


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("heads,kv_heads", [(3, None), (6, 3), (6, 2)])
@pytest.mark.parametrize("lineage", ["encoder", "decoder", "cross"])
def test_differential_attention_is_the_papers(lineage, heads, kv_heads, norm):
    """Outputs, gradients (input and every weight) and the kept maps, at layer 4 (lambda_init 0.57...), padding."""
    d_model, cross, causal = 4 * heads, lineage == "cross", lineage == "decoder"
    attn = differential(d_model, heads, norm, layer=3, cross=cross, n_kv_heads=kv_heads)
    torch.manual_seed(1)
    x = torch.randn(B, T, d_model, dtype=torch.float64, requires_grad=True)
    src = torch.randn(B, T - 4, d_model, dtype=torch.float64, requires_grad=True) if cross else None
    n = (src if cross else x).shape[1]
    padding = torch.ones(B, n, dtype=torch.bool)
    padding[1, n - 3:] = False
    visible = padding[:, None, :].expand(B, T, n)
    if causal:
        visible = visible & torch.ones(T, n, dtype=torch.bool).tril()
    real = torch.ones(B, T, dtype=torch.bool) if cross else padding  # padded queries: zoo keeps their own key
    attn.record = True
    ours = run_zoo(attn, x, padding, src, causal)
    theirs, maps = paper(attn, x, visible, src, norm, layer=4)
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-10, rtol=0)
    torch.testing.assert_close(attn.weights.transpose(1, 2)[real], maps.transpose(1, 2)[real], atol=1e-12, rtol=0)
    attn.record, attn.weights = False, None
    w = torch.randn_like(ours)
    inputs = [x] + ([src] if cross else []) + list(attn.parameters())
    ours = run_zoo(attn, x, padding, src, causal)  # the fused kernel (record took the written-out path)
    for a, b in zip(torch.autograd.grad((ours * w)[real].sum(), inputs),
                    torch.autograd.grad((theirs * w)[real].sum(), inputs), strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    if causal:
        check_cached_decoding(attn)


def test_lambda_init_follows_the_layer_through_the_model():
    """lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)) with l the block's number in the whole model: a decoder-only
    model's blocks 1, 2, 3; an encoder-decoder's decoder counts on after its encoder's 2 blocks (cross-attention
    takes its block's); a number in the config fixes it."""
    schedule = lambda ls: [pytest.approx(0.8 - 0.6 * math.exp(-0.3 * (n - 1)), abs=1e-15) for n in ls]  # noqa: E731
    model = build_model(tiny_cfg(attention={"name": "differential"}, n_layers=3))
    assert [b.attn.f.lambda_init for b in model.decoder.blocks] == schedule([1, 2, 3])
    model = build_model(tiny_cfg("encoder_decoder", attention={"name": "differential"}, n_layers=2,
                                 n_decoder_layers=2))
    assert [b.attn.f.lambda_init for b in model.encoder.blocks] == schedule([1, 2])
    assert [b.attn.f.lambda_init for b in model.decoder.blocks] == schedule([3, 4])
    assert [b.cross.f.lambda_init for b in model.decoder.blocks] == schedule([3, 4])
    model = build_model(tiny_cfg(attention={"name": "differential", "lambda_init": 0.5}, n_layers=2))
    assert [b.attn.f.lambda_init for b in model.decoder.blocks] == [0.5, 0.5]


def test_rope_rotates_each_half_so_scores_depend_on_distance_only():
    """RoPE rotates each half on its own (the paper's code: sub-heads of size d): moving every position by 5 leaves
    the output unchanged (rotating whole heads would pair a number of the first half with one of the second)."""
    from zoo.registry import POSITION

    attn = differential(24, 3)  # heads of 8: halves of 4, two frequencies each
    rope = build(POSITION, Part("rope", POSITION.options("rope")()), Context(d_model=24, n_heads=3, max_seq_len=64))
    x = torch.randn(B, T, 24, dtype=torch.float64)
    at = lambda offset: attn(x, rope, None, True, offset=offset)  # noqa: E731
    torch.testing.assert_close(at(5), at(0), atol=1e-5, rtol=0)  # RoPE's angles are float32


def test_cached_decoding_with_rope_equals_recomputation():
    """Each half is rotated on its own (d = 4 with 3 heads of 8): cached decoding at offsets equals the full
    forward with RoPE, in a whole decoder."""
    model = build_model(tiny_cfg(attention={"name": "differential", "n_kv_heads": 1}, d_model=24, n_heads=3,
                                 position={"name": "rope"})).double().eval()
    seq = torch.randint(0, 37, (2, 13))
    with torch.no_grad():
        cache = model.new_cache()
        steps = [model(seq[:, :6], cache=cache)] + [model(seq[:, t:t + 1], cache=cache) for t in range(6, 13)]
        torch.testing.assert_close(torch.cat(steps, dim=1), model(seq), atol=1e-12, rtol=0)


@pytest.mark.parametrize("options,d_model,n_heads,message", [
    ({}, 9, 3, "model.n_heads: differential attention splits each head (d_model / n_heads = 3) into two halves"),
    ({"lambda_init": 1.0}, 12, 3, "model.attention.lambda_init: must be in [0, 1)"),
])
def test_refused_in_one_line(options, d_model, n_heads, message):
    ctx = Context(d_model=d_model, n_heads=n_heads, max_seq_len=16)
    with pytest.raises(ConfigError, match=re.escape(message)):
        build(ATTENTION, Part("differential", ATTENTION.options("differential")(**options)), ctx)
