"""zoo as a user installs it: the wheel, in a fresh virtual environment, used from an empty directory.

The wheel is built from a copy of the sources (setuptools writes build/ and *.egg-info beside them), installed
with --no-deps into a venv that reuses this interpreter's packages (torch, Lightning, Hydra: nothing is
downloaded), and every command runs with no PYTHONPATH, from a directory holding nothing of the clone: the
configs must come from the wheel (pkg://zoo.conf), not from a conf/ nearby.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from zoo.registry import FFN

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "conf", "zoo", "hydra_plugins")
TIMEOUT = 900  # a busy machine: each command imports torch and Lightning

pytestmark = pytest.mark.slow  # builds, installs, trains a run and a two-job sweep: minutes on two cores


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv with zoo's wheel in it; its bin/ directory."""
    tmp = tmp_path_factory.mktemp("wheel")
    src, dist, env = tmp / "src", tmp / "dist", tmp / "venv"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    # --no-build-isolation: build with the setuptools installed here instead of downloading one
    _pip("wheel", str(src), "--no-deps", "--no-build-isolation", "-w", str(dist))
    venv.create(env, system_site_packages=True)  # torch and the rest from this interpreter's site-packages
    wheels = list(dist.glob("zoo-*.whl"))
    assert len(wheels) == 1, wheels
    # --ignore-installed: the system's zoo (an editable install) is seen from the venv; pip would call the wheel
    # already installed, and must neither skip it nor touch that one
    _pip("--python", str(env / "bin" / "python"), "install", "--no-deps", "--ignore-installed", str(wheels[0]))
    return env / "bin"


