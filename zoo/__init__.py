"""zoo: a config-driven, registry-based Transformer architecture zoo."""

import importlib

from zoo import registry

__all__ = ["ConfigError", "build_model", "count_params", "flops_per_token", "registry", "resolve_config"]


def __getattr__(name: str):
    # zoo.build (and torch) load on first use, so `import zoo.training.cli` and train.py's argument
    # checks and --help answer without torch's start-up time.
    if name in __all__:
        return getattr(importlib.import_module("zoo.build"), name)
    raise AttributeError(f"module 'zoo' has no attribute '{name}'")
