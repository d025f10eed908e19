"""Where the configs are: the clone's conf/ (what `python train.py` reads, edits included), else the copy an
installed wheel carries as the package zoo.conf. Every command composes from config_dir()."""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from pathlib import Path

from zoo.component import ConfigError

CONFIG_PACKAGE = "zoo.conf"  # conf/ inside an installed wheel (setup.py maps it)


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
    try:
        packaged = Path(str(files(CONFIG_PACKAGE)))
    except ModuleNotFoundError:
        packaged = None
    if packaged is None or not (packaged / "config.yaml").is_file():
        raise ConfigError(f"no configs: neither a conf/ beside '{Path(__file__).resolve().parents[1]}' (a clone) "
                          f"nor the package {CONFIG_PACKAGE} (an installed wheel); reinstall zoo")
    return packaged
