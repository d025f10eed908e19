"""ScaleNorm (zoo/layers/scalenorm.py) against its equation in float64 and x-transformers' ScaleNorm with the
weight copied, alone and as the model's norm (norm=pre_scale)."""

import math

import torch
from x_transformers.x_transformers import ScaleNorm as TheirScaleNorm

from tests.helpers import make, tiny_cfg
from zoo import build_model
from zoo.registry import NORM


def test_scalenorm_is_g_times_x_over_its_norm_in_float64():
    norm = make(NORM, "scalenorm", 24).double()
    assert abs(norm.g.item() - math.sqrt(24)) < 1e-6 and sum(p.numel() for p in norm.parameters()) == 1
    with torch.no_grad():
        norm.g.fill_(1.7)
    x = torch.randn(3, 13, 24, dtype=torch.float64)
    expect = 1.7 * x / torch.sqrt((x * x).sum(-1, keepdim=True))
    torch.testing.assert_close(norm(x), expect, rtol=1e-12, atol=1e-12)
    assert norm(torch.zeros(2, 24, dtype=torch.float64)).eq(0).all()  # the floor eps: no division by zero


def test_scalenorm_equals_x_transformers_with_copied_weight():
    theirs, ours = TheirScaleNorm(24).double(), make(NORM, "scalenorm", 24).double()
    with torch.no_grad():
        theirs.g.fill_(0.8)
        ours.g.copy_(theirs.g[0] * theirs.scale)  # theirs: g * sqrt(dim), g at 1; ours: one g at sqrt(dim)
    x = torch.randn(3, 13, 24, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    a, b = ours(x), theirs(x2)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    (a.sin().sum()).backward(), (b.sin().sum()).backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours.g.grad, theirs.g.grad[0] / theirs.scale, rtol=1e-10, atol=1e-10)


def test_scalenorm_as_the_model_norm_and_the_per_head_qk_norm():
    model = build_model(tiny_cfg(norm={"placement": "pre", "type": "scalenorm"}, attention={"name": "mha",
                                                                                            "qk_norm": True}))
    gains = {n: p.item() for n, p in model.named_parameters() if n.endswith(".g")}
    assert abs(gains["decoder.blocks.0.attn.norm.g"] - math.sqrt(32)) < 1e-6  # the model's: over d_model
    assert abs(gains["decoder.blocks.0.attn.f.q_norm.g"] - math.sqrt(8)) < 1e-6 # each head's: over the head size
    assert model(torch.randint(0, 37, (2, 13))).isfinite().all()
