"""NormFormer (zoo/layers/normformer.py, attention.head_scale, ffn.post_act_norm): head scaling against
x-transformers' Attention(head_scale=True), the FFN's post-activation norm against its FeedForward(post_act_ln=True),
both with copied weights, and the placement against the paper's equations, in float64 at odd shapes."""

from dataclasses import replace
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from x_transformers.x_transformers import Attention as TheirAttention
from x_transformers.x_transformers import FeedForward

from tests.helpers import make, tiny_cfg
from zoo import build_model
from zoo.block import NO_POSITION
from zoo.component import Context, build
from zoo.generate import generate
from zoo.layers.attention import KVCache
from zoo.layers.ffn import FFNOptions
from zoo.layers.norm import NormOptions
from zoo.registry import ATTENTION, FFN, NORM
from zoo.spec import Part

D, H, T = 24, 3, 13


def _grads_equal(a, b, x, x2, pairs):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    a.sin().sum().backward(), b.sin().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-10, atol=1e-10)
    for p, q in pairs:
        torch.testing.assert_close(p.grad, q.grad.reshape_as(p.grad), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_head_scale_equals_x_transformers_attention(causal):
    theirs = TheirAttention(D, dim_head=D // H, heads=H, head_scale=True, causal=causal).double()
    theirs.attend.attn_fn = partial(F.softmax, dim=-1)  # theirs softmaxes in float32: here in float64, as ours
    ours = make(ATTENTION, "mha", D, H, bias=False, head_scale=True).double()
    with torch.no_grad():
        theirs.head_scale_params.copy_(torch.rand(1, H, 1, 1) + 0.5)
        ours.head_scale.copy_(theirs.head_scale_params[0])
        ours.qkv.weight.copy_(torch.cat([theirs.to_q.weight, theirs.to_k.weight, theirs.to_v.weight]))
        ours.out.weight.copy_(theirs.to_out.weight)
    padding = torch.ones(2, T, dtype=torch.bool)
    padding[1, 9:] = False  # the second sequence: 9 real tokens
    x = torch.randn(2, T, D, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    mask = None if causal else padding[:, None, None, :]
    a = ours(x, NO_POSITION, mask=mask, is_causal=causal)
    b = theirs(x2, mask=None if causal else padding)
    b = b[0] if isinstance(b, tuple) else b
    rows = padding if not causal else torch.ones_like(padding)
    _grads_equal(a[rows], b[rows], x, x2, [(ours.head_scale, theirs.head_scale_params),
                                           (ours.out.weight, theirs.to_out.weight)])
    if causal:  # cached decoding at an offset: the first 7 tokens at once, then one at a time
        cache = KVCache()
        with torch.no_grad():
            steps = [ours(x[:, :7], NO_POSITION, is_causal=True, cache=cache)]
            steps += [ours(x[:, t:t + 1], NO_POSITION, cache=cache, offset=t) for t in range(7, T)]
            torch.testing.assert_close(torch.cat(steps, 1), a, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("gated", [False, True])
def test_post_act_norm_equals_x_transformers_feedforward(gated):
    theirs = FeedForward(D, mult=2, glu=gated, post_act_ln=True, no_bias=not gated).double()
    name = "geglu" if gated else "gelu"
    ctx = Context(d_model=D, n_heads=H, max_seq_len=T, bias=gated)
    ctx = replace(ctx, norm=partial(NORM.get("layernorm"), ctx, NormOptions()))  # the model's norm, as the stack's
    ours = build(FFN, Part(name, FFNOptions(d_ff=2 * D, post_act_norm=True)), ctx)
    assert ours.post_act_norm.weight.shape == (2 * D,)
    ours = ours.double()
    proj_in, ln, proj_out = theirs.ff[0], theirs.ff[1], theirs.ff[-1]
    with torch.no_grad():
        ln.gamma.copy_(torch.rand(2 * D) + 0.5)
        ours.post_act_norm.weight.copy_(ln.gamma)
        if gated:  # their GLU's one projection is [up; gate], with biases; their post-act LayerNorm has none
            ours.post_act_norm.bias.zero_()
            for mine, w, b in zip((ours.up, ours.gate), proj_in.proj.weight.chunk(2), proj_in.proj.bias.chunk(2),
                                  strict=True):
                mine.weight.copy_(w), mine.bias.copy_(b)
            ours.down.bias.copy_(proj_out.bias)
        else:
            ours.up.weight.copy_(proj_in[0].weight)
        ours.down.weight.copy_(proj_out.weight)
    x = torch.randn(3, T, D, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    _grads_equal(ours(x), theirs(x2), x, x2,
                 [(ours.post_act_norm.weight, ln.gamma), (ours.down.weight, proj_out.weight)])


def test_normformer_placement_norms_attention_outputs_only():
    """x + LN(attn(LN(x))) and x + ffn(LN(x)) (Shleifer et al. 2021, Fig. 1), written out."""
    model = build_model(tiny_cfg("encoder_only", d_model=D, n_heads=H, n_layers=1, position={"name": "none"},
                                 norm={"placement": "normformer", "type": "layernorm"})).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    block = model.encoder.blocks[0]
    assert isinstance(block.ffn.norm_out, torch.nn.Identity)
    ln = lambda x, n: F.layer_norm(x, (D,), n.weight, n.bias, n.eps)
    x = torch.randn(2, T, D, dtype=torch.float64)
    h = x + ln(block.attn.f(ln(x, block.attn.norm), NO_POSITION), block.attn.norm_out)
    expect = h + block.ffn.f(ln(h, block.ffn.norm))
    torch.testing.assert_close(block(x, NO_POSITION, None, False), expect, rtol=1e-10, atol=1e-10)


def test_all_three_generate_with_the_cache_as_without():
    cfg = tiny_cfg(norm={"placement": "normformer", "type": "rmsnorm"}, attention={"name": "gqa", "n_kv_heads": 2,
                   "head_scale": True}, ffn={"name": "swiglu", "post_act_norm": True}, position={"name": "rope"})
    model = build_model(cfg).eval()
    prompt = torch.randint(0, 37, (1, 5))
    cached = generate(model, prompt, 8, temperature=0)
    with torch.no_grad():
        seq = prompt
        for _ in range(8):
            seq = torch.cat([seq, model(seq)[:, -1:].argmax(-1)], 1)
    assert torch.equal(cached, seq)
