"""zoo's import graph, read from the source with ast (nothing is imported): no circle among zoo's modules, the
layers below hold, and every import put off into a function says why.

Every import counts: at module level, inside `if TYPE_CHECKING:`, and inside functions. A package's
`__init__` that Python runs before one of its modules is not an edge of its own; `from zoo.pkg import name` is
an edge to zoo.pkg.name when that is a module, else to zoo.pkg.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The layers, lowest first: a module may import its own layer and the rows before its own, never a later row.
# Two layers on one row sit beside each other and import neither (training and report). A module belongs to the
# longest name in PLACES that is it or a package holding it; a module no name covers fails the test (place it).
LAYERS: list[tuple[str, ...]] = [
    ("base",),        # the registry, the contract, files, the machine, how the tools talk, a sweep's plan
    ("layers",),      # one file per part: its PyTorch formula
    ("kernels",),     # faster forms of the parts, applied by one pass
    ("spec",),        # the typed model spec: names its parts' options (layers), the models and build read it
    ("models",),      # the block, the stacks and the models that hold them; muP's scales; the meta-device build
    ("build",),       # model from spec, optimizers, conversion from Hugging Face, sampling
    ("data",),        # corpora, tokenizers, token shards, the network's bounds
    ("config",),      # the run's config: checks, sizing, budget
    ("training", "report"),  # training runs a plan; the report reads the runs; neither imports the other
    ("cli",),         # the tools a user runs
]
PLACES: dict[str, str] = {
    "zoo": "base",  # the package itself: the registry, and build's names on first use
    "zoo.registry": "base", "zoo.component": "base", "zoo.io": "base", "zoo.hardware": "base",
    "zoo.commands": "base", "zoo.sweep": "base",
    "zoo.layers": "layers",
    "zoo.kernels": "kernels",
    "zoo.spec": "spec",
    "zoo.block": "models", "zoo.models": "models", "zoo.mup": "models", "zoo.meta": "models",
    "zoo.build": "build", "zoo.optim": "build", "zoo.convert": "build", "zoo.generate": "build",
    "zoo.data": "data", "zoo.net": "data",
    "zoo.config": "config", "zoo.budget": "config",
    "zoo.training": "training",
    "zoo.report": "report",
    "zoo.cli": "cli", "zoo.__main__": "cli", "zoo.sample": "cli", "zoo.eval": "cli", "zoo.inspect": "cli",
    "zoo.prepare": "cli", "zoo.bench": "cli", "zoo.kernels.__main__": "cli",
}
RANK = {name: row for row, names in enumerate(LAYERS) for name in names}

# A function-local import of one of these (or of a zoo module) says why it waits, on its line or the line above
# its group of imports: `# lazy: <why> (<cost, measured>)`, or `# optional: <the extra>` for a package that may
# be missing. The costs: docs/benchmarks.md, "Imports (AVX-512 BF16)".
HEAVY = ("torch", "lightning", "hydra", "transformers", "wandb", "matplotlib")
REASON = re.compile(r"#\s*(?:lazy:.*\d(?:\.\d+)?\s*m?s\b|optional:\s*\S+)")


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / "zoo").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


MODULES = modules()


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the zoo module imported, or a third-party package's top name
    line: int
    local: bool  # inside a function
    reason: bool  # a reason comment on its line or above its group

    def where(self) -> str:
        return f"{MODULES[self.source].relative_to(ROOT)}:{self.line}"


def _targets(source: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = source.split(".") if MODULES[source].name == "__init__.py" else source.split(".")[:-1]
            package = package[:len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    out: list[str] = []
    for name in names:
        if name.split(".")[0] != "zoo":
            out.append(name.split(".")[0])
            continue
        while name not in MODULES:  # `import zoo.x.y` of a name inside a module: the module
            name = name.rpartition(".")[0]
        out.append(name)
    return list(dict.fromkeys(out))


def _reasoned(lines: list[str], body: list[ast.stmt], i: int) -> bool:
    """A reason on one of the statement's lines, or on the line above the run of imports it belongs to."""
    node = body[i]
    if any(REASON.search(lines[n - 1]) for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)):
        return True
    while i > 0 and isinstance(body[i - 1], ast.Import | ast.ImportFrom) and \
            not any(line.strip() for line in lines[body[i - 1].end_lineno or 0:body[i].lineno - 1]):
        i -= 1  # imports one after the other, or apart by blank lines (ruff's sections): one group
    return bool(REASON.search(lines[body[i].lineno - 2])) if body[i].lineno > 1 else False


