"""Multi-head latent attention (zoo/layers/mla.py): the cache holds the latent only, cached decoding (absorbed
weights) equals recomputation (expanded keys and values), both backends agree, causality holds, and one layer
equals the DeepSeek-V2 formulas written out here head by head."""

import math
from dataclasses import replace
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import make, run, tiny_cfg
from zoo import build_model, count_params, flops_per_token
from zoo.component import ConfigError, Context
from zoo.layers.attention import KVCache
from zoo.layers.norm import NormOptions
from zoo.layers.position import RotaryOptions
from zoo.registry import ATTENTION, MODEL, NORM, POSITION

# DeepSeek-V2's defaults (null: 4 x head size, half the head size), explicit sizes, query compression with qk_norm,
# no rotary part (fine where nothing rotates), a window; tiny_cfg's heads are of 8.
MLAS = [{"name": "mla"}, {"name": "mla", "kv_rank": 16, "rope_dim": 4},
        {"name": "mla", "kv_rank": 12, "q_rank": 10, "qk_norm": True}, {"name": "mla", "window": 4}]
NOT_ROTARY = [p for p in POSITION.names() if not POSITION.get(p).rotary]


def covering(lineages: list[str], per_pair: int = 1) -> list[tuple[str, str, dict]]:
    """(lineage, position, mla options) cases: every position with every lineage, each with per_pair of the
    option sets, rotated so each set meets every lineage and positions, without the whole cross product."""
    return [(lineage, position, MLAS[(i + j + k * len(MLAS) // per_pair) % len(MLAS)])
            for j, lineage in enumerate(lineages) for i, position in enumerate(POSITION.names())
            for k in range(per_pair)]


def _logits(model, tokens, cache=None, src=None):
    if src is None:
        return model(tokens, cache=cache)
    return model.decode(tokens, model.encode(src), cache=cache)


@pytest.mark.parametrize("lineage,position,attention", covering(["decoder_only", "encoder_decoder"], 2), ids=str)
def test_cached_logits_equal_full_recomputation(lineage, position, attention):
    """The cache path attends over the latent with absorbed weights; recomputation expands every head."""
    model = build_model(tiny_cfg(lineage, attention=attention, position={"name": position}, init_std=0.2)).eval()
    seq = torch.randint(0, 37, (2, 20))
    src = torch.randint(0, 37, (2, 9)) if lineage == "encoder_decoder" else None
    with torch.no_grad():
        full = _logits(model, seq, src=src)
        cache = model.new_cache()
        steps = [_logits(model, seq[:, :6], cache, src)]  # prefill a prompt, then one token at a time
        steps += [_logits(model, seq[:, t:t + 1], cache, src) for t in range(6, 20)]
    assert full.std() > 0.1  # weights large enough that attention is far from uniform
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_cache_holds_the_latent_and_rotary_key_only(lineage, position):
    cfg = tiny_cfg(lineage, attention={"name": "mla", "kv_rank": 12, "rope_dim": 4}, position={"name": position})
    model = build_model(cfg).eval()
    cache, src = model.new_cache(), torch.randint(0, 37, (3, 5)) if lineage == "encoder_decoder" else None
    with torch.no_grad():
        _logits(model, torch.randint(0, 37, (3, 7)), cache, src)
        _logits(model, torch.randint(0, 37, (3, 1)), cache, src)
    for block, (self_cache, cross_cache) in zip(model.decoder.blocks, cache, strict=True):
        attn = block.attn.f
        assert attn.n_kv_heads == 4 and attn.head_dim == 8
        assert attn.cache_bytes_per_token(4) == (12 + 4) * 4  # MHA of this size: 2 * 4 * 8 * 4
        assert self_cache.nbytes() == 3 * 8 * attn.cache_bytes_per_token(4)  # batch 3, 8 tokens, float32
        assert [t.shape for t in self_cache.tensors] == [(3, 1, 8, 12 + 4)]  # one head of latent and rotary key
        if lineage == "encoder_decoder":  # the encoder output's latent, once: 5 source tokens
            assert cross_cache.nbytes() == 3 * 5 * block.cross.f.cache_bytes_per_token(4)


def test_kv_cache_grows_two_tensors_of_different_shapes():
    cache, a, b = KVCache(), torch.randn(2, 1, 100, 12), torch.randn(2, 3, 100, 4)
    cache.append(a[:, :, :60], b[:, :, :60])  # capacity 64
    for t in range(60, 100):  # past 64: doubled, the past copied over
        out_a, out_b = cache.append(a[:, :, t:t + 1], b[:, :, t:t + 1])
    assert torch.equal(out_a, a) and torch.equal(out_b, b) and cache.len == 100
    assert cache.buffers[0].shape[2] == 128 and cache.nbytes() == (a.numel() + b.numel()) * 4


@pytest.mark.parametrize("lineage,position,attention", covering(MODEL.names()), ids=str)
def test_sdpa_and_math_backends_agree(lineage, position, attention):
    cfg = tiny_cfg(lineage, attention=attention, position={"name": position}, init_std=0.2)
    fast = build_model(cfg).eval()
    slow = build_model({**cfg, "attention": {**cfg["attention"], "backend": "math"}}).eval()
    slow.load_state_dict(fast.state_dict())
    tokens = torch.randint(0, 37, (3, 11))
    padding = torch.ones(3, 11, dtype=torch.bool)
    padding[1, 8:] = False
    with torch.no_grad():
        if lineage == "encoder_only":
            a, b = fast(tokens, padding=padding), slow(tokens, padding=padding)
        elif lineage == "encoder_decoder":
            a, b = fast(tokens, tokens[:, :6], padding), slow(tokens, tokens[:, :6], padding)
        else:
            a, b = fast(tokens), slow(tokens)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        if lineage == "decoder_only":  # and the absorbed (cached) path
            fc, sc = fast.new_cache(), slow.new_cache()
            torch.testing.assert_close(fast(tokens, cache=fc), slow(tokens, cache=sc), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(fast(tokens[:, :1], cache=fc), slow(tokens[:, :1], cache=sc),
                                       atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lineage,position,attention", covering(["decoder_only", "encoder_decoder"]), ids=str)
def test_causality(lineage, position, attention):
    """Changing tokens after t changes no decoder output at positions <= t."""
    model = build_model(tiny_cfg(lineage, attention=attention, position={"name": position})).eval()
    a = torch.randint(0, 37, (2, 12))
    b = a.clone()
    b[:, 7:] = torch.randint(0, 37, (2, 5))
    src = torch.randint(0, 37, (2, 9))
    out_a, out_b = (model(x) if lineage == "decoder_only" else model(src, x) for x in (a, b))
    torch.testing.assert_close(out_a[:, :7], out_b[:, :7], atol=1e-6, rtol=0)
    assert (out_a[:, 7:] - out_b[:, 7:]).abs().max() > 1e-3


def _rope(u: torch.Tensor, pos: int, theta: float) -> torch.Tensor:
    """RoPE of one vector at one position, pair (i, i + p/2) by angle pos * theta^(-2i/p) (half-split)."""
    half, out = u.shape[-1] // 2, u.clone()
    for i in range(half):
        a = pos * theta ** (-2 * i / u.shape[-1])
        out[i] = u[i] * math.cos(a) - u[i + half] * math.sin(a)
        out[i + half] = u[i + half] * math.cos(a) + u[i] * math.sin(a)
    return out


def _rms(u: torch.Tensor, gain: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return u / torch.sqrt((u * u).mean() + eps) * gain


def _reference(m, x: torch.Tensor, theta: float) -> torch.Tensor:
    """DeepSeek-V2's MLA, causal, token by token and head by head, from the layer's weights (RMSNorm, RoPE)."""
    H, d, r, p = m.n_heads, m.head_dim, m.kv_rank, m.rope_dim
    q_down, q_norm, q_up = m.q
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        latents, rotary_keys = [], []
        for t in range(x.shape[1]):
            down = m.kv_down.weight @ x[b, t] + m.kv_down.bias
            latents.append(_rms(down[:r], m.kv_norm.weight))  # c_t = norm(W_dkv x_t)
            rotary_keys.append(_rope(down[r:], t, theta))  # k_r = RoPE(W_kr x_t), shared by the heads
            c_q = _rms(q_down.weight @ x[b, t] + q_down.bias, q_norm.weight)
            q_all = (q_up.weight @ c_q + q_up.bias).view(H, d + p)
            heads = []
            for h in range(H):
                q_h = torch.cat([q_all[h, :d], _rope(q_all[h, d:], t, theta)])
                rows = slice(h * d, (h + 1) * d)
                keys = torch.stack([torch.cat([m.k_up.weight[rows] @ c + m.k_up.bias[rows], k_r])
                                    for c, k_r in zip(latents, rotary_keys, strict=True)])
                values = torch.stack([m.v_up.weight[rows] @ c + m.v_up.bias[rows] for c in latents])
                heads.append(torch.softmax(keys @ q_h / math.sqrt(d + p), dim=0) @ values)
            out[b, t] = m.out.weight @ torch.cat(heads) + m.out.bias
    return out


def test_one_layer_equals_the_written_out_formula():
    ctx = Context(d_model=24, n_heads=3, max_seq_len=16, causal=True, rotary=True)
    ctx = replace(ctx, norm=partial(NORM.get("rmsnorm"), ctx, NormOptions()))
    m = ATTENTION.get("mla")(ctx, ATTENTION.options("mla")(kv_rank=10, rope_dim=4, q_rank=6, backend="math"))
    with torch.no_grad():
        for p in m.parameters():  # random biases and gains too, so that each one is checked
            p.copy_(torch.randn(p.shape) * 0.5)
    rope = POSITION.get("rope")(ctx, RotaryOptions(theta=100.0))
    x = torch.randn(2, 7, 24)
    with torch.no_grad():
        ref = _reference(m, x, theta=100.0)
        torch.testing.assert_close(m(x, rope, is_causal=True), ref, atol=1e-4, rtol=1e-4)  # expanded
        cache = KVCache()  # absorbed: prefill 3, then one token at a time
        steps = [m(x[:, :3], rope, is_causal=True, cache=cache)]
        steps += [m(x[:, t:t + 1], rope, cache=cache, offset=t) for t in range(3, 7)]
        torch.testing.assert_close(torch.cat(steps, dim=1), ref, atol=1e-4, rtol=1e-4)
    assert ref.abs().mean() > 0.1


def test_rope_rotates_a_part_of_another_size_as_rope_of_that_head_size():
    """The position protocol: rotate() takes any even last dimension; a rotary part of size 4 is rotated as
    RoPE of heads of 4 would rotate it, with scores that depend only on the offset."""
    wide = make(POSITION, "rope", d_model=64, n_heads=4, max_seq_len=8)  # heads of 16
    narrow = make(POSITION, "rope", d_model=16, n_heads=4, max_seq_len=8)  # heads of 4
    q, k = torch.randn(2, 3, 20, 4), torch.randn(2, 1, 20, 4)  # a shared key, as MLA's
    for offset in (0, 5, 30):
        for a, b in zip(wide.rotate(q, k, offset), narrow.rotate(q, k, offset), strict=True):
            torch.testing.assert_close(a, b)
    score = lambda i, j: (wide.rotate(q, q, i)[0] * wide.rotate(k, k, j)[1]).sum()
    torch.testing.assert_close(score(7, 3), score(24, 20), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("lineage", MODEL.names())
@pytest.mark.parametrize("options", [{}, {"kv_rank": 6, "rope_dim": 2, "q_rank": 5, "qk_norm": True},
                                     {"rope_dim": 0}])
@pytest.mark.parametrize("bias", [True, False])
def test_count_params_equals_real_count(lineage, options, bias):
    position = "alibi" if options.get("rope_dim") == 0 else "rope"
    cfg = tiny_cfg(lineage, attention={"name": "mla", **options}, position={"name": position}, bias=bias)
    model = build_model(cfg)
    counts = count_params(cfg)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    attn = model.decoder.blocks[0].attn.f if lineage != "encoder_only" else model.encoder.blocks[0].attn.f
    own = sum(p.numel() for n, p in attn.named_parameters() if "norm" not in n and not n.startswith("q.1."))
    d, r, p, H, hd = 32, attn.kv_rank, attn.rope_dim, 4, 8
    q = d * H * (hd + p) if "q_rank" not in options else d * 5 + 5 * H * (hd + p)
    weights = q + d * (r + p) + 2 * r * H * hd + H * hd * d
    biases = (H * (hd + p) + (5 if "q_rank" in options else 0) + r + p + 2 * H * hd + d) if bias else 0
    assert own == weights + biases


@pytest.mark.parametrize("options,position,error", [
    ({"kv_rank": 0}, "rope", "model.attention.kv_rank: must be a positive integer or null, got 0"),
    ({"rope_dim": 3}, "alibi", "model.attention.rope_dim: must be an even integer >= 0"),
    ({"rope_dim": 0}, "rope", "model.attention.rope_dim: must be > 0 with a rotary position"),
    ({"q_rank": -1}, "rope", "model.attention.q_rank: must be a positive integer or null, got -1"),
    ({"kv_rank": "big"}, "rope", "model.attention.kv_rank: expected an integer | null, got 'big'"),
])
def test_bad_options_fail_in_one_line(options, position, error):
    with pytest.raises(ConfigError) as e:
        build_model(tiny_cfg(attention={"name": "mla", **options}, position={"name": position}))
    assert str(e.value).startswith(error) and "\n" not in str(e.value)


@pytest.mark.parametrize("position", NOT_ROTARY)
def test_no_rotary_part_without_a_rotary_position(position):
    """rope_dim null: half the head size where something rotates it, else 0 (the cache is the latent alone)."""
    model = build_model(tiny_cfg(attention={"name": "mla"}, position={"name": position}))
    attn = model.decoder.blocks[0].attn.f
    assert (attn.kv_rank, attn.rope_dim) == (32, 0)
    rotary = build_model(tiny_cfg(attention={"name": "mla"}, position={"name": "rope"})).decoder.blocks[0].attn.f
    assert (rotary.kv_rank, rotary.rope_dim) == (32, 4)


@pytest.mark.parametrize("lineage", MODEL.names())
def test_flops_per_token_match_torch_flop_counter(lineage):
    """MLA's own FLOP count (as trained: keys and values expanded) against torch.utils.flop_counter."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = tiny_cfg(lineage, attention={"name": "mla", "kv_rank": 16, "q_rank": 12, "backend": "math"},
                   position={"name": "rope"})
    model, t = build_model(cfg).eval(), 16
    tokens = torch.randint(0, 37, (1, t))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        run(model, tokens)
    assert flops_per_token(cfg, seq_len=t)["forward"] == counter.get_total_flops() / t
    attn = model.encoder.blocks[0].attn.f if lineage == "encoder_only" else model.decoder.blocks[0].attn.f
    linear = 2 * (32 * 12 + 12 * 4 * 12 + 32 * 20 + 2 * 16 * 32 + 32 * 32)  # q down and up, kv_down, k_up, v_up, out
    assert attn.flops(10) == linear + 2 * 10 * 4 * (8 + 4) + 2 * 10 * 4 * 8  # scores, weighted sum


def test_a_model_with_mla_learns_to_copy():
    """A broken attention (no access to earlier tokens, a wrong rotation, broken gradients) cannot reach this
    loss: the second half of each row repeats the first, so only attention to 8 tokens back predicts it."""
    model = build_model(tiny_cfg(attention={"name": "mla", "kv_rank": 16, "rope_dim": 4}, position={"name": "rope"},
                                 vocab_size=16, d_model=32, n_layers=2, max_seq_len=16))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest, and fair to a busy machine
    try:
        for _ in range(250):
            half = torch.randint(0, 16, (32, 8))
            seq = torch.cat([half, half], dim=1)
            logits = model(seq[:, :-1])
            loss = F.cross_entropy(logits[:, 8:].reshape(-1, 16), seq[:, 9:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    assert loss.item() < 0.3  # chance is ln 16 = 2.77; 0.08 after 250 steps
