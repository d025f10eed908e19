"""Training with Lightning, driven by Hydra configs: `run(cfg)` is the whole of train.py.

`run` and `main` are imported on first use, so `zoo.training.cli` and `zoo.training.checkpoint` load
without Lightning's start-up cost.
"""

import importlib
from typing import Any

__all__ = ["final_metric", "main", "run"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("zoo.training.runner"), name)
    raise AttributeError(f"module 'zoo.training' has no attribute '{name}'")