def imports(source: str) -> list[Import]:
    text = MODULES[source].read_text()
    lines = text.splitlines()
    found: list[Import] = []

    def visit(node: ast.AST, local: bool) -> None:
        for field in ("body", "orelse", "finalbody", "handlers"):
            body = getattr(node, field, None)
            if not isinstance(body, list):
                continue
            for i, child in enumerate(body):
                if isinstance(child, ast.Import | ast.ImportFrom):
                    reason = local and _reasoned(lines, body, i)
                    found.extend(Import(source, t, child.lineno, local, reason) for t in _targets(source, child)
                                 if t != source)
                visit(child, local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))
        for child in ast.iter_child_nodes(node):  # with, match, ...: bodies the fields above do not name
            if not isinstance(child, ast.stmt | ast.ExceptHandler) and hasattr(child, "body"):
                visit(child, local)

    visit(ast.parse(text), False)
    return found


def _packages(imp: Import) -> list[Import]:
    """Importing zoo.a.b runs zoo/a/__init__.py first: an edge to each package holding the target, but not to one
    that holds the importing module (Python is already running that package's __init__)."""
    parts = imp.target.split(".")
    held = [".".join(parts[:i]) for i in range(2, len(parts))]
    return [Import(imp.source, p, imp.line, imp.local, imp.reason) for p in held
            if p in MODULES and not imp.source.startswith(p + ".") and p != imp.source]


ALL = [imp for source in MODULES for imp in imports(source)]
EDGES = [edge for imp in ALL if imp.target in MODULES for edge in (imp, *_packages(imp))]


def layer(module: str) -> str | None:
    while module:
        if module in PLACES:
            return PLACES[module]
        module = module.rpartition(".")[0]
    return None


def find_cycle(edges: list[Import]) -> list[str] | None:
    """One circle of imports, as the modules in order (the first repeated at the end), or None."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for e in edges:
        graph[e.source].add(e.target)
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def walk(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (cycle := walk(n)):
                return cycle
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (cycle := walk(m)):
            return cycle
    return None


def test_every_module_has_a_layer():
    assert [m for m in MODULES if layer(m) is None] == [], "place these modules in PLACES"
    assert set(PLACES.values()) <= set(RANK)


def circles(edges: list[Import], most: int = 20) -> list[list[str]]:
    """Circles one after another, each found with the closing edge of those before it taken out."""
    found = []
    while len(found) < most and (cycle := find_cycle(edges)):
        found.append(cycle)
        edges = [e for e in edges if (e.source, e.target) != (cycle[-2], cycle[-1])]
    return found


def test_no_import_circle():
    found = circles(EDGES)
    assert found == [], "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_layers_hold():
    wrong = [f"{e.where()}: {e.source} ({layer(e.source)}) imports {e.target} ({layer(e.target)})"
             for e in EDGES
             if layer(e.source) != layer(e.target) and RANK[layer(e.target)] >= RANK[layer(e.source)]]
    assert wrong == [], "imports against the layers:\n" + "\n".join(wrong)


def test_function_local_imports_say_why():
    silent = [f"{imp.where()}: {imp.target}" for imp in ALL
              if imp.local and not imp.reason and (imp.target in MODULES or imp.target in HEAVY)]
    assert silent == [], "function-local imports without '# lazy: why (cost)' or '# optional: extra':\n" + \
        "\n".join(silent)


def _from_least(cycle: list[str]) -> list[str]:
    """A circle (first module repeated at the end) turned to start at its least name: one form for each rotation."""
    ring = cycle[:-1]
    i = ring.index(min(ring))
    return ring[i:] + ring[:i] + [ring[i]]


def test_the_checks_can_fail(tmp_path):
    """The cycle finder and the reason check see what they must (the test's own parts, on made-up input)."""
    a, b, c = "zoo.io", "zoo.component", "zoo.registry"
    edges = [Import(a, b, 1, False, False), Import(b, c, 1, False, False)]
    assert find_cycle(edges) is None
    found = find_cycle([*edges, Import(c, a, 1, True, False)])
    assert found is not None and _from_least(found) == _from_least([a, b, c, a])  # where it starts: the walk's order
    assert _from_least([a, b, c, a]) != _from_least([a, c, b, a])  # the direction counts
    lines = ["def f():", "    # lazy: torch-free --help (torch 2.7 s)", "    import torch", "", "    import zoo.io",
             "    x = 1", "    import lightning", "    import hydra  # optional: sweeps"]
    body = ast.parse("\n".join(lines)).body[0].body
    assert [_reasoned(lines, body, i) for i in (0, 1, 3, 4)] == [True, True, False, True]
    assert not REASON.search("# lazy: it is faster")  # a reason names the measured cost
