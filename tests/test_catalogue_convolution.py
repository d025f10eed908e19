"""Lightweight and dynamic convolution (Wu et al. 2019) against the paper's equations written out in float64 with
explicit loops over positions (x-transformers has neither): centred in an encoder with padding, causal in a decoder,
and cached decoding at an offset equal to recomputation."""

import pytest
import torch

from tests.catalogue import check_against_paper
from tests.helpers import make, tiny_cfg
from zoo import ConfigError, build_model
from zoo.block import NO_POSITION
from zoo.generate import generate
from zoo.layers.attention import Attention, KVCache
from zoo.registry import ATTENTION, POSITION

D, H, T = 12, 3, 13  # d_model, heads (4 channels each), tokens


def paper(m, x: torch.Tensor, causal: bool, padding: torch.Tensor | None) -> torch.Tensor:
    """out_i = W_O y_i + b_O, y_i,c = sum_{j=0..k-1} softmax(W_h)_j u_{i+j-p, c} with h = c // (D / H), u = GLU(W_I x
    + b_I) and u = 0 outside the sequence and at padded tokens; p = k - 1 when causal, (k - 1) // 2 otherwise;
    dynamic: W_h = (W_D u_i + b_D)[h k : (h + 1) k]."""
    k, hd = m.kernel, D // H
    a, g = (x @ m.glu_in.weight.T + m.glu_in.bias).chunk(2, dim=-1)
    u = a * torch.sigmoid(g)
    p = k - 1 if causal else (k - 1) // 2
    y = torch.zeros_like(u)
    for b in range(x.shape[0]):
        for i in range(x.shape[1]):
            for c in range(D):
                h = c // hd
                if m.dynamic:
                    logits = (m.kernel_from_token.weight @ u[b, i] + m.kernel_from_token.bias)[h * k:(h + 1) * k]
                else:
                    logits = m.weight[h]
                w = torch.softmax(logits, dim=-1)
                for j in range(k):
                    n = i + j - p
                    if 0 <= n < x.shape[1] and (padding is None or padding[b, n]):
                        y[b, i, c] = y[b, i, c] + w[j] * u[b, n, c]
    return y @ m.out.weight.T + m.out.bias


def _conv(name: str, kernel: int, causal: bool):
    from zoo.component import Context, build
    from zoo.schema import Part

    torch.manual_seed(0)
    ctx = Context(d_model=D, n_heads=H, max_seq_len=32, causal=causal)
    m = build(ATTENTION, Part(name, ATTENTION.options(name)(kernel=kernel)), ctx)
    with torch.no_grad():  # away from init's small values, so every term shows
        for p in m.parameters():
            p.normal_(0, 0.5)
    return m.double()


def _grads(m, out, x, probe):
    return list(torch.autograd.grad((out * probe).sum(), [x, *m.parameters()]))


@pytest.mark.parametrize("name", ["lightweight_conv", "dynamic_conv"])
@pytest.mark.parametrize("kernel", [1, 4, 5])
@pytest.mark.parametrize("lineage", ["encoder", "decoder"])
def test_convolution_follows_the_paper_outputs_and_gradients(name, kernel, lineage):
    causal = lineage == "decoder"
    m = _conv(name, kernel, causal)
    x = torch.randn(2, T, D, dtype=torch.float64, requires_grad=True)
    check_against_paper(m, x, causal, paper)  # in an encoder, pad tokens must count as zeros


@pytest.mark.parametrize("name", ["lightweight_conv", "dynamic_conv"])
@pytest.mark.parametrize("kernel", [1, 4, 12])
def test_cached_decoding_convolves_the_last_kernel_minus_one_tokens(name, kernel):
    """Prefill 9 tokens, then decode 4 one at a time (offsets 9 .. 12), and 2 at once: equal to the full pass."""
    m = _conv(name, kernel, causal=True).eval()
    x = torch.randn(2, T + 2, D, dtype=torch.float64)
    full = m(x, NO_POSITION, None, True)
    cache = KVCache()
    steps = [m(x[:, :9], NO_POSITION, None, True, cache=cache)]
    steps += [m(x[:, t:t + 1], NO_POSITION, None, False, cache=cache, offset=t) for t in range(9, T)]
    steps.append(m(x[:, T:], NO_POSITION, None, True, cache=cache, offset=T))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-12)
    assert cache.nbytes() == (T + 2) * 2 * m.cache_bytes_per_token(8)  # batch 2, as declared


