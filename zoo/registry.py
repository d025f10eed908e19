"""Registries: components are chosen by name, once, at build time.

Each kind of component (attention, position, norm, residual placement, FFN, model) has one
`Registry`; so has the optimizer (OPTIM: zoo/optim/, the `optim` config group). Components register where
they are defined; configs and checkpoints name them.

A part may live outside zoo: ZOO_PLUGINS names the modules (comma-separated; a module name on the import path,
or a .py file) imported with zoo's own components, before any config is composed or resolved, so each
registers its parts: `ZOO_PLUGINS=relu_squared.py python train.py ffn=relu_squared`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zoo.component import ConfigError, Options
from zoo.io import first_line

_COMPONENT_KINDS = ("attention", "position", "norm", "residual", "ffn", "model")


class UnknownNameError(KeyError):
    """An unknown component name; a KeyError whose message prints as one plain line."""

    def __str__(self) -> str:
        return str(self.args[0])


class Registry:
    """A name -> constructor table with errors that list the valid names."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Callable[..., Any]] = {}
        self._options: dict[str, type] = {}
        self._examples: dict[str, list[dict]] = {}

    def register(self, name: str, fn: Any = None, *, options: type | None = None,
                 examples: list[dict] | None = None) -> Any:
        """Register `fn` under `name`; usable as a decorator or called directly.

        options: the dataclass of the component's own options (zoo.component.Options when it has none);
        examples: option sets the property tests build it with (default: its defaults alone)."""

        def add(f: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._entries:
                raise KeyError(f"{self.kind}: '{name}' is already registered")
            self._entries[name] = f
            if options is not None:
                self._options[name] = options
            self._examples[name] = examples or [{}]
            return f

        return add if fn is None else add(fn)

    def _load(self) -> None:
        # Components register where they are defined; `import zoo` no longer imports them (it stays
        # torch-free), so a lookup in a component registry imports the modules that fill it.
        if self.kind in _COMPONENT_KINDS:
            importlib.import_module("zoo.layers")
            importlib.import_module("zoo.models")
            load_plugins()
        elif self.kind == "optim":
            importlib.import_module("zoo.optim")
            load_plugins()

    def get(self, name: str) -> Any:  # a factory, often a class whose attributes are read (hard_limit, generates)
        self._load()
        if name not in self._entries:
            raise UnknownNameError(f"{self.kind}: unknown name '{name}'; valid: {', '.join(self.names())}")
        return self._entries[name]

    def options(self, name: str) -> type:
        """The dataclass declaring the component's options (typed, with defaults)."""
        self.get(name)
        return self._options.get(name, Options)

    def examples(self, name: str) -> list[dict]:
        """The option sets the component is tested with, e.g. gqa: [{"n_kv_heads": 2}]."""
        self.get(name)
        return self._examples[name]

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def __contains__(self, name: Any) -> bool:
        self._load()
        return name in self._entries

    def __repr__(self) -> str:
        return f"Registry({self.kind}: {', '.join(self.names())})"


def plugins() -> list[str]:
    """The modules ZOO_PLUGINS names, in order."""
    return [p.strip() for p in os.environ.get("ZOO_PLUGINS", "").split(",") if p.strip()]


def load_plugins() -> None:
    """Import each ZOO_PLUGINS module once (a .py file by its path), so its parts register; a module that fails
    to import is one line naming it."""
    for plugin in plugins():
        is_file = plugin.endswith(".py")
        # a file's module is named for its full path: two files of one name (a/parts.py, b/parts.py) are two modules
        where = hashlib.sha256(str(Path(plugin).resolve()).encode()).hexdigest()[:12]
        name = f"zoo_plugin_{Path(plugin).stem}_{where}" if is_file else plugin
        if name in sys.modules:
            continue
        try:
            if is_file:
                spec = importlib.util.spec_from_file_location(name, Path(plugin).resolve())
                if spec is None or spec.loader is None:
                    raise ImportError("not a Python source file")
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module  # before it runs: a re-entrant lookup (its registrations) imports it once
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
            else:
                importlib.import_module(plugin)
        except Exception as e:  # its own error, in one line: the module is the user's, not zoo's
            raise ConfigError(f"ZOO_PLUGINS: cannot import '{plugin}': {type(e).__name__}: {first_line(e)}; valid: "
                              "comma-separated module names on the import path, or .py files") from e


ATTENTION = Registry("attention")
POSITION = Registry("position")
NORM = Registry("norm")
RESIDUAL = Registry("residual")  # norm placement: pre, post, sandwich, parallel
FFN = Registry("ffn")
MODEL = Registry("model")
OPTIM = Registry("optim")  # the optimizer a run trains with (zoo/optim/): not a part of the model

REGISTRIES = {r.kind: r for r in (ATTENTION, POSITION, NORM, RESIDUAL, FFN, MODEL, OPTIM)}
