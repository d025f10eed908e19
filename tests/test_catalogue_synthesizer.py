"""Synthesizer (Tay et al. 2020) against its equations written out in float64, token by token (x-transformers has
no synthesizer): dense, random and factorized logits, alone and mixed with dot-product attention (plus, alpha), in
an encoder with padding and in a decoder, with cached decoding at an offset."""

import math

import pytest
import torch

from tests.catalogue import check_against_paper
from tests.helpers import make, tiny_cfg
from zoo import ConfigError, build_model
from zoo.block import NO_POSITION
from zoo.component import Context, build
from zoo.generate import generate, position_limit
from zoo.layers.attention import Attention, KVCache, attention_bias
from zoo.registry import ATTENTION
from zoo.schema import Part

D, H, T, L = 12, 3, 13, 16  # d_model, heads (head size 4), tokens, max_seq_len
ROWS = [("dense", "none"), ("dense", "plus"), ("dense", "alpha"), ("factorized", "none"), ("random", "none"),
        ("random", "plus"), ("random", "alpha")]  # Narang et al. 2021's Table 1 rows


def softmax_of_seen(s: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    return torch.softmax(s.masked_fill(~seen, -math.inf), dim=-1)


def paper(m, x: torch.Tensor, causal: bool, padding: torch.Tensor | None, weights=softmax_of_seen) -> torch.Tensor:
    """y_i = W_o [g_h sum_j w_ij^h W_v^h x_j]_h + b_o with w_i^h = softmax_j(B_i^h[j]) (+ S_i^h[j] for plus; alpha_h
    softmax(B) + (1 - alpha_h) softmax(S) for alpha), B from the paper's formula for each kind, one token at a time.
    Key j is hidden from query i when causal and j > i, or when padded (a padded query keeps its own key).
    weights(s, seen): the softmax, or an option's map from scores to weights; g_h: head_scale's (else 1)."""
    hd = D // H
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for i in range(x.shape[1]):
            heads = []
            for h in range(H):
                rows = slice(h * hd, (h + 1) * hd)
                if m.kind == "dense":  # B_i = W2 relu(W1 x_i + b1) + b2, head h's max_seq_len outputs
                    hidden = torch.relu(m.dense[0].weight @ x[b, i] + m.dense[0].bias)
                    logits = (m.dense[2].weight[h * L:(h + 1) * L] @ hidden + m.dense[2].bias[h * L:(h + 1) * L])
                elif m.kind == "random":  # B_i = R[i]
                    logits = m.random[h, i]
                else:  # B_i = (R1 R2^T)[i] = sum_r R1[i, r] R2[:, r]
                    logits = sum(m.left[h, i, r] * m.right[h, :, r] for r in range(m.rank))
                logits = logits[: x.shape[1]]
                seen = torch.tensor([not (causal and j > i) and (padding is None or bool(padding[b, j]) or j == i)
                                     for j in range(x.shape[1])])
                softmax = lambda s, seen=seen: weights(s, seen)
                if m.mix != "none":
                    wq, wk = m.qk.weight[:D][rows], m.qk.weight[D:][rows]
                    bq, bk = m.qk.bias[:D][rows], m.qk.bias[D:][rows]
                    scores = torch.stack([(wq @ x[b, i] + bq) @ (wk @ x[b, j] + bk) for j in range(x.shape[1])])
                    scores = scores / math.sqrt(hd)
                if m.mix == "none":
                    w = softmax(logits)
                elif m.mix == "plus":
                    w = softmax(logits + scores)
                else:
                    w = m.alpha[h] * softmax(logits) + (1 - m.alpha[h]) * softmax(scores)
                values = torch.stack([m.v.weight[rows] @ x[b, j] + m.v.bias[rows] for j in range(x.shape[1])])
                heads.append((1 if m.head_scale is None else m.head_scale[h, 0, 0]) * (w @ values))
            out[b, i] = m.out.weight @ torch.cat(heads) + m.out.bias
    return out


def _synthesizer(kind: str, mix: str, **options):
    torch.manual_seed(0)
    m = build(ATTENTION, Part("synthesizer", ATTENTION.options("synthesizer")(synthetic=kind, mix=mix, rank=3,
                                                                              **options)),
              Context(d_model=D, n_heads=H, max_seq_len=L, bias=True, norm=lambda dim: torch.nn.LayerNorm(dim)))
    with torch.no_grad():  # away from init's small values, so every term shows
        for p in m.parameters():
            p.normal_(0, 0.5)
    return m.double()


def _grads(m, out: torch.Tensor, x: torch.Tensor, probe: torch.Tensor) -> list[torch.Tensor]:
    params = [x, *m.parameters()]
    return list(torch.autograd.grad((out * probe).sum(), params))


@pytest.mark.parametrize(("kind", "mix"), ROWS)
@pytest.mark.parametrize("lineage", ["encoder", "decoder"])
def test_synthesizer_follows_the_paper_outputs_and_gradients(kind, mix, lineage):
    m = _synthesizer(kind, mix)
    x = torch.randn(2, T, D, dtype=torch.float64, requires_grad=True)
    causal = lineage == "decoder"
    check_against_paper(m, x, causal, paper)


@pytest.mark.parametrize(("kind", "mix"), ROWS)
def test_cached_decoding_takes_each_new_querys_row_at_its_position(kind, mix):
    """Prefill 9 tokens, then decode 4 one at a time (offsets 9 .. 12): each equals the full causal pass."""
    m = _synthesizer(kind, mix).eval()
    x = torch.randn(2, T, D, dtype=torch.float64)
    full = m(x, NO_POSITION, None, True)
    cache = KVCache()
    steps = [m(x[:, :9], NO_POSITION, None, True, cache=cache)]
    for t in range(9, T):
        steps.append(m(x[:, t:t + 1], NO_POSITION, None, False, cache=cache, offset=t))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-12)
    assert cache.len == T and len(cache.tensors) == (1 if mix == "none" else 2)  # values (and keys)
    assert cache.nbytes() == T * 2 * m.cache_bytes_per_token(8)  # (batch 2) bytes per token, as declared