@pytest.mark.parametrize("name", ["lightweight_conv", "dynamic_conv"])
def test_a_decoder_generates_with_the_cache_as_without(name):
    model = build_model(tiny_cfg(attention={"name": name, "kernel": 3}, init_std=0.3)).eval()
    prompt = torch.randint(0, 37, (2, 4))
    torch.testing.assert_close(generate(model, prompt, 10), generate(model, prompt, 10, use_cache=False))


def test_an_encoder_ignores_padded_tokens():
    model = build_model(tiny_cfg("encoder_only", attention={"name": "dynamic_conv", "kernel": 5})).eval()
    tokens = torch.randint(0, 37, (1, 8))
    padding = torch.tensor([[True] * 5 + [False] * 3])
    other = tokens.clone()
    other[:, 5:] = (other[:, 5:] + 1) % 37
    torch.testing.assert_close(model(tokens, padding)[:, :5], model(other, padding)[:, :5])


def test_cross_attention_is_dot_product_attention_and_a_bad_kernel_is_one_line():
    model = build_model(tiny_cfg("encoder_decoder", attention={"name": "lightweight_conv"}))
    block = model.decoder.blocks[0]
    assert type(block.cross.f) is Attention and type(block.attn.f).__name__ == "Convolution"
    with pytest.raises(ConfigError, match=r"^model\.attention\.kernel: must be a positive integer, got 0$"):
        make(ATTENTION, "lightweight_conv", kernel=0)


@pytest.mark.parametrize(("name", "params"), [
    ("lightweight_conv", (2 * D * D + 2 * D) + H * 7 + (D * D + D)),  # W_I, the kernels, W_O
    ("dynamic_conv", (2 * D * D + 2 * D) + (D * H * 7 + H * 7) + (D * D + D)),  # W_I, W_D, W_O
])
def test_parameter_counts_are_the_papers(name, params):
    m = _conv(name, 7, causal=True)
    assert sum(p.numel() for p in m.parameters()) == params
    assert m.flops(100) == 2 * (params - sum(p.numel() for n, p in m.named_parameters() if "bias" in n or
                                             n == "weight")) + 2 * 7 * D


@pytest.mark.parametrize("causal", [True, False])
def test_a_bias_scheme_adds_its_bias_for_each_taps_distance_to_the_kernel(causal):
    """ALiBi's -m_h |distance| on the logits of tap j (distance p - j): the same as a kernel shifted by it."""
    m = _conv("lightweight_conv", 5, causal)
    alibi = make(POSITION, "alibi", d_model=D, n_heads=H).double()
    p = 4 if causal else 2
    shifted = _conv("lightweight_conv", 5, causal)
    with torch.no_grad():
        shifted.weight -= alibi.slopes.double()[:, None] * (p - torch.arange(5)).abs()
    x = torch.randn(2, T, D, dtype=torch.float64)
    torch.testing.assert_close(m(x, alibi, None, causal), shifted(x, NO_POSITION, None, causal), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["lightweight_conv", "dynamic_conv"])
@pytest.mark.parametrize("option", [{"sigmoid": True}, {"sparse_topk": 2}, {"head_scale": True}, {"qk_norm": True},
                                    {"backend": "math"}, {"window": 3}], ids=lambda o: next(iter(o)))
def test_every_attentions_options_are_refused_in_one_line(name, option):
    """A convolution has no scores (sigmoid, sparse_topk), queries or keys (qk_norm), attention kernel (backend) or
    mask of its own (window); head_scale is left out: its groups of channels are no attention heads. Each is refused
    by name, never silently ignored."""
    key = next(iter(option))
    with pytest.raises(ConfigError, match=rf"^model\.attention\.{key}: not an option of '{name}'; valid: kernel$"):
        build_model(tiny_cfg(attention={"name": name, **option}))
