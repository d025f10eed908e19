"""Optimizers, a component group: `optim=adamw` (the default) or `optim=muon` (conf/optim/), registered in
zoo.registry.OPTIM with typed options, as the model's parts are.

An optimizer is a class registered under its name (one file each: adamw.py, muon.py) that declares:
- its options: a dataclass extending `OptimOptions`, the keys every optimizer has (the warm-up + cosine schedule
  of zoo/training/module.py scales each parameter group's peak learning rate alike: min_lr / lr at the end);
- `check(values, run)`: its option values (the defaults filled in) and the run settings it cannot train with,
  each refused in one line naming the key and the valid values, before anything is built (`check`, below);
- `takes(model)`: which parameters each torch optimizer it builds receives, {"adamw": [(name, p), ...], ...};
- `state_per_param`: for each of those, how many numbers of state it keeps per parameter (validate's memory check);
- `build(model, opts, device, precision)`: the one torch.optim.Optimizer that Lightning steps (`Combined`, when
  the parameters are split between several).
"""

from zoo.optim import adamw, muon  # noqa: F401  register the optimizers
from zoo.optim.base import DEFAULT, Combined, OptimOptions, check, check_schedule, refuse, resolve, state_numbers

__all__ = ["DEFAULT", "Combined", "OptimOptions", "check", "check_schedule", "refuse", "resolve", "state_numbers"]
