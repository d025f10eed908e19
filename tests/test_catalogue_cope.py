"""CoPE, contextual position encoding (Golovneva et al. 2024), against x-transformers' attention with use_cope
(weights copied) and the paper's equations written out in float64."""

import math
import re
from functools import partial

import pytest
import torch

from tests.helpers import tiny_cfg
from zoo.block import NO_POSITION as NONE  # no positions but CoPE's
from zoo.component import Context
from zoo.layers.attention import KVCache, attention_bias
from zoo.registry import ATTENTION

xt = pytest.importorskip("x_transformers.x_transformers")


def _pair(max_pos: int, causal: bool = True):
    """zoo's cope and x-transformers' Attention(use_cope) with the same weights, 3 heads of 16, float64. Both tables
    start at zero; they are drawn here so the position term is not zero."""
    torch.manual_seed(0)
    theirs = xt.Attention(dim=48, heads=3, dim_head=16, causal=True, use_cope=True, cope_max_pos=max_pos).double()
    theirs.attend.attn_fn = partial(torch.softmax, dim=-1)  # its softmax runs in float32; float64 here, as zoo's
    ctx = Context(d_model=48, n_heads=3, max_seq_len=32, causal=causal, bias=False)
    ours = ATTENTION.get("cope")(ctx, ATTENTION.options("cope")(max_pos=max_pos)).double()
    with torch.no_grad():
        theirs.attend.cope.pos_emb.normal_()
        ours.qkv.weight.copy_(torch.cat([theirs.to_q.weight, theirs.to_k.weight, theirs.to_v.weight]))
        ours.out.weight.copy_(theirs.to_out.weight)
        ours.pos_emb.copy_(theirs.attend.cope.pos_emb)
    return ours, theirs


@pytest.mark.parametrize("max_pos", [3, 16])  # 3: most counts clamped; 16: none past 13 tokens
def test_cope_matches_x_transformers(max_pos):
    """Outputs and gradients (input, projections, position table) at 3 heads, 13 tokens, with key padding; then a
    cached decode of the last 4 tokens at offset 9 equals the recomputation and x-transformers' full pass."""
    ours, theirs = _pair(max_pos)
    x = torch.randn(2, 13, 48, dtype=torch.float64)
    padding = torch.ones(2, 13, dtype=torch.bool)
    padding[1, 4:6] = False  # keys 4 and 5 hidden (gate 0, not counted); every query still sees a real key

    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    out = ours(x_ours, NONE, *attention_bias(13, 13, True, None, NONE, padding, x.device, x.dtype))
    ref = theirs(x_theirs, mask=padding)
    real = padding[:, :, None]  # a padded query's row differs by convention (zoo: it sees itself); compare the rest
    torch.testing.assert_close(out * real, ref * real, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(out) * real
    out.backward(g), ref.backward(g)
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours.pos_emb.grad, theirs.attend.cope.pos_emb.grad, rtol=1e-10, atol=1e-10)
    assert ours.pos_emb.grad.abs().max() > 1e-3  # the table does learn
    torch.testing.assert_close(ours.qkv.weight.grad, torch.cat(
        [theirs.to_q.weight.grad, theirs.to_k.weight.grad, theirs.to_v.weight.grad]), rtol=1e-10, atol=1e-10)

    with torch.no_grad():
        cache = KVCache()
        ours(x[:, :9], NONE, *attention_bias(9, 9, True, None, NONE, None, x.device, x.dtype), cache=cache)
        step = ours(x[:, 9:], NONE, *attention_bias(4, 13, True, None, NONE, None, x.device, x.dtype), cache=cache,
                    offset=9)
        full = ours(x, NONE, *attention_bias(13, 13, True, None, NONE, None, x.device, x.dtype))
        torch.testing.assert_close(step, full[:, 9:], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(step, theirs(x)[:, 9:], rtol=1e-10, atol=1e-10)


def paper_cope_scores(q, k, e, max_pos: int, causal: bool):
    """The paper's equations, element by element (one head, float64): s_ij = q_i.k_j / sqrt(d) (-inf for a later key
    when causal), g_ij = sigmoid(s_ij), p_ij = min(sum_{k=j}^{i} g_ik, max_pos - 1) (to the last key when not causal),
    e[p] = (p - floor p) e[ceil p] + (1 - (p - floor p)) e[floor p], logits_ij = s_ij + q_i . e[p_ij]."""
    t, d = q.shape
    out = torch.full((t, t), float("-inf"), dtype=torch.float64)
    for i in range(t):
        last = i if causal else t - 1
        s = [float(q[i] @ k[j]) / d ** 0.5 for j in range(last + 1)]
        for j in range(last + 1):
            p = min(sum(1 / (1 + math.exp(-s[m])) for m in range(j, last + 1)), max_pos - 1)
            lo, hi = int(p), min(int(p) + 1, max_pos - 1)
            w = p - lo
            out[i, j] = s[j] + float(q[i] @ (w * e[hi] + (1 - w) * e[lo]))
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_cope_scores_follow_the_paper(causal):
    """The weights a recorded forward keeps are the softmax of the paper's logits, at 11 tokens and max_pos 4 (so
    counts both interpolate and clamp); non-causal (an encoder) counts to the last key."""
    ours, _ = _pair(4, causal=causal)
    torch.manual_seed(1)
    x = torch.randn(1, 11, 48, dtype=torch.float64)
    ours.record = True
    ours(x, NONE, *attention_bias(11, 11, causal, None, NONE, None, x.device, x.dtype))
    with torch.no_grad():
        q, k, _ = ours.qkv(x)[0].split(48, dim=-1)
    for h in range(3):
        heads = slice(16 * h, 16 * (h + 1))
        paper = paper_cope_scores(q[:, heads], k[:, heads], ours.pos_emb.detach(), 4, causal).softmax(-1)
        torch.testing.assert_close(ours.weights[0, h], paper, rtol=1e-10, atol=1e-12)


def test_cope_decoder_decodes_as_it_recomputes_and_stays_causal():
    """A whole decoder: a prompt, then one token at a time with the cache, equals the full recomputation; changing a
    later token changes no earlier logit; greedy generation runs with the cache."""
    from zoo import build_model
    from zoo.generate import generate

    torch.manual_seed(0)
    model = build_model(tiny_cfg(attention={"name": "cope", "max_pos": 6}, position={"name": "none"}, n_heads=3,
                                 d_model=48, init_std=0.3)).double().eval()
    with torch.no_grad():
        for block in model.decoder.blocks:
            block.attn.f.pos_emb.normal_()
    seq = torch.randint(0, 37, (2, 13))
    with torch.no_grad():
        full, cache = model(seq), model.new_cache()
        steps = [model(seq[:, :9], cache=cache)] + [model(seq[:, t:t + 1], cache=cache) for t in range(9, 13)]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)
        changed = seq.clone()
        changed[:, 8] = (changed[:, 8] + 1) % 37
        torch.testing.assert_close(model(changed)[:, :8], full[:, :8], rtol=0, atol=0)
        assert (model(changed)[:, 8:] - full[:, 8:]).abs().max() > 1e-6
    assert generate(model, seq[:, :5], max_new_tokens=6).shape == (2, 11)


