"""The type checker runs with the suite: `python -m mypy` (configured in pyproject.toml: zoo/, with a baseline of
modules not yet clean) passes, and it follows the typed config, so a misspelt or misplaced attribute fails it.
A cold run reads the standard library and Hydra's types (about 25 s of CPU); later runs reuse .mypy_cache."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is in the dev extra: pip install -e '.[dev]'")

ROOT = Path(__file__).resolve().parents[1]


def mypy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_zoo_passes_the_type_checker():
    proc = mypy()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found" in proc.stdout


def test_the_checker_follows_the_typed_config(tmp_path):
    """An option read off the component instead of its options, and a key the model does not have, both fail."""
    code = ("from zoo.spec import ModelSpec\n"
            "def window(spec: ModelSpec) -> int | None:\n"
            "    return spec.attention.options.window\n"
            "def wrong(spec: ModelSpec) -> int | None:\n"
            "    return spec.attention.window\n"
            "def missing(spec: ModelSpec) -> int:\n"
            "    return spec.d_ff\n")
    (tmp_path / "reads.py").write_text(code)
    proc = mypy(str(tmp_path / "reads.py"))
    assert proc.returncode == 1
    errors = [line for line in proc.stdout.splitlines() if ": error:" in line]
    assert [e.split(":")[1] for e in errors] == ["5", "7"], proc.stdout
    assert '"Part[AttentionOptions]" has no attribute "window"' in errors[0]
    assert '"ModelSpec" has no attribute "d_ff"' in errors[1]
