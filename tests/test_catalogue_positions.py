"""Position schemes of the catalogue (issue 41) against references nobody here wrote: x-transformers' modules
(installed) and the papers' formulas written out in float64."""

import math
import re

import pytest
import torch

from tests.helpers import make
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
    from zoo.schema import Part

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
