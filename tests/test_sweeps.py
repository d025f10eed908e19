"""Sweeps: Hydra multirun with the joblib launcher, a failing run, and budget=params."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.conftest import TINY

ROOT = Path(__file__).resolve().parents[1]


def test_joblib_multirun_with_a_failing_run_and_matched_parameters(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    cmd = [sys.executable, "train.py", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *TINY,
           "logger=csv", "ffn=gelu,swiglu", "model.n_heads=2,3", "budget=params", f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {tuple(sorted(o for o in s["overrides"] if o.startswith(("ffn=", "model.n_heads=")))): s
            for s in (json.loads(p.read_text()) for p in tmp_path.glob("*/summary.json"))}
    assert len(runs) == 4
    assert {k: s["status"] for k, s in runs.items()} == {
        ("ffn=gelu", "model.n_heads=2"): "completed", ("ffn=swiglu", "model.n_heads=2"): "completed",
        ("ffn=gelu", "model.n_heads=3"): "failed", ("ffn=swiglu", "model.n_heads=3"): "failed"}
    gelu, swiglu = runs["ffn=gelu", "model.n_heads=2"], runs["ffn=swiglu", "model.n_heads=2"]
    assert abs(swiglu["params"]["total"] - gelu["params"]["total"]) <= 0.01 * gelu["params"]["total"]
    from zoo.layers.ffn import default_d_ff

    assert swiglu["budget"]["d_ff"] != default_d_ff(32, gated=True)  # resized, and the summary says so
    assert swiglu["model"]["ffn"]["d_ff"] == swiglu["budget"]["d_ff"]


def test_unknown_budget_is_refused(tmp_path, capsys):
    from tests.training.conftest import compose_cfg
    from zoo.training import main

    assert main(compose_cfg(TINY + ["budget=flops"]), tmp_path) == 2
    assert "budget: unknown 'flops'; valid: params, null" in capsys.readouterr().err
