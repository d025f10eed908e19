"""Position schemes of the catalogue (issue 41) against references nobody here wrote: x-transformers' modules
(installed) and the papers' formulas written out in float64."""

import math
import re

import pytest
import torch

from tests.helpers import make, tiny_cfg
from zoo.registry import POSITION

xt = pytest.importorskip("x_transformers.x_transformers")


# ---- ALiBi (Press et al. 2022) at head counts that are not a power of two


def paper_alibi_slopes(n: int) -> list[float]:
    """The paper's rule, written out: for a power of two n the geometric sequence starting at 2^(-8/n) with that
    ratio; otherwise those of the closest lower power of two p, then every other slope of 2p's sequence (its
    1st, 3rd, ...) until there are n."""
    def geometric(m: int) -> list[float]:
        start = 2.0 ** (-8.0 / m)  # the first slope is also the ratio
        return [start ** (i + 1) for i in range(m)]

    p = 2 ** int(math.log2(n))
    return geometric(p) + [s for i, s in enumerate(geometric(2 * p)) if i % 2 == 0][: n - p]


def test_paper_alibi_slopes_as_printed():
    """The rule above gives the paper's own examples: 8 heads 1/2 .. 1/256; 6 heads those of 4 then 2 of 8's."""
    assert paper_alibi_slopes(8) == [2.0 ** -i for i in range(1, 9)]
    assert paper_alibi_slopes(6) == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]


@pytest.mark.parametrize("n_heads", [2, 3, 6, 8, 12])
def test_alibi_slopes_follow_the_paper_and_x_transformers(n_heads):
    alibi = make(POSITION, "alibi", d_model=4 * n_heads, n_heads=n_heads, max_seq_len=16)
    ours = alibi.slopes.double()
    torch.testing.assert_close(ours, torch.tensor(paper_alibi_slopes(n_heads), dtype=torch.float64), rtol=1e-7, atol=0)
    theirs = xt.AlibiPositionalBias(heads=n_heads, total_heads=n_heads).slopes.flatten().double()
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=0)
    assert len(set(ours.tolist())) == n_heads  # every head its own slope


@pytest.mark.parametrize("n_heads", [2, 3, 6, 8, 12])
@pytest.mark.parametrize(("t_q", "t_k"), [(13, 13), (1, 13), (4, 9)])
def test_alibi_bias_matches_x_transformers(n_heads, t_q, t_k):
    """The whole bias (H, t_q, t_k), queries the last t_q of the keys (a cached decode at offset t_k - t_q)."""
    alibi = make(POSITION, "alibi", d_model=4 * n_heads, n_heads=n_heads, max_seq_len=16)
    ours = alibi.score_bias(t_q, t_k, t_k - t_q)
    theirs = xt.AlibiPositionalBias(heads=n_heads, total_heads=n_heads)(t_q, t_k)
    torch.testing.assert_close(ours, theirs.reshape(n_heads, t_q, t_k), rtol=1e-6, atol=0)


# ---- partial rotary (GPT-NeoX rotary_pct, Phi partial_rotary_factor): rope's `fraction`


def _neox_attention(fraction: float, theta: float):
    """Hugging Face GPT-NeoX's attention and rotary embedding, from a config with random weights, in float64."""
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXAttention, GPTNeoXRotaryEmbedding

    cfg = GPTNeoXConfig(hidden_size=48, num_attention_heads=3, num_hidden_layers=1, intermediate_size=64,
                        vocab_size=37, attention_bias=True, attn_implementation="eager",
                        rope_parameters={"rope_type": "default", "rope_theta": theta,
                                         "partial_rotary_factor": fraction})
    return GPTNeoXAttention(cfg, layer_idx=0).double(), GPTNeoXRotaryEmbedding(cfg).double()


def _zoo_attention_from_neox(neox, fraction: float, theta: float):
    from zoo.component import Context
    from zoo.registry import ATTENTION
    from zoo.spec import Part

    ctx = Context(d_model=48, n_heads=3, max_seq_len=8, causal=True, rotary=True)
    attn = ATTENTION.get("mha")(ctx, ATTENTION.options("mha")())
    pos = POSITION.get("rope")(ctx, Part("rope", POSITION.options("rope")(theta=theta, fraction=fraction)).options)
    H, hd = 3, 16
    # NeoX fuses q, k, v per head ([q_h, k_h, v_h] for each head h); zoo all queries, then keys, then values
    w = neox.query_key_value.weight.detach().view(H, 3, hd, 48).transpose(0, 1).reshape(3 * 48, 48)
    b = neox.query_key_value.bias.detach().view(H, 3, hd).transpose(0, 1).reshape(3 * 48)
    with torch.no_grad():
        attn.qkv.weight.copy_(w), attn.qkv.bias.copy_(b)
        attn.out.weight.copy_(neox.dense.weight), attn.out.bias.copy_(neox.dense.bias)
    return attn.double(), pos.double()


