"""Every lineage x attention x position x placement x norm x ffn x bias combination builds, runs forward and
backward, and its parameter count equals the real one. Each combination is its own test case, so each
failing one is reported on its own.

The full product (3 lineages x 45 attentions x 10 positions x 13 placements x 3 norms x 24 ffns x 2 = about
2.5 million models today) is far too big, so the cases are covering designs (tests/helpers.py covering). The
default suite runs the design of strength 2: for ANY two kinds, lineage included, every combination of their
values is in some case (every part under every lineage, every pair of parts), about 1,100 models. The design
of strength 3 (any three kinds, so every pair of parts under every lineage and every placement x norm x ffn;
about 14,000 models, minutes to compute and 5-10 minutes to run on 2 cores) runs with the slow tests
(`-m slow`); it is made only when a run selects them. The cases come from the registries, so a part
registered tomorrow is in them with no edit here."""

import pytest
import torch

from tests.helpers import KINDS, case_id, cases, covering, lineages, model_cfg, run
from zoo import build_model, count_params

FACTORS = {"name": lineages(), **{kind: cases(kind) for kind in KINDS}, "bias": [True, False]}


def _cases(strength: int) -> list[dict]:
    return [model_cfg(row, d_model=16, n_layers=1) for row in covering(FACTORS, strength=strength)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Strength 2 in every run; strength 3 only where the run selects slow tests (its greedy design alone takes
    minutes, which every pytest-xdist worker would pay at collection)."""
    if metafunc.function is test_combination_builds_runs_backward_and_counts:
        params = [pytest.param(cfg, id=case_id(cfg)) for cfg in _cases(2)]
        if "slow" in metafunc.config.getoption("markexpr", "").replace("not slow", ""):
            params += [pytest.param(cfg, id=f"s3-{case_id(cfg)}", marks=pytest.mark.slow) for cfg in _cases(3)]
        metafunc.parametrize("cfg", params)


def test_combination_builds_runs_backward_and_counts(cfg):
    cfg = {**cfg, "tie_embeddings": not cfg["bias"]}  # both head layouts, tied and untied, are covered
    model = build_model(cfg)
    tokens = torch.randint(0, cfg["vocab_size"], (2, 6))
    logits = run(model, tokens)
    assert logits.shape == (2, 6, cfg["vocab_size"])
    assert torch.isfinite(logits).all()
    logits.logsumexp(-1).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"no finite gradient: {missing}"
    assert count_params(cfg)["total"] == sum(p.numel() for p in model.parameters())
