"""Only known classes may be instantiated from a config: `_target_` must be on an allow-list."""

from __future__ import annotations

from typing import Any

from zoo.build import ConfigError

ALLOWED_TARGETS = ("lightning.pytorch.loggers.", "lightning.pytorch.callbacks.", "torch.optim.", "zoo.")


def check_target(target: str, key: str = "_target_") -> None:
    if not any(target.startswith(prefix) for prefix in ALLOWED_TARGETS):
        raise ConfigError(f"{key}: '{target}' is not allowed; _target_ must start with one of: "
                          f"{', '.join(ALLOWED_TARGETS)}")


def instantiate_allowed(cfg: dict, key: str, **kwargs: Any) -> Any:
    """hydra.utils.instantiate for one object (at config `key`), after checking every nested _target_."""
    from hydra.utils import instantiate

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if "_target_" in node:
                check_target(str(node["_target_"]), f"{path}._target_".lstrip("."))
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(cfg, key)
    return instantiate(cfg, **kwargs)