@pytest.mark.parametrize(("fraction", "theta"), [(0.25, 10000.0), (0.5, 100.0), (1.0, 10000.0)])
def test_partial_rotary_matches_hugging_face_gpt_neox(fraction, theta):
    """Outputs and gradients at 3 heads, 13 tokens, with padding, then a cached decode of the last 4 at offset 9.
    Both compute their cos/sin tables in float32 (HF under autocast off, zoo in its table), so agreement is to
    float32's rounding of the angles, 1e-7, not float64's; a wrong rotated size is off by O(1)."""
    from zoo.layers.attention import KVCache, attention_bias

    torch.manual_seed(0)
    neox, rotary = _neox_attention(fraction, theta)
    attn, pos = _zoo_attention_from_neox(neox, fraction, theta)
    x = torch.randn(2, 13, 48, dtype=torch.float64)
    padding = torch.ones(2, 13, dtype=torch.bool)
    padding[1, :3] = False  # left padding in the second sequence
    mask, is_causal = attention_bias(13, 13, True, None, pos, padding, x.device, x.dtype)
    additive = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))

    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours = attn(x_ours, pos, mask, is_causal)
    cos_sin = rotary(x, torch.arange(13)[None].expand(2, -1))
    theirs = neox(x_theirs, additive, position_embeddings=cos_sin)[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    g = torch.randn_like(ours)
    ours.backward(g), theirs.backward(g)
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(attn.qkv.weight.grad.view(3, 3, 16, 48).transpose(0, 1).reshape(144, 48),
                               neox.query_key_value.weight.grad, rtol=1e-6, atol=1e-6)

    with torch.no_grad():  # cached: 9 tokens, then 4 at offset 9, equal to NeoX's full pass
        cache = KVCache()
        attn(x[:, :9], pos, *attention_bias(9, 9, True, None, pos, None, x.device, x.dtype), cache=cache)
        step = attn(x[:, 9:], pos, *attention_bias(4, 13, True, None, pos, None, x.device, x.dtype), cache=cache,
                    offset=9)
        causal = torch.full((13, 13), float("-inf"), dtype=torch.float64).triu(1)
        full = neox(x, causal[None, None], position_embeddings=cos_sin)[0]
        torch.testing.assert_close(step, full[:, 9:], rtol=1e-6, atol=1e-6)


def test_partial_rotary_leaves_the_other_dims_alone_and_scores_depend_on_offset_only():
    rope = make(POSITION, "rope", d_model=64, n_heads=4, fraction=0.25)  # head 16: its first 4 dims rotated
    q, k = torch.randn(1, 1, 3, 16, dtype=torch.float64), torch.randn(1, 1, 3, 16, dtype=torch.float64)
    rq, rk = rope.rotate(q, k, 7)
    assert torch.equal(rq[..., 4:], q[..., 4:]) and torch.equal(rk[..., 4:], k[..., 4:])
    assert (rq[..., :4] - q[..., :4]).abs().max() > 1e-3  # and the first 4 did turn
    score = lambda i, j: (rope.rotate(q, q, i)[0] * rope.rotate(k, k, j)[1]).sum()  # noqa: E731
    torch.testing.assert_close(score(12, 5), score(7, 0), rtol=1e-6, atol=0)  # float32 angles
    assert (score(12, 5) - score(12, 0)).abs() > 1e-3  # and they do depend on it


@pytest.mark.parametrize(("fraction", "message"), [
    (0.0, "model.position.fraction: must be in (0, 1], got 0.0"),
    (1.5, "model.position.fraction: must be in (0, 1], got 1.5"),
    (0.1, "model.position.fraction: 0.1 of the head size 16 rotates no pair of dims; valid: at least 0.125")])
def test_partial_rotary_refuses_a_fraction_that_rotates_nothing(fraction, message):
    from zoo.component import ConfigError

    with pytest.raises(ConfigError, match=r"^" + re.escape(message) + "$"):
        make(POSITION, "rope", d_model=64, n_heads=4, fraction=fraction)


# ---- xPos (Sun et al. 2022): rope's xpos_scale_base


def _zoo_mha(max_seq_len: int, causal: bool = True, bias: bool = False, **position):
    from zoo.component import Context
    from zoo.registry import ATTENTION

    ctx = Context(d_model=48, n_heads=3, max_seq_len=max_seq_len, causal=causal, rotary=True, bias=bias)
    attn = ATTENTION.get("mha")(ctx, ATTENTION.options("mha")())
    return attn.double(), POSITION.get("rope")(ctx, POSITION.options("rope")(**position)).double()


def _copy_interleaved(attn, xt_attn, rot: int, hd: int = 16):
    """x-transformers' attention into zoo's. It rotates interleaved pairs (2i, 2i+1) of each head's first `rot`
    dims, zoo half-split ones (i, i + rot/2): the same rotation of q and k after permuting those dims alike."""
    perm = torch.cat([torch.arange(0, rot, 2), torch.arange(1, rot, 2), torch.arange(rot, hd)])
    rows = torch.cat([h * hd + perm for h in range(48 // hd)])
    with torch.no_grad():
        attn.qkv.weight.copy_(torch.cat([xt_attn.to_q.weight[rows], xt_attn.to_k.weight[rows], xt_attn.to_v.weight]))
        attn.out.weight.copy_(xt_attn.to_out.weight)


@pytest.mark.parametrize(("scale_base", "fraction"), [(8.0, 1.0), (512.0, 1.0), (8.0, 0.5)])
def test_xpos_matches_x_transformers(scale_base, fraction):
    """Outputs and gradients at 3 heads, 13 tokens, with key padding; then a cached decode at offset 9 equals the
    recomputation and x-transformers' full pass. A small scale base makes the decay large at 13 tokens. Both tables
    of angles are float32 (x-transformers' inv_freq, zoo's table), so agreement is to 1e-6, not float64's."""
    from zoo.layers.attention import KVCache, attention_bias

    torch.manual_seed(0)
    rot = int(16 * fraction)
    theirs_attn = xt.Attention(dim=48, heads=3, dim_head=16, causal=True).double()
    rotary = xt.RotaryEmbedding(rot, use_xpos=True, scale_base=scale_base).double()
    # x-transformers centres the scale at the sequence's middle (13 // 2); zoo at max_seq_len // 2: the same here
    attn, pos = _zoo_mha(13, xpos_scale_base=scale_base, fraction=fraction)
    _copy_interleaved(attn, theirs_attn, rot)
    x = torch.randn(2, 13, 48, dtype=torch.float64)
    padding = torch.ones(2, 13, dtype=torch.bool)
    padding[1, 4:6] = False  # keys 4 and 5 hidden; every query still sees a real key, so no row is all masked
    freqs, scale = rotary(torch.arange(13))

    x_ours, x_theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours = attn(x_ours, pos, *attention_bias(13, 13, True, None, pos, padding, x.device, x.dtype))
    theirs = theirs_attn(x_theirs, mask=padding, rotary_pos_emb=(freqs, scale))
    real = padding[:, :, None]  # a padded query's row differs by convention (zoo: it sees itself); compare the rest
    torch.testing.assert_close(ours * real, theirs * real, rtol=1e-6, atol=1e-6)
    g = torch.randn_like(ours) * real
    ours.backward(g), theirs.backward(g)
    torch.testing.assert_close(x_ours.grad, x_theirs.grad, rtol=1e-6, atol=1e-6)

    with torch.no_grad():
        cache = KVCache()
        attn(x[:, :9], pos, *attention_bias(9, 9, True, None, pos, None, x.device, x.dtype), cache=cache)
        step = attn(x[:, 9:], pos, *attention_bias(4, 13, True, None, pos, None, x.device, x.dtype), cache=cache,
                    offset=9)
        full = attn(x, pos, *attention_bias(13, 13, True, None, pos, None, x.device, x.dtype))
        torch.testing.assert_close(step, full[:, 9:], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(step, theirs_attn(x, rotary_pos_emb=(freqs, scale))[:, 9:], rtol=1e-6,
                                   atol=1e-6)


def test_xpos_scores_follow_the_paper():
    """The paper's score, written out: q_n . k_m rotated by (n - m) theta, pair i scaled by zeta_i^((n - m)/B)."""
    B, hd = 4.0, 16
    rope = _zoo_mha(10, xpos_scale_base=B)[1]  # head size 16; the rotated vectors below are of size hd
    q, k = torch.randn(hd, dtype=torch.float64), torch.randn(hd, dtype=torch.float64)
    theta = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    zeta = (torch.arange(0, hd, 2, dtype=torch.float64) / hd + 0.4) / 1.4
    for n, m in [(5, 2), (9, 0), (3, 3), (12, 1)]:
        q_n = rope.rotate(q.view(1, 1, 1, hd), q.view(1, 1, 1, hd), n)[0].flatten()
        k_m = rope.rotate(k.view(1, 1, 1, hd), k.view(1, 1, 1, hd), m)[1].flatten()
        # pair i: (x_i, x_{i + hd/2}) as a complex number; the score is Re(q conj(k) e^{i (n - m) theta}) zeta^...
        qc, kc = torch.complex(q[: hd // 2], q[hd // 2:]), torch.complex(k[: hd // 2], k[hd // 2:])
        paper = ((qc * kc.conj() * torch.exp(1j * (n - m) * theta)).real * zeta ** ((n - m) / B)).sum()
        torch.testing.assert_close((q_n * k_m).sum(), paper, rtol=1e-6, atol=1e-6)  # float32 angle table


def test_xpos_is_refused_in_an_encoder():
    from zoo import build_model
    from zoo.component import ConfigError

    for lineage in ("encoder_only", "encoder_decoder"):
        with pytest.raises(ConfigError, match=r"^model.position.xpos_scale_base: xPos is for causal stacks only"):
            build_model(tiny_cfg(lineage, position={"name": "rope", "xpos_scale_base": 512.0}))


def test_xpos_decoder_decodes_as_it_recomputes_and_stays_causal():
    """A whole decoder with xPos: logits of a prompt, then of one token at a time with the cache, equal the full
    recomputation's, past max_seq_len // 2 (the scale's centre) too; changing a later token changes no earlier
    logit; greedy generation runs with the cache."""
    from zoo import build_model
    from zoo.generate import generate

    torch.manual_seed(0)
    model = build_model(tiny_cfg(position={"name": "rope", "xpos_scale_base": 16.0}, n_heads=3, d_model=48,
                                 max_seq_len=24, init_std=0.3)).double().eval()
    seq = torch.randint(0, 37, (2, 20))
    with torch.no_grad():
        full = model(seq)
        cache = model.new_cache()
        steps = [model(seq[:, :6], cache=cache)] + [model(seq[:, t:t + 1], cache=cache) for t in range(6, 20)]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)
        changed = seq.clone()
        changed[:, 11] = (changed[:, 11] + 1) % 37
        torch.testing.assert_close(model(changed)[:, :11], full[:, :11], rtol=0, atol=0)
    assert generate(model, seq[:, :5], max_new_tokens=10).shape == (2, 15)


# ---- dynamic position bias (Wang et al. 2021; x-transformers DynamicPositionBias)


@pytest.mark.parametrize(("depth", "log_distance"), [(1, False), (2, True), (3, False)])
@pytest.mark.parametrize(("t_q", "t_k"), [(13, 13), (1, 13), (4, 9)])
def test_dynamic_position_bias_matches_x_transformers(depth, log_distance, t_q, t_k):
    """The bias (H, t_q, t_k) and the MLP's gradients, 3 heads; queries the last t_q of the keys (a cached decode at
    offset t_k - t_q). In float32: x-transformers feeds its MLP float32 distances whatever its weights' dtype (the
    next test checks zoo against the formula in float64)."""
    torch.manual_seed(0)
    ours = make(POSITION, "dynamic", d_model=48, n_heads=3, width=8, depth=depth, log_distance=log_distance)
    theirs = xt.DynamicPositionBias(8, heads=3, depth=depth, log_distance=log_distance)
    linears = [m for m in ours.mlp if isinstance(m, torch.nn.Linear)]
    theirs_linears = [m for m in theirs.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == len(theirs_linears) == depth + 1
    with torch.no_grad():
        for a, b in zip(linears, theirs_linears, strict=True):
            b.weight.normal_(), b.bias.normal_()  # their init is not ours: draw both sides' weights here
            a.weight.copy_(b.weight), a.bias.copy_(b.bias)
    bias, ref = ours.score_bias(t_q, t_k, t_k - t_q), theirs(t_q, t_k)
    torch.testing.assert_close(bias, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(bias)
    bias.backward(g), ref.backward(g)
    for a, b in zip(linears, theirs_linears, strict=True):
        torch.testing.assert_close(a.weight.grad, b.weight.grad, rtol=1e-5, atol=1e-5)


def test_dynamic_position_bias_is_a_function_of_query_minus_key():
    """Written out: bias[h, i, j] = MLP(i - j)[h], at an offset (positions 20..24 against 0..24); in a decoder the
    cached logits equal recomputation (test_generate covers every registered position; this is the model-level
    check at 3 heads and 13 tokens)."""
    from zoo import build_model

    torch.manual_seed(0)
    pos = make(POSITION, "dynamic", d_model=48, n_heads=3, depth=2).double()
    with torch.no_grad():
        for p in pos.parameters():
            p.normal_()
    bias = pos.score_bias(5, 25, 20)
    for i in range(5):
        for j in range(25):
            d = torch.tensor([[float(20 + i - j)]], dtype=torch.float64)
            torch.testing.assert_close(bias[:, i, j], pos.mlp(d)[0], rtol=1e-12, atol=1e-12)
    model = build_model(tiny_cfg(position={"name": "dynamic"}, n_heads=3, d_model=48, init_std=0.3)).double().eval()
    seq = torch.randint(0, 37, (2, 13))
    with torch.no_grad():
        full, cache = model(seq), model.new_cache()
        steps = [model(seq[:, :9], cache=cache)] + [model(seq[:, t:t + 1], cache=cache) for t in range(9, 13)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)