def test_a_decoder_generates_with_the_cache_as_without_and_slides_past_max_seq_len():
    model = build_model(tiny_cfg(attention={"name": "synthesizer", "synthetic": "random", "mix": "plus"},
                                 max_seq_len=12, init_std=0.3)).eval()
    assert position_limit(model) == 12  # the synthesizer's own limit: generation knows it
    prompt = torch.randint(0, 37, (2, 4))
    torch.testing.assert_close(generate(model, prompt, 8), generate(model, prompt, 8, use_cache=False))
    assert generate(model, prompt, 14, slide=True).shape == (2, 18)  # past 12: the last 12 tokens each step


@pytest.mark.parametrize("synthetic", ["dense", "random"])
def test_memory_tokens_take_the_first_positions(synthetic):
    """model.memory_tokens=3: the weights cover 3 + max_seq_len positions, the memory's first; training length and
    cached generation work as without memory, and generation's limit on tokens stays max_seq_len."""
    model = build_model(tiny_cfg(attention={"name": "synthesizer", "synthetic": synthetic, "mix": "alpha"},
                                 max_seq_len=12, memory_tokens=3, init_std=0.3)).eval()
    attn = model.decoder.blocks[0].attn.f
    assert attn.positions == 15 and position_limit(model) == 12
    prompt = torch.randint(0, 37, (2, 4))
    torch.testing.assert_close(generate(model, prompt, 8), generate(model, prompt, 8, use_cache=False))
    assert model(torch.randint(0, 37, (2, 12))).shape[1] == 12


def test_longer_than_max_seq_len_is_refused_in_one_line():
    m = make(ATTENTION, "synthesizer", d_model=D, n_heads=H, max_seq_len=L)
    with pytest.raises(ConfigError, match=r"^model\.max_seq_len: the synthesizer's weights cover 16 positions, this "
                                          r"sequence reaches 17; valid: .*$"):
        m(torch.randn(1, L + 1, D), NO_POSITION)


