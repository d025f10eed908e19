"""The component rule: no code in zoo/ compares a value against a component registry name outside the
component's own file; other code asks the component (count_as, generates, hard_limit, parallel, ...).

zoo/bench/ (its lists of variants to time) and zoo/convert.py (its conversion tables) are excepted.
A component's own file (zoo/layers/*.py, zoo/models/*.py) may compare against the names it registers
itself, not against another component's. The names are read from the registries when the test runs,
so a part registered tomorrow is covered. "none" is left out: it is also every option's word for off
(model.share_blocks, a synthesizer's mix, the CPU kind), and position=none is asked of the part (`rotary`, ...)."""

from __future__ import annotations

import ast
from pathlib import Path

from zoo.registry import REGISTRIES

ZOO = Path(__file__).resolve().parents[1] / "zoo"
EXCEPTED = {"convert.py"}
EXCEPTED_DIRS = {ZOO / "bench"}
COMPARISONS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)
NOT_NAMES = {"none"}


def registered() -> dict[str, list[tuple[str, str]]]:
    """Every registered name -> [(kind, the module that registered it)]."""
    out: dict[str, list[tuple[str, str]]] = {}
    for kind, registry in REGISTRIES.items():
        for name in set(registry.names()) - NOT_NAMES:
            out.setdefault(name, []).append((kind, getattr(registry.get(name), "__module__", "")))
    return out


def _strings(node: ast.AST) -> list[str]:
    """The str constants an operand is: "rope" -> ["rope"]; ("pre", "post") -> ["pre", "post"]."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def name_comparisons(source: str, names: dict[str, list[tuple[str, str]]], module: str = "") -> list[str]:
    """'line: text' for each ==, !=, in, not in (and `case "..."`) whose operand is a registered name
    (or a tuple, list or set holding one), unless `module` registered that name itself."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, COMPARISONS) for op in node.ops):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        else:
            continue
        for s in (s for o in operands for s in _strings(o)):
            owners = names.get(s, [])
            if owners and not any(mod == module for _, mod in owners):
                kinds = ", ".join(kind for kind, _ in owners)
                found.append(f"{node.lineno}: compares against the {kinds} name {s!r}: {ast.unparse(node)[:80]}")
    return found


def test_no_code_outside_a_component_compares_registry_names():
    names = registered()
    violations = []
    for path in sorted(ZOO.rglob("*.py")):
        if (path.name in EXCEPTED and path.parent == ZOO) or EXCEPTED_DIRS & set(path.parents):
            continue
        module = ".".join(path.relative_to(ZOO.parent).with_suffix("").parts)
        violations += [f"{path.relative_to(ZOO.parent)}:{v}" for v in name_comparisons(path.read_text(), names, module)]
    assert not violations, "ask the component instead:\n" + "\n".join(violations)


def test_the_checker_flags_a_name_comparison():
    names = registered()
    assert "rope" in names  # the checker reads real registry names
    flagged = name_comparisons('if cfg["name"] == "rope":\n    pass\n', names)
    assert len(flagged) == 1 and "'rope'" in flagged[0] and "position" in flagged[0]
    for bad in ('x = a != "rope"', 'ok = name in ("alibi", "sinusoidal")', 'ok = p not in ["pre", "post"]',
                'match kind:\n    case "gqa":\n        pass'):
        assert name_comparisons(bad, names), bad
    for fine in ('x = a == "rope_theta"', 'x = "rope"', 'x = d["rope"]', 'ok = a < "rope"', 'x = a == b'):
        assert not name_comparisons(fine, names), fine
    # a component's own file may compare against its own names, not another component's
    own = names["rope"][0][1]
    assert not name_comparisons('ok = n == "rope"', names, module=own)
    assert name_comparisons('ok = n == "swiglu"', names, module=own)
