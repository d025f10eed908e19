"""The benchmark's child processes: a probe in a fresh interpreter (`python -m zoo.bench --memory-probe ...`,
whose memory is its own) and training runs (`python -m zoo train`, the command train.py runs), read back through
the summary.json they write. Both work in a clone and from an installed wheel, which has no train.py."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from zoo.bench.machine import load_average
from zoo.bench.settings import Settings
from zoo.commands import clone_config_dir, train_command

# What the sections train with: `zoo train` in this interpreter, so a clone and a wheel install run the same code
# (train.py is a clone's alias of it). A test may put a stand-in's command in its place.
TRAIN = (sys.executable, "-m", "zoo", "train")


def child_env() -> dict[str, str]:
    """The environment for zoo's child processes: in a clone, its checkout first on PYTHONPATH, so a child imports
    this zoo from any working directory; an installed zoo is on the interpreter's own path already."""
    env = dict(os.environ)
    if (conf := clone_config_dir()) is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(conf.parent), *filter(None, [env.get("PYTHONPATH")])])
    return env


def shown(overrides: Sequence[str]) -> str:
    """A training command as the report shows it: the way a user of this install types it (`python train.py ...`
    in a clone, `zoo train ...` from a wheel), with these overrides."""
    return " ".join([train_command(), shlex.join(overrides)])


def typed(cmd: Sequence[str]) -> str:
    """A child's command as a user types it: `python ...` for this interpreter's full path."""
    return shlex.join(["python", *cmd[1:]])


def run_probe(args: Sequence[str], s: Settings, timeout: int) -> dict | str:
    """`python -m zoo.bench <args>` in a fresh process (its memory is its own): the JSON it prints last, or why
    it failed, in one line."""
    cmd = [sys.executable, "-m", "zoo.bench", *args, *(["--threads", str(s.threads)] if s.threads else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env())
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not line:
        return (proc.stderr.strip().splitlines() or ["?"])[-1][:120]
    return json.loads(line[-1])


def status_kib(field_name: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field_name}:\s+(\d+)", text, re.M).group(1))


def _find_summary(stdout: str, root: Path, started: float) -> Path | None:
    """summary.json in a directory the run printed, else the newest one written under `root` since it started."""
    for token in reversed(re.findall(r"[\w./\\:~-]+", stdout)):
        p = (root / token).expanduser() if not Path(token).is_absolute() else Path(token)
        for cand in (p, p / "summary.json"):
            if cand.name == "summary.json" and cand.is_file():
                return cand
    found = [p for d in ("outputs", "runs", "multirun", "logs") for p in (root / d).glob("**/summary.json")
             if p.stat().st_mtime >= started]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def run_training(cmd: list[str], workdir: Path) -> tuple[dict, Path, float, str] | str:
    """Run a training command in `workdir` (where its outputs/ go); (summary, its path, process wall seconds, load
    average before -> after), or why it failed."""
    started, load_before = time.time(), load_average(short=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, timeout=3600, env=child_env())
    wall, load = time.time() - started, f"{load_before} -> {load_average(short=True)}"
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
        return f"failed: `{typed(cmd)}` exited {proc.returncode}: {err}\n"
    summary_path = _find_summary(proc.stdout + "\n" + proc.stderr, workdir, started)
    if summary_path is None:
        return "failed: no summary.json found in the run's output or run directories\n"
    return json.loads(summary_path.read_text()), summary_path, wall, load
