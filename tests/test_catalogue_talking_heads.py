"""Talking-heads attention (zoo/layers/talking_heads.py) against x-transformers' Attention(pre_talking_heads=,
post_talking_heads=) with the weights copied, float64, at odd shapes (tests/catalogue.py)."""

import pytest
import torch
from x_transformers.x_transformers import Attention as XAttention

from tests.catalogue import check_cached_decoding, compare, head_order, projection_pairs, zoo_attention
from zoo.component import ConfigError


def _mix_pairs(attn, xt) -> list:
    """zoo's I + P (pre) and I + Q (post) are x-transformers' I + W_pre and W_post (1x1 convolutions over heads)."""
    perm, eye = head_order(attn), torch.eye(attn.n_heads, dtype=torch.float64)[..., None, None]
    mix = lambda w: w[perm][:, perm][..., None, None]  # noqa: E731
    pairs = []
    if attn.pre_mix is not None:
        pairs.append((attn.pre_mix, mix, xt.attend.pre_softmax_talking_heads.weight, 0.0))
    if attn.post_mix is not None:
        pairs.append((attn.post_mix, mix, xt.attend.post_softmax_talking_heads.weight, eye))
    return pairs


@pytest.mark.parametrize("pre,post", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("heads,kv_heads", [(3, None), (6, 2)])
@pytest.mark.parametrize("lineage", ["encoder", "decoder", "cross"])
def test_talking_heads_equals_x_transformers(lineage, heads, kv_heads, pre, post):
    d, cross, causal = 4 * heads, lineage == "cross", lineage == "decoder"
    attn = zoo_attention("talking_heads", d, heads, cross=cross, n_kv_heads=kv_heads, pre=pre, post=post)
    xt = XAttention(d, dim_head=4, heads=heads, kv_heads=kv_heads, causal=causal, pre_talking_heads=pre,
                    post_talking_heads=post).double()
    compare(attn, xt, projection_pairs(attn, xt) + _mix_pairs(attn, xt), cross=cross, causal=causal)
    if causal:
        check_cached_decoding(attn)


def test_talking_heads_mixes_heads_and_refuses_no_mix():
    """With P = Q = 0 it is MHA with the same weights; a mix moves every head's output."""
    attn = zoo_attention("talking_heads", 12, 3)
    mha = zoo_attention("mha", 12, 3)
    mha.load_state_dict({k: v for k, v in attn.state_dict().items() if "mix" not in k})
    x = torch.randn(2, 13, 12, dtype=torch.float64)
    from tests.catalogue import run_zoo

    mixed = run_zoo(attn, x)
    with torch.no_grad():
        attn.pre_mix.zero_()
        attn.post_mix.zero_()
    torch.testing.assert_close(run_zoo(attn, x), run_zoo(mha, x), atol=1e-12, rtol=0)
    assert (mixed - run_zoo(mha, x)).abs().min() > 0
    with pytest.raises(ConfigError, match="attention.pre: talking_heads with neither pre nor post"):
        zoo_attention("talking_heads", 12, 3, pre=False, post=False)
