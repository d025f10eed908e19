"""Command-line conveniences for train.py, applied before Hydra sees the arguments.

Everything here loads without torch or Lightning, so a typo is answered in a fraction of a second."""

from __future__ import annotations

import copy
import difflib
import os
from collections.abc import Callable, KeysView
from pathlib import Path
from typing import Any, cast

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, RangeSweep
from hydra.errors import HydraException
from omegaconf import AnyNode, BooleanNode, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from zoo.commands import command, missing_module, needs
from zoo.component import ConfigError
from zoo.config.schema import KINDS, generated_options, one_line, register
from zoo.data.corpus import DataError, check_text_file
from zoo.io import RunDirError, busy_message, check_run_dir, is_running, is_secondary_rank, owned_path
from zoo.registry import load_plugins
from zoo.training.preflight import Composed, Failed, compose_command
from zoo.training.safety import too_many_jobs

TASK_FILE = str(Path(__file__).resolve().parents[1] / "cli" / "train.py")  # the task Hydra runs: zoo.cli.train
COMPONENTS = ("attention.", "position.", "norm.", "ffn.")
# Hydra flags that take the next argument as their value (that argument is not an override).
_VALUE_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--cfg", "-c",
                "--package", "-p", "--info", "--experimental-rerun")


def expand(arg: str) -> str:
    """norm.type=rmsnorm -> model.norm.type=rmsnorm (a component's options live under model)."""
    return f"model.{arg}" if arg.startswith(COMPONENTS) and "=" in arg else arg


def overrides(args: list[str]) -> list[str]:
    """The `key=value` overrides among train.py's arguments (flags and their values left out)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg.startswith("-"):
            skip = arg in _VALUE_FLAGS
        elif "=" in arg:
            out.append(arg)
    return out


def _is_group(key: str, conf_dir: Path) -> bool:
    return "/" not in key and ((conf_dir / key).is_dir() or key in KINDS)


def _options(group: str, conf_dir: Path) -> list[str]:
    """A group's options: its preset files, and the components registered with no preset (zoo.config.schema)."""
    register()
    files = {p.stem for p in (conf_dir / group).glob("*.yaml") if not p.stem.startswith("_")}
    return sorted(files | set(generated_options(group)))


def check_plugins() -> str | None:
    """Import the modules ZOO_PLUGINS names (zoo.registry), or say in one line why one does not import."""
    try:
        load_plugins()
    except ConfigError as e:
        return str(e)
    return None


def check_group_choices(args: list[str], conf_dir: Path) -> str | None:
    """One-line error for `group=option` naming an option that does not exist, else None.

    Hydra would report it too, but over many lines; sweeps (`ffn=relu,gelu`) are checked per value."""
    for arg in overrides(args):
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or not _is_group(key, conf_dir) or value in ("", "null"):
            continue
        valid = _options(key, conf_dir)
        for choice in value.split(","):
            if choice not in valid and not any(c in choice for c in "()[]{}*$"):
                close = difflib.get_close_matches(choice, valid, n=1, cutoff=0.6)  # the catalogue's lists are long
                hint = f" (did you mean {close[0]}?)" if close else ""
                return f"{key}: unknown option '{choice}'{hint}; valid: {', '.join(valid)}"
    return None


def help_text(args: list[str], conf_dir: Path, doc: str, command: str = "python train.py") -> str | None:
    """`command` --help (python train.py, zoo train): the groups and their options, then the config the other
    arguments compose, or None when they do not compose (Hydra's own help then answers). Hydra's help takes
    seconds: it composes the whole config tree once per group to list the options; reading the conf folder is
    enough here."""
    configs, _ = _compose_all(args, conf_dir)
    if configs is None:
        return None
    options = [f"{g}: {', '.join(_options(g, conf_dir))}" for g in _groups(conf_dir)]
    return "\n".join([doc.strip(), "", "== Configuration groups (group=option) ==", *options, "",
                      "== Config (override any key: key=value) ==", OmegaConf.to_yaml(configs[0]).rstrip(), "",
                      f"Hydra's own options (-m, --cfg, --info, hydra.run.dir=...): {command} --hydra-help"])


def _groups(conf_dir: Path) -> list[str]:
    dirs = {d.name for d in conf_dir.iterdir() if d.is_dir() and d.name != "hydra" and d.name[0] != "_"}
    return sorted(dirs | set(KINDS))


def _leaves(cfg: DictConfig, prefix: str = "") -> list[str]:
    """Every key path of a composed config, parents included (`model`, `model.d_model`, ...)."""
    out = []
    for key in cast(KeysView[str], cfg.keys()):  # a composed config's keys are names (strings)
        path = f"{prefix}{key}"
        out.append(path)
        value = cfg._get_node(key)
        if isinstance(value, DictConfig) and not value._is_missing() and not value._is_none():
            out += _leaves(value, path + ".")
    return out


