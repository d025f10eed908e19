"""Markdown cells and tables, numbers with about three significant digits."""

from __future__ import annotations

from collections.abc import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def num(x: float) -> str:
    """A positive number with about three significant digits, never in scientific notation."""
    if x == 0:
        return "0"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}" if x >= 1e-3 else f"{x:.6f}"


def ratio(x: float) -> str:
    return f"{x:.2f}x"


def ms(seconds: float) -> str:
    return num(seconds * 1e3)
