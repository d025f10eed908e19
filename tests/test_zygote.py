"""tests/zygote.py: a command forked from the warm interpreter behaves as the same command in a new one."""

import os
import subprocess
import sys
import textwrap

import pytest

from tests import zygote

PROBE = textwrap.dedent("""
    import atexit, os, random, sys
    atexit.register(lambda: print("exit handler ran"))
    print("name", __name__, __file__, sys.modules["__main__"].__file__ == __file__)
    print("argv", sys.argv[1:])
    print("cwd", os.getcwd())
    print("path0", sys.path[0])
    print("env", os.environ.get("ZOO_PLUGINS"), os.environ.get("WANDB_MODE"))
    if "--stdin" in sys.argv:
        print("stdin", repr(sys.stdin.read()))
    print("to stderr", file=sys.stderr)
    if "--raise" in sys.argv:
        raise ValueError("raised by the probe")
    if "--sleep" in sys.argv:
        import time; time.sleep(60)
    sys.exit(int(sys.argv[1]))
""")


@pytest.fixture
def probe(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "work").mkdir()
    return tmp_path


def _both(argv, cwd, env, monkeypatch, **kw):
    runs = []
    for fresh in ("1", "0"):
        monkeypatch.setenv("ZOO_FRESH_INTERPRETER", fresh)
        runs.append(zygote.run(argv, cwd=cwd, env=env, capture_output=True, text=True, **kw))
    return runs


@pytest.mark.parametrize("args", [["0", "a b"], ["3"], ["0", "--raise"]], ids=["exit 0", "exit 3", "raises"])
def test_a_forked_command_gives_what_a_new_interpreter_gives(probe, monkeypatch, args):
    env = {**os.environ, "ZOO_PLUGINS": "x.py", "WANDB_MODE": "offline"}
    fresh, warm = _both(["python", str(probe / "probe.py"), *args], probe / "work", env, monkeypatch)
    assert warm.returncode == fresh.returncode == (1 if "--raise" in args else int(args[0]))
    assert warm.stdout == fresh.stdout and "exit handler ran" in warm.stdout and f"cwd {probe / 'work'}" in warm.stdout
    # a traceback names its frames' files: the fork's has runpy's and the zygote's frames above the probe's
    assert warm.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1]
    assert warm.stderr.startswith("to stderr\n") and fresh.stderr.startswith("to stderr\n")


def test_a_relative_working_directory_and_the_script_directory(probe, monkeypatch):
    monkeypatch.chdir(probe)
    fresh, warm = _both(["python", "../probe.py", "0"], "work", dict(os.environ), monkeypatch)
    assert warm.stdout == fresh.stdout and f"path0 {probe}\n" in warm.stdout


def test_a_command_over_its_timeout_is_killed_and_raises(probe, monkeypatch):
    monkeypatch.setenv("ZOO_FRESH_INTERPRETER", "0")
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run(["python", str(probe / "probe.py"), "0", "--sleep"], cwd=probe, capture_output=True, text=True,
                   timeout=2)
    after = zygote.run(["python", str(probe / "probe.py"), "4"], cwd=probe, capture_output=True, text=True)
    assert after.returncode == 4  # the warm interpreter still answers


def test_what_it_cannot_fork_runs_in_a_new_interpreter(probe, monkeypatch):
    monkeypatch.setenv("ZOO_FRESH_INTERPRETER", "0")
    given = zygote.run([sys.executable, str(probe / "probe.py"), "0", "--stdin"], cwd=probe, input="typed",
                       capture_output=True, text=True)  # standard input: subprocess.run's
    assert "stdin 'typed'" in given.stdout
    # OMP_NUM_THREADS is read when torch loads: a warm interpreter cannot change it; WANDB_MODE is read by a run
    server = zygote._server_for(dict(os.environ))
    assert not server.serves({**os.environ, "OMP_NUM_THREADS": "7"})
    assert server.serves({**os.environ, "WANDB_MODE": "disabled"})
    assert not zygote._warm(["python", "-X", "importtime", "train.py"]) and not zygote._warm(["ls"])


def test_one_warm_interpreter_serves_the_checkout_on_pythonpath_or_not_with_a_new_interpreters_path(probe,
                                                                                                  monkeypatch):
    """The docs' commands set PYTHONPATH to the checkout, the other tests do not: zoo comes from there either way, so
    one warm interpreter serves both, and each command's sys.path is the one a new interpreter makes of its own."""
    probe.joinpath("probe.py").write_text("import sys\nprint(sys.path)\n")
    monkeypatch.setattr(zygote, "_servers", [])
    root = str(zygote.ROOT)
    for pythonpath in (None, root, f"{root}{os.pathsep}{probe}", f"{probe}{os.pathsep}{root}"):
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ZOO_FRESH_INTERPRETER")}
        env.update({} if pythonpath is None else {"PYTHONPATH": pythonpath})
        fresh, warm = _both(["python", str(probe / "probe.py")], probe / "work", env, monkeypatch)
        assert warm.returncode == fresh.returncode == 0, warm.stderr
        assert warm.stdout == fresh.stdout
    assert len(zygote._servers) == 2  # no PYTHONPATH and the checkout alone: one; with another entry: its own
    for server in zygote._servers:
        server.close()