def _compose_all(args: list[str], conf_dir: Path, composed: Composed | None = None
                 ) -> tuple[list[DictConfig] | None, str | None]:
    """(the primary config composed for each group choice given, zoo.training.preflight.Composition.primary; None
    when composition fails), and the one-line error of a preset's wrongly typed value (zoo.config.schema.one_line),
    else None: Hydra then reports the failure itself. `composed`: the pre-flight's one composition, when it has one
    (zoo.cli.train.preflight); else these arguments are composed from conf_dir here."""
    found = composed() if composed is not None else compose_command(args, TASK_FILE, str(conf_dir))
    if isinstance(found, Failed):
        return None, one_line(found.error)
    if found is None:
        return None, None
    return found.primary, None


def check_keys(args: list[str], conf_dir: Path, composed: Composed | None = None) -> str | None:
    """One-line error for `key=value` naming a key the composed config does not have (closest valid key
    suggested), or for a required key (`???`) left unset, else None. Hydra's own report is many lines, and
    its `+key` advice for a misspelling leads to a traceback later."""
    if any(a in ("--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd") for a in args):
        return None  # another primary config: nothing here describes it
    given = []
    for arg in overrides(args):
        key = arg.partition("=")[0]
        if key.startswith(("+", "~")) or key.startswith("hydra") or _is_group(key, conf_dir) or "/" in key:
            continue  # additions and deletions are explicit; hydra.* and group/option are Hydra's own
        given.append(key)
    configs, error = _compose_all(args, conf_dir, composed)
    if configs is None:
        return error
    known = set().union(*(_leaves(c) for c in configs))
    for key in given:
        if key not in known:
            parts = key.split(".")
            bad = next(i for i in range(len(parts)) if ".".join(parts[:i + 1]) not in known)  # first wrong word
            parent = ".".join(parts[:bad])
            siblings = sorted(k for k in known if k.rpartition(".")[0] == parent and k.count(".") == bad)
            if not parent:  # a top-level word may be a misspelled group (atention=mha)
                siblings = sorted(set(siblings) | {d.name for d in conf_dir.iterdir()
                                                   if d.is_dir() and d.name != "hydra" and d.name[0] != "_"})
            words = [k.rpartition(".")[2] for k in siblings]
            close = difflib.get_close_matches(parts[bad], words, n=1, cutoff=0.6)
            hint = f" (did you mean {'.'.join(parts[:bad] + close + parts[bad + 1:])}?)" if close else ""
            where = ", ".join(siblings) if siblings else f"see {command('train')} --cfg job"
            extra = "; a Lightning Trainer argument not in conf/trainer is added with +trainer.<name>=..." \
                if parent == "trainer" else ""
            return f"{key}: unknown key{hint}; valid: {where}{extra}"
    if error := _check_types(args, configs, conf_dir) or _check_data_path(args, configs) \
            or _check_extras(args, configs):
        return error
    for cfg in configs:
        for key in sorted(OmegaConf.missing_keys(cfg)):
            if key not in given:
                return f"{key}: required, not set; valid: {key}=<value> on the command line"
    return None


