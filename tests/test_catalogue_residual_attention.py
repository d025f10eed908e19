"""Residual attention (He et al. 2020, RealFormer) against x-transformers' attention with prev_attn (weights copied,
three layers chained) and the paper's equations written out in float64 over a whole model (the stack's seam)."""

from functools import partial

import pytest
import torch

from tests.helpers import tiny_cfg
from zoo.block import NO_POSITION
from zoo.component import Context
from zoo.layers.attention import attention_bias, attention_maps
from zoo.registry import ATTENTION

xt = pytest.importorskip("x_transformers.x_transformers")


def _layers(causal: bool, n: int = 3):
    """n layers of zoo's residual_attention and of x-transformers' Attention with the same weights, 3 heads of 16,
    float64 (x-transformers' softmax, float32, set to float64 as zoo's)."""
    torch.manual_seed(0)
    ctx = Context(d_model=48, n_heads=3, max_seq_len=32, causal=causal, bias=False)
    ours, theirs = [], []
    for _ in range(n):
        a = xt.Attention(dim=48, heads=3, dim_head=16, causal=causal).double()
        a.attend.attn_fn = partial(torch.softmax, dim=-1)
        b = ATTENTION.get("residual_attention")(ctx, ATTENTION.options("residual_attention")()).double()
        with torch.no_grad():
            b.qkv.weight.copy_(torch.cat([a.to_q.weight, a.to_k.weight, a.to_v.weight]) * 2)  # sharper scores
            a.to_q.weight.mul_(2), a.to_k.weight.mul_(2), a.to_v.weight.mul_(2)
            b.out.weight.copy_(a.to_out.weight)
        ours.append(b), theirs.append(a)
    return ours, theirs


def _run_ours(layers, x, mask, is_causal, **kw):
    """The layers chained as a stack chains them: x + attn(x), one list of scores handed along."""
    scores: list = []
    for layer in layers:
        x = x + layer(x, NO_POSITION, mask, is_causal, scores=scores, **kw)
    return x


def _run_theirs(layers, x, padding=None):
    prev = None
    for layer in layers:
        y, inter = layer(x, mask=padding, prev_attn=prev, return_intermediates=True)
        x, prev = x + y, inter.pre_softmax_attn
    return x


@pytest.mark.parametrize("causal", [True, False])
def test_residual_attention_matches_x_transformers(causal):
    """Three chained layers at 3 heads, 13 tokens, with key padding: outputs, and gradients into the input and into
    the first layer's projections (which reach the last layer through the scores too). Decoder: a cached decode of
    the last 4 tokens at offset 9 equals the recomputation."""
    from zoo.layers.attention import KVCache

    ours, theirs = _layers(causal)
    x = torch.randn(2, 13, 48, dtype=torch.float64)
    padding = torch.ones(2, 13, dtype=torch.bool)
    padding[1, 4:6] = False
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = _run_ours(ours, x_ours, *attention_bias(13, 13, causal, None, NO_POSITION, padding, x.device, x.dtype))
    ref = _run_theirs(theirs, x_theirs, padding)
    real = padding[:, :, None]  # a padded query's row differs by convention (zoo: it sees itself); compare the rest
    torch.testing.assert_close(out * real, ref * real, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(out) * real
    out.backward(g), ref.backward(g)
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours[0].qkv.weight.grad[:48], theirs[0].to_q.weight.grad, rtol=1e-10, atol=1e-10)
    # the chain matters: without it the output differs
    with torch.no_grad():
        plain = x
        for layer in ours:
            plain = plain + layer(plain, NO_POSITION, *attention_bias(13, 13, causal, None, NO_POSITION, padding,
                                                                        x.device, x.dtype))
        assert ((plain - out) * real).abs().max() > 1e-3

    if causal:
        with torch.no_grad():
            caches = [KVCache() for _ in ours]
            _chain_cached(ours, caches, x[:, :9], 9, 0)
            step = _chain_cached(ours, caches, x[:, 9:], 13, 9)
            full = _run_ours(ours, x, *attention_bias(13, 13, True, None, NO_POSITION, None, x.device, x.dtype))
            torch.testing.assert_close(step, full[:, 9:], rtol=1e-12, atol=1e-12)


