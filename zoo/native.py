"""CPU kernels torch lacks, as torch ops in C++ (zoo/layers/<name>.cpp: rmsnorm, rope, softmax), built once per machine.

`load(name)` compiles the file against the installed torch's headers and libraries into a per-user cache
(`$ZOO_CACHE`, else `$XDG_CACHE_HOME/zoo` or `~/.cache/zoo`), named by a hash of the source, the compiler, torch's
version and this CPU's flags, and loads it into `torch.ops` (about 15 s the first time, nothing after). Where there
is no C++ compiler (`$CXX`, else `c++`), the build fails (said once, its log kept beside the cache, not retried), or
`ZOO_NATIVE=0` is set, it returns False and the caller keeps its torch formula: the same results to float rounding,
slower.
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

SOURCES = Path(__file__).resolve().parent / "layers"
# No fused multiply-adds and no fast-math: the kernels' arithmetic is then the same on every CPU, vector width
# and all (their sums are written in fixed lanes for that); -march=native is why the CPU's flags name the build.
# -fopenmp: at::parallel_for runs on torch's own OpenMP threads (the process already holds torch's libgomp).
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fopenmp", "-std=c++20", "-shared",
         "-fPIC", "-w")


def cache_dir() -> Path:
    from zoo.data.corpus import cache_dir as zoo_cache

    return zoo_cache() / "native"


def build_command(source: Path, out: Path, cxx: str) -> list[str]:
    """The compiler's command line: torch's headers and libraries from the installed package itself (what
    torch.utils.cpp_extension would give, without its need of setuptools)."""
    root = Path(torch.__file__).resolve().parent
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    return [cxx, *FLAGS, abi, f"-I{root / 'include'}", f"-I{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
            str(source), "-o", str(out), f"-L{root / 'lib'}", "-lc10", "-ltorch_cpu"]


@cache
def load(name: str) -> bool:
    """Whether torch.ops now has the ops of `zoo/layers/<name>.cpp` (see the module's docstring)."""
    cxx = os.environ.get("CXX") or shutil.which("c++")
    if os.environ.get("ZOO_NATIVE") == "0" or not cxx:
        return False
    source = SOURCES / f"{name}.cpp"
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, timeout=30).stdout
        stamp = repr((FLAGS, torch.__version__, sorted(cpu_flags()))).encode()
        lib = cache_dir() / f"{name}-{hashlib.sha256(source.read_bytes() + version + stamp).hexdigest()[:16]}.so"
        failed = lib.with_suffix(".failed")  # a build that failed once is not tried again by every process
        if failed.is_file():
            return False
        if not lib.is_file():
            # on a line of its own: a progress bar may be drawing when a model first needs the kernel
            print(f"\nzoo: building {source.name} for this machine into {lib.parent} (once, about 15 s)",
                  file=sys.stderr, flush=True)
            lib.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:  # concurrent builds each rename a whole file
                built = Path(tmp) / lib.name
                done = subprocess.run(build_command(source, built, cxx), capture_output=True, text=True, timeout=600)
                if done.returncode != 0:
                    failed.write_text(done.stderr)
                    said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:200]
                    print(f"zoo: {source.name} did not build ({said}; the whole log: {failed}); using torch ops "
                          "instead", file=sys.stderr)
                    return False
                os.replace(built, lib)
        torch.ops.load_library(str(lib))
        return True
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return False
