"""Hyper-connections (norm.placement hyper, hyper_dynamic; Zhu et al. 2024): the paper's equations written out
stream by stream in float64 on the model's own sublayers (3 heads, 13 tokens), with the connections moved off their
start; Pre-LN at init; cached decoding equals recomputation; bad values refused in one line."""

import pytest
import torch
import torch.nn.functional as F

from tests.catalogue import check_chunked_decoding
from tests.helpers import tiny_cfg
from zoo import build_model
from zoo.build import resolve_config
from zoo.component import ConfigError
from zoo.generate import generate

B, T, D, H, N = 2, 13, 12, 3, 3


def _model(placement: str, lineage: str = "decoder_only", **over):
    over = {"position": {"name": "none"}, **over}
    return build_model(tiny_cfg(lineage, d_model=D, n_heads=H, norm={"placement": placement}, residual_streams=N,
                                **over)).double()


def _ln(x, norm):
    return F.layer_norm(x, (D,), norm.weight, norm.bias, norm.eps)


def _paper_step(step, hs, run):
    """One residual step on the streams hs (a list of n (B, T, d)), eqs. 5-7 and, when dynamic, 11-13."""
    c = step.connections
    am, ar, b = [c.width_in[j] for j in range(N)], [[c.width_mix[j, k] for k in range(N)] for j in range(N)], \
        [c.depth[k] for k in range(N)]
    if c.norm is not None:  # DHC: per token, from the normed streams
        hn = [_ln(h, c.norm) for h in hs]
        am = [am[j] + c.s_width * torch.tanh(hn[j] @ c.w_in)[..., None] for j in range(N)]
        ar = [[ar[j][k] + c.s_width * torch.tanh(hn[j] @ c.w_mix[:, k])[..., None] for k in range(N)]
              for j in range(N)]
        b = [b[k] + c.s_depth * torch.tanh(hn[k] @ c.w_depth)[..., None] for k in range(N)]
    h0 = sum(am[j] * hs[j] for j in range(N))  # width connection: the sublayer's input
    y = run(_ln(h0, step.norm))
    return [b[k] * y + sum(ar[j][k] * hs[j] for j in range(N)) for k in range(N)]  # depth connection + A_r^T H


@pytest.mark.parametrize("placement", ["hyper", "hyper_dynamic"])
def test_hyper_connections_follow_the_papers_equations(placement):
    model = _model(placement)
    torch.manual_seed(0)
    with torch.no_grad():  # every parameter off its start, connections included
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    stack = model.decoder
    tokens = torch.randint(0, 37, (B, T), generator=torch.Generator().manual_seed(1))
    hs = [stack.embed(tokens)] * N  # n copies of the embeddings
    for block in stack.blocks:
        hs = _paper_step(block.attn, hs, lambda x, a=block.attn.f: a(x, stack.position, is_causal=True))
        hs = _paper_step(block.ffn, hs, block.ffn.f)
    ref = _ln(sum(hs), stack.final_norm)  # the streams summed, then the final norm
    torch.testing.assert_close(stack(tokens), ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("placement", ["hyper", "hyper_dynamic"])
def test_at_init_it_is_pre_ln(placement):
    """A_m = e_{k mod n}, A_r = I, B = 1 (and no dynamic part): every stream is Pre-LN's x; their sum n x, through
    the final norm (eps 0), Pre-LN's output."""
    model, pre = _model(placement), _model("pre")
    pre.load_state_dict({k: v for k, v in model.state_dict().items() if "connections" not in k})
    model.decoder.final_norm.eps = pre.decoder.final_norm.eps = 0.0  # LN(n x) = LN(x) exactly
    tokens = torch.randint(0, 37, (B, T), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(tokens), pre(tokens), atol=1e-10, rtol=0)
    c = model.decoder.blocks[1].attn.connections
    assert torch.equal(c.width_in, torch.eye(N, dtype=c.width_in.dtype)[1 % N])


@pytest.mark.parametrize("placement", ["hyper", "hyper_dynamic"])
@pytest.mark.parametrize("lineage", ["decoder_only", "encoder_decoder"])
def test_cached_decoding_equals_recomputation(lineage, placement):
    model = _model(placement, lineage, position={"name": "rope"}).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    tokens = torch.randint(0, 37, (B, T), generator=torch.Generator().manual_seed(2))
    src = tokens[:, :7] if model.needs_source else None
    check_chunked_decoding(model, tokens)
    kw = {"src": src} if src is not None else {}
    assert torch.equal(generate(model, tokens[:, :4], 6, **kw), generate(model, tokens[:, :4], 6, use_cache=False,
                                                                         **kw))


def test_bad_stream_counts_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="^model.residual_streams: must be an integer >= 1, got 0"):
        build_model(resolve_config(tiny_cfg(norm={"placement": "hyper"}, residual_streams=0)))