def _chain_cached(layers, caches, x, t_k, offset):
    scores: list = []
    mask, is_causal = attention_bias(x.shape[1], t_k, True, None, NO_POSITION, None, x.device, x.dtype)
    for layer, cache in zip(layers, caches, strict=True):
        x = x + layer(x, NO_POSITION, mask, is_causal, cache=cache, offset=offset, scores=scores)
    return x


@pytest.mark.parametrize("position", ["none", "alibi"])
@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_only"])
def test_a_stack_chains_the_paper_scores(lineage, position):
    """The paper's equations over a whole 3-layer model, in float64: each layer's weights are softmax(S_l + bias,
    masked) with S_l = q_l k_l^T / sqrt(d) + S_(l-1), S_0 = 0, q and k of the layer's own input; a position bias
    (ALiBi) is added once per layer, not handed on."""
    from zoo import build_model

    torch.manual_seed(0)
    model = build_model(tiny_cfg(lineage, attention={"name": "residual_attention"}, position={"name": position},
                                 n_heads=3, d_model=48, n_layers=3, init_std=0.3)).double().eval()
    stack = model.decoder if lineage == "decoder_only" else model.encoder
    inputs = {}
    for i, block in enumerate(stack.blocks):
        block.attn.f.register_forward_pre_hook(lambda m, args, i=i: inputs.__setitem__(i, args[0]))
    tokens = torch.randint(0, 37, (2, 11))
    maps = attention_maps(model, tokens)
    bias = stack.position.score_bias(11, 11, 0)
    bias = torch.zeros(3, 11, 11, dtype=torch.float64) if bias is None else bias
    hidden = torch.ones(11, 11).triu(1).bool() if lineage == "decoder_only" else torch.zeros(11, 11).bool()
    prev = 0
    for i, block in enumerate(stack.blocks):
        q, k, _ = block.attn.f.qkv(inputs[i]).split(48, dim=-1)
        q, k = q.unflatten(-1, (3, 16)).transpose(1, 2), k.unflatten(-1, (3, 16)).transpose(1, 2)
        s = q @ k.transpose(-2, -1) / 4.0 + prev  # (B, H, T, T)
        paper = (s + bias).masked_fill(hidden, float("-inf")).softmax(-1)
        name = next(n for n in maps if n.endswith(f"blocks.{i}.attn.f"))
        torch.testing.assert_close(maps[name], paper.detach(), rtol=1e-10, atol=1e-12)
        prev = s


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
def test_residual_attention_decodes_as_it_recomputes(lineage):
    """A whole model, 2 layers, 3 heads: a 9-token prompt, then one token at a time with the cache (each layer's
    scores of the new query only), equal the full recomputation; generation runs with the cache."""
    from tests.helpers import run
    from zoo import build_model
    from zoo.generate import generate

    torch.manual_seed(0)
    model = build_model(tiny_cfg(lineage, attention={"name": "residual_attention"}, n_heads=3, d_model=48,
                                 init_std=0.3)).double().eval()
    seq = torch.randint(0, 37, (2, 13))
    with torch.no_grad():
        full, cache = run(model, seq), model.new_cache()
        if lineage == "encoder_decoder":  # the source is the sequence itself (run's convention)
            memory = model.encode(seq)
            step = lambda t: model.decode(t, memory, cache=cache)  # noqa: E731
        else:
            step = lambda t: model(t, cache=cache)  # noqa: E731
        steps = [step(seq[:, :9])] + [step(seq[:, t:t + 1]) for t in range(9, 13)]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)
    if lineage == "decoder_only":
        assert generate(model, seq[:, :5], max_new_tokens=6).shape == (2, 11)


