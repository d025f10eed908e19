"""Sharing and depth (zoo/models/depth.py): block sharing against x-transformers' weight_tie_layers with copied
weights in float64; the counts, the KV cache per application and the refusals."""

from __future__ import annotations

import math

import pytest
import torch
from x_transformers import Decoder, Encoder

from tests.catalogue import float64_softmax
from zoo.build import build_model, count_params, flops_per_token
from zoo.component import ConfigError, aux_losses
from zoo.generate import generate
from zoo.layers.attention import attention_bias, cross_attention_mask

B, T = 2, 13


def tiny(name: str = "decoder_only", **kw) -> dict:
    """3 heads of 4, 3 layers, pre-LN LayerNorm, GELU MLP, no biases and no positions: x-transformers' defaults."""
    return {**dict(name=name, vocab_size=37, d_model=12, n_heads=3, n_layers=3, max_seq_len=64, bias=False,
                   position={"name": "none"}), **kw}


def tied_xt(model, stack, causal: bool):
    """x-transformers' weight-tied layers with the weights of the zoo stack's one block, float64."""
    block = stack.blocks[0]
    xt = (Decoder if causal else Encoder)(dim=12, depth=3, heads=3, attn_dim_head=4, weight_tie_layers=True,
                                          ff_no_bias=True).double()
    attn, ff = xt.layers[0][1], xt.layers[1][1]
    float64_softmax(attn)
    qkv = block.attn.f.qkv.weight
    with torch.no_grad():
        # x-transformers adds 1 to its gains (norm_add_unit_offset)
        xt.layers[0][0][0].gamma.copy_(block.attn.norm.weight - 1)
        xt.layers[1][0][0].gamma.copy_(block.ffn.norm.weight - 1)
        xt.final_norm.gamma.copy_(stack.final_norm.weight - 1)
        for i, dst in enumerate((attn.to_q, attn.to_k, attn.to_v)):
            dst.weight.copy_(qkv[12 * i: 12 * (i + 1)])
        attn.to_out.weight.copy_(block.attn.f.out.weight)
        ff.ff[0][0].weight.copy_(block.ffn.f.up.weight)
        ff.ff[2].weight.copy_(block.ffn.f.down.weight)
    return xt, [(qkv, attn.to_q.weight, slice(0, 12)), (block.attn.f.out.weight, attn.to_out.weight, slice(None)),
                (block.ffn.f.up.weight, ff.ff[0][0].weight, slice(None)),
                (block.ffn.f.down.weight, ff.ff[2].weight, slice(None))]


class Given(torch.nn.Module):
    """An embedding that returns the tensor it was given, whatever the tokens."""

    def __init__(self, x: torch.Tensor):
        super().__init__()
        self.x = x

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.x


def randomise(model) -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(1.0 if p.dim() == 1 else 0.0, 0.3)


@pytest.mark.parametrize("lineage,share", [("decoder_only", "all"), ("decoder_only", "decoder"),
                                           ("encoder_only", "all"), ("encoder_only", "encoder")])
def test_shared_block_equals_x_transformers_weight_tied_layers(lineage, share):
    model = build_model(tiny(lineage, share_blocks=share)).double()
    randomise(model)
    stack = model.decoder if lineage == "decoder_only" else model.encoder
    assert len(stack.blocks) == 1 and stack.layer_blocks == [0, 0, 0]
    xt, pairs = tied_xt(model, stack, causal=lineage == "decoder_only")
    tokens = torch.randint(0, 37, (B, T))
    padding = torch.ones(B, T, dtype=torch.bool)
    padding[1, -3:] = False
    real = padding if lineage == "encoder_only" else torch.ones_like(padding)
    x = model.embed(tokens).detach().requires_grad_()
    stack.embed = Given(x)  # the same input to both: the embedding's output
    ours = stack(tokens, padding=None if lineage == "decoder_only" else padding)
    theirs = xt(x, mask=None if lineage == "decoder_only" else padding)
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-10, rtol=0)
    w = torch.randn_like(ours)
    g_ours = torch.autograd.grad((ours * w)[real].sum(), [x] + [p[0] for p in pairs])
    g_theirs = torch.autograd.grad((theirs * w)[real].sum(), [x] + [p[1] for p in pairs])
    torch.testing.assert_close(g_ours[0], g_theirs[0], atol=1e-10, rtol=0)
    for (_, _, rows), a, b in zip(pairs, g_ours[1:], g_theirs[1:], strict=True):
        torch.testing.assert_close(a[rows], b, atol=1e-10, rtol=0)  # the shared weight: summed over the layers