def _check_types(args: list[str], configs: list[DictConfig], conf_dir: Path) -> str | None:
    """One-line error for the first `key=value` whose value (any value of a sweep, `seed=0,x`) does not fit the
    key's type in the schema (zoo.config.schema), e.g. `model.d_model: got 'abc'; valid: an integer`; else None."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides(args))
    except HydraException:
        return None  # Hydra reports an override it cannot parse
    if error := too_many_jobs(parsed, "the command line"):  # before any sweep is expanded below
        return error
    probes = [copy.deepcopy(c) for c in configs]  # each value is tried on a copy
    for o in parsed:
        key = o.key_or_group
        if o.is_delete() or o.is_add() or o.is_force_add() or o.package is not None or key.startswith("hydra.") \
                or _is_group(key, conf_dir) or "/" in key:
            continue
        if o.is_sweep_override() and not isinstance(o.value(), (ChoiceSweep, RangeSweep)):
            continue  # interval(...) and the like: the sweeper draws the values
        for value in (list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]):
            for probe in probes:
                if OmegaConf.select(probe, key, default=_ABSENT) is _ABSENT:
                    continue  # a key check_keys reports
                parent, _, last = key.rpartition(".")
                node = (OmegaConf.select(probe, parent) if parent else probe)._get_node(last)
                if isinstance(node, BooleanNode) and not isinstance(value, bool):  # OmegaConf reads 5 as true
                    return f"{key}: got {value!r}; valid: true or false"
                # trainer.* and data.* are untyped (Any): their value in the composed config says the type. A part's
                # option typed Any (a union, as attention.qk_norm's true or 'projection') its part checks.
                untyped = isinstance(node, AnyNode) and not key.startswith("model.")
                # (the cast: untyped says node is an AnyNode)
                default = cast(AnyNode, node)._value() if untyped else \
                    [] if isinstance(node, ListConfig) else _ABSENT
                if default is not _ABSENT and (valid := _untyped_mismatch(key, default, value)):
                    return f"{key}: got {value!r}; valid: {valid}"
                try:
                    OmegaConf.update(probe, key, value, merge=True)
                except OmegaConfBaseException as e:
                    if error := one_line(e):
                        return error
    return None


_ABSENT = object()

# What a config may ask for that an extra installs: (key, when it asks, the package, the extra). Found without
# importing anything, so a missing one costs a fraction of a second and leaves no run directory behind.
EXTRAS = (
    ("logger.mlflow", lambda v: v is not None, "mlflow", "mlflow"),
    ("logger.wandb", lambda v: v is not None, "wandb", "wandb"),
    ("logger.tensorboard", lambda v: v is not None, "tensorboard", "tensorboard"),
    ("init_from", lambda v: str(v).startswith("hf:"), "transformers", "hf"),
    ("data.tokenizer", lambda v: str(v).startswith("hf:"), "transformers", "hf"),
    ("data.kind", lambda v: v == "hf", "datasets", "hf"),
)


# The group choices that select an EXTRAS key: `logger=mlflow` composes logger.mlflow, `data=hf` data.kind=hf
GROUP_KEYS: dict[str, Callable[[str], tuple[str, str]]] = {"logger": lambda v: (f"logger.{v}", v),
                                                           "data": lambda v: ("data.kind", v)}


def check_extras_given(args: list[str]) -> str | None:
    """_check_extras on the command line alone, before anything composes: composing may read the components'
    options from the registries, which imports torch (zoo.config.schema.option_specs: the first command after an
    install, or after an edit)."""
    return _check_extras(args, [])


def _check_extras(args: list[str], configs: list[DictConfig]) -> str | None:
    """`logger=mlflow` without mlflow (and every other extra in EXTRAS) as one line naming the command that
    installs it here (zoo.commands.pip_install), before torch loads and before Hydra makes a run directory. The
    configs hold the group choices; a key given on the command line (each value of a sweep) replaces theirs."""
    given: dict[str, list[str]] = {}
    for arg in overrides(args):
        key, _, value = arg.lstrip("+").partition("=")
        given[key] = value.split(",")
        for v in given[key] if key in GROUP_KEYS else ():
            chosen, chosen_value = GROUP_KEYS[key](v)
            given.setdefault(chosen, []).append(chosen_value)
    for key, asks, package, extra in EXTRAS:
        values = given.get(key) or [OmegaConf.select(c, key, default=None, throw_on_missing=False) for c in configs]
        for value in values:
            if value is not None and asks(value) and missing_module(package):
                what = f"logger={key.split('.')[-1]}" if key.startswith("logger.") else f"{key}={value}"
                return needs(package, extra, what)
    return None


def _check_data_path(args: list[str], configs: list[DictConfig]) -> str | None:
    """data.path's one-line error (a missing text file, a directory that is not a prepared corpus), before
    torch loads: the run would say the same after seconds of imports. The configs hold the group choices;
    a data.path on the command line replaces theirs."""
    from zoo.data.tokens import read_manifest  # lazy: a refused key or --help answers without numpy (numpy 0.08 s)

    given = [a.partition("=")[2] for a in overrides(args) if a.partition("=")[0].lstrip("+") == "data.path"]
    for cfg in configs:
        kind = OmegaConf.select(cfg, "data.kind", default=None)
        path = given[-1] if given else OmegaConf.select(cfg, "data.path", default=None, throw_on_missing=False)
        if path in (None, "", "null", "???") or "," in str(path):  # a sweep's paths are each checked by the run
            continue
        try:
            if kind == "text":
                check_text_file(path)
            elif kind == "tokens":
                read_manifest(path)
        except DataError as e:
            return str(e)
    return None


# Untyped keys (trainer.*, data.*: Lightning's arguments and the data kinds' own) whose values may take more
# than their default's type, and those whose default, null, says nothing of their type.
_ANY_OF = {"trainer.devices": "an integer, a list of device ids, or auto"}
_NULL_DEFAULT = {"data.long_context": 0}  # an example value of the type each takes


def _untyped_mismatch(key: str, default: Any, value: Any) -> str | None:
    """What a key of the untyped sections accepts, judged by the type of its value in the composed config
    (conf/trainer/*.yaml, conf/data/*.yaml), if `value` does not fit it; else None. null is left to the run."""
    if value is None or key in _ANY_OF and isinstance(value, (int, str, list)) and not isinstance(value, bool):
        return None
    if key in _ANY_OF:
        return _ANY_OF[key]
    if default is None and key in _NULL_DEFAULT:
        valid = _untyped_mismatch(key, _NULL_DEFAULT[key], value)
        return valid and f"{valid}, or null"
    kind = _kind_of(default)
    if kind is None:  # text, or null: any value, checked by the run
        return None
    accepted, valid = kind
    fits = isinstance(value, accepted) and (bool in accepted or not isinstance(value, bool))  # True is an int
    return None if fits else valid


def _kind_of(default: Any) -> tuple[tuple[type, ...], str] | None:
    """(the types a value may have, their name in an error) for a key whose default is `default`."""
    if isinstance(default, bool):
        return (bool,), "true or false"
    if isinstance(default, int):
        return (int,), "an integer"
    if isinstance(default, float):
        return (int, float), "a number"
    if isinstance(default, list):
        return (list,), "a list"
    return None


def asks_for_sweep(args: list[str]) -> bool:
    """Whether train.py's command line asks Hydra for a multirun (-m, --multirun, hydra.mode=MULTIRUN)."""
    return any(a in ("-m", "--multirun", "hydra.mode=MULTIRUN") for a in args)


def check_run_dir_free(args: list[str]) -> str | None:
    """One-line error if `hydra.run.dir=<dir>` names a directory a live run holds, else None.

    Checked before Hydra starts, because Hydra writes .hydra/ and its log into the directory first;
    the run checks again (and takes the lock) itself."""
    if is_secondary_rank() or asks_for_sweep(args):
        return None  # a DDP worker runs in its first process's directory; a sweep's jobs in hydra.sweep.dir
    for arg in args:
        key, sep, value = arg.partition("=")
        if key == "hydra.run.dir" and sep and is_running(value):
            return busy_message(value)
    return None


# What Hydra writes into a run's directory before zoo's code runs (hydra.output_subdir), and into a sweep's.
_HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")


def check_output_dirs(args: list[str]) -> str | None:
    """One-line error for a hydra.run.dir (or hydra.sweep.dir with -m) that zoo cannot use, else None: a file, a
    location it cannot write (read-only, no permission), zoo's or Hydra's names there as links or of the wrong
    kind, or a look-alike run (zoo.io.check_run_dir). Checked before Hydra starts, because Hydra creates the
    directory and writes .hydra/ (multirun.yaml in a sweep) first, and its own failure is a traceback."""
    given = {k: v for k, _, v in (a.partition("=") for a in overrides(args))}
    sweep = asks_for_sweep(args)
    key = "hydra.sweep.dir" if sweep else "hydra.run.dir"
    value = given.get(key)
    if is_secondary_rank() or not value or "$" in value:  # Hydra's default: a new, dated directory
        return None
    where = Path(value)
    subdir = given.get("hydra.output_subdir", ".hydra")
    try:
        if os.path.lexists(where) and not where.is_dir():
            return f"{key}: '{where}' is a file, not a directory; valid: a new directory, or one holding zoo's runs"
        if reason := _not_writable(where):
            return f"{key}: '{where}' cannot be written ({reason}); valid: a directory zoo can write"
        if not sweep:
            _check_hydra_files(where, subdir)
            check_run_dir(where)
        elif where.is_dir():
            _check_entry(where / "multirun.yaml", "file")
            for job in where.iterdir():  # the jobs' directories an earlier sweep left (hydra.sweep.subdir)
                if job.name.isdigit():
                    _check_entry(job, "dir")
                    _check_hydra_files(job, subdir)
                    check_run_dir(job)
    except RunDirError as e:
        return str(e)
    return None


def _check_entry(path: Path, kind: str) -> None:
    """RunDirError unless `path` is absent or a `kind` ("file" or "dir"), not a link."""
    if kind == "file":
        owned_path(path.parent, path.name)
    else:
        _refuse_link_or_file(path)


def _refuse_link_or_file(path: Path) -> None:
    if path.is_symlink():
        raise RunDirError(f"'{path}' is a symbolic link (to '{os.readlink(path)}'); zoo never writes through a "
                          "link in its output directories: remove the link")
    if os.path.lexists(path) and not path.is_dir():
        raise RunDirError(f"'{path}' is a file where Hydra makes a directory: move it away")


def _check_hydra_files(run_dir: Path, subdir: str) -> None:
    if subdir in ("null", "None", ""):
        return
    _refuse_link_or_file(run_dir / subdir)
    for name in _HYDRA_FILES:
        _check_entry(run_dir / subdir / name, "file")


def _not_writable(path: Path) -> str | None:
    """Why `path` (or, where it does not exist yet, the nearest directory above it) cannot be written, or None."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"'{existing}' is not a directory"
    if os.access(existing, os.W_OK | os.X_OK):
        return None
    return "read-only file system" if os.statvfs(existing).f_flag & os.ST_RDONLY else \
        f"no permission to write in '{existing}'"
