"""What zoo's command-line tools share: exit codes, a parser whose mistakes are one line, where the configs are, and
a config composed as train.py composes it. Nothing here imports torch: `zoo --help` and a tool's usage errors
answer at once."""

from __future__ import annotations

import argparse
import os
import sys
from functools import cache
from pathlib import Path

from zoo.component import ConfigError  # no torch
from zoo.io import first_line

EXIT_OK, EXIT_ERROR = 0, 2
# Each job's exit code, of the sweep this process launched: train.py's task adds its own; zoo's parallel launcher
# adds those its job processes send back. main reads them to exit 2 when every job was refused.
JOB_CODES: list[int] = []
CONFIG_PACKAGE = "zoo.conf"  # conf/ inside an installed wheel (setup.py maps it)

_command: str | None = None  # what the user typed to start the tool (`zoo sample`, `python train.py`): run_as
# ... also in the environment, for the processes a run starts (a parallel sweep's jobs print resume lines too)
COMMAND_ENV = "ZOO_COMMAND"


def run_as(command: str) -> None:
    """Name the running tool after the command that started it (`zoo sample`): its usage and error lines say so,
    and so does every hint it prints (command())."""
    global _command
    _command = command
    os.environ[COMMAND_ENV] = command


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (`error: <what>; see --help`) and exit code 2. Its name is how
    the user runs the tool (command(tool)): `python -m zoo.sample` in a clone, `zoo sample` through `zoo`."""

    REQUIRED = "the following arguments are required: "

    def __init__(self, tool: str | None = None, **kwargs):
        # prog given: a subcommand's parser (argparse makes those), or a tool `zoo` has no subcommand for
        if tool is not None:
            kwargs.setdefault("prog", command(tool))
        super().__init__(**kwargs)

    def error(self, message: str):
        if message.startswith(self.REQUIRED):  # argparse also names positionals that may be left out (nargs *)
            optional = {a.dest for a in self._actions if a.nargs in ("*", "?")}
            message = self.REQUIRED + ", ".join(n for n in message[len(self.REQUIRED):].split(", ")
                                                if n not in optional)
        print(f"error: {message}; see {self.prog} --help", file=sys.stderr)
        sys.exit(EXIT_ERROR)


# ----------------------------------------------------------------------------------------------
# Where the configs are
# ----------------------------------------------------------------------------------------------

def clone_config_dir() -> Path | None:
    """The clone's conf/, beside the zoo package with train.py (what `python train.py` reads, edits included), or
    None when zoo is installed from a wheel."""
    root = Path(__file__).resolve().parents[2]
    return root / "conf" if (root / "conf" / "config.yaml").is_file() and (root / "train.py").is_file() else None


@cache
def config_dir() -> Path:
    """The folder every command composes its config from: the clone's conf/ when there is one, else the copy the
    wheel carries as the package zoo.conf."""
    if (clone := clone_config_dir()) is not None:
        return clone
    from importlib.resources import files

    try:
        packaged = Path(str(files(CONFIG_PACKAGE)))
    except ModuleNotFoundError:
        packaged = None
    if packaged is None or not (packaged / "config.yaml").is_file():
        raise ConfigError(f"no configs: neither a conf/ beside '{Path(__file__).resolve().parents[1]}' (a clone) "
                          f"nor the package {CONFIG_PACKAGE} (an installed wheel); reinstall zoo")
    return packaged


def command(tool: str, *, as_installed: bool = False) -> str:
    """How the user in front of this install runs `tool` (train, sample, eval, prepare, report, ...): the one
    source of every command zoo prints in a hint or a usage line. Started through `zoo` (`zoo train`), it is `zoo
    <tool>`; started with Python (`python train.py`, `python -m zoo.sample`) in a clone, the clone's documented
    commands, `python train.py` and `python -m zoo.<tool>`; from a wheel, which has no train.py, `zoo <tool>`.
    as_installed: the install's documented way whatever started this process (what the benchmark's tables name)."""
    started = None if as_installed else _command or os.environ.get(COMMAND_ENV)
    if clone_config_dir() is None or (started is not None and started.startswith("zoo ")):
        return f"zoo {tool}"
    return "python train.py" if tool == "train" else f"python -m zoo.{tool}"


def train_command() -> str:
    """The install's training command, as the benchmark's tables name it: `python train.py` in a clone, `zoo
    train` from a wheel."""
    return command("train", as_installed=True)


def pip_install(extra: str) -> str:
    """The command that adds one of zoo's extras (mlflow, hf, ...) to this install: `pip install -e ".[mlflow]"`
    in a clone (its root named unless it is the working directory), `pip install "zoo[mlflow]"` for a wheel."""
    if (conf := clone_config_dir()) is None:
        return f'pip install "zoo[{extra}]"'
    root = conf.parent
    where = "." if Path.cwd().resolve() == root else str(root)
    return f'pip install -e "{where}[{extra}]"'


def missing_module(name: str) -> bool:
    """Whether the package `name` cannot be imported, found without importing it (no torch, no seconds): an
    extra checked before a run starts."""
    from importlib.util import find_spec

    if name in sys.modules:  # None there: an import that is blocked
        return sys.modules[name] is None
    try:
        return find_spec(name) is None
    except (ImportError, ValueError):
        return True


def needs(package: str, extra: str, what: str) -> str:
    """The one line for a missing extra: `<what> needs the 'mlflow' package: pip install ...`."""
    return f"{what} needs the '{package}' package: {pip_install(extra)}"


def config_search_path() -> str:
    """Hydra's name for config_dir(): the clone's folder, or pkg://zoo.conf for the wheel's copy (a run's
    .hydra/hydra.yaml then names the package, not a path inside one environment)."""
    return str(config_dir()) if clone_config_dir() is not None else f"pkg://{CONFIG_PACKAGE}"


# ----------------------------------------------------------------------------------------------
# A config, composed as train.py would
# ----------------------------------------------------------------------------------------------

def compose(overrides: list[str]) -> dict:
    """The config train.py would see for these overrides, as a plain dict (no hydra node); ConfigError in one
    line for an override that does not compose."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from zoo.training.cli import check_group_choices, expand

    conf = config_dir()
    overrides = [expand(o) for o in overrides]
    if any("," in o.partition("=")[2] and (conf / o.partition("=")[0]).is_dir() for o in overrides):
        raise ConfigError("overrides: a sweep (a,b) is several configs; give one choice")
    if error := check_group_choices(overrides, conf):
        raise ConfigError(error)
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3", job_name="zoo"):
            cfg = hydra_compose("config", overrides=overrides)
        plain = OmegaConf.to_container(cfg, resolve=True)
    except Exception as e:  # hydra and omegaconf errors span many lines and types: keep the first line
        from zoo.schema import one_line

        if typed := one_line(e):  # a wrongly typed value: its key, the value and the type
            raise ConfigError(typed) from None
        raise ConfigError(f"overrides: {first_line(e)}") from None
    assert isinstance(plain, dict)  # config.yaml is a mapping
    return plain
