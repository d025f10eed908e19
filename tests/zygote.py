"""Run `python train.py ...` as a test's subprocess would, without paying for its imports each time.

Most of a shrunk run's time is spent importing lightning, torch and the libraries they bring (docs/benchmarks.md,
"What the suite's work is"), and the suite runs a few hundred of them. A warm interpreter (up to three per pytest
process) imports zoo's training stack once; each command is then a fork of it that runs the script as `__main__`
with the command's argv, working directory, environment, standard streams and import path, and exits with its exit
code after its exit handlers, as the fresh interpreter would. What differs is only what was imported before the
script began, so a test about imports (train.py's torch-free pre-flight, tests/test_preflight.py) runs a fresh
interpreter.

`run` takes subprocess.run's arguments. It forks `python <script>.py ...` and `python -m zoo...` run with
capture_output=True and text=True, and hands anything else to subprocess.run: another program, other arguments
(standard input, bytes, `-X importtime`), or every command when ZOO_FRESH_INTERPRETER=1 (the suite as it ran before,
each command in a new interpreter). An environment that differs from a warm interpreter's in a variable a module may
read when it is imported (OMP_NUM_THREADS, HF_HOME) gets a warm interpreter of its own; PYTHONPATH with the
checkout or without it is served by one (zoo comes from the checkout either way), each command with its own path.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zoo.net import library_settings

ROOT = Path(__file__).resolve().parents[1]
# What `python train.py` imports before it trains (the sweep launcher's fork server preloads the same).
PRELOAD = ["zoo.cli.train", "zoo.training.runner"]
# Variables read when a run reads them, not when a module is imported: a command may set them, and so may the
# tests that train in pytest's own process (Lightning's seed, torch's CUDA and inductor settings, W&B's service,
# pytest's test name).
RUNTIME_ENV = {"WANDB_MODE", "WANDB_SILENT", "WANDB_DIR", "WANDB_SERVICE", "HYDRA_FULL_ERROR", "ZOO_PLUGINS", "PATH",
               "ZOO_CACHE", "ZOO_NET_TIMEOUT_S", "PYTEST_CURRENT_TEST", "PL_GLOBAL_SEED", "PL_SEED_WORKERS",
               "CUBLAS_WORKSPACE_CONFIG", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",
               # the network bound zoo.net gives MLflow and W&B (read at each request; the hub's, at its import)
               *(k for k in library_settings(1.0) if not k.startswith("HF_HUB_"))}


def _pythonpath() -> list[str]:
    """PYTHONPATH's entries as a new interpreter puts them on sys.path: absolute (against the working directory)."""
    return [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


SERVED_PYTHONPATH: list[str] = []  # the warm interpreter's own PYTHONPATH entries (serve)


def _beyond_root(env: dict[str, str]) -> list[str]:
    """PYTHONPATH's entries but the checkout's root: zoo is imported from there with it or without it, so a warm
    interpreter serves either (each command gets its own import path: _child)."""
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) != str(ROOT)]


def _child(request: dict) -> int:
    """In the fork: become the command's process, run its script or module as `__main__`, return its exit code."""
    import random
    import runpy

    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_CREAT),
                            (2, request["stderr"], os.O_WRONLY | os.O_CREAT)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)  # only 0, 1 and 2 open, as in a new interpreter
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    random.seed()  # a fresh interpreter's `random` is seeded from the OS, not inherited
    args = request["argv"][1:]
    module = args[1] if args[0] == "-m" else None
    sys.argv = [module or args[0], *args[2 if module else 1:]]
    # sys.path[0]: the script's directory (links resolved, as python does), or the working directory for -m
    sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.realpath(args[0]))
    # the command's PYTHONPATH in place of the warm interpreter's: after sys.path[0], before the rest, once each
    ours = _pythonpath()
    sys.path[1:] = [*dict.fromkeys(ours), *(p for p in sys.path[1:] if p not in SERVED_PYTHONPATH and p not in ours)]
    code: int = 0
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            _run_script(args[0])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException as e:  # an uncaught exception: its traceback on stderr, exit code 1
        sys.excepthook(type(e), e, e.__traceback__)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return code


def _run_script(path: str) -> None:
    """Run a script as `python <path>` does (runpy.run_path does not): `__main__` is a module of sys.modules whose
    `__file__` is absolute (multiprocessing's fork server finds the script by it), sys.argv[0] as it was typed."""
    import builtins
    import importlib.machinery
    import types

    file = os.path.join(os.getcwd(), path)  # as python makes it: absolute, not normalized (`work/../train.py`)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=file, __builtins__=builtins, __spec__=None, __cached__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", file))
    sys.modules["__main__"] = main
    exec(compile(Path(file).read_bytes(), file, "exec"), main.__dict__)


