"""The residual placements of the catalogue (zoo/layers/rezero.py, ...) against the papers' equations written out
in float64: each block's output from its own sublayers, at odd shapes (3 heads, 13 tokens, a padding mask)."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import tiny_cfg
from zoo import build_model
from zoo.block import NO_POSITION, TransformerBlock

D, H, T = 24, 3, 13


def _model(placement: str, norm_type: str = "layernorm", lineage: str = "encoder_only", **over):
    cfg = tiny_cfg(lineage, d_model=D, n_heads=H, n_layers=2, norm={"placement": placement, "type": norm_type},
                   position={"name": "none"}, **over)
    model = build_model(cfg).double()
    with torch.no_grad():  # every parameter away from its init, so a missing gain, norm or term shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def _ln(x, norm):
    return F.layer_norm(x, (D,), norm.weight, norm.bias, norm.eps)


def _blocks_by_hand(model, x, pad, step):
    """The stack's blocks applied by hand: step(block, name, sublayer_input) -> the residual step's output."""
    kw = {"attn": dict(pos=model.encoder.position, mask=pad, is_causal=False), "ffn": {}}
    for block in model.encoder.blocks:
        for name in ("attn", "ffn"):
            x = step(getattr(block, name), x, kw[name])
    return x


def _hidden(model, tokens, padding):
    seen = {}
    handle = model.encoder.blocks[-1].register_forward_hook(lambda m, a, out: seen.setdefault("h", out))
    model(tokens, padding=padding)
    handle.remove()
    return seen["h"]


@pytest.mark.parametrize("placement,norm_type", [("rezero", "layernorm"), ("rezero_pre", "layernorm"),
                                                 ("rezero_pre", "rmsnorm")])
def test_rezero_is_x_plus_alpha_f(placement, norm_type):
    """ReZero: x_{l+1} = x_l + alpha_l F(x_l) (Bachlechner et al. 2020, eq. 3); with a norm, F(norm(x_l))."""
    model = _model(placement, norm_type)
    tokens, padding = torch.randint(0, 37, (2, T)), torch.ones(2, T, dtype=torch.bool)
    padding[1, 9:] = False
    pad = torch.zeros(2, 1, 1, T, dtype=torch.float64).masked_fill(~padding[:, None, None, :], float("-inf"))

    def norm(x, n):
        if placement == "rezero":
            return x
        if norm_type == "rmsnorm":
            return x / x.square().mean(-1, keepdim=True).add(n.eps).sqrt() * n.weight
        return _ln(x, n)

    def step(res, x, kw):
        y = res.f(norm(x, getattr(res, "norm", None)), **kw)
        return x + res.alpha.gain * y

    x = model.encoder.embed(tokens)
    expect = _blocks_by_hand(model, x, pad, step)
    got = _hidden(model, tokens, padding)
    torch.testing.assert_close(got[padding], expect[padding], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("placement", ["rezero", "rezero_pre"])
@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
def test_rezero_blocks_start_as_the_identity(placement, lineage):
    """alpha = 0 at init: every block returns its input; the gradient still reaches the decoder's alphas."""
    model = build_model(tiny_cfg(lineage, norm={"placement": placement, "type": "layernorm"}))
    alphas = {n: p for n, p in model.named_parameters() if n.endswith("alpha.gain")}
    assert len(alphas) == (4 if lineage == "decoder_only" else 2 * 2 + 2 * 3) and all(a == 0 for a in alphas.values())
    seen = []
    for block in model.modules():
        if isinstance(block, TransformerBlock):
            block.register_forward_hook(lambda m, args, out: seen.append(torch.equal(args[0], out)))
    tokens = torch.randint(0, 37, (2, 7))
    logits = model(tokens, tokens) if model.needs_source else model(tokens)
    assert len(seen) == sum(isinstance(m, TransformerBlock) for m in model.modules()) and all(seen)
    logits.logsumexp(-1).sum().backward()
    # the encoder's get none until the decoder's cross-attention alpha moves from 0: its output is not yet read
    assert all(a.grad.abs() > 0 for n, a in alphas.items() if n.startswith("decoder"))


def _attention_step(placement: str, norm_type: str = "layernorm"):
    """A self-attention (3 heads of 8) inside the placement, in float64, every parameter moved from its init."""
    cfg = tiny_cfg("decoder_only", d_model=D, n_heads=H, n_layers=20, norm={"placement": placement, "type": norm_type},
                   position={"name": "none"})
    step = build_model(cfg).double().decoder.blocks[0].attn
    with torch.no_grad():
        for p in step.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return step


def _copy_of(x):
    return x.detach().clone().requires_grad_()


def _compare(ours, theirs, x, params):
    """Outputs, and the gradients of the input and of the paired parameters, equal in float64."""
    x2 = _copy_of(x)
    a, b = ours(x), theirs(x2)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    a.sin().sum().backward(), b.sin().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-10, atol=1e-10)
    for p, q in params:
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-10)


