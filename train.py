"""Train any zoo model from configs.

    python train.py                                        # small GPT on the embedded Shakespeare
    python train.py model=decoder_only norm=pre_ln         # pick components by name
    python train.py -m ffn=relu,gelu,swiglu seed=0,1,2     # a Hydra multirun sweep
    python train.py experiment=nanogpt_cpu                 # a named preset

Component options can be written short: `norm.type=rmsnorm` means `model.norm.type=rmsnorm`.
The same command is `zoo train ...` (zoo/cli/train.py), which an installed zoo has without a clone.
"""

import sys

from zoo.cli.train import check_arguments, main

__all__ = ["check_arguments", "main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], command="python train.py", doc=__doc__))
