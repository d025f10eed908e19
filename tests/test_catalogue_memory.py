"""Persistent memory key/values (zoo/layers/memory_kv.py) against x-transformers' Attention(num_mem_kv=n) with
the weights copied, float64, at odd shapes (tests/catalogue.py)."""

import pytest
import torch
from x_transformers.x_transformers import Attention as XAttention

from tests.catalogue import check_cached_decoding, compare, projection_pairs, zoo_attention


@pytest.mark.parametrize("heads,kv_heads", [(3, None), (6, 2)])
@pytest.mark.parametrize("lineage", ["encoder", "decoder", "cross"])
def test_memory_kv_equals_x_transformers(lineage, heads, kv_heads):
    d, cross, causal = 4 * heads, lineage == "cross", lineage == "decoder"
    attn = zoo_attention("memory_kv", d, heads, cross=cross, n_kv_heads=kv_heads, n_mem_kv=3)
    xt = XAttention(d, dim_head=4, heads=heads, kv_heads=kv_heads, causal=causal, num_mem_kv=3).double()
    same = lambda w: w  # noqa: E731  key/value heads keep their order
    pairs = [(attn.mem_k, same, xt.mem_k, 0.0), (attn.mem_v, same, xt.mem_v, 0.0)]
    compare(attn, xt, projection_pairs(attn, xt) + pairs, cross=cross, causal=causal)
    if causal:
        check_cached_decoding(attn)


def test_memory_is_seen_by_every_query_and_not_cached():
    """The first query of a causal layer sees its own key and the memory, whatever the window and ALiBi's bias: the
    paper's softmax over [M_k ; k_0] written out; the cache grows by the sequence's keys only."""
    from zoo.component import Context, build
    from zoo.layers.attention import KVCache, attention_bias
    from zoo.registry import POSITION
    from zoo.spec import Part

    attn = zoo_attention("memory_kv", 12, 3, n_mem_kv=2, window=2)
    alibi = build(POSITION, Part("alibi", POSITION.options("alibi")()), Context(d_model=12, n_heads=3, max_seq_len=64))
    x = torch.randn(1, 5, 12, dtype=torch.float64)
    mask, is_causal = attention_bias(5, 5, True, 2, alibi, None, x.device, x.dtype)
    cache = KVCache()
    out = attn(x, alibi, mask, is_causal, cache=cache)
    assert cache.len == 5
    q, k, v = attn.qkv(x[:, :1]).unflatten(-1, (3, 3, 4)).permute(2, 0, 3, 1, 4)  # (1, H, 1, hd)
    keys, values = torch.cat([attn.mem_k[None], k], dim=2), torch.cat([attn.mem_v[None], v], dim=2)
    w = (q @ keys.transpose(-1, -2) / 2).softmax(-1)  # ALiBi's bias is 0 at distance 0 and absent for memory
    torch.testing.assert_close(out[:, :1], attn.out((w @ values).transpose(1, 2).flatten(2)), atol=1e-12, rtol=0)


@pytest.mark.parametrize("position", ["learned", "rope", "alibi"])
def test_memory_tokens_decode_from_the_cache_as_full_recomputation(position):
    """model.memory_tokens: the memory goes in with the first tokens and stays in the cache, before position 0:
    logits decoded a token (or three) at a time at an offset equal the full forward's, float64."""
    from zoo import build_model
    from zoo.build import count_params

    cfg = {"name": "decoder_only", "vocab_size": 37, "d_model": 12, "n_heads": 3, "n_layers": 2, "max_seq_len": 16,
           "memory_tokens": 3, "position": {"name": position}, "value_embeddings": 1, "embed_skip": True}
    model = build_model(cfg).double().eval()
    assert count_params(cfg)["total"] == sum(p.numel() for p in model.parameters())
    tokens = torch.randint(0, 37, (2, 16))
    with torch.no_grad():
        full, cache, steps, start = model(tokens), model.new_cache(), [], 0
        for t in (5, 1, 3, 1, 6):
            steps.append(model(tokens[:, start:start + t], cache=cache))
            start += t
    assert cache[0][0].len == 3 + 16  # the memory, then every token
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-12, rtol=0)


def test_memory_tokens_are_seen_and_dropped_in_every_lineage():
    """The output keeps the sequence's length; the memory changes it (its tokens are attended to), a padded
    encoder row's real tokens ignore the padding as without memory, and a bad count is one line."""
    from zoo import build_model
    from zoo.component import ConfigError

    for lineage in ("encoder_only", "encoder_decoder"):
        cfg = {"name": lineage, "vocab_size": 37, "d_model": 12, "n_heads": 3, "n_layers": 1, "max_seq_len": 16}
        plain, mem = build_model(cfg).eval(), build_model({**cfg, "memory_tokens": 2}).eval()
        tokens = torch.randint(0, 37, (2, 9))
        args = (tokens, tokens) if lineage == "encoder_decoder" else (tokens,)
        assert mem(*args).shape == plain(*args).shape
        assert (mem(*args) - plain(*args)).abs().max() > 1e-4
    padding = torch.ones(2, 9, dtype=torch.bool)
    padding[1, 6:] = False
    short = build_model({**cfg, "name": "encoder_only", "memory_tokens": 2}).eval()
    torch.testing.assert_close(short(tokens, padding=padding)[1, :6], short(tokens[1:, :6])[0], atol=1e-6, rtol=0)
    with pytest.raises(ConfigError, match="model.memory_tokens: must be an integer >= 0, got -1"):
        build_model({**cfg, "memory_tokens": -1})
