"""ffn=pkm against Lample et al. 2019's equations written out in float64: every one of the n_keys^2 product keys
scored (no product search), the top-k of all of them, softmax, the weighted sum of values, heads added.
x-transformers has no product key memory (2.31: no such module), so the paper is the reference."""

import pytest
import torch

from tests.helpers import tiny_cfg
from zoo.build import build_model, count_params, flops_per_token
from zoo.component import ConfigError, Context
from zoo.generate import generate
from zoo.layers.pkm import PKMOptions, ProductKeyMemory

D = 12


def memory(**opts) -> ProductKeyMemory:
    ctx = Context(d_model=D, n_heads=3, max_seq_len=32)
    m = ProductKeyMemory(ctx, PKMOptions(**opts)).double()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_()
    return m


def brute_force(m: ProductKeyMemory, x: torch.Tensor, query_norm: str) -> torch.Tensor:
    """The paper's memory read, every product key scored: m(x) = sum_h sum_{k in top-k} softmax(q_h . K_k) v_k."""
    h, k, n = m.heads, m.topk, m.n_keys
    q = x.reshape(-1, D) @ m.query.weight.T + m.query.bias  # (N, H * k_dim)
    if query_norm == "batch":  # batch statistics, biased variance (training mode)
        q = (q - q.mean(0)) / torch.sqrt(q.var(0, unbiased=False) + 1e-5)
    q = q.view(-1, h, m.k_dim)
    if query_norm == "layer":
        q = (q - q.mean(-1, keepdim=True)) / torch.sqrt(q.var(-1, unbiased=False, keepdim=True) + 1e-5)
    c1, c2 = m.keys[:, 0], m.keys[:, 1]  # (H, n_keys, k_dim / 2)
    # every product key K_(i, j) = [c_i ; c'_j], slot i * n_keys + j
    full = torch.cat([c1[:, :, None].expand(h, n, n, -1), c2[:, None, :].expand(h, n, n, -1)], -1).reshape(h, n * n, -1)
    out = torch.zeros(q.shape[0], D, dtype=x.dtype)
    for head in range(h):
        scores = q[:, head] @ full[head].T  # (N, n_keys^2)
        top, slot = scores.topk(k, dim=-1)
        out += (torch.softmax(top, -1)[..., None] * m.values.weight[slot]).sum(1)
    return out.view(x.shape)


@pytest.mark.parametrize("query_norm", ["batch", "layer", "none"])
def test_product_search_equals_brute_force_over_every_product_key(query_norm):
    m = memory(n_keys=7, topk=4, heads=3, k_dim=10, query_norm=query_norm).train()
    x = torch.randn(2, 13, D, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    out, ref = m(x), brute_force(m, x_ref, query_norm)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    w = torch.randn_like(out)
    grads = torch.autograd.grad((out * w).sum(), [x, m.query.weight, m.keys, m.values.weight])
    grads_ref = torch.autograd.grad((ref * w).sum(), [x_ref, m.query.weight, m.keys, m.values.weight])
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-10)


def test_topk_equal_to_n_keys_reads_the_whole_memory():
    """topk = n_keys: the candidates are all n_keys^2 pairs, and the read is a softmax over the top n_keys of them."""
    m = memory(n_keys=3, topk=3, heads=1, k_dim=4, query_norm="none")
    x = torch.randn(1, 5, D, dtype=torch.float64)
    torch.testing.assert_close(m(x), brute_force(m, x, "none"))


def test_counts_and_flops_come_from_the_module():
    cfg = tiny_cfg(ffn={"name": "pkm", "n_keys": 8, "topk": 2, "heads": 2, "k_dim": 16}, n_layers=1)
    counts = count_params(cfg)
    assert counts["ffn"] == 32 * 2 * 16 + 2 * 16 + 2 * 2 * 8 * 8 + 64 * 32  # query, its bias, sub-keys, values
    assert counts["total"] - counts["active"] == (64 - 2 * 2) * 32  # the values a token does not read
    plain = flops_per_token(tiny_cfg(ffn={"name": "gelu", "d_ff": 4}, n_layers=1))["forward"] - 2 * 2 * 32 * 4
    assert flops_per_token(cfg)["forward"] - plain == 2 * 32 * 32 + 2 * 2 * 8 * 16 + 2 * 2 * 2 + 2 * 2 * 2 * 32


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
def test_cached_generation_equals_recomputation(lineage):
    model = build_model(tiny_cfg(lineage, ffn={"name": "pkm", "n_keys": 6, "topk": 3, "heads": 3}), seed=1).eval()
    prompt = torch.randint(0, 37, (2, 5))
    src = torch.randint(0, 37, (2, 7)) if lineage == "encoder_decoder" else None
    cached = generate(model, prompt, 8, src=src)
    assert torch.equal(cached, generate(model, prompt, 8, src=src, use_cache=False))


@pytest.mark.parametrize("opts, key", [({"topk": 40}, "model.ffn.topk"), ({"k_dim": 7}, "model.ffn.k_dim"),
                                       ({"query_norm": "group"}, "model.ffn.query_norm")])
def test_bad_options_are_one_line_naming_the_key(opts, key):
    with pytest.raises(ConfigError, match=f"^{key}: "):
        build_model(tiny_cfg(ffn={"name": "pkm", **opts}))
