"""Train any zoo model from configs (`zoo train` and `python train.py` are this one command).

    zoo train                                        # small GPT on the embedded Shakespeare
    zoo train model=decoder_only norm=pre_ln         # pick components by name
    zoo train -m ffn=relu,gelu,swiglu seed=0,1,2     # a Hydra multirun sweep
    zoo train experiment=nanogpt_cpu                 # a named preset

Component options can be written short: `norm.type=rmsnorm` means `model.norm.type=rmsnorm`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache, partial
from pathlib import Path
from typing import TYPE_CHECKING

from hydra import version
from hydra._internal.hydra import Hydra
from hydra._internal.utils import _run_hydra, get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode

from zoo.commands import EXIT_ERROR, EXIT_OK, JOB_CODES, command, config_dir, config_search_path, run_as
from zoo.component import ConfigError
from zoo.io import collect_once_at_exit, pause_gc_while_loading, resume_gc
from zoo.training.cli import (  # no torch: fast answers
    asks_for_sweep,
    check_extras_given,
    check_group_choices,
    check_keys,
    check_output_dirs,
    check_plugins,
    check_run_dir_free,
    expand,
    help_text,
)
from zoo.training.preflight import Composed, Composition, compose_command
from zoo.training.safety import check_argv  # no torch either

if TYPE_CHECKING:
    from omegaconf import DictConfig


def task(cfg: DictConfig) -> float | None:
    """What Hydra runs for each job: one training run."""
    # torch and Lightning load here, after the argument checks and --help: a typo costs no import time.
    # lazy: the checks and --help run without them (torch 2.75 s, Lightning about 7 s more, quiet)
    from zoo.training import final_metric
    from zoo.training import main as train

    resume_gc()  # everything is loaded: collect once, freeze it, collector back on for the run
    code = train(cfg)
    JOB_CODES.append(code)
    if code and HydraConfig.get().mode == RunMode.RUN:  # in a sweep, one failed run must not stop the others
        sys.exit(code)
    if cfg.get("optimized_metric"):  # what a search sweeper (Optuna) minimises or maximises
        return final_metric(HydraConfig.get().runtime.output_dir, cfg.optimized_metric)
    return None


class SweepEnd(Callback):
    """A Hydra callback (conf/config.yaml's hydra.callbacks.sweep_end): every multirun, whichever launcher ran its
    jobs one after another or side by side, ends with where its runs are and the command that compares them."""

    def on_multirun_end(self, config, **kwargs) -> None:
        import json
        import shlex

        root = Path(str(config.hydra.sweep.dir))
        statuses = []
        for summary in sorted(root.glob("*/summary.json")) if root.is_dir() else []:
            try:
                statuses.append(json.loads(summary.read_text()).get("status", "?"))
            except (OSError, ValueError):
                statuses.append("unreadable")
        counts = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses)) or "no run finished"
        # a refused job leaves its directory as it was: an earlier run's summary.json there is counted above
        refused = f"; {JOB_CODES.count(EXIT_ERROR)} of this sweep's {len(JOB_CODES)} jobs refused (each said why " \
            "above)" if EXIT_ERROR in JOB_CODES else ""
        print(f"sweep: {len(statuses)} runs in {root} ({counts}){refused}\ncompare them: {command('report')} "
              f"{shlex.quote(str(root))}", flush=True)


def check_arguments(args: list[str], composed: Composed | None = None) -> str | None:
    """The command line's mistakes as one line, before Hydra starts and before torch loads. `composed`: the command's
    one composition (preflight); composed here when not given."""
    if "--hydra-help" in args:
        return None
    conf = config_dir()
    # a busy or unusable hydra.run.dir (hydra.sweep.dir) is refused before Hydra writes .hydra/ into it
    return check_plugins() or check_extras_given(args) or check_group_choices(args, conf) \
        or check_keys(args, conf, composed) or check_run_dir_free(args) or check_output_dirs(args)


def composition(args: list[str]) -> Composed:
    """The command's one composition for the pre-flight (zoo.training.preflight.compose_command), made when the first
    check that reads it asks, then kept."""
    return cache(partial(compose_command, args, __file__, config_search_path()))


def preflight(args: list[str], composed: Composed | None = None) -> str | None:
    """Every check before Hydra starts, torch not loaded (tests/test_preflight.py): the command line's mistakes,
    then a class the config names that is not allowed, before Hydra instantiates hydra.callbacks, the launcher or
    the sweeper. The first problem as one line, else None. The config is composed once for all of them."""
    composed = composed or composition(args)
    return check_arguments(args, composed) or check_argv(args, __file__, config_search_path(), composed=composed)


def known_mode(composed: Composed) -> tuple[RunMode | None] | None:
    """hydra.mode as Hydra's get_mode would read it, from the pre-flight's composition: (mode,), or None where that
    composition cannot say (it failed, or it left out an override, or a group is swept: each choice may set it)."""
    done = composed()
    if not isinstance(done, Composition) or not done.complete or len(done.configs) != 1:
        return None
    try:
        return (done.configs[0].hydra.mode,)
    except Exception:  # unset (MISSING): get_mode's None
        return (None,)


@contextmanager
def _mode_given(mode: tuple[RunMode | None] | None) -> Iterator[None]:
    # Hydra composes the whole config once only to read hydra.mode (Hydra.get_mode), then again to run it: a
    # tenth of a short run's CPU. The pre-flight's composition already holds it.
    if mode is None:
        yield
        return
    original = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: mode[0]  # type: ignore[method-assign]
    try:
        yield
    finally:
        Hydra.get_mode = original  # type: ignore[method-assign]


def run_hydra(args: list[str], mode: tuple[RunMode | None] | None = None) -> None:
    """Hydra's main on these arguments, as @hydra.main runs it on sys.argv. The arguments are passed rather than
    read from sys.argv, which stays as the user typed it (`zoo train ...`): a process Lightning starts for
    another DDP rank repeats sys.argv, and must land here again. _run_hydra is what @hydra.main calls (Hydra's
    own, private; the same since Hydra 1.1). `mode`: hydra.mode already known (known_mode), as (mode,)."""
    version.setbase("1.3")  # what @hydra.main(version_base="1.3") sets
    parser = get_args_parser()
    with _mode_given(mode):
        _run_hydra(args=parser.parse_args(args), args_parser=parser, task_function=task,
                   config_path=config_search_path(), config_name="config")


def main(argv: list[str] | None = None, command: str = "zoo train", doc: str = __doc__) -> int:
    """The whole command: checks that answer in a fraction of a second, then Hydra. `command` is what the user
    typed before the arguments and `doc` the help's introduction (train.py passes its own)."""
    collect_once_at_exit()  # first, so it runs after every exit handler registered later
    run_as(command)  # its hints (a resume line, a sweep's report command) name what the user typed
    pause_gc_while_loading()  # until task() has imported torch and Lightning
    args = [expand(a) for a in (sys.argv[1:] if argv is None else argv)]
    try:
        if "--help" in args or "-h" in args:
            if text := help_text(args, config_dir(), doc, command):
                print(text)
                return EXIT_OK
        composed = composition(args)
        error = preflight(args, composed)
    except ConfigError as e:  # no configs at all
        error = str(e)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    if asks_for_sweep(args):
        resume_gc()  # a launcher may run every job elsewhere: this process never reaches task()'s own call
    JOB_CODES.clear()
    run_hydra(args, known_mode(composed))
    if JOB_CODES and all(c == EXIT_ERROR for c in JOB_CODES):  # a sweep refused whole: say so in the code
        print(f"error: all {len(JOB_CODES)} jobs of the sweep were refused (each said why above)", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK
