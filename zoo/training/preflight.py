"""The pre-flight's one composition: the config `python train.py <args>` runs, composed before torch loads through one
function, `compose`, once per command (once per choice of a swept group), and handed to every check: the keys, their
types, data.path and the extras (zoo.training.cli), the classes a config may name (zoo.training.safety).

What is composed: the primary config with the command line's group choices (`ffn=swiglu`, the first value of a swept
group) and its Hydra overrides (`hydra.*`, `hydra/launcher=...`): the defaults the key and type checks compare each
`key=value` against, and Hydra's own section, which the allow-list checks. The command line's other values are not
composed in: a misspelled key would fail the composition that names it (the checks say which key, with the closest
valid one), and each value is checked on its own (its type against the composed node, a `_target_` it carries
against the allow-list).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hydra import version
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_automatic_config_search_path, get_args_parser
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, open_dict, read_write

from zoo.config.schema import register

# A value with one of these is a sweep function or an interpolation (choice(...), glob(*), ${...}): the sweeper
# expands it, nothing here composes it
_FUNCTION = "()[]{}*$"


def compose(hydra: Hydra, name: str, overrides: list[str]) -> DictConfig:
    """The one composition of the pre-flight: config `name` with these overrides, Hydra's section included, as Hydra
    composes a multirun's master config (a sweep's values left to the sweeper)."""
    return hydra.compose_config(name, overrides, run_mode=RunMode.MULTIRUN, with_log_configuration=False,
                                from_shell=True, validate_sweep_overrides=False)


@dataclass
class Composition:
    """The configs a command runs: one per choice of its swept groups (the first choices, then each other choice of
    each swept group in turn), each with Hydra's section; `primary`: the same without it, as the task sees them."""

    hydra: Hydra  # composes a choice that only the config sweeps (hydra.sweeper.params, zoo.training.safety)
    name: str
    variants: list[list[str]]  # each config's overrides: the Hydra overrides and one choice of each group
    configs: list[DictConfig]
    complete: bool = True  # False: composed without the command line's Hydra overrides, which do not compose
    _primary: list[DictConfig] | None = field(default=None, repr=False)

    @property
    def primary(self) -> list[DictConfig]:
        if self._primary is None:
            self._primary = [_without_hydra(c) for c in self.configs]
        return self._primary

    def is_group(self, key: str) -> bool:
        """Whether Hydra reads `key=...` as a choice of a config group (a folder of conf/, or zoo's registered ones)."""
        loader = self.hydra.config_loader
        assert isinstance(loader, ConfigLoaderImpl)  # Hydra's only loader
        return loader.repository.group_exists(key)

    def choice(self, key: str, value: str) -> DictConfig:
        """The first config with another choice of one group (`key`: the group, `+` or `~` in front as given): a
        variant already composed, else composed now."""
        group = key.lstrip("+~")
        overrides = [o for o in self.variants[0] if o.lstrip("+~").partition("=")[0] != group] + [f"{key}={value}"]
        for config, variant in zip(self.configs, self.variants, strict=True):
            if sorted(variant) == sorted(overrides):
                return config
        return compose(self.hydra, self.name, overrides)


@dataclass(frozen=True)
class Failed:
    """A command line whose config does not compose: Hydra's error, which the checks turn into one line or leave to
    Hydra to report."""

    error: Exception


# What the checks take: the command's composition, made on first use (a check that fails before it, a plugin that
# does not import or an extra that is missing, composes nothing) and kept for the next check
Composed = Callable[[], "Composition | Failed | None"]


def _without_hydra(cfg: DictConfig) -> DictConfig:
    primary = copy.deepcopy(cfg)
    with read_write(primary), open_dict(primary):
        del primary["hydra"]
    return primary


def hydra_args(argv: list[str]) -> argparse.Namespace:
    """argv as Hydra's own parser reads it, printing nothing: SystemExit where it cannot (Hydra prints that usage
    error itself when it runs, after the checks that need no parse, such as the output directory's, have answered)."""
    with contextlib.redirect_stderr(io.StringIO()):
        return get_args_parser().parse_args(argv)


def compose_command(argv: list[str], app_file: str, config_path: str, config_name: str = "config") \
        -> Composition | Failed | None:
    """The configs `python <app_file> <argv>` would run (Composition), Failed when they do not compose, None when the
    command names a config folder that is not one (Hydra says so) or its overrides do not parse (Hydra reports
    them). Reads argv as Hydra does: --config-dir, --config-path, --config-name."""
    try:
        args = hydra_args(argv)
        parsed = OverridesParser.create().parse_overrides(list(args.overrides))
    except (SystemExit, HydraException):  # a usage error or a bad override: Hydra reports them
        return None
    search_path = create_automatic_config_search_path(str(Path(app_file).resolve()), None,
                                                      args.config_path or config_path)
    if args.config_dir is not None:
        if not Path(args.config_dir).is_dir():
            return None
        search_path.prepend(provider="command-line", path=f"file://{Path(args.config_dir).resolve()}",
                            anchor=SearchPathQuery(provider="schema"))
    name = args.config_name or config_name
    register()  # the components' generated presets (zoo.config.schema), before Hydra reads the config store
    version.setbase("1.3")  # what train.py's run sets (zoo.cli.train.run_hydra): the same defaults, the same config
    GlobalHydra.instance().clear()
    try:
        hydra = Hydra.create_main_hydra2(task_name=Path(app_file).stem, config_search_path=search_path)
        composition = Composition(hydra, name, [], [])
        own = [line for o, line in zip(parsed, args.overrides, strict=True)
               if o.is_hydra_override() and not o.is_sweep_override()]
        groups: dict[str, list[str]] = {}
        for o, line in zip(parsed, args.overrides, strict=True):
            key, _, value = line.partition("=")
            if not o.is_hydra_override() and composition.is_group(o.key_or_group) and \
                    not any(c in value for c in _FUNCTION):
                groups[key] = value.split(",")
        first = {k: v[0] for k, v in groups.items()}
        choices = [first] + [{**first, k: c} for k, v in groups.items() for c in v[1:]]
        variants = [own + [f"{k}={v}" for k, v in choice.items()] for choice in choices]
        try:
            composition.configs = [compose(hydra, name, v) for v in variants]
        except Exception:  # Hydra's and OmegaConf's errors span many types (an assertion among them)
            if not own:
                raise
            # A Hydra override that does not compose (hydra/launcher=nope) is Hydra's to report, and the allow-list
            # then checks nothing (complete: False); the key and type checks still read the config without it:
            # the one command that composes twice.
            variants = [[o for o in v if o not in own] for v in variants]
            composition.configs = [compose(hydra, name, v) for v in variants]
            composition.complete = False
        composition.variants = variants
        return composition
    except Exception as e:  # Hydra's and OmegaConf's errors span many types: each check decides what to say
        return Failed(e)
    finally:
        GlobalHydra.instance().clear()