def test_cope_refuses_a_table_without_rows():
    from zoo.component import ConfigError

    with pytest.raises(ConfigError, match=r"^" + re.escape("model.attention.max_pos: must be a positive integer, got 0")
                       + "$"):
        ATTENTION.get("cope")(Context(d_model=48, n_heads=3, max_seq_len=8), ATTENTION.options("cope")(max_pos=0))


def test_cope_keeps_its_position_term_under_the_cpu_kernels():
    """The attention kernels (bf16 training on CPU) route attention to the written-out form and its softmax; CoPE's
    term must survive them: a kernelled model equals the formula's bit for bit, and the term is not zero."""
    from zoo import build_model
    from zoo.kernels import apply_kernels

    cfg = tiny_cfg(attention={"name": "cope", "max_pos": 4}, position={"name": "none"}, n_heads=3, d_model=48)
    fast, slow = build_model(cfg).train(), build_model(cfg).train()
    with torch.no_grad():
        for block in fast.decoder.blocks:
            block.attn.f.pos_emb.normal_()
    slow.load_state_dict(fast.state_dict())
    assert apply_kernels(fast, "auto", precision="bf16-mixed")  # whichever this CPU's build gives
    tokens = torch.randint(0, 37, (3, 11))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = fast(tokens), slow(tokens)
        for block in slow.decoder.blocks:
            block.attn.f.pos_emb.data.zero_()
        plain = slow(tokens)
    assert torch.equal(a, b)
    assert (a - plain).abs().max() > 1e-2


SCORE_OPTIONS = [{}, {"sigmoid": True}, {"sparse_topk": 4}]


@pytest.mark.parametrize("option", SCORE_OPTIONS, ids=["softmax", "sigmoid", "sparse_topk"])
@pytest.mark.parametrize("heads,kv_heads", [(3, None), (6, 2)])
def test_cope_with_shared_heads_and_score_options_equals_x_transformers(heads, kv_heads, option):
    """n_kv_heads (GQA) and the options of every attention on CoPE's logits, as x-transformers applies its attn_fn
    after its CoPE term (tests/catalogue.py: 13 tokens, padding, outputs and gradients, a cached decode at offsets;
    its sigmoid has no bias: zoo's b = -log(max_seq_len) is 0 at max_seq_len 1)."""
    from x_transformers.x_transformers import Attention as XAttention

    from tests.catalogue import check_cached_decoding, compare, projection_pairs, zoo_attention

    d = 4 * heads
    attn = zoo_attention("cope", d, heads, causal=True, max_seq_len=1 if option.get("sigmoid") else 64,
                         n_kv_heads=kv_heads, max_pos=5, **option)
    theirs = XAttention(d, dim_head=4, heads=heads, kv_heads=kv_heads, causal=True, use_cope=True, cope_max_pos=5,
                        **option).double()
    table = (attn.pos_emb, lambda w: w, theirs.attend.cope.pos_emb, 0.0)
    compare(attn, theirs, projection_pairs(attn, theirs) + [table], causal=True)
    check_cached_decoding(attn)
