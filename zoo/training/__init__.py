"""Training with Lightning, driven by Hydra configs: `run(cfg)` is the whole of train.py."""

from zoo.training.run import main, run

__all__ = ["main", "run"]
