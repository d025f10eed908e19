"""Gated attention (zoo/layers/gated.py) against x-transformers' Attention(gate_values=True, with
gate_values_headwise for gate=head), weights copied, float64, at odd shapes (tests/catalogue.py)."""

import pytest
import torch
from x_transformers.x_transformers import Attention as XAttention

from tests.catalogue import check_cached_decoding, compare, head_order, projection_pairs, run_zoo, zoo_attention


def _gate_pair(attn, xt) -> tuple:
    """zoo's gate rows, per query head, in x-transformers' head order."""
    perm, w = head_order(attn), attn.gate_width
    return (attn.gate.weight, lambda g: g.unflatten(0, (-1, w))[perm].flatten(0, 1), xt.to_v_gate.weight, 0.0)


@pytest.mark.parametrize("gate", ["element", "head"])
@pytest.mark.parametrize("heads,kv_heads", [(3, None), (6, 3)])
@pytest.mark.parametrize("lineage", ["encoder", "decoder", "cross"])
def test_gated_attention_equals_x_transformers(lineage, heads, kv_heads, gate):
    d, cross, causal = 4 * heads, lineage == "cross", lineage == "decoder"
    attn = zoo_attention("gated", d, heads, cross=cross, n_kv_heads=kv_heads, gate=gate)
    xt = XAttention(d, dim_head=4, heads=heads, kv_heads=kv_heads, causal=causal, gate_values=True,
                    gate_values_headwise=gate == "head").double()
    compare(attn, xt, projection_pairs(attn, xt) + [_gate_pair(attn, xt)], cross=cross, causal=causal)
    if causal:
        check_cached_decoding(attn)


def test_gate_is_the_papers_sigmoid_of_the_input():
    """The paper's equation in float64: y' = (softmax(q k^T / sqrt(d)) v) * sigmoid(x W), per head and number."""
    attn = zoo_attention("gated", 12, 3)
    mha = zoo_attention("mha", 12, 3)
    mha.load_state_dict({k: v for k, v in attn.state_dict().items() if not k.startswith("gate")})
    x = torch.randn(2, 13, 12, dtype=torch.float64)
    heads = []
    hook = mha.out.register_forward_pre_hook(lambda m, args: heads.append(args[0]))
    run_zoo(mha, x)
    hook.remove()
    gated = heads[0] * torch.sigmoid(x @ attn.gate.weight.T)  # (B, T, H * hd): heads side by side
    torch.testing.assert_close(run_zoo(attn, x), gated @ attn.out.weight.T, atol=1e-12, rtol=0)
