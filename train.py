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

from zoo.training import final_metric
from zoo.training import main as train
from zoo.training.cli import check_group_choices, expand
from zoo.training.safety import refuse_disallowed_targets

CONF = Path(__file__).resolve().parent / "conf"


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    code = train(cfg)
    from hydra.core.hydra_config import HydraConfig

    if code and HydraConfig.get().mode.name == "RUN":  # in a sweep, one failed run must not stop the others
        sys.exit(code)
    if cfg.get("optimized_metric"):  # what a search sweeper (Optuna) minimises or maximises
        return final_metric(HydraConfig.get().runtime.output_dir, cfg.optimized_metric)
    return None


if __name__ == "__main__":
    sys.argv = [sys.argv[0]] + [expand(a) for a in sys.argv[1:]]
    if error := check_group_choices(sys.argv[1:], CONF):
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    refuse_disallowed_targets(__file__)  # before Hydra instantiates hydra.callbacks, the launcher or the sweeper
    main()