def _pip(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, f"pip {' '.join(args)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def empty(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("empty")


def _env(bin_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "ZOO_COMMAND")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1", VIRTUAL_ENV=str(bin_dir.parent))
    return {**env, **extra}


def _zoo(bin_dir: Path, cwd: Path, *args: str, code: int = 0, **env: str) -> subprocess.CompletedProcess:
    """`zoo <args>` as the venv's console script, with none of the clone on the path."""
    proc = subprocess.run([str(bin_dir / args[0]), *args[1:]], cwd=cwd, env=_env(bin_dir, **env),
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == code, f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n" \
                                    f"{proc.stderr[-3000:]}"
    return proc


def test_the_venv_imports_its_own_zoo_and_configs(installed, empty):
    code = ("import json, zoo, hydra_plugins.zoo_launcher.parallel_launcher as launcher\n"
            "from zoo.commands import config_dir, config_search_path\n"
            "print(json.dumps([zoo.__file__, launcher.__file__, str(config_dir()), config_search_path()]))")
    out = _zoo(installed, empty, "python", "-c", code).stdout
    package, launcher, conf, search = json.loads(out)
    venv_dir = str(installed.parent)
    # the editable install in the system site-packages must not win over the venv's wheel
    assert package.startswith(venv_dir) and launcher.startswith(venv_dir), (package, launcher)
    assert conf == str(Path(package).parent / "conf") and search == "pkg://zoo.conf"


def test_zoo_help_lists_the_commands(installed, empty):
    out = _zoo(installed, empty, "zoo", "--help").stdout
    for name in ("train", "sample", "eval", "inspect", "prepare", "report", "bench"):
        assert f"\n  {name} " in out, out


def test_a_bad_override_is_one_line(installed, empty):
    proc = _zoo(installed, empty, "zoo", "train", "ffn=nope", code=2)
    # the ffn group: its presets in conf/ (the wheel's is this one) and every registered FFN (a generated node)
    valid = ", ".join(sorted({p.stem for p in (ROOT / "conf" / "ffn").glob("*.yaml")} | set(FFN.names())))
    assert proc.stderr.splitlines() == [f"error: ffn: unknown option 'nope'; valid: {valid}"]


def test_train_then_sample_eval_report(installed, empty):
    """The first hour, from the wheel: a debug run (with its checkpoint), then the tools on that run."""
    _zoo(installed, empty, "zoo", "train", "debug=fast", "trainer.enable_checkpointing=true")
    runs = list(empty.glob("outputs/debug/*/*"))
    assert len(runs) == 1, runs
    run = runs[0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed", summary
    hydra = (run / ".hydra" / "hydra.yaml").read_text()
    assert "path: zoo.conf\n      schema: pkg\n      provider: main" in hydra  # read through pkg://zoo.conf

    ckpt = str(run / "checkpoints" / "best.ckpt")
    sample = _zoo(installed, empty, "zoo", "sample", ckpt, "--prompt", "ROMEO:", "--max-new-tokens", "20").stdout
    assert sample.startswith("ROMEO:") and "-" * 40 in sample, sample
    result = json.loads(_zoo(installed, empty, "zoo", "eval", ckpt, "--max-windows", "4", "--json").stdout)
    assert result["windows"] == 4 and result["loss"] > 0, result
    report = _zoo(installed, empty, "zoo", "report", str(run)).stdout
    assert "1 finished" in report and (run / "report.md").is_file(), report


def test_a_parallel_sweep_finds_zoos_launcher(installed, empty):
    """-m with hydra/launcher=parallel: Hydra finds the launcher among the wheel's hydra_plugins."""
    _zoo(installed, empty, "zoo", "train", "-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2", "threads=1",
         "debug=fast", "seed=0,1", "hydra.sweep.dir=sweep")
    plan = (empty / "sweep" / "multirun.yaml").read_text()
    assert "_target_: hydra_plugins.zoo_launcher.parallel_launcher.ParallelLauncher" in plan
    statuses = [json.loads((empty / "sweep" / job / "summary.json").read_text())["status"] for job in ("0", "1")]
    assert statuses == ["completed", "completed"]
    report = _zoo(installed, empty, "zoo", "report", "sweep").stdout
    assert "2 finished" in report, report


def test_inspect_composes_from_the_wheel(installed, empty):
    out = _zoo(installed, empty, "zoo", "inspect", "ffn=swiglu").stdout
    assert out.startswith("decoder_only: d_model 128, 4 layers") and "swiglu FFN" in out, out


def test_prepare_a_text_file(installed, empty, tmp_path):
    text = tmp_path / "plays.txt"
    text.write_text("".join(f"Scene {i}. Enter the players, and speak the speech {i} times.\n\n" for i in range(200)))
    out = _zoo(installed, empty, "zoo", "prepare", str(text), "--out", str(tmp_path / "plays.tokens"),
               "--sample-by", "paragraph", "--quiet").stdout
    assert out.startswith(f"prepared {tmp_path / 'plays.tokens'}: ") and \
        f"train on it: zoo train data=tokens data.path={tmp_path / 'plays.tokens'}" in out, out
    assert (tmp_path / "plays.tokens" / "manifest.json").is_file()


def test_bench_trains_with_zoo_train(installed, empty):
    """A benchmark section that trains runs the wheel's `zoo train` (python -m zoo train): there is no train.py."""
    out = _zoo(installed, empty, "zoo", "bench", "--only", "overhead", "--quick", "--out", "-").stdout
    assert "## train.py overhead (" in out and "failed" not in out, out
    assert "`zoo train experiment=nanogpt_cpu trainer.max_steps=20 trainer.precision=32-true`" in out, out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith(("| zoo train |", "| bare "))]
    assert len(rows) == 2 and all(float(row[1]) > 0 for row in rows), out  # tokens/s of both runs


# ----------------------------------------------------------------------------------------------
# The README's first hour, from the wheel in an empty directory: each step and each hint run as zoo prints it

TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "data.context=32", "data.batch_size=8",
        "data.eval_batches=2", "sample.max_new_tokens=20"]


def _printed(out: str, prefix: str) -> list[str]:
    """The command on the line zoo printed after `prefix`, split as a shell would."""
    [line] = [ln for ln in out.splitlines() if ln.startswith(prefix)]
    return shlex.split(line.removeprefix(prefix))


def test_a_stopped_run_resumes_with_the_command_it_printed(installed, tmp_path):
    """Ctrl-C once the first checkpoint is written; the run's `resume with:` line is `zoo train ...` (no train.py
    here), and running it as printed finishes the run."""
    run = tmp_path / "run"
    args = ["train", *TINY, "trainer.max_steps=300", "trainer.val_check_interval=10", f"hydra.run.dir={run}"]
    proc = subprocess.Popen([str(installed / "zoo"), *args], cwd=tmp_path, env=_env(installed),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + TIMEOUT
    while not (run / "checkpoints" / "last.ckpt").is_file() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    command = _printed(out, "resume with: ")
    assert command[:2] == ["zoo", "train"] and "ckpt_path=last" in command, command
    _zoo(installed, tmp_path, *command)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 300, summary


def test_a_sweep_one_job_after_another_ends_with_its_report_command(installed, tmp_path):
    out = _zoo(installed, tmp_path, "zoo", "train", "-m", "debug=fast", "seed=0,1", "hydra.sweep.dir=sweep").stdout
    lines = out.strip().splitlines()
    assert lines[-2] == "sweep: 2 runs in sweep (2 completed)" and "--- sample" not in out, out
    command = _printed(lines[-1], "compare them: ")
    assert command == ["zoo", "report", "sweep"]
    assert "2 finished" in _zoo(installed, tmp_path, *command).stdout


def test_prepare_one_text_file_then_train_on_it_as_printed(installed, tmp_path):
    """The obvious first call, one file and no flags: its last 10% is validation; then the printed command trains."""
    text = tmp_path / "input.txt"
    text.write_text("".join(f"Scene {i}. Enter the players, and speak the speech {i} times.\n" for i in range(400)))
    out = _zoo(installed, tmp_path, "zoo", "prepare", "input.txt", "--out", "input.tokens", "--quiet").stdout
    command = _printed(out, "train on it: ")
    assert command == ["zoo", "train", "data=tokens", "data.path=input.tokens"], out
    _zoo(installed, tmp_path, *command, "debug=fast", "data.context=32", "hydra.run.dir=on_input")
    assert json.loads((tmp_path / "on_input" / "summary.json").read_text())["status"] == "completed"


def test_a_missing_extra_names_the_wheels_install_command(installed, tmp_path):
    """logger=mlflow where mlflow cannot be imported (blocked here by a sitecustomize): one line, exit 2, before a
    run directory exists. (Running the printed pip command would need the network.)"""
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['mlflow'] = None\n")
    work = tmp_path / "work"
    work.mkdir()
    proc = _zoo(installed, work, "zoo", "train", "logger=mlflow", code=2, PYTHONPATH=str(blocker))
    assert proc.stderr.splitlines() == ['error: logger=mlflow needs the \'mlflow\' package: pip install "zoo[mlflow]"']
    assert list(work.iterdir()) == []
