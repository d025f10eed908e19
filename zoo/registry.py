"""Registries: components are chosen by name, once, at build time.

Each kind of component (attention, position, norm, residual placement, FFN, model) has one
`Registry`. Components register where they are defined; configs and checkpoints name them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

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

    def register(self, name: str, fn: Callable[..., Any] | None = None, *, options: type | None = None,
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

    def get(self, name: str) -> Any:  # a factory, often a class whose attributes are read (hard_limit, generates)
        self._load()
        if name not in self._entries:
            raise UnknownNameError(f"{self.kind}: unknown name '{name}'; valid: {', '.join(self.names())}")
        return self._entries[name]

    def options(self, name: str) -> type:
        """The dataclass declaring the component's options (typed, with defaults)."""
        from zoo.component import Options

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


ATTENTION = Registry("attention")
POSITION = Registry("position")
NORM = Registry("norm")
RESIDUAL = Registry("residual")  # norm placement: pre, post, sandwich, parallel
FFN = Registry("ffn")
MODEL = Registry("model")

REGISTRIES = {r.kind: r for r in (ATTENTION, POSITION, NORM, RESIDUAL, FFN, MODEL)}
