"""Only known classes may be instantiated from a config: every `_target_` must be on an explicit allow-list.

Two places instantiate from a config: the run (loggers, in zoo.training.runner) and Hydra itself, which
builds `hydra.callbacks`, the launcher and the sweeper before the task function runs. `check_argv` checks the
config train.py is about to run, Hydra's section included (the pre-flight's one composition, zoo.training.preflight),
before Hydra gets that far.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from zoo.component import ConfigError  # torch-free: train.py's checks run before torch loads
from zoo.io import MAX_SWEEP_JOBS, sweep_size
from zoo.sweep import ReportError, check_callbacks
from zoo.training.preflight import Composed, Composition, compose_command, hydra_args

# Exact dotted paths, no prefixes: a prefix such as "zoo." also admits whatever a zoo module imports
# (zoo.report.np.savez writes files). To allow another class, add its full path to the right group below.
ALLOWED_TARGETS: tuple[str, ...] = (
    # Lightning loggers (conf/logger/ uses CSV, TensorBoard and W&B)
    "lightning.pytorch.loggers.CSVLogger",
    "lightning.pytorch.loggers.TensorBoardLogger",
    "lightning.pytorch.loggers.WandbLogger",
    "lightning.pytorch.loggers.MLFlowLogger",
    "lightning.pytorch.loggers.CometLogger",
    # Lightning callbacks
    "lightning.pytorch.callbacks.EarlyStopping",
    "lightning.pytorch.callbacks.LearningRateMonitor",
    "lightning.pytorch.callbacks.ModelCheckpoint",
    "lightning.pytorch.callbacks.DeviceStatsMonitor",
    "lightning.pytorch.callbacks.StochasticWeightAveraging",
    "lightning.pytorch.callbacks.Timer",
    "lightning.pytorch.callbacks.TQDMProgressBar",
    "lightning.pytorch.callbacks.RichProgressBar",
    "lightning.pytorch.callbacks.ModelSummary",
    "lightning.pytorch.callbacks.RichModelSummary",
    # zoo's own classes named by conf/
    "zoo.report.ReportAfterSweep",
    "zoo.cli.train.SweepEnd",  # every multirun: its directory and the report command, at the end
    "zoo.training.loggers.MLflowSweep",  # logger=mlflow: logs the sweep's report to its parent run
    # Hydra launchers and sweepers (conf/ uses joblib, submitit and optuna; basic is Hydra's default)
    "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "hydra._internal.core_plugins.basic_sweeper.BasicSweeper",
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
    "hydra_plugins.zoo_launcher.parallel_launcher.ParallelLauncher",  # zoo's: a killed job costs that job only
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
    "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper",
    "optuna.samplers.TPESampler",
    "optuna.samplers.RandomSampler",
    "optuna.samplers.CmaEsSampler",
    "optuna.samplers.GridSampler",
    "optuna.samplers.NSGAIISampler",
    "optuna.samplers.MOTPESampler",
)

# logging.config.dictConfig calls the `class` (handlers, formatters) and `()` (any factory) it is given, so
# hydra.job_logging / hydra.hydra_logging are code too. Exact names: "logging." would admit logging.os.system.
ALLOWED_LOGGING_CLASSES: tuple[str, ...] = (
    "logging.StreamHandler", "logging.FileHandler", "logging.NullHandler", "logging.Formatter",
    "logging.handlers.RotatingFileHandler", "logging.handlers.TimedRotatingFileHandler",
    "logging.handlers.WatchedFileHandler", "colorlog.ColoredFormatter",
)
LOGGING_SECTIONS = ("hydra.job_logging", "hydra.hydra_logging")


def check_target(target: Any, key: str = "_target_") -> None:
    if not isinstance(target, str) or target not in ALLOWED_TARGETS:
        raise ConfigError(f"{key}: '{target}' is not allowed; valid: a class listed in zoo.training.safety."
                          "ALLOWED_TARGETS (Lightning loggers and callbacks, Hydra launchers and sweepers, "
                          "zoo.report.ReportAfterSweep)")


def check_targets(node: Any, path: str = "") -> None:
    """Raise ConfigError at the first `_target_` (anywhere in `node`) or logging class that is not allowed."""
    logging_section = path.startswith(LOGGING_SECTIONS)
    if isinstance(node, dict):
        for k, v in node.items():
            key = f"{path}.{k}".lstrip(".")
            if k == "_target_":
                check_target(v, key)
            elif logging_section and k in ("class", "()") and v not in ALLOWED_LOGGING_CLASSES:
                raise ConfigError(f"{key}: '{v}' is not allowed; valid: {', '.join(ALLOWED_LOGGING_CLASSES)}")
            check_targets(v, key)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            check_targets(v, f"{path}[{i}]")


def instantiate_allowed(cfg: dict[str, Any], key: str, **kwargs: Any) -> Any:
    """hydra.utils.instantiate for one object (at config `key`), after checking every nested _target_."""
    check_targets(cfg, key)
    return instantiate(cfg, **kwargs)


def _sweep_values(override: Any) -> list[Any]:
    """A value override's values (a sweep's, after too_many_jobs bounded their number); an interval, which a search
    samples, by its start."""
    if not override.is_sweep_override():
        return [override.value()]
    return [override.value().start] if hasattr(override.value(), "end") else list(override.sweep_iterator())


def plain_mapping(node: Any, resolve: bool) -> dict[Any, Any]:
    """A section of Hydra's config (callbacks, sweeper, a logger: mappings) as plain data; {} for one that is not."""
    plain = OmegaConf.to_container(node, resolve=resolve)
    return plain if isinstance(plain, dict) else {}


