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
    from zoo.schema import Part

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
