"""The README's Layout section is the map of the code: it names every module under zoo/ (and the C++ kernels),
every config group under conf/, and nothing that is gone.

The Layout is one code block of entries, one a line: a name, then what it is for. Indentation nests an entry in
the folder above it (`zoo/`, then `  layers/`, then `    attention.py`). A folder's description may name files
inside it (`zoo/  __init__.py: the public API`) or, for `conf/`, its groups (`model/ attention/ ...`). A line
indented as far as the description above it continues that entry. Packages' `__init__.py` and `__main__.py` files
need no line of their own: the folder's line stands for them.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = re.compile(r"[\w.-]+\.(?:py|cpp)\b")
EXEMPT = {"__init__.py", "__main__.py"}


def layout_block(readme: str) -> list[str]:
    """The lines of the first code block after the '## Layout' heading."""
    section = readme.split("\n## Layout\n", 1)[1]
    return section.split("```", 2)[1].split("\n")[1:]


def parse(lines: list[str]) -> dict[str, str]:
    """Each entry's path from the repository root (folders end with '/') -> its description, continuations joined."""
    entries: dict[str, str] = {}
    folders: list[tuple[int, str]] = []  # the open folders: (indent, path)
    last, column = None, 0  # the entry above, and the column its description starts at
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if last is not None and indent >= column:  # indented to the description: it goes on
            entries[last] += " " + line.strip()
            continue
        name, _, description = line.strip().partition(" ")
        column = len(line) - len(description.lstrip()) if description.strip() else len(line)
        while folders and folders[-1][0] >= indent:
            folders.pop()
        path = (folders[-1][1] if folders else "") + name
        if name.endswith("/"):
            folders.append((indent, path))
        entries[path], last = description.strip(), path
    return entries


def named_paths(entries: dict[str, str]) -> set[str]:
    """Every path the Layout names: its entries, and the files a folder's description names inside it."""
    named = set(entries)
    for path, description in entries.items():
        if path.endswith("/"):
            named |= {path + name for name in CODE.findall(description)}
    return named


def code_files() -> set[str]:
    """The modules and C++ kernels under zoo/, as paths from the repository root."""
    return {str(p.relative_to(ROOT)) for ext in ("py", "cpp") for p in (ROOT / "zoo").rglob(f"*.{ext}")
            if "__pycache__" not in p.parts and p.name not in EXEMPT}


def config_groups() -> set[str]:
    """The folders under conf/, each as its path below conf/ ('model', 'hydra/launcher')."""
    return {str(p.relative_to(ROOT / "conf")) for p in (ROOT / "conf").rglob("*")
            if p.is_dir() and "__pycache__" not in p.parts}


ENTRIES = parse(layout_block((ROOT / "README.md").read_text()))


def test_the_layout_names_every_module_under_zoo():
    missing = sorted(code_files() - named_paths(ENTRIES))
    assert not missing, f"README.md's Layout does not name {', '.join(missing)}: add a line for each, saying " \
                        "what it is for"


def test_the_layout_names_nothing_that_is_gone():
    gone = sorted(p for p in named_paths(ENTRIES) if not (ROOT / p).exists() and Path(p).name not in EXEMPT)
    assert not gone, f"README.md's Layout names {', '.join(gone)}, which no longer exist: remove or rename them"


def test_the_layout_names_every_config_group():
    named = [token.rstrip(",;:.)") for token in ENTRIES["conf/"].split()]  # `hydra/launcher/` names hydra too
    missing = sorted(g for g in config_groups() if not any(n.startswith(f"{g}/") for n in named))
    assert not missing, f"README.md's Layout (conf/) does not name the config groups {', '.join(missing)}"


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    unlinked = sorted(p.name for p in (ROOT / "docs").glob("*.md") if f"](docs/{p.name})" not in readme)
    assert not unlinked, f"README.md links to no docs/ page named {', '.join(unlinked)}: add it to Documentation"


def test_the_parser_reads_nesting_continuations_and_named_files():
    """The reading the tests above rely on, on a small Layout: a file missing from it is caught by name."""
    entries = parse(["zoo/          __init__.py: the API",
                     "  layers/     one file per part",
                     "    norm.py   norms",
                     "  build.py    build_model",
                     "conf/         model/ attention/",
                     "              hydra/launcher/ the launchers"])
    assert named_paths(entries) == {"zoo/", "zoo/__init__.py", "zoo/layers/", "zoo/layers/norm.py",
                                    "zoo/build.py", "conf/"}
    assert entries["conf/"].split() == ["model/", "attention/", "hydra/launcher/", "the", "launchers"]


def test_the_readme_is_a_guide_of_about_300_lines():
    """Details belong in docs/ pages (the README's Documentation table links each); the README is the first hour."""
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= 300, f"README.md has {n} lines, over the guide's ~300: move the details into the docs/ page they " \
                     "belong to and link it"