def check_argv(argv: list[str], app_file: str, config_path: str = "conf", config_name: str = "config",
               composed: Composed | None = None) -> str | None:
    """The one-line error for the first disallowed `_target_` in the config(s) `python <app_file> <argv>` would
    run, Hydra's own section (callbacks, launcher, sweeper, logging) included, or for bad arguments of the sweep's
    report callback; None if all are allowed.

    Reads argv as Hydra does (--config-dir, --config-path, --config-name, -m, hydra.mode=MULTIRUN); the config is
    the pre-flight's one composition (`composed`, zoo.training.preflight), made here when none is given: one config
    per choice of a swept group. Commands that run nothing
    (--help, --cfg, --info, ...) are not checked. A config Hydra cannot compose is left to Hydra to report."""
    try:
        args = hydra_args(argv)
    except SystemExit:  # a usage error: Hydra prints it when it runs
        return None
    if args.help or args.hydra_help or args.cfg or args.info or args.shell_completion:
        return None
    if args.experimental_rerun is not None:  # it unpickles a saved config and runs it: nothing could check it
        return ("--experimental-rerun: not supported (it unpickles a config, which could run any code); "
                "valid: rerun with the overrides saved in <run dir>/.hydra/overrides.yaml")
    overrides = list(args.overrides)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        if too_many := too_many_jobs(parsed, "the command line"):  # before any sweep is expanded
            return too_many
        for o in parsed:  # a value override can carry a target itself: +x._target_=a,b or +x={_target_: a}
            key = o.key_or_group
            for v in _sweep_values(o):
                check_targets({key.rsplit(".", 1)[-1]: v} if "." in key else {key: v}, key.rpartition(".")[0])
    except ConfigError as e:
        return str(e)
    except HydraException:
        return None
    found = composed() if composed is not None else compose_command(argv, app_file, config_path, config_name)
    if not isinstance(found, Composition) or not found.complete:
        return None  # Hydra reports a config it cannot compose itself, before running anything
    try:
        # The first config, Hydra's section included: what Hydra instantiates callbacks, launcher and sweeper from
        cfg = found.configs[0]
        check_targets(OmegaConf.to_container(cfg, resolve=False))
        if callbacks := plain_mapping(cfg.hydra.callbacks, resolve=True):
            _check_report_callbacks(callbacks)
        if args.multirun or cfg.hydra.mode == RunMode.MULTIRUN:
            # Each choice of a swept group (on the command line or in hydra.sweeper.params, as the study
            # presets do) may carry its own targets, and each job configures logging from its own config:
            # one config per choice.
            params = plain_mapping(cfg.hydra.sweeper, resolve=False).get("params") or {}
            in_config = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
            # a key the command line sets too sweeps the command line's values alone (Hydra's sweeper)
            given = {o.get_key_element() for o in parsed}
            in_config = [o for o in in_config if o.get_key_element() not in given]
            if too_many := too_many_jobs(in_config + parsed, "hydra.sweeper.params and the command line"):
                return too_many
            if search := check_search(plain_mapping(cfg.hydra.sweeper, resolve=True), in_config + parsed):
                return search
            for other in found.configs[1:]:  # the command line's other choices: composed already
                check_targets(OmegaConf.to_container(other, resolve=False))
            for o in in_config:
                if not (o.is_sweep_override() and found.is_group(o.key_or_group)):
                    continue
                for v in _sweep_values(o):
                    try:
                        other = found.choice(o.get_key_element(), v)
                    except (HydraException, OmegaConfBaseException):
                        continue  # a choice that does not compose fails its own job, before it runs
                    check_targets(OmegaConf.to_container(other, resolve=False))
    except ConfigError as e:
        return str(e)
    except (HydraException, OmegaConfBaseException, OSError, ValueError):
        return None  # Hydra reports a config it cannot compose itself, before running anything
    return None


