"""What zoo's command-line tools share: exit codes, a parser whose mistakes are one line, where the configs are, and
a config composed as train.py composes it. Nothing here imports torch: `zoo --help` and a tool's usage errors
answer at once."""

from __future__ import annotations

import argparse
import sys
from functools import cache
from pathlib import Path

from zoo.component import ConfigError  # no torch
from zoo.io import first_line

EXIT_OK, EXIT_ERROR = 0, 2
CONFIG_PACKAGE = "zoo.conf"  # conf/ inside an installed wheel (setup.py maps it)

_command: str | None = None  # what the user typed to start the tool (`zoo sample`), when zoo.cli.main started it


def run_as(command: str) -> None:
    """Name the running tool after the command that started it (`zoo sample`): its usage and error lines say so."""
    global _command
    _command = command


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (`error: <what>; see --help`) and exit code 2. Its name is the
    command that started the tool: `python -m zoo.sample`, or `zoo sample` when run through `zoo`."""

    REQUIRED = "the following arguments are required: "

    def __init__(self, prog: str, **kwargs):
        super().__init__(prog=_command or prog, **kwargs)

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


def train_command() -> str:
    """How the user in front of this install starts training, for hints: `python train.py` in a clone (the
    documented command), `zoo train` where zoo was installed from a wheel."""
    return "python train.py" if clone_config_dir() is not None else "zoo train"


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
