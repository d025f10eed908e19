"""model.funnel (Dai et al. 2020) against the paper's equations written out in float64: stride-2 mean pooling over
the real positions, pool-q-only attention, LayerNorm(h' + Attn(Q=h', KV=h)) (the paper's Post-LN), the up-sampling
(repeat by 2^k, plus the first group's output) and full-length blocks after it; 3 heads, 13 tokens, a padding mask."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from zoo import build_model
from zoo.build import flops_per_token
from zoo.component import ConfigError
from zoo.models import funnel

BASE = dict(name="encoder_only", vocab_size=40, d_model=12, n_heads=3, n_layers=3, max_seq_len=32, dropout=0.0,
            norm={"placement": "post", "type": "layernorm"}, funnel=[1, 1, 1], funnel_upsample_blocks=1)


def ref_pool(h, real):
    """The pairs (0, 1), (2, 3), ...: the mean of each pair's real positions (an odd length's last one alone)."""
    b, t, _ = h.shape
    out, out_real = [], []
    for j in range(0, t, 2):
        pair = [i for i in (j, j + 1) if i < t]
        rows = []
        for n in range(b):
            keep = [i for i in pair if real[n, i]] or pair  # all padding: the plain mean (never read)
            rows.append(torch.stack([h[n, i] for i in keep]).mean(0))
        out.append(torch.stack(rows))
        out_real.append(torch.stack([real[:, i] for i in pair]).any(0))
    return torch.stack(out, 1), torch.stack(out_real, 1)


def ref_block(p, h_q, h_kv, key_real):
    """Post-LN: a = LN(h_q + MHA(Q=h_q, KV=h_kv)), LN(a + W2 gelu(W1 a)); keys masked by key_real; 3 heads."""
    d, heads = h_q.shape[-1], 3
    wq, wk, wv = p["attn.f.qkv.weight"].split(d)
    bq, bk, bv = p["attn.f.qkv.bias"].split(d)

    def split(x):
        return x.unflatten(-1, (heads, d // heads)).transpose(1, 2)

    q, k, v = split(h_q @ wq.T + bq), split(h_kv @ wk.T + bk), split(h_kv @ wv.T + bv)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d // heads)
    scores = scores.masked_fill(~key_real[:, None, None, :], float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).flatten(2) @ p["attn.f.out.weight"].T + p["attn.f.out.bias"]
    a = F.layer_norm(h_q + y, (d,), p["attn.norm.weight"], p["attn.norm.bias"])
    f = F.gelu(a @ p["ffn.f.up.weight"].T + p["ffn.f.up.bias"]) @ p["ffn.f.down.weight"].T + p["ffn.f.down.bias"]
    return F.layer_norm(a + f, (d,), p["ffn.norm.weight"], p["ffn.norm.bias"])


def params(model, prefix):
    return {n[len(prefix):]: w for n, w in model.named_parameters() if n.startswith(prefix)}


def reference(model, tokens, real):
    """The encoder written out: embeddings + learned positions; group 1 at full length; each later group's first
    block pool-q-only; up-sample by 2^(groups - 1), add group 1's output, one full-length block."""
    t = tokens.shape[1]
    h = model.embed.weight[tokens] + model.encoder.position.weight[:t]
    h = first = ref_block(params(model, "encoder.blocks.0."), h, h, real)
    pooled_real = real
    for g in (1, 2):
        pooled, new_real = ref_pool(h, pooled_real)
        h = ref_block(params(model, f"encoder.blocks.{g}."), pooled, h, pooled_real)  # Q pooled, KV unpooled
        pooled_real = new_real
    up = h.repeat_interleave(4, dim=1)[:, :t] + first
    return ref_block(params(model, "encoder.upsample.0."), up, up, real)


def test_funnel_encoder_matches_the_papers_equations():
    torch.manual_seed(0)
    model = build_model(BASE).double()
    tokens = torch.randint(0, 40, (2, 13))
    real = torch.ones(2, 13, dtype=torch.bool)
    real[1, 9:] = False  # row 1: 9 real tokens, then padding: pairs (8, 9) and then (4, 5) mix real and padding
    out = model.encoder(tokens, padding=real)
    ref = reference(model, tokens, real)
    assert out.shape == (2, 13, 12)
    torch.testing.assert_close(out[real], ref[real], rtol=1e-10, atol=1e-10)
    # padding leaks into no real position: changing the padded tokens changes no real output
    other = tokens.clone()
    other[1, 9:] = (other[1, 9:] + 1) % 40
    torch.testing.assert_close(model.encoder(other, padding=real)[real], out[real], rtol=1e-10, atol=1e-10)
    # gradients reach every block through the pooled path
    model.encoder(tokens, padding=real)[real].sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.encoder.named_parameters()
               if n.startswith("blocks."))


def test_pool_pads_an_odd_length_and_leaves_padding_out():
    x = torch.arange(5.0, dtype=torch.float64)[None, :, None]  # 0 1 2 3 4
    pooled, real = funnel.pool(x, torch.tensor([[True, True, True, False, False]]))
    assert pooled.flatten().tolist() == [0.5, 2.0, 4.0]  # (0+1)/2; 2 alone (3 is padding); 4 alone (odd length)
    assert real.tolist() == [[True, True, False]]
    assert funnel.pool(x, None)[1] is None and funnel.pool(x, None)[0].flatten().tolist() == [0.5, 2.5, 4.0]


def test_encoder_decoder_reads_the_pooled_memory_and_padding():
    torch.manual_seed(0)
    model = build_model(dict(BASE, name="encoder_decoder", n_decoder_layers=1)).double()
    src, tgt = torch.randint(0, 40, (2, 13)), torch.randint(0, 40, (2, 5))
    real = torch.ones(2, 13, dtype=torch.bool)
    real[1, 8:] = False
    memory = model.encode(src, real)
    assert memory.shape == (2, 4, 12)  # 13 -> 7 -> 4
    out = model(src, tgt, real)
    other = src.clone()
    other[1, 8:] = 0  # padded source tokens change nothing the decoder reads
    torch.testing.assert_close(model(other, tgt, real), out, rtol=1e-10, atol=1e-10)


def test_flops_per_token_show_the_saving():
    plain = dict(BASE, funnel=None, n_layers=4)
    pooled = dict(plain, funnel=[1, 1, 2], funnel_upsample_blocks=0)
    full, less = flops_per_token(plain, 32)["forward"], flops_per_token(pooled, 32)["forward"]
    assert less < full
    # the head and embeddings are the same; the blocks of groups 2 and 3 run on 1/2 and 1/4 of the tokens
    one_block = (flops_per_token(dict(plain, n_layers=2), 32)["forward"]
                 - flops_per_token(dict(plain, n_layers=1), 32)["forward"])
    assert full - less > one_block  # four blocks' work for about two: more than one block saved


@pytest.mark.parametrize("override, key", [
    (dict(name="decoder_only"), "funnel"), (dict(position={"name": "rope"}), "funnel"),
    (dict(position={"name": "alibi"}), "funnel"), (dict(funnel=[1, 1]), "funnel"), (dict(funnel=[3]), "funnel"),
    (dict(share_blocks="all"), "funnel"), (dict(attention={"name": "mla"}), "funnel"),
    *[(dict(attention={"name": name}), "funnel") for name in ("memory_kv", "differential", "residual_attention",
                                                               "cope")],  # pools_queries false
    (dict(shift_tokens=1), "funnel")])
def test_refused_in_one_line(override, key):
    with pytest.raises(ConfigError, match=f"model.{key}"):
        build_model(dict(BASE, **override))
