"""nanoGPT: its model.py, imported at run time from a checkout given with `--nanogpt PATH` (GPT-2 style only)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from pathlib import Path

import torch

from zoo.bench.contenders.base import NotInstalled
from zoo.bench.settings import Settings, Shape


def load_nanogpt(path: Path):
    """nanoGPT's model.py imported from a checkout at run time (nothing of it lives in zoo)."""
    path = Path(path).expanduser().resolve()
    file = path / "model.py"
    if not file.is_file():
        raise NotInstalled(f"no model.py in {path}")
    name = "zoo_bench_nanogpt_model"
    if name not in sys.modules:
        sys.path.insert(0, str(path))
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def build_nanogpt(shape: Shape, family: str, s: Settings):
    if s.nanogpt is None:
        raise NotInstalled("not given (--nanogpt PATH)")
    if family != "gpt2":
        raise NotInstalled("GPT-2 style only")
    ng = load_nanogpt(s.nanogpt)
    cfg = ng.GPTConfig(block_size=shape.context, vocab_size=shape.vocab, n_layer=shape.n_layers,
                       n_head=shape.n_heads, n_embd=shape.d_model, dropout=0.0, bias=True)
    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its parameter count
        model = ng.GPT(cfg)
    return model, lambda m, x, y: m(x, y)[1]  # its loss is lm_loss's call on the full logits
