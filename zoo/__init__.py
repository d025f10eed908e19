"""zoo: a config-driven, registry-based Transformer architecture zoo."""

from zoo import registry
from zoo.build import ConfigError, build_model, count_params, flops_per_token, resolve_config

__all__ = ["ConfigError", "build_model", "count_params", "flops_per_token", "registry", "resolve_config"]
