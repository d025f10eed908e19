"""The `zoo` command (zoo.cli): its subcommands, its help before torch loads, one-line mistakes, and `zoo train`
being train.py; where the configs come from (zoo.commands.config_dir). The installed wheel: test_wheel.py."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import zygote
from zoo import commands
from zoo.cli import COMMANDS, main
from zoo.component import ConfigError
from zoo.registry import FFN

ROOT = Path(__file__).resolve().parents[1]
VALID = "valid: train, sample, eval, inspect, prepare, report, bench"


@pytest.fixture(autouse=True)
def _plain_names(monkeypatch):
    """zoo.cli.main names the tool it starts (`zoo sample`) for the rest of the process: not past one test."""
    monkeypatch.setattr(commands, "_command", None)


def _run(*args: str) -> subprocess.CompletedProcess:
    return zygote.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_help_lists_every_command_without_importing_torch():
    code = ("import sys\nfrom zoo.cli import main\ncode = main(['--help'])\n"
            "print(code, sorted(m for m in ('torch', 'lightning', 'hydra') if m in sys.modules))")
    proc = _run("-c", code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    *help_lines, status = proc.stdout.strip().splitlines()
    assert status == "0 []"  # nothing heavy was imported to answer
    for name, (_, line) in COMMANDS.items():
        assert f"  {name}{' ' * (9 - len(name))}{line}" in help_lines, help_lines


def test_python_m_zoo_is_the_zoo_command():
    proc = _run("-m", "zoo", "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: zoo <command> [arguments]"), proc.stderr


@pytest.mark.parametrize("argv,expected", [
    (["trian"], f"error: unknown command 'trian' (did you mean train?); {VALID}"),
    (["--version"], f"error: unknown command '--version'; {VALID}"),
    ([], f"error: name a command; {VALID} (zoo --help says what each does)"),
])
def test_a_wrong_command_is_one_line_naming_the_valid_ones(argv, expected, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [expected]


def test_every_command_is_a_module_with_main():
    for name, (module, _) in COMMANDS.items():
        assert callable(importlib.import_module(module).main), name


def test_a_command_help_is_that_tools_help_under_its_zoo_name(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sample", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: zoo sample [-h] [--prompt PROMPT]") and "--max-new-tokens" in out


@pytest.mark.parametrize("argv,expected", [
    (["inspect", "--bogus"], "error: unrecognized arguments: --bogus; see zoo inspect --help"),
    (["report"], "error: the following arguments are required: dir (or several: --across DIR[:METRIC] ...); see zoo "
                  "report --help"),
    (["prepare", "x.txt"], "error: the following arguments are required: --out; see zoo prepare --help"),
    (["eval", "nope.ckpt", "--split", "val", "--max-windows"],
     "error: argument --max-windows: expected one argument; see zoo eval --help"),
])
def test_a_tools_usage_mistake_is_one_line_naming_the_command(argv, expected, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and capsys.readouterr().err.splitlines() == [expected]


def test_zoo_train_answers_as_train_py():
    """The same checks, the same one line, exit 2, for both spellings of the command."""
    args = ["ffn=nope", "trainer.max_steps=1"]
    by_file, by_zoo = _run("train.py", *args), _run("-m", "zoo", "train", *args)
    assert by_file.returncode == by_zoo.returncode == 2
    valid = ", ".join(sorted({p.stem for p in (ROOT / "conf" / "ffn").glob("*.yaml")} | set(FFN.names())))
    assert by_file.stderr == by_zoo.stderr == f"error: ffn: unknown option 'nope'; valid: {valid}\n"


def test_zoo_train_help_names_zoo_train():
    proc = _run("-m", "zoo", "train", "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("Train any zoo model from configs") and "\nffn: " in proc.stdout
    assert proc.stdout.rstrip().endswith("zoo train --hydra-help")


@pytest.mark.slow  # two processes train: about a minute on two busy cores
def test_zoo_train_ddp_ranks_run_zoo_train_again(tmp_path):
    """Lightning starts rank 1 by repeating the command line: `python -m zoo.__main__ train ...` must train too."""
    proc = _run("-m", "zoo", "train", "trainer=ddp", "model.d_model=32", "model.n_layers=1", "model.n_heads=2",
                "trainer.max_steps=4", "trainer.val_check_interval=2", "data.eval_batches=2", "data.batch_size=4",
                "data.context=16", "logger=none", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "completed" and s["tokens_seen"] == 2 * 4 * 4 * 16  # both ranks trained


def test_configs_come_from_the_clone():
    assert commands.config_dir() == ROOT / "conf"
    assert commands.config_search_path() == str(ROOT / "conf")
    assert commands.train_command() == "python train.py"


def test_no_configs_anywhere_is_one_line(monkeypatch):
    monkeypatch.setattr(commands, "clone_config_dir", lambda: None)
    monkeypatch.setattr(commands, "CONFIG_PACKAGE", "zoo.no_such_conf")
    commands.config_dir.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"^no configs: neither a conf/ beside '.*zoo' \(a clone\) nor the "
                                              r"package zoo.no_such_conf \(an installed wheel\); reinstall zoo$"):
            commands.config_dir()
    finally:
        commands.config_dir.cache_clear()


# ----------------------------------------------------------------------------------------------
# Hints that fit the install and the command (zoo.commands.command, pip_install)


@pytest.mark.parametrize("clone, started, tool, expected", [
    (True, None, "train", "python train.py"),  # a clone's documented commands
    (True, None, "sample", "python -m zoo.sample"),
    (True, "python train.py", "train", "python train.py"),
    (True, "zoo train", "train", "zoo train"),  # started through `zoo`: `zoo` in every hint
    (True, "zoo train", "report", "zoo report"),
    (False, None, "train", "zoo train"),  # a wheel has no train.py
    (False, None, "prepare", "zoo prepare"),
])
def test_every_hint_names_the_command_as_this_user_runs_it(monkeypatch, clone, started, tool, expected):
    monkeypatch.setattr(commands, "clone_config_dir", lambda: ROOT / "conf" if clone else None)
    if started:
        commands.run_as(started)
    assert commands.command(tool) == expected


def test_a_missing_extra_is_installed_as_zoo_was(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    assert commands.pip_install("mlflow") == 'pip install -e ".[mlflow]"'
    monkeypatch.chdir(tmp_path)  # elsewhere, the clone's own path
    assert commands.pip_install("hf") == f'pip install -e "{ROOT}[hf]"'
    monkeypatch.setattr(commands, "clone_config_dir", lambda: None)
    assert commands.pip_install("mlflow") == 'pip install "zoo[mlflow]"'


def test_every_flag_of_every_tool_says_what_it_does(monkeypatch):
    """Each subcommand's parser (zoo train has Hydra's, with its own help): every argument it shows has a help text
    (the benchmark's internal flags, for its own child processes, are hidden: argparse.SUPPRESS)."""
    import argparse

    class Parsed(Exception):
        pass

    def capture(self, *args, **kwargs):
        raise Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    for name, (module, _) in COMMANDS.items():
        if name == "train":
            continue
        with pytest.raises(Parsed) as parsed:
            importlib.import_module(module).main([])
        parser = parsed.value.args[0]
        silent = [a.option_strings[0] if a.option_strings else a.dest for a in parser._actions
                  if not (a.help or "").strip()]
        assert not silent, f"zoo {name}: no help for {silent}"


# Each mistake, the module that must look missing (None: nothing blocked), and the one line it gets
PREFLIGHT = {
    "logger=mlflow without mlflow": (["train", "logger=mlflow", "trainer.max_steps=2"], "mlflow",
                                     "error: logger=mlflow needs the 'mlflow' package: "
                                     "pip install -e \"{root}[mlflow]\""),
    "a sweep's wandb without wandb": (["train", "-m", "logger=csv,wandb"], "wandb",
                                      "error: logger=wandb needs the 'wandb' package: "
                                      "pip install -e \"{root}[wandb]\""),
    "init_from=hf: without transformers": (["train", "init_from=hf:gpt2"], "transformers",
                                           "error: init_from=hf:gpt2 needs the 'transformers' package: "
                                           "pip install -e \"{root}[hf]\""),
    "zoo eval nope.ckpt": (["eval", "nope.ckpt"], None, "error: checkpoint: no such file 'nope.ckpt'"),
    "zoo sample nope.ckpt": (["sample", "nope.ckpt"], None, "error: checkpoint: no such file 'nope.ckpt'"),
    "zoo sample <a directory>": (["sample", "."], None, "error: checkpoint: '.' is a directory; give a checkpoint "
                                                        "file (<run dir>/checkpoints/best.ckpt or last.ckpt)"),
    "zoo eval hf: without transformers": (["eval", "hf:gpt2"], "transformers",
                                          "error: hf:<name> needs the 'transformers' package: "
                                          "pip install -e \"{root}[hf]\""),
}


@pytest.mark.parametrize("case", [c for c, (argv, _, _) in PREFLIGHT.items() if argv[0] == "train"])
def test_a_missing_extra_is_one_line_before_torch_with_no_options_cache(case, tmp_path):
    """The first command after an install has no copy of the components' options (zoo.config.schema.option_specs
    reads them from the registries then, importing torch): an extra named on the command line is checked before
    that."""
    argv, blocked, expected = PREFLIGHT[case]
    code = (f"import sys\nfrom pathlib import Path\nsys.modules[{blocked!r}] = None  # as if not installed\n"
            "import zoo.config.schema as schema\n"
            "schema._cache_path = lambda: Path('/nonexistent/zoo-options.json')  # no copy\n"
            "from zoo.cli import main\ncode = main(sys.argv[1:])\nprint(code, 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.split() == ["2", "False"], proc.stdout + proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [expected.format(root=ROOT)]
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def warm_options():
    """The components' options are read once from the registries (importing torch) and kept in zoo/__pycache__
    (zoo.config.schema.option_specs); every later command reads that copy."""
    assert _run("-c", "from zoo.config.schema import option_specs; option_specs()").returncode == 0


@pytest.mark.parametrize("case", PREFLIGHT)
def test_a_missing_file_checkpoint_or_extra_is_one_line_before_torch(case, tmp_path, warm_options):
    """In a fresh process in an empty directory: one line, exit code 2, torch never imported, no run directory."""
    argv, blocked, expected = PREFLIGHT[case]
    code = (f"import sys\nif {blocked!r}: sys.modules[{blocked!r}] = None  # as if not installed\n"
            "from zoo.cli import main\ncode = main(sys.argv[1:])\nprint(code, 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.split() == ["2", "False"], proc.stdout + proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [expected.format(root=ROOT)]
    assert list(tmp_path.iterdir()) == []  # no outputs/, no multirun/