@pytest.mark.parametrize("share,shared", [("none", ()), ("all", ("encoder", "decoder")), ("encoder", ("encoder",)),
                                          ("decoder", ("decoder",))])
def test_encoder_decoder_sharing_counts_once_and_flops_per_layer(share, shared):
    cfg = tiny("encoder_decoder", share_blocks=share)
    model, base = build_model(cfg), build_model(tiny("encoder_decoder"))
    for name in ("encoder", "decoder"):
        stack = getattr(model, name)
        assert len(stack.blocks) == (1 if name in shared else 3)
        assert stack.layer_blocks == ([0, 0, 0] if name in shared else [0, 1, 2])
    one_block = {name: sum(p.numel() for p in getattr(base, name).blocks[0].parameters())
                 for name in ("encoder", "decoder")}
    counted = count_params(cfg)["total"]
    assert counted == sum(p.numel() for p in model.parameters())
    assert counted == count_params(tiny("encoder_decoder"))["total"] - sum(2 * one_block[n] for n in shared)
    assert flops_per_token(cfg) == flops_per_token(tiny("encoder_decoder"))  # every layer still runs


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
def test_shared_block_cached_decoding_equals_recomputation(lineage):
    """Each layer keeps its own cache slot: a one-slot cache would mix the layers' keys."""
    model = build_model(tiny(lineage, share_blocks="all", position={"name": "rope"})).double()
    randomise(model)
    assert len(model.new_cache()) == 3
    src = torch.randint(0, 37, (B, 7)) if lineage == "encoder_decoder" else None
    prompt = torch.randint(0, 37, (B, 5))
    cached = generate(model, prompt, 8, src=src)
    assert torch.equal(cached, generate(model, prompt, 8, src=src, use_cache=False))
    # logits at an offset: the prompt through the cache, then 3 tokens at once
    tokens = torch.randint(0, 37, (B, 11))
    with torch.no_grad():
        memory = model.encode(src) if src is not None else None
        full = model.decoder(tokens, memory=memory)
        cache = model.new_cache()
        first = model.decoder(tokens[:, :8], memory=memory, cache=cache)
        rest = model.decoder(tokens[:, 8:], memory=memory, cache=cache)
    torch.testing.assert_close(torch.cat([first, rest], 1), full, atol=1e-12, rtol=0)


