"""Building zoo's C++ kernels (zoo/kernels/<name>.cpp) into torch ops, once per machine.

`load(name)` compiles the file against the installed torch's headers and libraries into a per-user cache
(`$ZOO_CACHE`, else `$XDG_CACHE_HOME/zoo` or `~/.cache/zoo`), named by a hash of the source, the compiler, torch's
version and this CPU's flags, and loads it into `torch.ops`. Only the kernel pass (zoo.kernels.apply_kernels) and
`python -m zoo.kernels build` call it, never a component in the middle of a run. A build says so on one line
before it starts; one that cannot happen (no C++ compiler: `$CXX`, else `c++`) or fails says why on one line, its
compiler log kept beside the cache. Either answer is remembered for the process (no retry storm); a new process
tries again, so a compiler installed since is picked up.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import torch

from zoo.hardware import cpu_flags
from zoo.io import cache_dir as zoo_cache
from zoo.io import first_line

SOURCES = Path(__file__).resolve().parent
# No fused multiply-adds and no fast-math: the kernels' arithmetic is then the same on every CPU, vector width
# and all (their sums are written in fixed lanes for that); -march=native is why the CPU's flags name the build.
# -fopenmp: at::parallel_for runs on torch's own OpenMP threads (the process already holds torch's libgomp).
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fopenmp", "-std=c++20", "-shared",
         "-fPIC", "-w")


def cache_dir() -> Path:
    return zoo_cache() / "native"


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++")


def build_command(source: Path, out: Path, cxx: str) -> list[str]:
    """The compiler's command line: torch's headers and libraries from the installed package itself (what
    torch.utils.cpp_extension would give, without its need of setuptools)."""
    root = Path(torch.__file__).resolve().parent
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    return [cxx, *FLAGS, abi, f"-I{root / 'include'}", f"-I{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
            str(source), "-o", str(out), f"-L{root / 'lib'}", "-lc10", "-ltorch_cpu"]


def library(name: str, cxx: str) -> Path:
    """Where the build of zoo/kernels/<name>.cpp with this compiler, torch and CPU lives in the cache."""
    source = SOURCES / f"{name}.cpp"
    version = subprocess.run([cxx, "--version"], capture_output=True, timeout=30).stdout
    stamp = repr((FLAGS, torch.__version__, sorted(cpu_flags()))).encode()
    return cache_dir() / f"{name}-{hashlib.sha256(source.read_bytes() + version + stamp).hexdigest()[:16]}.so"


def is_built(name: str) -> bool:
    """Whether zoo/kernels/<name>.cpp is in the cache for this machine (loaded or not); nothing is built."""
    cxx = compiler()
    try:
        return cxx is not None and library(name, cxx).is_file()
    except (OSError, subprocess.SubprocessError):
        return False


def _say(line: str) -> None:
    print(f"zoo: {line}", file=sys.stderr, flush=True)


@cache
def load(name: str) -> bool:
    """Whether torch.ops now has the ops of zoo/kernels/<name>.cpp, built first where the cache lacks them
    (see the module's docstring)."""
    cxx = compiler()
    if not cxx:
        _say(f"{name}.cpp not built: no C++ compiler (c++ or $CXX); the formula runs instead")
        return False
    try:
        lib = library(name, cxx)
        if not lib.is_file():
            _say(f"building {name}.cpp for this machine into {lib.parent} (once, about 15 s)")
            lib.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:  # concurrent builds each rename a whole file
                built = Path(tmp) / lib.name
                done = subprocess.run(build_command(SOURCES / f"{name}.cpp", built, cxx), capture_output=True,
                                      text=True, timeout=600)
                if done.returncode != 0:
                    log = lib.with_suffix(".log")
                    log.write_text(done.stderr)
                    said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:200]
                    _say(f"{name}.cpp did not build ({said}; the whole log: {log}); the formula runs instead")
                    return False
                os.replace(built, lib)
        torch.ops.load_library(str(lib))
        return True
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        _say(f"{name}.cpp could not be built or loaded ({first_line(e)}); the formula runs instead")
        return False
