"""The benchmark's sections by name, as zoo's components are (zoo.registry): each section's file registers the
function that runs it and returns its Markdown, `--only` picks among the names, and the report keeps their
order."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from zoo.bench.session import Session
from zoo.registry import Registry


class SectionRegistry(Registry):
    """zoo's Registry with the names in the order they were registered (sections/__init__.py imports the files in
    the report's order), not sorted."""

    def _load(self) -> None:
        importlib.import_module("zoo.bench.sections")

    def names(self) -> list[str]:
        self._load()
        return list(self._entries)


SECTIONS = SectionRegistry("section")


def section(name: str) -> Callable[[Callable[[Session], str]], Callable[[Session], str]]:
    """Register a section: `@section("kv")` over `def section_kv(sess: Session) -> str`."""
    return SECTIONS.register(name)