@pytest.mark.parametrize("cfg,message", [
    (dict(share_blocks="both"), "model.share_blocks: unknown 'both'; valid: none, all, encoder, decoder"),
    (dict(share_blocks="encoder"), "model.share_blocks: decoder_only has no encoder stack; valid: none, all, decoder"),
    (dict(share_blocks="all", value_embeddings=1), "model.share_blocks: not with value_embeddings"),
])
def test_sharing_refusals(cfg, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        build_model(tiny(**cfg))


# ---- the Universal Transformer: the step signal and ACT, as the paper's appendix listing, one position at a time


def sinusoid(x: float, d: int) -> list[float]:
    """sin(x / 10000^(2j/d)) at 2j, cos at 2j + 1: the paper's P for a position or a step."""
    return [math.sin(x / 10000 ** (i / d)) if i % 2 == 0 else math.cos(x / 10000 ** ((i - 1) / d)) for i in range(d)]


def universal_reference(model, tokens: torch.Tensor, threshold: float, tau: float):
    """Dehghani et al. 2019, appendix (tensor2tensor's ut_act): for t = 1..N, s += P^t (position + step sinusoid),
    p = sigmoid(w.s + b), the halting bookkeeping per position in Python floats, s <- block(s),
    y <- w s + (1 - w) y. Returns the final-normed y and the ponder cost tau * mean(steps + remainder)."""
    stack = model.decoder
    block, halt_w, halt_b = stack.blocks[0], stack.depth.halt_weight, stack.depth.halt_bias
    b, t = tokens.shape
    d = halt_w.shape[0]
    s = model.embed(tokens)  # H^0: the embeddings, no positions
    # the positions' sinusoid: zoo's table (float32, as position=sinusoidal adds it to the embedding), which is the
    # paper's to float32 precision
    positions = stack.position.embed(torch.zeros(1, t, d, dtype=s.dtype))
    paper = torch.tensor([sinusoid(j, d) for j in range(t)], dtype=s.dtype)
    torch.testing.assert_close(positions[0], paper, atol=1e-6, rtol=0)
    y = torch.zeros_like(s)
    halted = [[0.0] * t for _ in range(b)]
    remainder = [[0.0] * t for _ in range(b)]
    steps = [[0.0] * t for _ in range(b)]
    for step in range(1, len(stack.layer_blocks) + 1):
        s = s + positions + torch.tensor(sinusoid(step, d), dtype=s.dtype)
        weights = torch.zeros(b, t, 1, dtype=s.dtype)
        for r in range(b):
            for j in range(t):
                p = float(torch.sigmoid(s[r, j] @ halt_w + halt_b).detach())
                if halted[r][j] >= 1:  # halted earlier: no share of the output
                    continue
                steps[r][j] += 1
                if halted[r][j] + p > threshold:  # halts now: the remainder is this step's share
                    remainder[r][j] = 1 - halted[r][j]
                    halted[r][j] = 1.0
                    weights[r, j] = remainder[r][j]
                else:
                    halted[r][j] += p
                    weights[r, j] = p
        mask, is_causal = None, True
        s = block(s, stack.position, mask, is_causal)
        y = weights * s + (1 - weights) * y
    ponder = tau * sum(steps[r][j] + remainder[r][j] for r in range(b) for j in range(t)) / (b * t)
    return stack.final_norm(y), ponder, steps


def universal(**kw) -> dict:
    return tiny(**{**dict(share_blocks="all", step_signal=True, act=True, n_layers=4,
                           position={"name": "sinusoidal"}), **kw})


def test_universal_transformer_with_act_equals_the_papers_listing():
    model = build_model(universal(ponder_cost=0.01)).double()
    randomise(model)
    torch.manual_seed(0)
    with torch.no_grad():  # halting probabilities far apart: positions halt at steps 2, 3, 4 or never
        model.embed.weight.mul_(5)
        model.decoder.depth.halt_weight.normal_(0, 0.3)
        model.decoder.depth.halt_bias.fill_(0.0)
    tokens = torch.randint(0, 37, (B, T))
    ours = model.decoder(tokens)
    (ponder,) = aux_losses(model).values()
    ref, ref_ponder, steps = universal_reference(model, tokens, 0.99, 0.01)
    assert len({s for row in steps for s in row}) >= 3  # halting at different steps
    torch.testing.assert_close(ours, ref, atol=1e-10, rtol=0)
    assert abs(float(ponder.detach()) - ref_ponder) < 1e-12
    grad = torch.autograd.grad(ponder, model.decoder.depth.halt_weight)[0]  # the ponder cost trains the halting
    assert grad.abs().sum() > 0


def test_universal_transformer_halting_unit_starts_at_bias_one():
    model = build_model(universal())
    assert float(model.decoder.depth.halt_bias.detach()) == 1.0 and model.decoder.depth.halt_weight.std() > 0
    assert count_params(universal())["total"] == count_params(tiny(share_blocks="all", n_layers=4,
                                                                     position={"name": "sinusoidal"}))["total"] + 13


@pytest.mark.parametrize("act", [False, True])
@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
def test_universal_transformer_cached_decoding_equals_recomputation(lineage, act):
    """Every step runs for every position: each step's cache slot holds every position's keys and values."""
    model = build_model(universal(name=lineage, act=act)).double()
    randomise(model)
    with torch.no_grad():
        if act:
            model.decoder.depth.halt_weight.normal_(0, 0.1)
    src = torch.randint(0, 37, (B, 7)) if lineage == "encoder_decoder" else None
    prompt = torch.randint(0, 37, (B, 5))
    assert torch.equal(generate(model, prompt, 8, src=src), generate(model, prompt, 8, src=src, use_cache=False))
    tokens = torch.randint(0, 37, (B, T))
    with torch.no_grad():
        memory = model.encode(src) if src is not None else None
        full = model.decoder(tokens, memory=memory)
        cache, parts, start = model.new_cache(), [], 0
        for n in (6, 1, 4, 2):  # a prefill, then chunks at offsets 6, 7 and 11
            parts.append(model.decoder(tokens[:, start:start + n], memory=memory, cache=cache))
            start += n
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-12, rtol=0)


