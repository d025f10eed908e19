"""Train any zoo model from configs.

    python train.py                                        # small GPT on the embedded Shakespeare
    python train.py model=decoder_only norm=pre_ln         # pick components by name
    python train.py -m ffn=relu,gelu,swiglu seed=0,1,2     # a Hydra multirun sweep
    python train.py experiment=nanogpt_cpu                 # a named preset

Component options can be written short: `norm.type=rmsnorm` means `model.norm.type=rmsnorm`.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from zoo.io import collect_once_at_exit, pause_gc_while_loading, resume_gc
from zoo.training.cli import (  # no torch: fast answers
    asks_for_sweep,
    check_group_choices,
    check_keys,
    check_output_dirs,
    check_plugins,
    check_run_dir_free,
    expand,
    help_text,
)
from zoo.training.safety import refuse_disallowed_targets  # no torch either

CONF = Path(__file__).resolve().parent / "conf"


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    # torch and Lightning load here, after the argument checks and --help: a typo costs no import time.
    from hydra.core.hydra_config import HydraConfig

    from zoo.training import final_metric
    from zoo.training import main as train

    resume_gc()  # everything is loaded: collect once, freeze it, collector back on for the run
    code = train(cfg)
    if code and HydraConfig.get().mode.name == "RUN":  # in a sweep, one failed run must not stop the others
        sys.exit(code)
    if cfg.get("optimized_metric"):  # what a search sweeper (Optuna) minimises or maximises
        return final_metric(HydraConfig.get().runtime.output_dir, cfg.optimized_metric)
    return None


def check_arguments(args: list[str]) -> str | None:
    """The command line's mistakes as one line, before Hydra composes and before torch loads."""
    if "--hydra-help" in args:
        return None
    # a busy or unusable hydra.run.dir (hydra.sweep.dir) is refused before Hydra writes .hydra/ into it
    return check_plugins() or check_group_choices(args, CONF) or check_keys(args, CONF) or check_run_dir_free(args) \
        or check_output_dirs(args)


if __name__ == "__main__":
    collect_once_at_exit()  # first, so it runs after every exit handler registered later
    pause_gc_while_loading()  # until main() has imported torch and Lightning
    sys.argv = [sys.argv[0]] + [expand(a) for a in sys.argv[1:]]
    if ("--help" in sys.argv or "-h" in sys.argv) and (text := help_text(sys.argv[1:], CONF, __doc__)):
        print(text)
        sys.exit(0)
    if error := check_arguments(sys.argv[1:]):
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    refuse_disallowed_targets(__file__)  # before Hydra instantiates hydra.callbacks, the launcher or the sweeper
    if asks_for_sweep(sys.argv[1:]):
        resume_gc()  # a launcher may run every job elsewhere: this process never reaches main()'s own call
    main()