def too_many_jobs(parsed: list[Any], where: str) -> str | None:
    if sweep_size(parsed) > MAX_SWEEP_JOBS:
        return f"{where}: the sweep plans more than {MAX_SWEEP_JOBS} jobs; valid: fewer values (a sweep's jobs " \
               "are its sweeps' lengths multiplied)"
    return None


OPTUNA = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"


def check_search(sweeper: dict[str, Any], parsed: list[Any]) -> str | None:
    """A search sweeper's (Optuna's) settings, before its first trial: n_trials and n_jobs at least 1, and each
    interval it samples (hydra.sweeper.params, then the command line) low < high, and low > 0 for a log one."""
    if sweeper.get("_target_") != OPTUNA:
        return None
    for key in ("n_trials", "n_jobs"):
        v = sweeper.get(key)
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            return f"hydra.sweeper.{key}: expected an integer >= 1, got {v!r}"
    for o in {o.key_or_group: o for o in parsed}.values():
        v = o.value()
        if not (o.is_sweep_override() and hasattr(v, "end")):
            continue
        log = "log" in getattr(v, "tags", ())
        shown = f"{'tag(log, ' if log else ''}interval({v.start}, {v.end}){')' if log else ''}"
        if not (math.isfinite(v.start) and math.isfinite(v.end) and v.start < v.end):
            return f"{o.key_or_group}: {shown} is empty or reversed; valid: interval(low, high) with low < high"
        if log and v.start <= 0:
            return f"{o.key_or_group}: {shown} starts at {v.start}, where a log interval cannot; valid: " \
                   "tag(log, interval(low, high)) with 0 < low < high"
    return None


def _check_report_callbacks(callbacks: dict[str, Any]) -> None:
    """The report callback's own arguments (zoo.sweep: the report's, without its statistics), checked before Hydra
    creates it."""
    try:
        check_callbacks(callbacks)
    except ReportError as e:
        raise ConfigError(str(e)) from e


def refuse_disallowed_targets(app_file: str, config_path: str = "conf", config_name: str = "config") -> None:
    """train.py's guard: exit 2 with one line if the command's config names a class that is not allowed."""
    if error := check_argv(sys.argv[1:], app_file, config_path, config_name):
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