def test_cross_attention_is_dot_product_attention():
    """An encoder-decoder keeps source attention as it was (the papers'): MHA over the encoder's keys."""
    model = build_model(tiny_cfg("encoder_decoder", attention={"name": "synthesizer", "synthetic": "random"}))
    blocks = model.decoder.blocks[0]
    assert type(blocks.cross.f) is Attention and type(blocks.attn.f).__name__ == "Synthesizer"


@pytest.mark.parametrize(("kind", "mix", "params"), [
    ("dense", "none", (D * D + D) + (D * H * L + H * L) + 2 * (D * D + D)),  # W1, W2 (H rows of L), W_v, W_o
    ("random", "plus", H * L * L + 2 * (D * D + D) + (2 * D * D + 2 * D)),  # R, W_v, W_o, W_q and W_k
    ("factorized", "alpha", 2 * H * L * 3 + 2 * (D * D + D) + (2 * D * D + 2 * D) + H),  # R1, R2, ..., alpha
])
def test_parameter_counts_are_the_papers(kind, mix, params):
    assert sum(p.numel() for p in _synthesizer(kind, mix).parameters()) == params


def sigmoid_of_seen(s: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """attention.sigmoid (Ramapuram et al. 2024): each weight sigmoid(s - log(max_seq_len)), hidden keys 0."""
    return torch.sigmoid(s - math.log(L)) * seen


def top3_softmax(s: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """attention.sparse_topk=3 (Zhao et al. 2019): the softmax over the 3 highest seen scores only."""
    s = s.masked_fill(~seen, -math.inf)
    return torch.softmax(s.masked_fill(s < s.topk(min(3, s.numel())).values[-1], -math.inf), dim=-1)


@pytest.mark.parametrize(("option", "kind", "mix"), [
    (option, kind, mix) for option in ("sigmoid", "sparse_topk", "head_scale")
    for kind, mix in [("dense", "none"), ("random", "plus"), ("factorized", "alpha")]])
def test_every_attentions_options_apply_to_the_synthetic_weights(option, kind, mix):
    """sigmoid and sparse_topk turn the synthetic (or mixed) logits into weights through AttentionBase's shared
    _weights (each softmax of alpha on its own); head_scale scales each head's output. Against the equations, decoder
    and padded encoder, and cached decoding."""
    m = _synthesizer(kind, mix, **{option: 3 if option == "sparse_topk" else True})
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)
    m = m.double()
    weights = {"sigmoid": sigmoid_of_seen, "sparse_topk": top3_softmax}.get(option, softmax_of_seen)
    x = torch.randn(2, T, D, dtype=torch.float64, requires_grad=True)
    padding = torch.ones(2, T, dtype=torch.bool)
    padding[1, -4:] = False
    for causal, pad in [(True, None), (False, padding)]:
        mask, is_causal = attention_bias(T, T, causal, None, NO_POSITION, pad, x.device, x.dtype)
        ours = m(x, NO_POSITION, mask, is_causal)
        theirs = paper(m, x, causal, pad, weights)
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
        probe = torch.randn_like(ours)
        for a, b in zip(_grads(m, ours, x, probe), _grads(m, theirs, x, probe), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    cache = KVCache()
    steps = [m(x[:, :9], NO_POSITION, None, True, cache=cache)]
    steps += [m(x[:, t:t + 1], NO_POSITION, None, False, cache=cache, offset=t) for t in range(9, T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), m(x, NO_POSITION, None, True), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("option", [{"backend": "sdpa"}, {"qk_norm": True}], ids=lambda o: next(iter(o)))
@pytest.mark.parametrize("mix", ["none", "plus"])
def test_options_it_cannot_apply_are_refused_in_one_line(option, mix):
    """No silent no-op: backend (the weights are always written out) and qk_norm (mix=none has no queries or keys;
    an option is the registered name's, whatever its mix)."""
    with pytest.raises(ConfigError, match=rf"^model\.attention\.{next(iter(option))}: not an option of "
                                          r"'synthesizer'; valid: head_scale, .*$"):
        build_model(tiny_cfg(attention={"name": "synthesizer", "mix": mix, **option}))
