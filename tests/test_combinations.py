"""Every lineage x attention x position x norm x ffn combination builds, runs forward and backward,
and its analytic parameter count equals the real one."""

import itertools

import pytest
import torch

from tests.helpers import run, tiny_cfg
from zoo import build_model, count_params
from zoo.registry import ATTENTION, FFN, MODEL, NORM, POSITION, RESIDUAL

ATTN_OPTS = {"gqa": {"n_kv_heads": 2}}


@pytest.mark.parametrize("lineage", MODEL.names())
@pytest.mark.parametrize("attention", ATTENTION.names())
@pytest.mark.parametrize("position", POSITION.names())
def test_all_combinations(lineage, attention, position):
    # norm placement x type x ffn inside, to keep the test count readable
    for placement, norm, ffn, bias in itertools.product(RESIDUAL.names(), NORM.names(), FFN.names(), [True, False]):
        cfg = tiny_cfg(lineage, d_model=16, n_layers=1, n_heads=4, bias=bias, tie_embeddings=not bias,
                       attention={"name": attention, **ATTN_OPTS.get(attention, {})},
                       position={"name": position}, norm={"placement": placement, "type": norm},
                       ffn={"name": ffn})
        model = build_model(cfg)
        tokens = torch.randint(0, cfg["vocab_size"], (2, 6))
        logits = run(model, tokens)
        assert logits.shape == (2, 6, cfg["vocab_size"])
        assert torch.isfinite(logits).all()
        logits.logsumexp(-1).mean().backward()
        grads = [p.grad for p in model.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), cfg
        assert count_params(cfg)["total"] == sum(p.numel() for p in model.parameters()), cfg