def test_layerscale_equals_x_transformers_layerscale_on_a_pre_ln_branch():
    from x_transformers.x_transformers import LayerScale as TheirLayerScale

    ours = _attention_step("layerscale")
    assert ours.scale.gain.shape == (D,)
    theirs = TheirLayerScale(ours.f, D).double()
    with torch.no_grad():
        theirs.gamma.copy_(torch.rand(D) * 0.1)
        ours.scale.gain.copy_(theirs.gamma)
    pad = torch.zeros(2, 1, T, T, dtype=torch.float64)
    pad[1, ..., 9:] = float("-inf")  # a padding mask: the second sequence has 9 real tokens
    kw = dict(pos=NO_POSITION, mask=pad, is_causal=False)
    x = torch.randn(2, T, D, dtype=torch.float64, requires_grad=True)
    _compare(lambda x: ours(x, **kw), lambda x: x + theirs(_ln(x, ours.norm), **kw), x,
             [(ours.scale.gain, theirs.gamma)])


def test_layerscale_starts_by_depth_as_cait():
    for blocks, start in [(2, 0.1), (18, 0.1), (24, 1e-5), (36, 1e-6)]:
        model = build_model(tiny_cfg(n_layers=blocks, norm={"placement": "layerscale", "type": "rmsnorm"}))
        gains = torch.cat([p for n, p in model.named_parameters() if n.endswith("scale.gain")])
        assert gains.shape == (2 * blocks * 32,) and gains.eq(torch.tensor(start)).all(), blocks


def test_gated_residual_equals_x_transformers_gru_gating():
    from x_transformers.x_transformers import GRUGating

    ours = _attention_step("gated", "rmsnorm")
    theirs = GRUGating(D).double()
    ours.gate.load_state_dict(theirs.gru.state_dict())
    kw = dict(pos=NO_POSITION, mask=None, is_causal=True)
    x = torch.randn(3, T, D, dtype=torch.float64, requires_grad=True)
    norm = ours.norm
    _compare(lambda x: ours(x, **kw), lambda x: theirs(ours.f(norm(x), **kw), x), x,
             [(ours.gate.weight_hh, theirs.gru.weight_hh), (ours.gate.bias_ih, theirs.gru.bias_ih)])


def test_gated_residual_starts_near_the_identity_and_counts_its_gate():
    from zoo import count_params

    cfg = tiny_cfg(norm={"placement": "gated", "type": "rmsnorm"})
    model = build_model(cfg)
    gate = model.decoder.blocks[0].ffn.gate
    assert gate.bias_hh[32:64].eq(2).all() and gate.bias_hh[:32].eq(0).all() and gate.bias_ih.eq(0).all()
    plain = count_params(tiny_cfg(norm={"placement": "pre", "type": "rmsnorm"}))
    assert count_params(cfg)["norm"] - plain["norm"] == 2 * 2 * (6 * 32 * 32 + 6 * 32)  # 2 blocks x 2 steps


def test_fixup_step_is_x_plus_scale_f_of_x_plus_bias_plus_bias():
    """Fixup's residual step with its scalars (Zhang et al. 2019, Fig. 1 right: bias, branch, multiplier, bias)."""
    model = _model("fixup")
    tokens, padding = torch.randint(0, 37, (2, T)), torch.ones(2, T, dtype=torch.bool)
    padding[0, 11:] = False
    pad = torch.zeros(2, 1, 1, T, dtype=torch.float64).masked_fill(~padding[:, None, None, :], float("-inf"))

    def step(res, x, kw):
        a, s, b = res.scalars.bias_in, res.scalars.scale, res.scalars.bias_out
        return x + s * res.branch(x + a, **kw) + b

    expect = _blocks_by_hand(model, model.encoder.embed(tokens), pad, step)
    torch.testing.assert_close(_hidden(model, tokens, padding)[padding], expect[padding], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_only"])
def test_fixup_initialisation_zeroes_last_layers_and_scales_the_rest_by_depth(lineage, monkeypatch):
    """Rules 2 and 3: the branch's last layer 0, the others times L^(-1/(2m-2)) = L^(-1/2) (m = 2), L = 3 blocks x 2
    branches; scalars 1 and 0. Against the same model's draws without Fixup's rules (init_for_depth skipped)."""
    from zoo.layers.fixup import Fixup

    n_layers, layers = 3, "decoder" if lineage == "decoder_only" else "encoder"
    cfg = tiny_cfg(lineage, n_layers=n_layers, norm={"placement": "fixup"})
    fixup = build_model(cfg, seed=5)
    monkeypatch.setattr(Fixup, "init_for_depth", lambda self, blocks: None)
    drawn = dict(build_model(cfg, seed=5).named_parameters())
    factor = (2 * n_layers) ** -0.5
    for name, p in fixup.named_parameters():
        if f"{layers}.blocks." not in name or name.endswith("bias"):
            continue
        if name.endswith((".branch.out.weight", ".branch.down.weight")):
            assert p.eq(0).all() and drawn[name].ne(0).all(), name
        elif ".scalars." in name:
            assert p.item() == (1.0 if name.endswith("scale") else 0.0), name
        else:
            torch.testing.assert_close(p, drawn[name] * factor, rtol=1e-6, atol=0)
    assert not any("norm" in n for n in dict(fixup.named_parameters()) if f"{layers}.blocks." in n)  # no norm