def test_act_ponder_cost_averages_real_tokens_of_a_padded_encoder():
    model = build_model(universal(name="encoder_only")).double()
    tokens = torch.randint(0, 37, (B, T))
    padding = torch.ones(B, T, dtype=torch.bool)
    padding[1, -4:] = False
    model(tokens, padding)
    first = float(aux_losses(model)["act_ponder"])
    tokens[1, -4:] = 0  # what stands in padded places changes no real token's steps
    model(tokens, padding)
    assert first == float(aux_losses(model)["act_ponder"]) and aux_losses(model) == {}


@pytest.mark.parametrize("cfg,message", [
    (dict(step_signal=True, memory_tokens=2), "model.step_signal: not with memory_tokens"),
    (dict(act=True, act_threshold=1.5), "model.act_threshold: got 1.5; valid: a number in"),
    (dict(act=True, ponder_cost=-1), "model.ponder_cost: got -1; valid: a number >= 0"),
])
def test_universal_refusals(cfg, message):
    with pytest.raises(ConfigError, match="^" + message):
        build_model(tiny(**cfg))


# ---- transparent attention: each decoder layer attends to its own softmax mix of every encoder state


def test_transparent_attention_equals_the_papers_equations():
    """Bapna et al. 2018: decoder layer j's memory is sum_i s_ij h_i, s_ij = exp(W_ij) / sum_k exp(W_kj), h_0 the
    embedding, h_i encoder layer i's output (each through the encoder's final norm); written out in float64."""
    cfg = tiny("encoder_decoder", transparent_attention=True, n_decoder_layers=2, position={"name": "rope"})
    model = build_model(cfg).double()
    randomise(model)
    W = model.decoder.memory_mix.weight
    assert W.shape == (4, 2)
    src, tgt = torch.randint(0, 37, (B, T)), torch.randint(0, 37, (B, 6))
    padding = torch.ones(B, T, dtype=torch.bool)
    padding[1, -3:] = False
    ours = model(src, tgt, padding)

    enc, dec = model.encoder, model.decoder
    mask, _ = attention_bias(T, T, False, None, enc.position, padding, src.device, torch.float64)
    h = [model.embed(src)]
    for block in enc.blocks:
        h.append(block(h[-1], enc.position, mask, False))
    h = [enc.final_norm(state) for state in h]
    x = model.embed(tgt)
    for j, block in enumerate(dec.blocks):
        total = sum(math.exp(float(W[k, j].detach())) for k in range(4))
        memory_j = sum(math.exp(float(W[i, j].detach())) / total * h[i] for i in range(4))
        x = block(x, dec.position, None, True, memory_j, cross_attention_mask(padding))
    ref = model.head(dec.final_norm(x))
    torch.testing.assert_close(ours, ref, atol=1e-10, rtol=0)
    (g,) = torch.autograd.grad(ours.sum(), W)  # the mix learns
    assert g.abs().min() > 0


def test_transparent_attention_counts_cached_decoding_and_refusals():
    cfg = tiny("encoder_decoder", transparent_attention=True)
    assert count_params(cfg)["attention"] == count_params(tiny("encoder_decoder"))["attention"] + 4 * 3
    model = build_model(cfg).double()
    randomise(model)
    src, prompt = torch.randint(0, 37, (B, 9)), torch.randint(0, 37, (B, 3))
    assert torch.equal(generate(model, prompt, 8, src=src), generate(model, prompt, 8, src=src, use_cache=False))
    for lineage in ("decoder_only", "encoder_only"):
        with pytest.raises(ConfigError, match=f"^model.transparent_attention: {lineage} has no decoder that "):
            build_model(tiny(lineage, transparent_attention=True))
    with pytest.raises(ConfigError, match="^model.transparent_attention: not with act"):
        build_model(tiny("encoder_decoder", transparent_attention=True, act=True))
