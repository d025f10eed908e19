"""Narang et al. 2021's FFN rows (zoo/layers/ffn.py): silu (Swish), elu, selu, sigmoid, softplus MLPs and the glu
(sigmoid gate) and liglu (bilinear) gated ones, against the formula in float64 and against x-transformers'
FeedForward with the weights copied."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from x_transformers.x_transformers import FeedForward

from tests.helpers import make
from zoo.registry import FFN

D, D_FF = 24, 40

# zoo name -> (gated, the activation written out with torch.nn.functional)
ROWS = {
    "silu": (False, lambda x: x * torch.sigmoid(x)),
    "elu": (False, lambda x: torch.where(x > 0, x, torch.exp(x) - 1)),
    "selu": (False, lambda x: 1.0507009873554805 * torch.where(x > 0, x, 1.6732632423543772 * (torch.exp(x) - 1))),
    "sigmoid": (False, lambda x: 1 / (1 + torch.exp(-x))),
    "softplus": (False, lambda x: torch.log1p(torch.exp(x))),
    "glu": (True, lambda x: 1 / (1 + torch.exp(-x))),
    "liglu": (True, lambda x: x),
}
TORCH_ACT = {"silu": nn.SiLU, "elu": nn.ELU, "selu": nn.SELU, "sigmoid": nn.Sigmoid, "softplus": nn.Softplus,
             "glu": nn.Sigmoid, "liglu": nn.Identity}


@pytest.mark.parametrize("name", ROWS)
def test_ffn_matches_its_formula_in_float64(name):
    gated, act = ROWS[name]
    ffn = make(FFN, name, D, d_ff=D_FF).double()
    assert ffn.gated == gated
    x = torch.randn(2, 13, D, dtype=torch.float64)
    hidden = act(F.linear(x, ffn.gate.weight, ffn.gate.bias)) * F.linear(x, ffn.up.weight, ffn.up.bias) if gated \
        else act(F.linear(x, ffn.up.weight, ffn.up.bias))
    torch.testing.assert_close(ffn(x), F.linear(hidden, ffn.down.weight, ffn.down.bias), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ROWS)
def test_ffn_equals_x_transformers_feedforward_with_copied_weights(name):
    gated = ROWS[name][0]
    theirs = FeedForward(D, mult=D_FF / D, glu=gated, custom_activation=TORCH_ACT[name]()).double()
    ours = make(FFN, name, D, d_ff=D_FF).double()
    proj_in, proj_out = theirs.ff[0], theirs.ff[-1]
    with torch.no_grad():
        if gated:  # their one projection is [up; gate]
            up_w, gate_w = proj_in.proj.weight.chunk(2)
            up_b, gate_b = proj_in.proj.bias.chunk(2)
            ours.gate.weight.copy_(gate_w), ours.gate.bias.copy_(gate_b)
        else:
            up_w, up_b = proj_in[0].weight, proj_in[0].bias
        ours.up.weight.copy_(up_w), ours.up.bias.copy_(up_b)
        ours.down.weight.copy_(proj_out.weight), ours.down.bias.copy_(proj_out.bias)
    x = torch.randn(3, 13, D, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    mine, ref = ours(x), theirs(x2)
    torch.testing.assert_close(mine, ref, rtol=1e-10, atol=1e-10)
    mine.square().sum().backward(), ref.square().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ours.down.weight.grad, proj_out.weight.grad, rtol=1e-10, atol=1e-10)


def test_gated_rows_take_the_gated_width_and_the_plain_rows_four_times():
    assert make(FFN, "glu", 96).d_ff == make(FFN, "liglu", 96).d_ff == 256  # 8/3 * 96, as swiglu
    assert make(FFN, "selu", 96).d_ff == 384