def serve() -> None:
    """The warm interpreter: read one JSON request a line from stdin, fork it, answer its pid, then its exit code."""
    import importlib

    SERVED_PYTHONPATH[:] = _pythonpath()
    for name in PRELOAD:
        importlib.import_module(name)
    gc.collect()  # as train.py's resume_gc does once loaded: each fork's collections then skip what was imported,
    gc.freeze()  # and leave its memory pages shared instead of copying them
    out = sys.stdout
    out.write(json.dumps({"environ": dict(os.environ)}) + "\n")  # with what the imports set themselves
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        out.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(request)
            except BaseException as e:  # zygote's own failure, not the command's: say it where the test reads
                sys.excepthook(type(e), e, e.__traceback__)
                sys.stderr.flush()
            finally:
                os._exit(code)
        out.write(json.dumps({"pid": pid}) + "\n")
        out.flush()
        _, status = os.waitpid(pid, 0)
        out.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        out.flush()


class _Server:
    def __init__(self, env: dict[str, str]):
        self.env = env
        self.proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                                      "import zygote; del sys.path[0]; zygote.serve()", str(Path(__file__).parent)],
                                     cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.imported_env: dict[str, str] = self.answer(None)["environ"]

    def serves(self, env: dict[str, str]) -> bool:
        """Whether `env` is this interpreter's environment as far as its imports could have read it: equal but for
        RUNTIME_ENV and what those imports set themselves (the same in a new interpreter that imports them)."""
        return all(k in RUNTIME_ENV or env.get(k) == self.env.get(k) or env.get(k) == self.imported_env.get(k) or
                   (k == "PYTHONPATH" and _beyond_root(env) == _beyond_root(self.env))
                   for k in env.keys() | self.env.keys())

    def answer(self, deadline: float | None) -> dict:
        assert self.proc.stdout is not None
        if deadline is not None:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the warm interpreter exited {self.proc.wait()}")
        return json.loads(line)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


_servers: list[_Server] = []  # the most recently used last
MAX_SERVERS = 3  # each holds the training stack in memory (0.5 GB): the docs' environment, the tests', one more


def _server_for(env: dict[str, str]) -> _Server:
    """A warm interpreter that serves `env`: one already started, or a new one in place of the least recently used
    (a test's own environment, or one that tests training in pytest's process changed)."""
    server = next((s for s in _servers if s.serves(env)), None)
    if server is None:
        if len(_servers) >= MAX_SERVERS:
            _servers.pop(0).close()
        server = _Server(env)
    else:
        _servers.remove(server)
    _servers.append(server)
    return server


def _warm(argv: list[str]) -> bool:
    if not argv or argv[0] not in ("python", sys.executable) or len(argv) < 2:
        return False
    if argv[1] == "-m":
        return len(argv) > 2 and argv[2].split(".")[0] == "zoo"
    return argv[1].endswith(".py") and not argv[1].startswith("-")


def run(argv: list[str], *, cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None,
        timeout: float | None = None, check: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(argv, cwd=..., env=..., timeout=..., check=..., **kwargs), in a fork of a warm interpreter
    where that gives the same run (the module's docstring): with capture_output=True and text=True."""
    env = dict(os.environ if env is None else env)
    warm = kwargs == {"capture_output": True, "text": True} and _warm(argv)
    server = _server_for(env) if warm and os.environ.get("ZOO_FRESH_INTERPRETER") != "1" else None
    if server is None:
        return subprocess.run([sys.executable if argv[0] == "python" else argv[0], *argv[1:]], cwd=cwd, env=env,
                              timeout=timeout, check=check, **kwargs)
    with tempfile.TemporaryDirectory() as tmp:
        streams = {name: os.path.join(tmp, name) for name in ("stdout", "stderr")}
        assert server.proc.stdin is not None
        server.proc.stdin.write(json.dumps({"argv": argv, "cwd": os.path.abspath(cwd or "."), "env": env, **streams})
                                + "\n")
        server.proc.stdin.flush()
        pid = server.answer(None)["pid"]
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            returncode = server.answer(deadline)["returncode"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)  # as subprocess.run does: the process, not what it started
            server.answer(None)
            raise subprocess.TimeoutExpired(argv, timeout or 0) from None
        out, err = (Path(streams[name]).read_text() for name in ("stdout", "stderr"))
    proc = subprocess.CompletedProcess(argv, returncode, out, err)
    if check:
        proc.check_returncode()
    return proc