def test_residual_attention_keeps_its_chain_under_the_cpu_kernels():
    """bf16 training on CPU with the attention kernels equals the formula bit for bit, and differs from MHA with the
    same weights (the chain is not dropped by a kernel's written-out form)."""
    from zoo import build_model
    from zoo.kernels import apply_kernels

    cfg = tiny_cfg(attention={"name": "residual_attention"}, n_heads=3, d_model=48, n_layers=3, init_std=0.3)
    fast, slow = build_model(cfg).train(), build_model(cfg).train()
    mha = build_model({**cfg, "attention": {"name": "mha"}}).train()
    slow.load_state_dict(fast.state_dict()), mha.load_state_dict(fast.state_dict())
    assert apply_kernels(fast, "auto", precision="bf16-mixed")
    tokens = torch.randint(0, 37, (3, 11))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b, plain = fast(tokens), slow(tokens), mha(tokens)
    assert torch.equal(a, b)
    assert (a - plain).abs().max() > 1e-2


@pytest.mark.parametrize("option", [{}, {"sigmoid": True}, {"sparse_topk": 4}], ids=["softmax", "sigmoid", "topk"])
@pytest.mark.parametrize("heads,kv_heads", [(3, None), (6, 2)])
@pytest.mark.parametrize("causal", [True, False])
def test_residual_attention_with_shared_heads_and_score_options_equals_x_transformers(causal, heads, kv_heads, option):
    """n_kv_heads (GQA) and the options of every attention over three chained layers, against x-transformers' chain
    (prev_attn; its sigmoid has no bias: zoo's b = -log(max_seq_len) is 0 at max_seq_len 1): 13 tokens, key padding,
    outputs, gradients into the input and every weight of the first layer; decoder: a cached decode at offset 9."""
    from x_transformers.x_transformers import Attention as XAttention

    from tests.catalogue import B, T, copy_pairs, float64_softmax, projection_pairs, zoo_attention
    from zoo.layers.attention import KVCache

    d, ours, theirs, pairs = 4 * heads, [], [], []
    for seed in range(3):
        attn = zoo_attention("residual_attention", d, heads, causal=causal, n_kv_heads=kv_heads,
                             max_seq_len=1 if option.get("sigmoid") else 64, **option)
        with torch.no_grad():  # each layer its own weights (zoo_attention draws the same for all)
            torch.manual_seed(seed)
            for p in attn.parameters():
                p.normal_(0, 0.2)
        xa = float64_softmax(XAttention(d, dim_head=4, heads=heads, kv_heads=kv_heads, causal=causal,
                                        **option).double())
        layer_pairs = projection_pairs(attn, xa)
        copy_pairs(layer_pairs)
        ours.append(attn), theirs.append(xa), pairs.append(layer_pairs)
    torch.manual_seed(3)
    x = torch.randn(B, T, d, dtype=torch.float64)
    padding = torch.ones(B, T, dtype=torch.bool)
    padding[1, 4:6] = False
    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = _run_ours(ours, x_ours, *attention_bias(T, T, causal, None, NO_POSITION, padding, x.device, x.dtype))
    ref = _run_theirs(theirs, x_theirs, padding)
    real = padding[:, :, None]
    torch.testing.assert_close(out * real, ref * real, rtol=0, atol=1e-10)
    g = torch.randn_like(out) * real
    first = pairs[0]
    ours_g = torch.autograd.grad((out * g).sum(), [x_ours] + [p[0] for p in first])
    theirs_g = torch.autograd.grad((ref * g).sum(), [x_theirs] + [p[2] for p in first])
    torch.testing.assert_close(ours_g[0], theirs_g[0], rtol=1e-9, atol=1e-10)  # large: three layers' worth
    for (_, transform, _, _), a, b in zip(first, ours_g[1:], theirs_g[1:], strict=True):
        torch.testing.assert_close(transform(a), b, rtol=1e-9, atol=1e-10)
    if causal:
        with torch.no_grad():
            caches = [KVCache() for _ in ours]
            _chain_cached(ours, caches, x[:, :9], 9, 0)
            step = _chain_cached(ours, caches, x[:, 9:], T, 9)
            full = _run_ours(ours, x, *attention_bias(T, T, True, None, NO_POSITION, None, x.device, x.dtype))
            torch.testing.assert_close(step, full[:, 9:], rtol=1e-12, atol=1e-12)
