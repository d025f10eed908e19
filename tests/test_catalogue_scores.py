"""Options of every attention that change only how scores become weights (zoo/layers/attention.py): sigmoid
attention (Ramapuram et al. 2024) and explicit sparse attention, top-k scores per query (Zhao et al. 2019).
Against x-transformers' Attention(sigmoid=True) and Attention(sparse_topk=k) with the weights copied, and the
papers' equations in float64, at odd shapes (tests/catalogue.py)."""

import math

import pytest
import torch
from x_transformers.x_transformers import Attention as XAttention

from tests.catalogue import check_cached_decoding, compare, projection_pairs, run_zoo, zoo_attention
from zoo.component import ConfigError

LINEAGES = ["encoder", "decoder", "cross"]


@pytest.mark.parametrize("heads,kv_heads", [(3, None), (6, 2)])
@pytest.mark.parametrize("lineage", LINEAGES)
def test_sigmoid_attention_equals_x_transformers(lineage, heads, kv_heads):
    """x-transformers' sigmoid attention has no bias term: zoo's b = -log(max_seq_len) is 0 at max_seq_len 1."""
    d, cross, causal = 4 * heads, lineage == "cross", lineage == "decoder"
    name, kv = ("gqa", {"n_kv_heads": kv_heads}) if kv_heads else ("mha", {})
    attn = zoo_attention(name, d, heads, cross=cross, max_seq_len=1, sigmoid=True, **kv)
    xt = XAttention(d, dim_head=4, heads=heads, kv_heads=kv_heads, causal=causal, sigmoid=True).double()
    compare(attn, xt, projection_pairs(attn, xt), cross=cross, causal=causal)


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_sigmoid_attention_is_the_papers_equation_and_caches(backend):
    """weights = sigmoid(q k^T / sqrt(d) + b), b = -log(n), masked keys 0, each weight on its own (rows do not sum
    to 1); either backend computes it written out; cached decoding at an offset equals recomputation."""
    attn = zoo_attention("gqa", 24, 6, max_seq_len=40, n_kv_heads=3, sigmoid=True, backend=backend)
    x = torch.randn(2, 13, 24, dtype=torch.float64)
    q, k, v = attn.qkv(x).split((24, 12, 12), dim=-1)
    q, k, v = (t.unflatten(-1, (-1, 4)).transpose(1, 2) for t in (q, k, v))
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    causal = torch.ones(13, 13, dtype=torch.bool).tril()
    w = torch.sigmoid(q @ k.transpose(-1, -2) / 2 - math.log(40)) * causal
    expected = attn.out((w @ v).transpose(1, 2).flatten(2))
    torch.testing.assert_close(run_zoo(attn, x, causal=True), expected, atol=1e-12, rtol=0)
    check_cached_decoding(attn)
    with pytest.raises(ConfigError, match="attention.sigmoid: needs model.max_seq_len > 0"):
        zoo_attention("mha", 12, 3, max_seq_len=0, sigmoid=True)


@pytest.mark.parametrize("heads,kv_heads", [(3, None), (6, 2)])
@pytest.mark.parametrize("lineage", LINEAGES)
def test_sparse_topk_equals_x_transformers(lineage, heads, kv_heads):
    d, cross, causal = 4 * heads, lineage == "cross", lineage == "decoder"
    name, kv = ("gqa", {"n_kv_heads": kv_heads}) if kv_heads else ("mha", {})
    attn = zoo_attention(name, d, heads, cross=cross, sparse_topk=4, **kv)
    xt = XAttention(d, dim_head=4, heads=heads, kv_heads=kv_heads, causal=causal, sparse_topk=4).double()
    compare(attn, xt, projection_pairs(attn, xt), cross=cross, causal=causal)
    if causal:
        check_cached_decoding(attn)


def test_sparse_topk_keeps_each_querys_k_best_keys():
    """Zhao et al.'s equation in float64: softmax over the scores >= the k-th largest of the query's visible
    keys, 0 elsewhere; every row with at least k visible keys has exactly k non-zero weights (no ties here)."""
    attn = zoo_attention("mha", 12, 3, sparse_topk=5, backend="math")
    attn.record = True
    x = torch.randn(2, 13, 12, dtype=torch.float64)
    run_zoo(attn, x, causal=True)
    q, k, _ = attn.qkv(x).unflatten(-1, (3, 3, 4)).permute(2, 0, 3, 1, 4)
    s = (q @ k.transpose(-1, -2) / 2).masked_fill(~torch.ones(13, 13, dtype=torch.bool).tril(), float("-inf"))
    kth = s.sort(dim=-1, descending=True).values[..., 4:5]
    torch.testing.assert_close(attn.weights, s.masked_fill(s < kth, float("-inf")).softmax(-1), atol=1e-12, rtol=0)
    assert ((attn.weights > 0).sum(-1) == torch.arange(1, 14).clamp(max=5)).all()
    with pytest.raises(ConfigError, match="attention.sparse_topk: must be a positive integer or null, got 0"):
        zoo_attention("mha", 12, 3, sparse_topk=0)
