"""A new part is one file: registered from outside zoo (ZOO_PLUGINS), it trains from the command line with no yaml,
the budget sizing it by asking it."""

import json
import math
import os
import sys
from pathlib import Path

import pytest

from tests import zygote
from tests.helpers import TINY
from zoo.registry import FFN, load_plugins

ROOT = Path(__file__).resolve().parents[2]

RELU_SQUARED = '''
from dataclasses import dataclass, replace

import torch
from torch import nn

from zoo.component import Context, Options, need
from zoo.registry import FFN


@dataclass(kw_only=True)
class SquaredReLUOptions(Options):
    d_ff: int | None = None  # hidden size; null: 4 * d_model


@FFN.register("{name}", options=SquaredReLUOptions)
class SquaredReLU(nn.Module):
    """down(relu(up(x))^2) (So et al. 2021, Primer)."""

    count_as, residual_outputs = "ffn", ("down",)

    def __init__(self, ctx: Context, opts: SquaredReLUOptions):
        super().__init__()
        need(opts.d_ff is None or opts.d_ff > 0, "ffn.d_ff", f"must be positive, got {{opts.d_ff}}")
        d_ff = opts.d_ff or 4 * ctx.d_model
        self.up = nn.Linear(ctx.d_model, d_ff, bias=ctx.bias)
        self.down = nn.Linear(d_ff, ctx.d_model, bias=ctx.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)) ** 2)

    @classmethod
    def resize(cls, opts: SquaredReLUOptions, size: int) -> SquaredReLUOptions:
        return replace(opts, d_ff=size)
'''


def test_a_part_in_one_file_trains_from_the_command_line_with_budget_params(tmp_path):
    plugin = tmp_path / "relu_squared.py"
    plugin.write_text(RELU_SQUARED.format(name="relu_squared"))
    run_dir = tmp_path / "run"
    env = {**os.environ, "ZOO_PLUGINS": str(plugin), "PYTHONPATH": str(ROOT)}
    proc = zygote.run([sys.executable, "train.py", "ffn=relu_squared", "budget=params", "logger=none",
                       "debug=fast", *TINY, f"hydra.run.dir={run_dir}"],
                      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "completed" and s["architecture"]["ffn"] == "relu_squared"
    assert math.isfinite(s["final"]["val_loss"])
    budget = s["budget"]  # sized by the part's own resize: the baseline's parameters within 1%
    assert budget["kind"] == "params" and abs(budget["deviation"]) <= 0.01
    assert s["params"]["total"] == budget["params"]
    # one file, no config: nothing in conf/ names the part, and the test wrote no yaml
    assert not list(tmp_path.glob("*.yaml")) and not (ROOT / "conf" / "ffn" / "relu_squared.yaml").exists()
    assert "relu_squared" in (run_dir / "config.yaml").read_text()


def test_a_plugin_module_on_the_import_path_registers_its_parts(tmp_path, monkeypatch):
    (tmp_path / "zoo_test_plugin_ffn.py").write_text(RELU_SQUARED.format(name="relu_squared_module"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ZOO_PLUGINS", "zoo_test_plugin_ffn")
    monkeypatch.setattr(FFN, "_entries", dict(FFN._entries))  # the registration lasts this test only
    monkeypatch.setattr(FFN, "_options", dict(FFN._options))
    monkeypatch.setattr(FFN, "_examples", dict(FFN._examples))
    try:
        assert "relu_squared_module" in FFN.names()
    finally:
        sys.modules.pop("zoo_test_plugin_ffn", None)


@pytest.mark.parametrize("plugin,says", [
    ("no_such_zoo_plugin", "ModuleNotFoundError: No module named 'no_such_zoo_plugin'"),
    ("{tmp}/missing.py", "FileNotFoundError"),
    ("{tmp}/broken.py", "ZeroDivisionError: division by zero"),
])
def test_a_plugin_that_does_not_import_is_one_line_before_anything_runs(tmp_path, plugin, says):
    (tmp_path / "broken.py").write_text("1 / 0\n")
    env = {**os.environ, "ZOO_PLUGINS": plugin.format(tmp=tmp_path), "PYTHONPATH": str(ROOT)}
    proc = zygote.run([sys.executable, "train.py", f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env,
                      capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith(f"error: ZOO_PLUGINS: cannot import '{plugin.format(tmp=tmp_path)}': ")
    assert says in proc.stderr and not (tmp_path / "run").exists()


def test_no_plugins_imports_nothing(monkeypatch):
    monkeypatch.delenv("ZOO_PLUGINS", raising=False)
    before = set(sys.modules)
    load_plugins()
    assert set(sys.modules) == before
